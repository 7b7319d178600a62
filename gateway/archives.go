package gateway

// Checkpoint archives: signed download links and the tar.gz they serve.

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/store"
)

// archiveCheckpoint answers with a signed download URL, valid for 15 minutes and usable without
// the API key (as the SDK's get_checkpoint_archive_url expects): JSON {url, expires} when the client
// accepts JSON, a 302 to the URL otherwise (so `curl -L` downloads the tar.gz).
func (s *Server) archiveCheckpoint(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	m, err := s.ownedCheckpoint(r, tenant)
	if err != nil {
		return nil, err
	}
	format, err := s.archiveFormat(r, m) // gguf_export.go
	if err != nil {
		return nil, err
	}
	expires := time.Now().Add(ArchiveURLLifetime).UTC()
	var url string
	if s.objectStorage() && format == "" {
		// The object store serves the bytes: a presigned GET of the archive object, for the
		// same 15 minutes, and no gateway in the download's path. A GGUF is converted by the
		// gateway, so it keeps the gateway's signed link below.
		if url, err = s.presignedArchive(r.Context(), m); err != nil {
			return nil, err
		}
		if strings.Contains(r.Header.Get("Accept"), "application/json") {
			return api.ArchiveURLResponse{URL: url, Expires: expires.Format(time.RFC3339)}, nil
		}
		w.Header().Set("Location", url)
		writeJSON(w, http.StatusFound, api.ArchiveURLResponse{URL: url, Expires: expires.Format(time.RFC3339)})
		return nil, nil
	}
	public, err := s.publicBase(r)
	if err != nil {
		return nil, err
	}
	url = fmt.Sprintf("%s%sarchives/%s", public, v1, s.signArchive(archiveClaim{Path: m.Path, Generation: m.Generation, KeyID: callerOf(r).keyID, Format: format}, expires))
	if strings.Contains(r.Header.Get("Accept"), "application/json") {
		return api.ArchiveURLResponse{URL: url, Expires: expires.Format(time.RFC3339)}, nil
	}
	w.Header().Set("Location", url)
	w.Header().Set("Expires", expires.Format(http.TimeFormat))
	writeJSON(w, http.StatusFound, api.ArchiveURLResponse{URL: url, Expires: expires.Format(time.RFC3339)})
	return nil, nil
}

// downloadArchive streams a checkpoint as .tar.gz for a valid signed token.
func (s *Server) downloadArchive(w http.ResponseWriter, r *http.Request, _ string) (any, error) {
	c, err := s.verifyArchive(r, r.PathValue("token"), time.Now())
	if err != nil {
		return nil, err
	}
	path, generation := c.Path, c.Generation
	m, err := s.lookupCheckpoint(r.Context(), path)
	if err != nil {
		return nil, err
	}
	s.ckpts.mu.Lock()
	if m != nil && m.Generation != generation {
		m = nil // deleted or overwritten since the link was made: the link was for the old one
	}
	s.ckpts.mu.Unlock()
	if m == nil {
		return nil, errf(http.StatusNotFound, "checkpoint %s no longer exists", path)
	}
	s.writeWithin(w, ArchiveWriteTimeout) // a big checkpoint takes longer than an answer
	if c.Format == formatGGUF {
		return s.downloadGGUF(w, r, m)
	}
	w.Header().Set("Content-Type", "application/gzip")
	w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", strings.ReplaceAll(m.parsed.ModelID+"-"+m.parsed.Name, ":", "_")+".tar.gz"))
	w.WriteHeader(http.StatusOK)
	if err := writeTarGz(w, m.parsed.Dir(s.opts.DataDir)); err != nil {
		s.log.Error("archive", "path", m.Path, "err", err)
	}
	return nil, nil
}

// writeTarGz streams a checkpoint directory as a .tar.gz (files at the archive's top level).
func writeTarGz(w io.Writer, dir string) error {
	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: e.Name(), Mode: 0o644, Size: info.Size(), ModTime: info.ModTime()}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		_, err = io.Copy(tw, f)
		f.Close()
		if err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}

// archiveSecretName is the cluster secret that signs download links: every gateway on one store
// signs and checks with the same key, so a link one gateway made downloads through any.
const archiveSecretName = "archive-signing"

