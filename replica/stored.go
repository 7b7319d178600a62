package replica

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/storage"
)

// Stored is a compute whose adapter directories live in a storage.Storage. The directories its
// callers name are paths under root (the data directory: DATA/state/<run>@<v>,
// DATA/checkpoints/…); each is the storage key of its path relative to root. When the storage
// is the local directory root itself, the engine reads and writes the path in place (what skein
// did before storage had backends: no copy); otherwise a load copies the key's objects into a
// scratch directory for the engine, and a save writes there and uploads. So the engine keeps
// reading and writing local files, and a worker needs no directory shared with its gateway.
type Stored struct {
	engine.Compute
	st      storage.Storage
	root    string
	scratch string
	inPlace bool
	// maxBytes bounds what one load copies down: an adapter's files (weights, optimizer, state).
	maxBytes int64
}

// DefaultMaxAdapterBytes bounds one adapter's saved files copied from object storage (a rank-64
// adapter of a 70B model with Adam moments is a few GB).
const DefaultMaxAdapterBytes = 32 << 30

// NewStored wraps c. root is the data directory the callers' paths are under; scratch is a local
// directory for copies (used only when st is not root itself).
func NewStored(c engine.Compute, st storage.Storage, root, scratch string) (*Stored, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	s := &Stored{Compute: c, st: st, root: abs, scratch: scratch, maxBytes: DefaultMaxAdapterBytes}
	s.inPlace = storage.Local(st) == abs
	if !s.inPlace {
		if err := os.MkdirAll(scratch, 0o755); err != nil {
			return nil, fmt.Errorf("scratch directory: %w", err)
		}
	}
	return s, nil
}

// LocalEngine is the in-process engine behind it, if any (see localEngine).
func (s *Stored) LocalEngine() *engine.Engine { return localEngine(s.Compute) }

// Effects passes a remote compute's effect counter through (see effectCounter).
func (s *Stored) Effects() int64 {
	if c, ok := s.Compute.(effectCounter); ok {
		return c.Effects()
	}
	return 0
}

// Key is the storage key of a path under root.
func (s *Stored) Key(dir string) (string, error) { return KeyOf(s.root, dir) }

// KeyOf is the storage key of path dir under root: its relative path, checked
// (storage.CheckKey), so nothing outside root can be named.
func KeyOf(root, dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if root, err = filepath.Abs(root); err != nil {
		return "", err
	}
	rel, err := filepath.Rel(root, abs)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("%w: %s is not under the data directory %s", storage.ErrBadKey, dir, root)
	}
	key := filepath.ToSlash(rel)
	if err := storage.CheckKey(key); err != nil {
		return "", err
	}
	return key, nil
}

func (s *Stored) LoadAdapter(ctx context.Context, id, dir string, withOptimizer bool) error {
	return s.load(ctx, dir, func(local string) error { return s.Compute.LoadAdapter(ctx, id, local, withOptimizer) })
}

func (s *Stored) LoadSnapshot(ctx context.Context, id, dir string) error {
	return s.load(ctx, dir, func(local string) error { return s.Compute.LoadSnapshot(ctx, id, local) })
}

func (s *Stored) load(ctx context.Context, dir string, fn func(local string) error) error {
	key, err := s.Key(dir)
	if err != nil {
		return err
	}
	if s.inPlace {
		return fn(dir)
	}
	tmp, err := os.MkdirTemp(s.scratch, "load-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := storage.GetTree(ctx, s.st, key, tmp, s.maxBytes); err != nil {
		return fmt.Errorf("copying %s from %s: %w", key, s.st, err)
	}
	return fn(tmp)
}

func (s *Stored) SaveAdapter(ctx context.Context, id, dir string, withOptimizer bool) error {
	key, err := s.Key(dir)
	if err != nil {
		return err
	}
	if s.inPlace {
		return s.Compute.SaveAdapter(ctx, id, dir, withOptimizer)
	}
	tmp, err := os.MkdirTemp(s.scratch, "save-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := s.Compute.SaveAdapter(ctx, id, tmp, withOptimizer); err != nil {
		return err
	}
	if _, err := storage.PutTree(ctx, s.st, key, tmp); err != nil {
		return fmt.Errorf("copying %s to %s: %w", key, s.st, err)
	}
	return nil
}
