package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/storage"
)

// The tokenizer files a client may read, and nothing else: the name never comes from the request.
const (
	tokenizerFile       = "tokenizer.json"
	tokenizerConfigFile = "tokenizer_config.json"
	// preprocessorConfigFile is a vision model's image preprocessing (imageproc.ParseConfig).
	preprocessorConfigFile = "preprocessor_config.json"
	// maxTokenizerFile bounds what one file may hold in memory (the largest real tokenizer.json,
	// Gemma 3's, is about 33 MB).
	maxTokenizerFile = 64 << 20
)

var errNoTokenizerFile = errors.New("no such tokenizer file")

// tokenizerCache keeps each engine directory's answer: its files do not change while it is served,
// and re-reading megabytes for every request would let one tenant make the gateway do so at will.
type tokenizerCache struct {
	mu    sync.Mutex
	byDir map[string][]byte
}

var servedTokenizers = &tokenizerCache{byDir: map[string][]byte{}}

// modelTokenizer answers GET /api/v1/models/{name}/tokenizer with
// {"model_name": ..., "tokenizer_json": {...}, "tokenizer_config": {...} or null}: the files the
// served base model encodes text with, so that a client tokenizes as the server would. The model
// name may contain "/" (written as is or as %2F).
func (s *Server) modelTokenizer(w http.ResponseWriter, r *http.Request, _ string) (any, error) {
	name, ok := strings.CutSuffix(r.PathValue("rest"), "/tokenizer")
	if !ok || name == "" {
		return nil, errf(http.StatusNotFound, "no such endpoint: %s %s (want /api/v1/models/{name}/tokenizer)", r.Method, r.URL.Path)
	}
	files, _, err := s.filesOf(name)
	if err != nil {
		var he *httpError
		if errors.As(err, &he) {
			he.status = http.StatusNotFound
		}
		return nil, err
	}
	read := func(file string) ([]byte, error) { return files.read(r.Context(), file) }
	cacheKey := files.key
	body, err := servedTokenizers.get(name, cacheKey, read)
	if errors.Is(err, errNoTokenizerFile) {
		return nil, errf(http.StatusNotFound, "base model %q has no %s", name, tokenizerFile)
	}
	if err != nil {
		return nil, fmt.Errorf("tokenizer of %q: %w", name, err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
	return nil, nil
}

func (c *tokenizerCache) get(name, dir string, read func(file string) ([]byte, error)) ([]byte, error) {
	key := name + "\x00" + dir
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.byDir[key]; ok {
		return b, nil
	}
	tok, err := read(tokenizerFile)
	if err != nil {
		return nil, err
	}
	cfg, err := read(tokenizerConfigFile)
	if errors.Is(err, errNoTokenizerFile) {
		cfg, err = []byte("null"), nil
	}
	if err != nil {
		return nil, err
	}
	nameJSON, err := json.Marshal(name)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	buf.Grow(len(tok) + len(cfg) + len(nameJSON) + 64)
	buf.WriteString(`{"model_name":`)
	buf.Write(nameJSON)
	buf.WriteString(`,"tokenizer_json":`)
	buf.Write(tok)
	buf.WriteString(`,"tokenizer_config":`)
	buf.Write(cfg)
	buf.WriteString("}\n")
	c.byDir[key] = buf.Bytes()
	return buf.Bytes(), nil
}

// readTokenizerFile reads one fixed file of an engine directory (the operator's; a symlink there,
// as Hugging Face's cache makes, is followed), refusing anything but a regular file, an oversized
// file and one that is not JSON.
func readTokenizerFile(dir, file string) ([]byte, error) {
	if b, ok := engine.TokenizerFile(dir, file); ok { // a GGUF model's, rebuilt from its metadata
		return b, nil
	}
	path := filepath.Join(dir, file)
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errNoTokenizerFile
	}
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", file)
	}
	if fi.Size() > maxTokenizerFile {
		return nil, fmt.Errorf("%s is %d bytes, over %d", file, fi.Size(), maxTokenizerFile)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTokenizerFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxTokenizerFile {
		return nil, fmt.Errorf("%s grew over %d bytes", file, maxTokenizerFile)
	}
	if !json.Valid(b) {
		return nil, fmt.Errorf("%s is not valid JSON", file)
	}
	return bytes.TrimSpace(b), nil
}

// readStoredTokenizerFile reads one tokenizer file a worker published in object storage, with
// the checks of readTokenizerFile (bounded, JSON).
func (s *Server) readStoredTokenizerFile(ctx context.Context, prefix, file string) ([]byte, error) {
	b, _, err := storage.ReadAll(ctx, s.storage, prefix+"/"+file, maxTokenizerFile)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, errNoTokenizerFile
	}
	if err != nil {
		return nil, err
	}
	if !json.Valid(b) {
		return nil, fmt.Errorf("%s is not valid JSON", file)
	}
	return bytes.TrimSpace(b), nil
}
