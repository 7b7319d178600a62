package checkpoint

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// A checkpoint directory is replaced in three renames-and-removes so that a crash at any point
// leaves the acknowledged checkpoint or the new one on disk, never neither: the old directory is
// moved aside (dir + AsideMark + random), the new one renamed in, then the aside copy removed.
// Recover, at start, puts an aside copy back where the final directory is missing.

// AsideMark marks an acknowledged checkpoint moved aside while its replacement is renamed in.
const AsideMark = ".old-"

// PartialMark marks a checkpoint being written (never acknowledged).
const PartialMark = ".partial-"

// crashAfter, in tests, stops Replace right after the named step, as a SIGKILL would.
var crashAfter func(step string) bool

var errCrashed = errors.New("checkpoint: simulated crash")

func crashed(step string) bool { return crashAfter != nil && crashAfter(step) }

// Replace puts the complete directory tmp at dir, replacing what is there.
func Replace(tmp, dir string) error {
	aside := ""
	if _, err := os.Lstat(dir); err == nil {
		aside = dir + AsideMark + randomHex(4)
		if err := os.Rename(dir, aside); err != nil {
			return err
		}
		if crashed("aside") {
			return errCrashed
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		if aside != "" {
			_ = os.Rename(aside, dir) // the old one stays the checkpoint
		}
		return err
	}
	if crashed("renamed") {
		return errCrashed
	}
	if err := SyncDir(filepath.Dir(dir)); err != nil {
		return err
	}
	if aside != "" {
		// A failure here leaves only a stale copy, which Recover removes.
		_ = os.RemoveAll(aside)
	}
	return nil
}

// Recover repairs the checkpoint tree under root (DATA/checkpoints) after a crash: where a
// checkpoint's directory is missing, its newest aside copy is put back; aside copies of present
// checkpoints are removed, and so are partial directories if removePartials (when no other
// process can be writing one). It returns the directories it put back.
func Recover(root string, removePartials bool) (restored []string, err error) {
	kinds, _ := filepath.Glob(filepath.Join(root, "*", "*"))
	var errs []error
	for _, kindDir := range kinds {
		entries, err := os.ReadDir(kindDir)
		if err != nil {
			continue
		}
		asides := map[string][]string{}
		for _, e := range entries {
			n := e.Name()
			switch {
			case strings.Contains(n, PartialMark):
				if removePartials {
					errs = append(errs, os.RemoveAll(filepath.Join(kindDir, n)))
				}
			case strings.Contains(n, AsideMark) && e.IsDir():
				name, _, _ := strings.Cut(n, AsideMark)
				asides[name] = append(asides[name], n)
			}
		}
		for name, olds := range asides {
			final := filepath.Join(kindDir, name)
			if _, err := os.Lstat(final); errors.Is(err, os.ErrNotExist) {
				sort.Slice(olds, func(i, j int) bool {
					return modTime(filepath.Join(kindDir, olds[i])).After(modTime(filepath.Join(kindDir, olds[j])))
				})
				if err := os.Rename(filepath.Join(kindDir, olds[0]), final); err != nil {
					errs = append(errs, err)
					continue
				}
				restored = append(restored, final)
				olds = olds[1:]
			}
			for _, o := range olds {
				errs = append(errs, os.RemoveAll(filepath.Join(kindDir, o)))
			}
		}
	}
	return restored, errors.Join(errs...)
}

func modTime(path string) time.Time {
	if info, err := os.Stat(path); err == nil {
		return info.ModTime()
	}
	return time.Time{}
}

// SyncDir makes a directory's entries (renames, creations) durable; a filesystem that cannot
// sync a directory is not an error.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return err
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
