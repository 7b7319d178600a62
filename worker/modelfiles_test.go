package worker

import (
	"errors"
	"testing"

	"github.com/skein-ai/skein/storage"
)

// A base model's name becomes a storage prefix only through the key check: Org/Name keeps its
// "/", and nothing can climb out of models/ or name a hidden object.
func TestModelFilesKeyRefusesHostileNames(t *testing.T) {
	for name, want := range map[string]string{"tiny-qwen3": "models/tiny-qwen3", "Qwen/Qwen3-8B": "models/Qwen/Qwen3-8B"} {
		if got, err := ModelFilesKey(name); err != nil || got != want {
			t.Errorf("ModelFilesKey(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
	for _, name := range []string{"", "../state", "a/../../x", "/abs", ".hidden", "a//b", "a/", "x y", "a\\b", "..", "a..b/.."} {
		if got, err := ModelFilesKey(name); !errors.Is(err, storage.ErrBadKey) {
			t.Errorf("ModelFilesKey(%q) = %q, %v; want ErrBadKey", name, got, err)
		}
	}
}
