package worker

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/skein-ai/skein/storage"
)

// A gateway in front of workers on object storage has no model directory of its own; workers
// publish the files it reads from one (the tokenizer for GET /api/v1/models/{name}/tokenizer, the
// image preprocessor's config) under models/<base model>/ in the shared storage.

// ModelFiles are the files published: fixed names, never taken from a request.
var ModelFiles = []string{"tokenizer.json", "tokenizer_config.json", "preprocessor_config.json"}

// maxModelFile bounds one published file (the largest real tokenizer.json is about 33 MB).
const maxModelFile = 64 << 20

// ModelFilesKey is the storage prefix of a base model's published files: models/<name>, the
// name's "/" (Org/Name) kept as key separators and every element checked (storage.CheckKey).
func ModelFilesKey(baseModel string) (string, error) {
	key := "models/" + baseModel
	if strings.Contains(baseModel, "..") {
		return "", fmt.Errorf("%w: model name %q", storage.ErrBadKey, baseModel)
	}
	if err := storage.CheckKey(key); err != nil {
		return "", err
	}
	return key, nil
}

// PublishModelFiles copies the model directory's tokenizer and preprocessor files (those it has)
// into st under ModelFilesKey(baseModel).
func PublishModelFiles(ctx context.Context, st storage.Storage, baseModel, dir string) error {
	prefix, err := ModelFilesKey(baseModel)
	if err != nil {
		return err
	}
	for _, name := range ModelFiles {
		path := filepath.Join(dir, name)
		fi, err := os.Stat(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() || fi.Size() > maxModelFile {
			return fmt.Errorf("%s: not a regular file of at most %d bytes", path, maxModelFile)
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		_, err = st.Put(ctx, prefix+"/"+name, f, storage.Cond{})
		f.Close()
		if err != nil {
			return fmt.Errorf("publishing %s: %w", name, err)
		}
	}
	return nil
}
