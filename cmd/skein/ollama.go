package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Ollama keeps a model as a JSON manifest, <models>/manifests/<registry>/<namespace>/<model>/<tag>,
// whose layer of media type application/vnd.ollama.image.model is the GGUF, stored as
// <models>/blobs/sha256-<hex>. --model may name the manifest: skein serves its GGUF under Ollama's
// name (qwen3:8b for registry.ollama.ai/library/qwen3/8b).

const (
	ollamaModelLayer  = "application/vnd.ollama.image.model"
	maxOllamaManifest = 1 << 20
)

// ollamaManifest resolves path if it is a manifest inside an Ollama models directory: the GGUF
// blob and the name; ok false when path is not one (then nothing was wrong with it).
func ollamaManifest(path string) (blob, name string, ok bool, err error) {
	path = filepath.Clean(path)
	parts := strings.Split(filepath.ToSlash(path), "/")
	i := len(parts) - 5 // .../manifests/<registry>/<namespace>/<model>/<tag>
	if i < 0 || parts[i] != "manifests" {
		return "", "", false, nil
	}
	fi, err := os.Stat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return "", "", false, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", "", true, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxOllamaManifest+1))
	if err != nil {
		return "", "", true, err
	}
	if len(b) > maxOllamaManifest {
		return "", "", true, fmt.Errorf("--model %s: an Ollama manifest over %d bytes", path, maxOllamaManifest)
	}
	var m struct {
		Layers []struct {
			MediaType string `json:"mediaType"`
			Digest    string `json:"digest"`
		} `json:"layers"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return "", "", true, fmt.Errorf("--model %s: not an Ollama manifest: %w", path, err)
	}
	digest := ""
	for _, l := range m.Layers {
		if l.MediaType == ollamaModelLayer {
			digest = l.Digest
		}
	}
	hexPart, okDigest := strings.CutPrefix(digest, "sha256:")
	if !okDigest || len(hexPart) != 64 || strings.Trim(hexPart, "0123456789abcdef") != "" {
		return "", "", true, fmt.Errorf("--model %s: the manifest names no GGUF layer (%s) with a sha256 digest", path, ollamaModelLayer)
	}
	models := filepath.Join(path, "..", "..", "..", "..", "..")
	blob = filepath.Join(models, "blobs", "sha256-"+hexPart)
	if _, err := os.Lstat(blob); err == nil {
		// The blob must lie inside the models directory, links resolved (Ollama writes regular
		// files; a link out of it would serve a file the operator did not put there).
		if err := linksStayInside(models, blob); err != nil {
			return "", "", true, fmt.Errorf("--model %s: %w", path, err)
		}
	}
	name = parts[i+3] + ":" + parts[i+4]
	if parts[i+2] != "library" {
		name = parts[i+2] + "/" + name
	}
	return blob, name, true, nil
}
