package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// A "directory" in a key space is a prefix ending in "/": a saved adapter (its PEFT files,
// optimizer, trainer state) is the files under one. The engine reads and writes local
// directories; these copy one between a local directory and a prefix (flat: adapters have no
// subdirectories).

// Bounds of one copied directory: a hostile or corrupt store cannot make a reader allocate or
// write without limit.
const (
	MaxTreeFiles = 64
)

// PutTree uploads the regular files of the local directory dir as prefix/<name>, and returns
// the bytes written. Names must be valid key elements.
func PutTree(ctx context.Context, st Storage, prefix, dir string) (int64, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("storage: %w", err)
	}
	if len(entries) > MaxTreeFiles {
		return 0, fmt.Errorf("storage: %s has %d entries, at most %d", dir, len(entries), MaxTreeFiles)
	}
	var total int64
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		if err := putFile(ctx, st, prefix+"/"+e.Name(), filepath.Join(dir, e.Name()), &total); err != nil {
			return total, err
		}
	}
	return total, nil
}

func putFile(ctx context.Context, st Storage, key, path string, total *int64) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("storage: %w", err)
	}
	defer f.Close()
	info, err := st.Put(ctx, key, f, Cond{})
	if err != nil {
		return err
	}
	*total += info.Size
	return nil
}

// GetTree downloads the objects directly under prefix/ into the local directory dir (created),
// at most maxBytes together. It returns ErrNotFound when the prefix holds nothing.
func GetTree(ctx context.Context, st Storage, prefix, dir string, maxBytes int64) error {
	objs, err := st.List(ctx, prefix+"/", MaxTreeFiles)
	if err != nil {
		return err
	}
	var files []Info
	var total int64
	for _, o := range objs {
		name := strings.TrimPrefix(o.Key, prefix+"/")
		if strings.Contains(name, "/") {
			continue // deeper: not part of this directory
		}
		if total += o.Size; total > maxBytes {
			return fmt.Errorf("%w: %s/ holds more than %d bytes", ErrTooBig, prefix, maxBytes)
		}
		files = append(files, o)
	}
	if len(files) == 0 {
		return fmt.Errorf("%w: %s/", ErrNotFound, prefix)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("storage: %w", err)
	}
	for _, o := range files {
		if err := getFile(ctx, st, o, filepath.Join(dir, strings.TrimPrefix(o.Key, prefix+"/"))); err != nil {
			return err
		}
	}
	return nil
}

func getFile(ctx context.Context, st Storage, o Info, path string) error {
	rc, info, err := st.Get(ctx, o.Key)
	if err != nil {
		return err
	}
	defer rc.Close()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("storage: %w", err)
	}
	// The object may have been replaced since it was listed: bound by what Get says, too.
	n, err := io.Copy(f, io.LimitReader(rc, max(info.Size, o.Size)+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n > max(info.Size, o.Size) {
		err = fmt.Errorf("%w: %s grew while read", ErrTooBig, o.Key)
	}
	if err != nil {
		return fmt.Errorf("storage: reading %s: %w", o.Key, err)
	}
	return nil
}

// DeleteTree removes every object under prefix/ (at most limit of them; ErrTooMany past it).
func DeleteTree(ctx context.Context, st Storage, prefix string, limit int) error {
	objs, err := st.List(ctx, prefix+"/", limit)
	if err != nil {
		return err
	}
	var errs []error
	for _, o := range objs {
		errs = append(errs, st.Delete(ctx, o.Key))
	}
	return errors.Join(errs...)
}

// TreeSize is the bytes of the objects under prefix/.
func TreeSize(ctx context.Context, st Storage, prefix string) (int64, error) {
	objs, err := st.List(ctx, prefix+"/", MaxTreeFiles*16)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, o := range objs {
		n += o.Size
	}
	return n, nil
}
