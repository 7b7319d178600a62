package gateway

import (
	"bytes"
	"context"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/skein-ai/skein/checkpoint"
	"github.com/skein-ai/skein/storage"
	"github.com/skein-ai/skein/storage/storagetest"
	"github.com/skein-ai/skein/store"
)

// On object storage (SKEIN_TEST_S3) the leftovers sweep removes what interrupted writes and
// deletes leave: a generation an overwrite wrote but no row names (with its archive), a deleted
// checkpoint's files, a gone sampler's weights. It keeps every generation a row names, a live
// sampler's weights, keys of any other shape, and anything younger than a save could be.
func TestObjectStorageSweepRemovesUnreferencedGenerations(t *testing.T) {
	st := storagetest.S3(t)
	data := t.TempDir()
	s, err := New(Options{DataDir: data, Storage: st})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	put := func(key string) {
		t.Helper()
		if _, err := st.Put(ctx, key, bytes.NewReader([]byte("x")), storage.Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	// Checkpoint a names generation 1111…; 2222… is what an overwrite wrote before it died (or the
	// old one it did not remove). Checkpoint b has files but no row: its delete died.
	p, err := checkpoint.Parse("tinker://sess-1:train:0/weights/a")
	if err != nil {
		t.Fatal(err)
	}
	meta := &ckptMeta{Path: p.String(), Owner: "t-x", BaseModel: "m", Generation: "1111111111111111", Created: time.Now(), parsed: p}
	if err := s.saveMeta(meta); err != nil {
		t.Fatal(err)
	}
	kept := []string{
		"checkpoints/sess-1_train_0/weights/a/1111111111111111/adapter_model.safetensors",
		"checkpoints/sess-1_train_0/weights/a/1111111111111111/adapter_config.json",
		"checkpoints/sess-1_train_0/weights/a/1111111111111111.tar.gz",
		"checkpoints/sess-1_train_0/weights/a/notageneration/adapter_model.safetensors", // not a shape the gateway writes
		"ephemeral/samp-live/adapter_model.safetensors",
	}
	swept := []string{
		"checkpoints/sess-1_train_0/weights/a/2222222222222222/adapter_model.safetensors",
		"checkpoints/sess-1_train_0/weights/a/2222222222222222/adapter_config.json",
		"checkpoints/sess-1_train_0/weights/a/2222222222222222.tar.gz",
		"checkpoints/sess-1_train_0/sampler_weights/b/3333333333333333/adapter_model.safetensors",
		"ephemeral/samp-gone/adapter_model.safetensors",
	}
	for _, k := range append(append([]string{}, kept...), swept...) {
		put(k)
	}
	if err := s.st.PutSampler(ctx, store.Sampler{ID: "samp-live", Tenant: "t-x", SessionID: "sess-1"}); err != nil {
		t.Fatal(err)
	}
	all := append(append([]string{}, kept...), swept...)
	sort.Strings(all)

	// Now everything is as young as a save in progress: nothing goes.
	s.sweepLeftovers(time.Now())
	if got := keysUnder(ctx, t, st); !slices.Equal(got, all) {
		t.Fatalf("a sweep of young objects removed some: left %v, want %v", got, all)
	}
	// Two hours on, the unreferenced ones are left by a crash.
	s.sweepLeftovers(time.Now().Add(2 * time.Hour))
	want := append([]string{}, kept...)
	sort.Strings(want)
	if got := keysUnder(ctx, t, st); !slices.Equal(got, want) {
		t.Fatalf("after the sweep: %v, want %v", got, want)
	}
}

func keysUnder(ctx context.Context, t *testing.T, st storage.Storage) []string {
	t.Helper()
	var out []string
	for _, root := range []string{"checkpoints/", "ephemeral/"} {
		objs, err := st.List(ctx, root, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			out = append(out, o.Key)
		}
	}
	sort.Strings(out)
	return out
}
