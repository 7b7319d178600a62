package gateway

// Where the files of adapters live when --storage is object storage. The paths the gateway
// names (DATA/checkpoints/…, DATA/ephemeral/…, DATA/state/…) are then storage keys (their path
// relative to the data directory; replica.KeyOf), written and read by the replicas' computes
// (replica.Stored in process, the worker itself for a worker) and never present on this disk.
// Object storage has no rename, so a checkpoint is written under its generation
// (checkpoints/<model>/<kind>/<name>/<generation>/), recorded in its row, and the previous
// generation removed after the row names the new one.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/skein-ai/skein/replica"
	"github.com/skein-ai/skein/storage"
)

// objectStorage reports whether adapters' files live in object storage, not the data directory.
func (s *Server) objectStorage() bool { return s.localStorage() == "" }

// ckptDir is where a checkpoint's files are, as a path under the data directory.
func (s *Server) ckptDir(m *ckptMeta) string {
	if s.objectStorage() && m.Generation != "" {
		return filepath.Join(m.parsed.Dir(s.opts.DataDir), m.Generation)
	}
	return m.parsed.Dir(s.opts.DataDir)
}

// maxTreeObjects bounds the objects one removed directory may hold (an adapter has four files;
// an archive beside it one more).
const maxTreeObjects = 1024

// removeTree removes a directory of adapter files wherever they live.
func (s *Server) removeTree(dir string) error {
	if !s.objectStorage() {
		return os.RemoveAll(dir)
	}
	key, err := replica.KeyOf(s.opts.DataDir, dir)
	if err != nil {
		return err
	}
	ctx := context.Background()
	err = storage.DeleteTree(ctx, s.storage, key, maxTreeObjects)
	if derr := s.storage.Delete(ctx, key+archiveSuffix); err == nil {
		err = derr
	}
	return err
}

// treeSize is the bytes of a directory of adapter files wherever they live.
func (s *Server) treeSize(dir string) int64 {
	if !s.objectStorage() {
		return fileSize(dir)
	}
	key, err := replica.KeyOf(s.opts.DataDir, dir)
	if err != nil {
		return 0
	}
	n, _ := storage.TreeSize(context.Background(), s.storage, key)
	return n
}

// archiveSuffix names a checkpoint generation's archive object, beside its directory.
const archiveSuffix = ".tar.gz"

// ArchiveURLLifetime is how long a checkpoint's download link works (signed by the gateway, or
// presigned by the object store).
const ArchiveURLLifetime = 15 * time.Minute

// presignedArchive returns a presigned URL of the checkpoint's .tar.gz in object storage, making
// the archive first if this generation has none yet (copied down through a scratch directory,
// packed, and put back beside the checkpoint).
func (s *Server) presignedArchive(ctx context.Context, m *ckptMeta) (string, error) {
	dir := s.ckptDir(m)
	key, err := replica.KeyOf(s.opts.DataDir, dir)
	if err != nil {
		return "", err
	}
	akey := key + archiveSuffix
	err = s.archives.once(ctx, akey+"@"+m.Generation, func() bool {
		_, err := s.storage.Head(ctx, akey)
		return err == nil
	}, func(ctx context.Context) error { return s.makeArchive(ctx, key, akey) })
	if err != nil {
		return "", fmt.Errorf("making the archive of %s: %w", m.Path, err)
	}
	return s.storage.PresignGet(ctx, akey, ArchiveURLLifetime)
}

// archiveBuilds runs one build per checkpoint generation at a time (concurrent requests for it
// wait for that build and use its archive) and at most MaxArchiveBuilds builds at once (others
// wait for a slot while their request lives). Each build copies the checkpoint into the scratch
// directory: 24 requests of one 146 MB checkpoint made 24 copies, 3.9 GB, before this.
type archiveBuilds struct {
	mu      sync.Mutex
	running map[string]*archiveBuild
	slots   chan struct{}
}

type archiveBuild struct {
	done chan struct{}
	err  error
}

// once makes sure what exists reports (building it with build if not), building it at most once
// at a time for id.
func (a *archiveBuilds) once(ctx context.Context, id string, exists func() bool, build func(context.Context) error) error {
	for {
		if exists() {
			return nil
		}
		a.mu.Lock()
		if a.running == nil {
			a.running, a.slots = map[string]*archiveBuild{}, make(chan struct{}, MaxArchiveBuilds)
		}
		if b := a.running[id]; b != nil {
			a.mu.Unlock()
			select {
			case <-b.done:
			case <-ctx.Done():
				return ctx.Err()
			}
			if b.err != nil && !errors.Is(b.err, context.Canceled) && !errors.Is(b.err, context.DeadlineExceeded) {
				return b.err
			}
			continue // built (exists says so), or its request went away: look again
		}
		b := &archiveBuild{done: make(chan struct{})}
		a.running[id] = b
		slots := a.slots
		a.mu.Unlock()
		select {
		case slots <- struct{}{}:
			b.err = build(ctx)
			<-slots
		case <-ctx.Done():
			b.err = ctx.Err()
		}
		a.mu.Lock()
		delete(a.running, id)
		a.mu.Unlock()
		close(b.done)
		return b.err
	}
}

// fetchCheckpoint copies a checkpoint's files out of the bucket into a new scratch directory,
// which the caller removes.
func (s *Server) fetchCheckpoint(ctx context.Context, m *ckptMeta) (string, error) {
	key, err := replica.KeyOf(s.opts.DataDir, s.ckptDir(m))
	if err != nil {
		return "", err
	}
	scratch := filepath.Join(s.opts.DataDir, "scratch")
	if err := os.MkdirAll(scratch, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(scratch, "checkpoint-")
	if err != nil {
		return "", err
	}
	if err := storage.GetTree(ctx, s.storage, key, tmp, replica.DefaultMaxAdapterBytes); err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("reading checkpoint %s from storage: %w", m.Path, err)
	}
	return tmp, nil
}

func (s *Server) makeArchive(ctx context.Context, key, akey string) error {
	scratch := filepath.Join(s.opts.DataDir, "scratch")
	if err := os.MkdirAll(scratch, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(scratch, "archive-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	files := filepath.Join(tmp, "files")
	if err := storage.GetTree(ctx, s.storage, key, files, replica.DefaultMaxAdapterBytes); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(tmp, "archive.tar.gz"))
	if err != nil {
		return err
	}
	defer f.Close()
	if err := writeTarGz(f, files); err != nil {
		return err
	}
	_, err = s.storage.Put(ctx, akey, f, storage.Cond{})
	return err
}

// MaxArchiveBuilds is how many checkpoint archives the gateway builds at once on object storage
// (each copies a checkpoint into its scratch directory and packs it); more wait their turn.
const MaxArchiveBuilds = 2
