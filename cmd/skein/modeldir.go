package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/internal/filebound"
)

// hfCachePrefix starts the name of a Hugging Face hub cache entry: huggingface_hub keeps the
// model Org/Name in models--Org--Name/, with refs/main holding the commit hash of the snapshot
// in snapshots/<hash>/ that "main" means.
const hfCachePrefix = "models--"

// maxRefBytes bounds a cache entry's refs/main (a commit hash: 40 hex digits and a newline).
const maxRefBytes = 4 << 10

// resolveModel is the model directory --model names and the name it is served by unless --name
// says otherwise: a cache entry models--Org--Name is its refs/main snapshot, named Org/Name; a
// snapshot directory inside one is named Org/Name too (its own name is a hash, which means
// nothing to a user); any other directory is itself, named by its last element.
//
// A --model that is no path here but reads as a hub id (Org/Name) is looked up in the local hub
// cache (hubCaches): skein never downloads a model.
func resolveModel(dir string) (string, string, error) {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) && hubID.MatchString(dir) {
		return resolveHubID(dir)
	}
	dir = filepath.Clean(dir)
	if repo, ok := strings.CutPrefix(filepath.Base(dir), hfCachePrefix); ok && repo != "" {
		b, err := filebound.Read(filepath.Join(dir, "refs", "main"), maxRefBytes)
		if err != nil {
			return "", "", fmt.Errorf("--model %s is a Hugging Face cache entry without a readable refs/main (%w): pass one of its snapshots/<hash> directories", dir, err)
		}
		hash := strings.TrimSpace(string(b))
		// The hash names a directory under snapshots/: nothing else (no separators, no ..).
		if hash == "" || hash == "." || hash == ".." || strings.ContainsAny(hash, `/\`) {
			return "", "", fmt.Errorf("--model %s: refs/main holds %q, not a snapshot's commit hash", dir, hash)
		}
		snap := filepath.Join(dir, "snapshots", hash)
		if st, err := os.Stat(snap); err != nil || !st.IsDir() {
			return "", "", fmt.Errorf("--model %s: refs/main names snapshot %s, which is not there (download it, or pass a snapshot directory)", dir, hash)
		}
		if err := linksStayInside(dir, snap); err != nil {
			return "", "", fmt.Errorf("--model %s: %w", dir, err)
		}
		return snap, hubName(repo), nil
	}
	if blob, name, ok, err := ollamaManifest(dir); ok || err != nil { // ollama.go
		return blob, name, err
	}
	parent := filepath.Dir(dir)
	if filepath.Base(parent) == "snapshots" {
		if repo, ok := strings.CutPrefix(filepath.Base(filepath.Dir(parent)), hfCachePrefix); ok && repo != "" {
			if err := linksStayInside(filepath.Dir(parent), dir); err != nil {
				return "", "", fmt.Errorf("--model %s: %w", dir, err)
			}
			return dir, hubName(repo), nil
		}
	}
	if engine.IsGGUF(dir) { // a GGUF file: named without its extension
		return dir, strings.TrimSuffix(filepath.Base(dir), ".gguf"), nil
	}
	return dir, filepath.Base(dir), nil
}

// hubName turns a cache entry's "Org--Name" back into the hub's "Org/Name" (huggingface_hub
// joins the id's parts with "--"; an id without an organization has one part).
func hubName(repo string) string { return strings.Replace(repo, "--", "/", 1) }

// loadModel loads the model --model names (resolved as resolveModel says), served as name or,
// with none given, as resolveModel names it; saved adapters name it as their base model.
func loadModel(dir, name string, opts engine.Options) (*engine.Engine, string, error) {
	path, resolved, err := resolveModel(dir)
	if err != nil {
		return nil, "", err
	}
	if name == "" {
		name = resolved
	}
	opts.Name = name
	e, err := engine.Load(path, opts)
	if err != nil {
		return nil, "", err
	}
	return e, name, nil
}

// maxSnapshotEntries bounds the files and directories of a cache snapshot that are checked.
const maxSnapshotEntries = 100000

// linksStayInside checks that path, and everything under it (links followed one by one), lies
// inside root once links are resolved. A Hugging Face snapshot links its files to
// ../../blobs/, inside its cache entry, which is the boundary: a link to anywhere else is refused,
// naming it, so a planted link cannot make the server read (and serve a tokenizer from, or
// publish as a model) a file outside the cache.
func linksStayInside(root, path string) error {
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return err
	}
	inside := func(p string) error {
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if rel, err := filepath.Rel(realRoot, real); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) {
			return fmt.Errorf("%s resolves to %s, outside %s: links may point only inside it", p, real, root)
		}
		return nil
	}
	if err := inside(path); err != nil {
		return err
	}
	fi, err := os.Stat(path)
	if err != nil || !fi.IsDir() {
		return err
	}
	n := 0
	return filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if n++; n > maxSnapshotEntries {
			return fmt.Errorf("%s holds more than %d files", path, maxSnapshotEntries)
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return inside(p)
		}
		return nil
	})
}

// hubID is a Hugging Face model id: Org/Name, or Name alone (a relative path of one or two
// elements that does not exist is read as one).
var hubID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$`)

// hubCaches are the directories huggingface_hub keeps its cache in, in the order it uses them:
// $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
// ~/.cache/huggingface/hub.
func hubCaches() []string {
	if d := os.Getenv("HF_HUB_CACHE"); d != "" {
		return []string{d}
	}
	if d := os.Getenv("HF_HOME"); d != "" {
		return []string{filepath.Join(d, "hub")}
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return []string{filepath.Join(d, "huggingface", "hub")}
	}
	if home, err := os.UserHomeDir(); err == nil {
		return []string{filepath.Join(home, ".cache", "huggingface", "hub")}
	}
	return nil
}

// resolveHubID finds the hub id in the local cache: its entry's refs/main snapshot, or, without
// refs/main, its most recently written snapshot; it is served under the id.
func resolveHubID(id string) (string, string, error) {
	entryName := hfCachePrefix + strings.ReplaceAll(id, "/", "--")
	caches := hubCaches()
	for _, c := range caches {
		entry := filepath.Join(c, entryName)
		if st, err := os.Stat(entry); err != nil || !st.IsDir() {
			continue
		}
		if _, err := os.Stat(filepath.Join(entry, "refs", "main")); err != nil {
			if snap := newestSnapshot(entry); snap != "" {
				return snap, id, nil
			}
		}
		dir, _, err := resolveModel(entry)
		return dir, id, err
	}
	where := "no cache directory (set HF_HOME)"
	if len(caches) > 0 {
		where = strings.Join(caches, ", ")
	}
	return "", "", fmt.Errorf("--model %s: no such file or directory here, and no Hugging Face cache entry %s in %s. "+
		"skein never downloads a model: on a machine with internet run `huggingface-cli download %s` and copy the "+
		"cache (or a --local-dir download) here, then pass its directory, or set HF_HOME to the cache's parent", id, entryName, where, id)
}

// newestSnapshot is the most recently written directory under entry/snapshots, "" if none.
func newestSnapshot(entry string) string {
	dirs, err := os.ReadDir(filepath.Join(entry, "snapshots"))
	if err != nil {
		return ""
	}
	var best string
	var bestTime int64
	for _, d := range dirs {
		info, err := d.Info()
		if err != nil || !d.IsDir() {
			continue
		}
		if t := info.ModTime().UnixNano(); best == "" || t > bestTime {
			best, bestTime = filepath.Join(entry, "snapshots", d.Name()), t
		}
	}
	return best
}
