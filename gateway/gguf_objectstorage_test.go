package gateway_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/engine/gguf"
)

// With --storage s3://… a checkpoint's files are only in the bucket: ?format=gguf still gives
// the GGUF adapter, converted from the bucket's copy, byte for byte the file export-gguf makes
// of the checkpoint's presigned tar.gz.
func TestGGUFArchiveFromObjectStorage(t *testing.T) {
	ts, _, _, e := s3Gateway(t)
	ctx := context.Background()
	c := client.New(ts.URL, "tml-s3-gguf")
	sess, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	no := false
	tc, err := c.CreateLoraTrainingClientConfig(ctx, sess, 0, base, api.LoraConfig{Rank: 4, TrainUnembed: &no})
	if err != nil {
		t.Fatal(err)
	}
	fb, _ := tc.ForwardBackward(ctx, []api.Datum{datum([]int{3, 14, 15, 92, 65, 35}, true)}, "cross_entropy", nil, false)
	op, _ := tc.OptimStep(ctx, 1e-2)
	if err := fb.Result(ctx, &api.ForwardBackwardOutput{}); err != nil {
		t.Fatal(err)
	}
	if err := op.Result(ctx, nil); err != nil {
		t.Fatal(err)
	}
	f, _ := tc.SaveState(ctx, "g1")
	if err := f.Result(ctx, nil); err != nil {
		t.Fatal(err)
	}
	route := "training_runs/" + tc.ModelID + "/checkpoints/weights/g1/archive"
	var u, tgz struct{ URL string }
	if err := c.Do(ctx, "GET", route+"?format=gguf", nil, &u); err != nil || u.URL == "" {
		t.Fatalf("gguf url: %v %+v", err, u)
	}
	got := download(t, u.URL)
	file, err := gguf.Parse(got)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := file.Value("general.type"); v != "adapter" {
		t.Fatalf("general.type %v", v)
	}
	if err := c.Do(ctx, "GET", route, nil, &tgz); err != nil {
		t.Fatal(err)
	}
	dir := untarGz(t, download(t, tgz.URL))
	out := filepath.Join(t.TempDir(), "a.gguf")
	if err := engine.ExportAdapterGGUF(dir, e.Config, out); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(out)
	if !bytes.Equal(got, want) {
		t.Fatalf("the route's GGUF (%d bytes) is not export-gguf's of the bucket's archive (%d bytes)", len(got), len(want))
	}
}

// untarGz writes a flat .tar.gz's files into a new directory.
func untarGz(t *testing.T, b []byte) string {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return dir
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(h.Name)), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
