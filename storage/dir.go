package storage

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Dir is the local-directory backend: key a/b/c is the file ROOT/a/b/c. A Put writes a temporary
// file under ROOT/.tmp, syncs it, renames it over the key's file and syncs the directory, so a
// crash leaves the old object or the new one. Conditional Puts hold an exclusive flock on
// ROOT/.lock across the check and the rename, so processes sharing the directory (a gateway and
// workers on one filesystem) cannot both win one condition. An ETag is the file's inode, mtime
// and size: a rename of a new file changes it.
type Dir struct {
	root string
	mu   sync.Mutex // serializes this process's conditional writes (flock is per open file)
}

// NewDir is the backend rooted at root (created if missing).
func NewDir(root string) (*Dir, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(abs, ".tmp"), 0o755); err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	return &Dir{root: abs}, nil
}

// Root is the directory the keys are relative to.
func (d *Dir) Root() string { return d.root }

func (d *Dir) String() string { return "dir:" + d.root }

// Path is the file of a checked key.
func (d *Dir) Path(key string) (string, error) {
	if err := CheckKey(key); err != nil {
		return "", err
	}
	return filepath.Join(d.root, filepath.FromSlash(key)), nil
}

func (d *Dir) info(key string, fi fs.FileInfo) Info {
	var ino uint64
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		ino = st.Ino
	}
	return Info{Key: key, Size: fi.Size(), Modified: fi.ModTime(),
		ETag: fmt.Sprintf("%x-%x-%x", ino, fi.ModTime().UnixNano(), fi.Size())}
}

func notFound(key string, err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return fmt.Errorf("storage: %s: %w", key, err)
}

func (d *Dir) Get(ctx context.Context, key string) (io.ReadCloser, Info, error) {
	p, err := d.Path(key)
	if err != nil {
		return nil, Info{}, err
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, Info{}, notFound(key, err)
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, Info{}, fmt.Errorf("%w: %s (not a regular file)", ErrNotFound, key)
	}
	return f, d.info(key, fi), nil
}

func (d *Dir) Head(ctx context.Context, key string) (Info, error) {
	p, err := d.Path(key)
	if err != nil {
		return Info{}, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return Info{}, notFound(key, err)
	}
	if !fi.Mode().IsRegular() {
		return Info{}, fmt.Errorf("%w: %s (not a regular file)", ErrNotFound, key)
	}
	return d.info(key, fi), nil
}

func (d *Dir) Put(ctx context.Context, key string, body io.ReadSeeker, cond Cond) (Info, error) {
	p, err := d.Path(key)
	if err != nil {
		return Info{}, err
	}
	if err := ctx.Err(); err != nil {
		return Info{}, err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return Info{}, fmt.Errorf("storage: %w", err)
	}
	tmp, err := d.writeTemp(body)
	if err != nil {
		return Info{}, err
	}
	defer os.Remove(tmp) // gone already after a successful rename
	if cond != (Cond{}) {
		unlock, err := d.lock()
		if err != nil {
			return Info{}, err
		}
		defer unlock()
		cur, err := d.Head(ctx, key)
		switch {
		case err != nil && !errors.Is(err, ErrNotFound):
			return Info{}, err
		case cond.IfAbsent && err == nil,
			cond.IfMatch != "" && (err != nil || cur.ETag != cond.IfMatch):
			return Info{}, &ConditionError{Key: key, Cond: cond}
		}
	}
	if err := os.Rename(tmp, p); err != nil {
		return Info{}, fmt.Errorf("storage: %w", err)
	}
	if err := SyncDir(filepath.Dir(p)); err != nil {
		return Info{}, fmt.Errorf("storage: %w", err)
	}
	return d.Head(ctx, key)
}

// writeTemp copies body into a synced file under ROOT/.tmp.
func (d *Dir) writeTemp(body io.Reader) (string, error) {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(d.root, ".tmp", hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return "", fmt.Errorf("storage: %w", err)
	}
	_, err = io.Copy(f, body)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("storage: writing: %w", err)
	}
	return tmp, nil
}

// lock takes this process's mutex and the directory's flock.
func (d *Dir) lock() (func(), error) {
	d.mu.Lock()
	f, err := os.OpenFile(filepath.Join(d.root, ".lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		d.mu.Unlock()
		return nil, fmt.Errorf("storage: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		d.mu.Unlock()
		return nil, fmt.Errorf("storage: locking: %w", err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
		d.mu.Unlock()
	}, nil
}

func (d *Dir) List(ctx context.Context, prefix string, limit int) ([]Info, error) {
	if err := CheckPrefix(prefix); err != nil {
		return nil, err
	}
	// Walk from the deepest directory the prefix names whole.
	start := d.root
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		start = filepath.Join(d.root, filepath.FromSlash(prefix[:i]))
	}
	var out []Info
	err := filepath.WalkDir(start, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, _ := filepath.Rel(d.root, path)
		key := filepath.ToSlash(rel)
		if strings.HasPrefix(e.Name(), ".") && path != start {
			if e.IsDir() {
				return filepath.SkipDir // the backend's own (.tmp) or not ours
			}
			return nil
		}
		if e.IsDir() {
			// Skip subtrees that cannot hold a key with the prefix.
			if path != start && !strings.HasPrefix(key+"/", prefix) && !strings.HasPrefix(prefix, key+"/") {
				return filepath.SkipDir
			}
			return nil
		}
		if !e.Type().IsRegular() || !strings.HasPrefix(key, prefix) || CheckKey(key) != nil {
			return nil
		}
		fi, err := e.Info()
		if err != nil {
			return nil // removed meanwhile
		}
		if len(out) == limit {
			return fmt.Errorf("%w: %q has more than %d objects", ErrTooMany, prefix, limit)
		}
		out = append(out, d.info(key, fi))
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

func (d *Dir) Delete(ctx context.Context, key string) error {
	p, err := d.Path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("storage: %w", err)
	}
	// Object stores have no directories: remove the ones this key leaves empty.
	for dir := filepath.Dir(p); dir != d.root && strings.HasPrefix(dir, d.root); dir = filepath.Dir(dir) {
		if os.Remove(dir) != nil {
			break
		}
	}
	return nil
}

func (d *Dir) PresignGet(ctx context.Context, key string, ttl time.Duration) (string, error) {
	return "", ErrNoPresign
}

// SweepTemp removes temporary files older than age under ROOT/.tmp (what a writer killed between
// its write and its rename left) and returns how many it removed. A younger one may still be
// being written by another process sharing the directory.
func (d *Dir) SweepTemp(now time.Time, age time.Duration) int {
	entries, err := os.ReadDir(filepath.Join(d.root, ".tmp"))
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		if info, err := e.Info(); err == nil && e.Type().IsRegular() && now.Sub(info.ModTime()) > age {
			if os.Remove(filepath.Join(d.root, ".tmp", e.Name())) == nil {
				n++
			}
		}
	}
	return n
}

// SyncDir makes a directory's entries (renames, creations) durable; a filesystem that cannot
// sync a directory is not an error.
func SyncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return err
	}
	return nil
}
