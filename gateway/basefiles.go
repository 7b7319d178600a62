package gateway

// A served base model's files that the gateway reads itself: the tokenizer (the tokenizer
// endpoint, and the OpenAI endpoints, which tokenize prompts and decode answers here), the chat
// template in tokenizer_config.json, and the image preprocessor's config. They come from an
// in-process replica's model directory, else from what the model's workers published in object
// storage (worker.PublishModelFiles), so that a gateway in front of workers needs no model
// directory of its own.

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/skein-ai/skein/engine/imageproc"
	"github.com/skein-ai/skein/engine/tokenizer"
	"github.com/skein-ai/skein/replica"
	"github.com/skein-ai/skein/worker"
)

// baseFiles reads one fixed file of a base model (errNoTokenizerFile when it has none); key
// names where from, for the caches (the directory, or the storage prefix).
type baseFiles struct {
	key  string
	read func(ctx context.Context, file string) ([]byte, error)
}

// filesOf finds base's files: a local replica's directory (and that replica's model), else the
// published ones. A base served by remote workers without object storage has none here.
func (s *Server) filesOf(base string) (baseFiles, replica.LocalModel, error) {
	reps, err := s.replicasOf(base)
	if err != nil {
		return baseFiles{}, replica.LocalModel{}, err
	}
	for _, rep := range reps {
		if e, ok := rep.Local(); ok && e.Dir != "" {
			return baseFiles{key: e.Dir, read: func(_ context.Context, file string) ([]byte, error) { return readTokenizerFile(e.Dir, file) }}, e, nil
		}
	}
	if !s.objectStorage() {
		return baseFiles{}, replica.LocalModel{}, errf(http.StatusNotFound, "base model %q is served by remote workers only and this gateway has no object storage their model files could be published in", base)
	}
	prefix, err := worker.ModelFilesKey(base)
	if err != nil {
		return baseFiles{}, replica.LocalModel{}, errf(http.StatusNotFound, "base model %q: %v", base, err)
	}
	m := replica.LocalModel{}
	for _, rep := range reps {
		if cfg := rep.Info().Config; cfg != nil {
			m.Config = cfg
			break
		}
	}
	return baseFiles{key: "storage:" + s.storage.String() + "/" + prefix, read: func(ctx context.Context, file string) ([]byte, error) {
		return s.readStoredTokenizerFile(ctx, prefix, file)
	}}, m, nil
}

// storedTokenizers keeps each published tokenizer, parsed once (a missing one is not kept: a
// worker may publish it later).
func (s *Server) storedTokenizer(ctx context.Context, f baseFiles) (*tokenizer.Tokenizer, error) {
	if t, ok := s.remoteTokenizers.Load(f.key); ok {
		return t.(*tokenizer.Tokenizer), nil
	}
	b, err := f.read(ctx, tokenizerFile)
	if err != nil {
		return nil, err
	}
	t, err := tokenizer.Parse(b)
	if err != nil {
		return nil, fmt.Errorf("the published %s: %w", tokenizerFile, err)
	}
	got, _ := s.remoteTokenizers.LoadOrStore(f.key, t)
	return got.(*tokenizer.Tokenizer), nil
}

// preprocessorConfig reads base's image preprocessor config once per source; a model without
// one gets Qwen3-VL's defaults (as imageproc.LoadConfig gives a directory without one).
func (s *Server) preprocessorConfig(ctx context.Context, f baseFiles) (imageproc.Config, error) {
	if c, ok := s.visionCfgs.Load(f.key); ok {
		return c.(imageproc.Config), nil
	}
	b, err := f.read(ctx, preprocessorConfigFile)
	cfg := imageproc.DefaultConfig()
	switch {
	case errors.Is(err, errNoTokenizerFile):
	case err != nil:
		return imageproc.Config{}, err
	default:
		if cfg, err = imageproc.ParseConfig(b); err != nil {
			return imageproc.Config{}, fmt.Errorf("%s: %w", preprocessorConfigFile, err)
		}
	}
	s.visionCfgs.Store(f.key, cfg)
	return cfg, nil
}
