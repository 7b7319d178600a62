package gateway

import (
	"archive/tar"
	"compress/gzip"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

func (s *Server) sweepCheckpoints(now time.Time) {
	var gone []*ckptMeta
	s.mu.Lock()
	for _, m := range s.ckpts {
		if m.expired(now) {
			gone = append(gone, m)
		}
	}
	s.mu.Unlock()
	for _, m := range gone {
		s.removeCheckpoint(m)
		s.audit(m.Owner, "checkpoint.expire", m.parsed.ModelID, m.Path, "")
	}
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

// archiveSecret is the HMAC key of archive download URLs, kept in the data directory so that
// URLs handed out stay valid across a restart.
func (s *Server) archiveSecret() []byte {
	s.secretOnce.Do(func() {
		path := filepath.Join(s.opts.DataDir, "archive-secret")
		if b, err := os.ReadFile(path); err == nil && len(b) >= 32 {
			s.secret = b
			return
		}
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		_ = os.MkdirAll(s.opts.DataDir, 0o755)
		_ = os.WriteFile(path, b, 0o600)
		s.secret = b
	})
	return s.secret
}

type archiveClaim struct {
	Path       string `json:"p"`
	Generation string `json:"g,omitempty"` // the checkpoint's generation when the link was made
	Expires    int64  `json:"e"`
}

func (s *Server) signArchive(path, generation string, expires time.Time) string {
	body, _ := json.Marshal(archiveClaim{Path: path, Generation: generation, Expires: expires.Unix()})
	enc := base64.RawURLEncoding.EncodeToString(body)
	mac := hmac.New(sha256.New, s.archiveSecret())
	mac.Write([]byte(enc))
	return enc + "." + hex.EncodeToString(mac.Sum(nil))
}

func (s *Server) verifyArchive(token string, now time.Time) (path, generation string, err error) {
	enc, sig, ok := strings.Cut(token, ".")
	if !ok {
		return "", "", errors.New("malformed download token")
	}
	mac := hmac.New(sha256.New, s.archiveSecret())
	mac.Write([]byte(enc))
	want := hex.EncodeToString(mac.Sum(nil))
	if !hmac.Equal([]byte(sig), []byte(want)) {
		return "", "", errors.New("invalid download token")
	}
	body, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return "", "", errors.New("malformed download token")
	}
	var c archiveClaim
	if err := json.Unmarshal(body, &c); err != nil {
		return "", "", errors.New("malformed download token")
	}
	if now.Unix() > c.Expires {
		return "", "", errors.New("download link expired: ask for a new one")
	}
	return c.Path, c.Generation, nil
}
