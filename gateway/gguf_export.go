package gateway

// A checkpoint as a GGUF LoRA adapter (llama.cpp, Ollama's ADAPTER): the archive route with
// ?format=gguf gives a signed link like the tar.gz's, whose download converts the checkpoint's
// PEFT files for the base model it was trained on (engine.WriteAdapterGGUF).

import (
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/skein-ai/skein/engine"
)

const formatGGUF = "gguf"

// ggufExports bounds the conversions running at once, all tenants together: one holds the
// adapter's tensors about three times over (float64 as read, float32 as written), up to a GB
// for a rank-32 adapter of an 8B model, so a tenant's parallel downloads must not multiply it.
var ggufExports = make(chan struct{}, 2)

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

// baseConfig is the config of a base model served in this process.
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
	return nil, errf(http.StatusNotFound, "base model %q is served by remote workers only: convert the checkpoint with skein model export-gguf --base MODEL", base)
}

// downloadGGUF writes a checkpoint as a GGUF adapter. The adapter is read and checked before the
// answer starts, so a checkpoint that does not fit the base gets a clear error, not a cut file.
func (s *Server) downloadGGUF(w http.ResponseWriter, r *http.Request, m *ckptMeta) (any, error) {
	cfg, err := s.baseConfig(m.BaseModel)
	if err != nil {
		return nil, err
	}
	select {
	case ggufExports <- struct{}{}:
		defer func() { <-ggufExports }()
	default:
		return nil, errf(http.StatusTooManyRequests, "%d GGUF exports are running: retry in a moment", cap(ggufExports))
	}
	hw := &headerOnWrite{w: w, start: func() {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", strings.ReplaceAll(m.parsed.ModelID+"-"+m.parsed.Name, ":", "_")+".gguf"))
		w.WriteHeader(http.StatusOK)
	}}
	dir := m.parsed.Dir(s.opts.DataDir)
	if s.objectStorage() {
		// The checkpoint lives in the bucket: its files are copied to a scratch directory
		// for the conversion, and removed after it.
		tmp, err := s.fetchCheckpoint(r.Context(), m)
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	if err := engine.WriteAdapterGGUF(dir, cfg, hw); err != nil {
		if !hw.started {
			return nil, errf(http.StatusUnprocessableEntity, "checkpoint %s as GGUF: %v", m.Path, err)
		}
		s.log.Error("gguf export", "path", m.Path, "err", err)
	}
	return nil, nil
}

// headerOnWrite sends the answer's status and headers at its first write.
type headerOnWrite struct {
	w       http.ResponseWriter
	start   func()
	started bool
}

func (h *headerOnWrite) Write(b []byte) (int, error) {
	if !h.started {
		h.started = true
		h.start()
	}
	return h.w.Write(b)
}
