package engine

import "os"

// Bounds on the small files of a model or adapter directory, read whole (internal/filebound:
// regular files only, links followed). Real ones are far smaller: a config.json is a few KB, a
// large vocabulary's tokenizer.json 33 MB (Gemma 3), an index of a big mixture of experts a few MB.
const (
	maxConfigBytes        = 4 << 20  // config.json
	maxTokenizerBytes     = 64 << 20 // tokenizer.json, tokenizer_config.json
	maxIndexBytes         = 64 << 20 // model.safetensors.index.json
	maxAdapterConfigBytes = 4 << 20  // adapter_config.json, trainer_state.json
)

// fileExists reports whether something is at path (what it is, filebound checks).
func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