// settleArchiveSecret reads the key of download links from the store, storing a new one if it
// has none. A data directory's key from before the store kept it (archive-secret) is offered
// first, so that links handed out before an upgrade stay valid.
func (s *Server) settleArchiveSecret() ([]byte, error) {
	candidate, err := os.ReadFile(filepath.Join(s.opts.DataDir, "archive-secret"))
	if err != nil || len(candidate) < 32 {
		candidate = make([]byte, 32)
		if _, err := rand.Read(candidate); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := s.st.ClusterSecret(ctx, archiveSecretName, candidate)
	if err != nil {
		return nil, fmt.Errorf("the key of download links: %w", err)
	}
	if len(b) < 32 {
		return nil, fmt.Errorf("the stored key of download links is %d bytes, under 32", len(b))
	}
	return b, nil
}

// archiveSecret is the HMAC key of download links (settled in New).
func (s *Server) archiveSecret() []byte { return s.secret }

type archiveClaim struct {
	Path       string `json:"p"`
	Generation string `json:"g,omitempty"` // the checkpoint's generation when the link was made
	KeyID      string `json:"k,omitempty"` // the key that asked for the link (keys mode)
	Format     string `json:"f,omitempty"` // "" (tar.gz of the checkpoint) or "gguf" (a llama.cpp LoRA adapter)
	Expires    int64  `json:"e"`
}

// signArchive makes the token of a download link for claim, valid until expires.
func (s *Server) signArchive(c archiveClaim, expires time.Time) string {
	c.Expires = expires.Unix()
	body, _ := json.Marshal(c)
	enc := base64.RawURLEncoding.EncodeToString(body)
	mac := hmac.New(sha256.New, s.archiveSecret())
	mac.Write([]byte(enc))
	return enc + "." + hex.EncodeToString(mac.Sum(nil))
}

// verifyArchive checks a download token: its signature, its expiry and, in keys mode, that the
// key which asked for the link is still valid. A link needs no key to be used (the SDK downloads
// with a plain GET), so without this check a revoked key's links would keep working for their
// whole life (15 minutes for archives, an hour for traces). Errors are 403s (503 when the store
// cannot be read).
func (s *Server) verifyArchive(r *http.Request, token string, now time.Time) (archiveClaim, error) {
	c, err := s.parseArchiveToken(token, now)
	if err != nil {
		return archiveClaim{}, errf(http.StatusForbidden, "%v", err)
	}
	if s.opts.Auth != AuthKeys {
		return c, nil
	}
	if c.KeyID == "" { // made in open mode, before this server required keys
		return archiveClaim{}, errf(http.StatusForbidden, "this download link was not made with an API key: ask for a new one")
	}
	row, err := s.st.GetKey(r.Context(), c.KeyID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return archiveClaim{}, errf(http.StatusForbidden, "the API key that made this download link no longer exists")
	case err != nil:
		s.log.Error("reading an API key", "key_id", c.KeyID, "err", err)
		return archiveClaim{}, errf(http.StatusServiceUnavailable, "cannot check the download link's API key now; retry")
	case row.Revoked != nil:
		return archiveClaim{}, errf(http.StatusForbidden, "the API key that made this download link (%s) was revoked", c.KeyID)
	}
	return c, nil
}

func (s *Server) parseArchiveToken(token string, now time.Time) (archiveClaim, error) {
	enc, sig, ok := strings.Cut(token, ".")
	if !ok {
		return archiveClaim{}, errors.New("malformed download token")
	}
	mac := hmac.New(sha256.New, s.archiveSecret())
	mac.Write([]byte(enc))
	want := hex.EncodeToString(mac.Sum(nil))
	if !hmac.Equal([]byte(sig), []byte(want)) {
		return archiveClaim{}, errors.New("invalid download token")
	}
	body, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return archiveClaim{}, errors.New("malformed download token")
	}
	var c archiveClaim
	if err := json.Unmarshal(body, &c); err != nil {
		return archiveClaim{}, errors.New("malformed download token")
	}
	if now.Unix() > c.Expires {
		return archiveClaim{}, errors.New("download link expired: ask for a new one")
	}
	return c, nil
}
