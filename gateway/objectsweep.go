package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/skein-ai/skein/checkpoint"
	"github.com/skein-ai/skein/replica"
	"github.com/skein-ai/skein/storage"
)

// On object storage a checkpoint's write is: its files under a fresh generation's prefix, then
// its row naming that generation, then the previous generation's files removed; a delete is the
// row, then the files. A crash between two of those steps leaves a generation no row names. The
// leftovers sweep removes such generations, and the weights of ephemeral samplers that are gone,
// once their newest object is older than any save in progress could be (staleTempAge), so a save
// running on another gateway is never touched.

// maxSweptObjects bounds one sweep's listing of the checkpoint or ephemeral tree (a checkpoint is
// four or five objects); past it the sweep logs and does nothing rather than guess.
const maxSweptObjects = 1 << 17

// generationLen is the length of a generation's name (randomHex(8)); only directories named so
// are ever swept.
const generationLen = 16

// sweepObjects is the object-storage part of the leftovers sweep.
func (s *Server) sweepObjects(ctx context.Context, now time.Time) {
	if !s.objectStorage() {
		return
	}
	if n, err := s.sweepGenerations(ctx, now); err != nil {
		s.logErr("sweeping unreferenced checkpoint generations", err)
	} else if n > 0 {
		s.log.Info("removed checkpoint generations no checkpoint names (an interrupted write or delete)", "count", n)
	}
	if n, err := s.sweepObjectEphemeral(ctx, now); err != nil {
		s.logErr("sweeping gone samplers' weights", err)
	} else if n > 0 {
		s.log.Info("removed the weights of samplers that are gone", "count", n)
	}
}

// sweepGenerations removes the checkpoint generations no checkpoint row names.
func (s *Server) sweepGenerations(ctx context.Context, now time.Time) (int, error) {
	// Listed before the rows are read: a generation written after the listing is not in it, and
	// one whose row appears after the read is too young to be swept.
	groups, err := s.staleGroups(ctx, "checkpoints/", now, generationOf)
	if err != nil || len(groups) == 0 {
		return 0, err
	}
	rows, err := s.st.Checkpoints(ctx)
	if err != nil {
		return 0, err
	}
	named := map[string]bool{}
	for _, row := range rows {
		var meta struct {
			Generation string `json:"generation"`
		}
		p, err := checkpoint.Parse(row.Path)
		if err != nil || json.Unmarshal(row.Data, &meta) != nil || meta.Generation == "" {
			continue
		}
		if key, err := replica.KeyOf(s.opts.DataDir, p.Dir(s.opts.DataDir)); err == nil {
			named[key+"/"+meta.Generation] = true
		}
	}
	removed := 0
	for _, prefix := range groups {
		if named[prefix] {
			continue
		}
		err := storage.DeleteTree(ctx, s.storage, prefix, maxTreeObjects)
		if derr := s.storage.Delete(ctx, prefix+archiveSuffix); err == nil {
			err = derr
		}
		if err != nil {
			return removed, err
		}
		removed++
	}
	return removed, nil
}

// sweepObjectEphemeral removes ephemeral samplers' weights whose sampler no longer exists.
func (s *Server) sweepObjectEphemeral(ctx context.Context, now time.Time) (int, error) {
	groups, err := s.staleGroups(ctx, "ephemeral/", now, samplerOf)
	if err != nil || len(groups) == 0 {
		return 0, err
	}
	samplers, err := s.st.Samplers(ctx)
	if err != nil {
		return 0, err
	}
	live := map[string]bool{}
	for _, x := range samplers {
		live["ephemeral/"+x.ID] = true
	}
	removed := 0
	for _, prefix := range groups {
		if live[prefix] {
			continue
		}
		if err := storage.DeleteTree(ctx, s.storage, prefix, maxTreeObjects); err != nil {
			return removed, err
		}
		removed++
	}
	return removed, nil
}

// staleGroups lists the objects under root, groups them by the prefix group names (skipping keys
// it returns "" for), and returns the prefixes whose newest object is older than staleTempAge.
func (s *Server) staleGroups(ctx context.Context, root string, now time.Time, group func(key string) string) ([]string, error) {
	objs, err := s.storage.List(ctx, root, maxSweptObjects)
	if errors.Is(err, storage.ErrTooMany) {
		return nil, fmt.Errorf("more than %d objects under %s: not swept", maxSweptObjects, root)
	}
	if err != nil {
		return nil, err
	}
	newest := map[string]time.Time{}
	var order []string
	for _, o := range objs {
		g := group(o.Key)
		if g == "" {
			continue
		}
		if t, seen := newest[g]; !seen {
			order = append(order, g)
			newest[g] = o.Modified
		} else if o.Modified.After(t) {
			newest[g] = o.Modified
		}
	}
	var stale []string
	for _, g := range order {
		if now.Sub(newest[g]) > staleTempAge {
			stale = append(stale, g)
		}
	}
	return stale, nil
}

// generationOf is the generation prefix an object of the checkpoint tree belongs to
// (checkpoints/<model>/<kind>/<name>/<generation>, from one of its files or its .tar.gz), or ""
// for a key of any other shape.
func generationOf(key string) string {
	dir := path.Dir(key)
	if strings.HasSuffix(key, archiveSuffix) && strings.Count(key, "/") == 4 {
		dir = strings.TrimSuffix(key, archiveSuffix)
	}
	if strings.Count(dir, "/") != 4 || !isGeneration(path.Base(dir)) {
		return ""
	}
	return dir
}

// samplerOf is the sampler prefix (ephemeral/<sampler id>) an ephemeral object belongs to.
func samplerOf(key string) string {
	parts := strings.SplitN(key, "/", 3)
	if len(parts) < 3 || parts[1] == "" {
		return ""
	}
	return parts[0] + "/" + parts[1]
}

func isGeneration(name string) bool {
	if len(name) != generationLen {
		return false
	}
	for _, c := range name {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}
