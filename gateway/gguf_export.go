package gateway

// A checkpoint as a GGUF LoRA adapter (llama.cpp, Ollama's ADAPTER): the archive route with
// ?format=gguf gives a signed link like the tar.gz's, whose download converts the checkpoint's
// PEFT files for the base model it was trained on (engine.WriteAdapterGGUF).

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/skein-ai/skein/engine"
)

const formatGGUF = "gguf"

// GGUF exports are bounded while they convert, not while they are downloaded. A conversion
// holds the adapter's tensors about three times over (float64 as read, float32 as written), up
// to a GB for a rank-32 adapter of an 8B model, so at most MaxGGUFExports run at once, all tenants
// together, and one tenant runs at most one (its parallel downloads must not take every slot).
// The result goes to an unlinked scratch file and the slot is given back before the file is
// streamed: a client that stops reading holds its file and its connection, never a slot (two
// stalled downloads gave every other tenant 429 for the 30-minute write timeout). A tenant has at
// most MaxGGUFStreamsPerTenant such files being downloaded at once.
const (
	MaxGGUFExports          = 2
	MaxGGUFStreamsPerTenant = 2
)

type ggufSlots struct {
	mu         sync.Mutex
	converting int
	byTenant   map[string]bool // tenants converting now
	streams    map[string]int  // GGUF files being downloaded, by tenant
}

// acquire takes a conversion slot and a download for tenant (a 429 naming the bound when there is
// none); converted gives back the conversion slot, done the download (each once; done does both).
func (g *ggufSlots) acquire(tenant string) (converted, done func(), err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.byTenant[tenant]:
		return nil, nil, errf(http.StatusTooManyRequests, "a GGUF export of yours is converting (one at a time per tenant): retry when it is done")
	case g.streams[tenant] >= MaxGGUFStreamsPerTenant:
		return nil, nil, errf(http.StatusTooManyRequests, "%d GGUF exports of yours are downloading (at most %d at once per tenant): retry when one is done", g.streams[tenant], MaxGGUFStreamsPerTenant)
	case g.converting >= MaxGGUFExports:
		return nil, nil, errf(http.StatusTooManyRequests, "%d GGUF exports are converting (at most %d at once): retry in a moment", g.converting, MaxGGUFExports)
	}
	if g.byTenant == nil {
		g.byTenant, g.streams = map[string]bool{}, map[string]int{}
	}
	g.converting++
	g.byTenant[tenant] = true
	g.streams[tenant]++
	var convOnce, doneOnce sync.Once
	converted = func() {
		convOnce.Do(func() {
			g.mu.Lock()
			g.converting--
			delete(g.byTenant, tenant)
			g.mu.Unlock()
		})
	}
	done = func() {
		converted()
		doneOnce.Do(func() {
			g.mu.Lock()
			if g.streams[tenant]--; g.streams[tenant] <= 0 {
				delete(g.streams, tenant)
			}
			g.mu.Unlock()
		})
	}
	return converted, done, nil
}

// archiveFormat reads ?format= of an archive request: "" or tar.gz for the checkpoint's files,
// gguf for a GGUF adapter, which needs the base model's config on this gateway.
func (s *Server) archiveFormat(r *http.Request, m *ckptMeta) (string, error) {
	switch f := r.URL.Query().Get("format"); f {
	case "", "tar.gz":
		return "", nil
	case formatGGUF:
		cfg, err := s.baseConfig(m.BaseModel)
		if err != nil {
			return "", err
		}
		if m.Lora.TrainUnembed && cfg.TieWordEmbeddings {
			return "", errf(http.StatusUnprocessableEntity, "checkpoint %s has a LoRA on the head of %s, whose head is its embedding: llama.cpp's model has no head weight to carry it (train with train_unembed=False to export to GGUF)", m.Path, m.BaseModel)
		}
		return formatGGUF, nil
	default:
		return "", errf(http.StatusBadRequest, "format %q: tar.gz (the default) or gguf", f)
	}
}

// baseConfig is the config of a served base model: its in-process replica's, else the one its
// workers reported when they registered (the config.json a GGUF export needs, nothing more).
func (s *Server) baseConfig(base string) (*engine.Config, error) {
	reps, err := s.replicasOf(base)
	if err != nil {
		return nil, errf(http.StatusNotFound, "base model %q is not served here: convert the checkpoint with skein model export-gguf --base MODEL", base)
	}
	for _, rep := range reps {
		if l, ok := rep.Local(); ok && l.Config != nil {
			return l.Config, nil
		}
	}
	for _, rep := range reps {
		if cfg := rep.Info().Config; cfg != nil {
			return cfg, nil
		}
	}
	return nil, errf(http.StatusNotFound, "base model %q: no replica reported its config: convert the checkpoint with skein model export-gguf --base MODEL", base)
}

// downloadGGUF writes a checkpoint as a GGUF adapter. The adapter is read and checked before the
// answer starts, so a checkpoint that does not fit the base gets a clear error, not a cut file.
func (s *Server) downloadGGUF(w http.ResponseWriter, r *http.Request, m *ckptMeta) (any, error) {
	cfg, err := s.baseConfig(m.BaseModel)
	if err != nil {
		return nil, err
	}
	converted, done, err := s.exports.acquire(m.Owner)
	if err != nil {
		return nil, err
	}
	defer done()
	f, size, err := s.convertGGUF(r, m, cfg)
	converted() // the conversion's memory is free: the download holds only its file
	if err != nil {
		return nil, err
	}
	defer func() {
		f.Close()
		_ = os.Remove(f.Name()) // where an open file could not be unlinked (Windows)
	}()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", strings.ReplaceAll(m.parsed.ModelID+"-"+m.parsed.Name, ":", "_")+".gguf"))
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, f); err != nil {
		s.log.Info("gguf export: the download ended early", "path", m.Path, "err", err)
	}
	return nil, nil
}

// convertGGUF writes a checkpoint as a GGUF adapter into an unlinked scratch file and returns it,
// at its start, with its size.
func (s *Server) convertGGUF(r *http.Request, m *ckptMeta, cfg *engine.Config) (*os.File, int64, error) {
	dir := m.parsed.Dir(s.opts.DataDir)
	if s.objectStorage() {
		// The checkpoint lives in the bucket: its files are copied to a scratch directory
		// for the conversion, and removed after it.
		tmp, err := s.fetchCheckpoint(r.Context(), m)
		if err != nil {
			return nil, 0, err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	scratch := filepath.Join(s.opts.DataDir, "scratch")
	if err := os.MkdirAll(scratch, 0o755); err != nil {
		return nil, 0, err
	}
	f, err := os.CreateTemp(scratch, "gguf-*.gguf")
	if err != nil {
		return nil, 0, err
	}
	_ = os.Remove(f.Name()) // unlinked: the file goes with the download, crash or not (where the OS allows)
	ok := false
	defer func() {
		if !ok {
			f.Close()
		}
		_ = os.Remove(f.Name())
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	if err := engine.WriteAdapterGGUF(dir, cfg, bw); err != nil {
		return nil, 0, errf(http.StatusUnprocessableEntity, "checkpoint %s as GGUF: %v", m.Path, err)
	}
	if err := bw.Flush(); err != nil {
		return nil, 0, fmt.Errorf("writing the GGUF of %s: %w", m.Path, err)
	}
	size, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return nil, 0, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, 0, err
	}
	ok = true
	return f, size, nil
}
