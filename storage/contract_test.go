package storage_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/skein-ai/skein/storage"
	"github.com/skein-ai/skein/storage/storagetest"
)

// The contract every backend keeps, run against the local directory always and against a real
// S3 server when SKEIN_TEST_S3 names its endpoint (.ci/run starts versitygw on loopback and sets
// it, with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY).

func backends(t *testing.T) map[string]func(t *testing.T) storage.Storage {
	return map[string]func(t *testing.T) storage.Storage{
		"dir": func(t *testing.T) storage.Storage {
			d, err := storage.NewDir(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
		"s3": func(t *testing.T) storage.Storage { return storagetest.S3(t) },
	}
}

func put(t *testing.T, st storage.Storage, key, body string, cond storage.Cond) (storage.Info, error) {
	t.Helper()
	return st.Put(context.Background(), key, bytes.NewReader([]byte(body)), cond)
}

func read(t *testing.T, st storage.Storage, key string) string {
	t.Helper()
	b, _, err := storage.ReadAll(context.Background(), st, key, 1<<20)
	if err != nil {
		t.Fatalf("reading %s: %v", key, err)
	}
	return string(b)
}

func TestContract(t *testing.T) {
	for name, open := range backends(t) {
		t.Run(name, func(t *testing.T) {
			t.Run("PutGetHead", func(t *testing.T) { testPutGetHead(t, open(t)) })
			t.Run("Conditional", func(t *testing.T) { testConditional(t, open(t)) })
			t.Run("RacingSwaps", func(t *testing.T) { testRacingSwaps(t, open(t)) })
			t.Run("ListDelete", func(t *testing.T) { testListDelete(t, open(t)) })
			t.Run("BadKeys", func(t *testing.T) { testBadKeys(t, open(t)) })
			t.Run("Trees", func(t *testing.T) { testTrees(t, open(t)) })
			t.Run("StalePointer", func(t *testing.T) { testStalePointer(t, open(t)) })
			t.Run("Presign", func(t *testing.T) { testPresign(t, open(t), name) })
		})
	}
}

func testPutGetHead(t *testing.T, st storage.Storage) {
	ctx := context.Background()
	if _, err := st.Head(ctx, "a/missing"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Head of a missing key: %v, want ErrNotFound", err)
	}
	if _, _, err := st.Get(ctx, "a/missing"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Get of a missing key: %v, want ErrNotFound", err)
	}
	w1, err := put(t, st, "a/b/obj.json", "first", storage.Cond{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := st.Head(ctx, "a/b/obj.json")
	if err != nil || h.Size != 5 || h.ETag == "" || h.ETag != w1.ETag {
		t.Fatalf("Head = %+v, %v; want size 5 and the Put's ETag %q", h, err, w1.ETag)
	}
	if got := read(t, st, "a/b/obj.json"); got != "first" {
		t.Fatalf("read %q", got)
	}
	w2, err := put(t, st, "a/b/obj.json", "second!", storage.Cond{})
	if err != nil {
		t.Fatal(err)
	}
	if w2.ETag == w1.ETag {
		t.Fatalf("a replacement kept the ETag %q", w1.ETag)
	}
	if got := read(t, st, "a/b/obj.json"); got != "second!" {
		t.Fatalf("after replacing: %q", got)
	}
	if _, _, err := storage.ReadAll(ctx, st, "a/b/obj.json", 3); !errors.Is(err, storage.ErrTooBig) {
		t.Fatalf("ReadAll past its bound: %v, want ErrTooBig", err)
	}
}

func testConditional(t *testing.T, st storage.Storage) {
	w, err := put(t, st, "p", "v1", storage.Cond{IfAbsent: true})
	if err != nil {
		t.Fatalf("if-none-match on a new key: %v", err)
	}
	var ce *storage.ConditionError
	if _, err := put(t, st, "p", "v2", storage.Cond{IfAbsent: true}); !errors.As(err, &ce) || !errors.Is(err, storage.ErrPrecondition) {
		t.Fatalf("if-none-match on an existing key: %v, want a ConditionError", err)
	}
	w2, err := put(t, st, "p", "v2", storage.Cond{IfMatch: w.ETag})
	if err != nil {
		t.Fatalf("if-match with the current ETag: %v", err)
	}
	if _, err := put(t, st, "p", "v3", storage.Cond{IfMatch: w.ETag}); !errors.Is(err, storage.ErrPrecondition) {
		t.Fatalf("if-match with a stale ETag: %v, want ErrPrecondition", err)
	}
	if got := read(t, st, "p"); got != "v2" {
		t.Fatalf("a refused write changed the object: %q", got)
	}
	if _, err := put(t, st, "q", "x", storage.Cond{IfMatch: w2.ETag}); !errors.Is(err, storage.ErrPrecondition) && !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("if-match on a missing key: %v, want refused", err)
	}
	if _, err := st.Head(context.Background(), "q"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("a refused if-match created the key: %v", err)
	}
}

// Writers that all read the same ETag race to swap: exactly one wins.
func testRacingSwaps(t *testing.T, st storage.Storage) {
	ctx := context.Background()
	etag, err := storage.SwapPointer(ctx, st, "run.current", "run@0", "")
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = storage.SwapPointer(ctx, st, "run.current", "run@"+string(rune('a'+i)), etag)
		}()
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		var se *storage.StaleError
		switch {
		case err == nil:
			won++
		case !errors.As(err, &se):
			t.Fatalf("a losing swap failed with %v, want a StaleError", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d of %d racing swaps on one ETag won, want exactly 1", won, n)
	}
}

func testListDelete(t *testing.T, st storage.Storage) {
	ctx := context.Background()
	for _, k := range []string{"state/r1@1/a", "state/r1@1/b", "state/r1.current", "state/r10@1/a", "checkpoints/x"} {
		if _, err := put(t, st, k, k, storage.Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	keys := func(prefix string, limit int) []string {
		t.Helper()
		objs, err := st.List(ctx, prefix, limit)
		if err != nil {
			t.Fatalf("List(%q): %v", prefix, err)
		}
		var out []string
		for _, o := range objs {
			out = append(out, o.Key)
		}
		return out
	}
	if got := strings.Join(keys("state/r1@1/", 10), ","); got != "state/r1@1/a,state/r1@1/b" {
		t.Fatalf("List(state/r1@1/) = %s", got)
	}
	if got := strings.Join(keys("state/r1", 10), ","); got != "state/r1.current,state/r10@1/a,state/r1@1/a,state/r1@1/b" {
		t.Fatalf("List(state/r1) = %s", got)
	}
	if got := len(keys("", 10)); got != 5 {
		t.Fatalf("List of everything: %d objects, want 5", got)
	}
	if _, err := st.List(ctx, "state/", 2); !errors.Is(err, storage.ErrTooMany) {
		t.Fatalf("List past its limit: %v, want ErrTooMany", err)
	}
	if err := st.Delete(ctx, "state/r1@1/a"); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(ctx, "state/r1@1/a"); err != nil {
		t.Fatalf("deleting a missing key: %v", err)
	}
	if got := strings.Join(keys("state/r1@1/", 10), ","); got != "state/r1@1/b" {
		t.Fatalf("after delete: %s", got)
	}
	if err := storage.DeleteTree(ctx, st, "state/r1@1", 10); err != nil {
		t.Fatal(err)
	}
	if got := keys("state/r1@1/", 10); len(got) != 0 {
		t.Fatalf("after DeleteTree: %v", got)
	}
}

func testBadKeys(t *testing.T, st storage.Storage) {
	ctx := context.Background()
	for _, k := range []string{"", "/abs", "a/../b", "..", "a/./b", "a//b", "a/", ".hidden", "a/.lock", "a\\b", "a b", "a%2f..", "ä", strings.Repeat("x", 300), strings.Repeat("a/", 400) + "a"} {
		if _, err := put(t, st, k, "x", storage.Cond{}); !errors.Is(err, storage.ErrBadKey) {
			t.Errorf("Put(%q): %v, want ErrBadKey", k, err)
		}
		if _, err := st.Head(ctx, k); !errors.Is(err, storage.ErrBadKey) {
			t.Errorf("Head(%q): %v, want ErrBadKey", k, err)
		}
		if err := st.Delete(ctx, k); !errors.Is(err, storage.ErrBadKey) {
			t.Errorf("Delete(%q): %v, want ErrBadKey", k, err)
		}
	}
	if _, err := st.List(ctx, "../", 10); !errors.Is(err, storage.ErrBadKey) {
		t.Errorf("List(../): %v, want ErrBadKey", err)
	}
}

func testTrees(t *testing.T, st storage.Storage) {
	ctx := context.Background()
	src := t.TempDir()
	files := map[string]string{"adapter_model.safetensors": strings.Repeat("w", 1000), "adapter_config.json": "{}", "trainer_state.json": `{"step":3}`}
	for n, b := range files {
		if err := os.WriteFile(filepath.Join(src, n), []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n, err := storage.PutTree(ctx, st, "state/run@5", src)
	if err != nil || n != 1000+2+10 {
		t.Fatalf("PutTree = %d, %v; want 1012 bytes", n, err)
	}
	if size, err := storage.TreeSize(ctx, st, "state/run@5"); err != nil || size != 1012 {
		t.Fatalf("TreeSize = %d, %v", size, err)
	}
	dst := filepath.Join(t.TempDir(), "copy")
	if err := storage.GetTree(ctx, st, "state/run@5", dst, 1<<20); err != nil {
		t.Fatal(err)
	}
	for n, want := range files {
		if b, err := os.ReadFile(filepath.Join(dst, n)); err != nil || string(b) != want {
			t.Fatalf("%s came back as %q, %v", n, b, err)
		}
	}
	if err := storage.GetTree(ctx, st, "state/run@5", t.TempDir(), 100); !errors.Is(err, storage.ErrTooBig) {
		t.Fatalf("GetTree past its byte bound: %v, want ErrTooBig", err)
	}
	if err := storage.GetTree(ctx, st, "state/none@1", t.TempDir(), 1<<20); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("GetTree of an empty prefix: %v, want ErrNotFound", err)
	}
}

// The fencing rule: a writer whose pointer ETag is old cannot replace newer state.
func testStalePointer(t *testing.T, st storage.Storage) {
	ctx := context.Background()
	if _, _, err := storage.ReadPointer(ctx, st, "state/r.current"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("no pointer yet: %v", err)
	}
	e1, err := storage.SwapPointer(ctx, st, "state/r.current", "r@1", "")
	if err != nil {
		t.Fatal(err)
	}
	// Worker A read e1 and was cut off; worker B claimed the adapter (rewriting the same value:
	// the ETag must change all the same, S3's being the content's MD5) and saved twice.
	claim, err := storage.SwapPointer(ctx, st, "state/r.current", "r@1", e1)
	if err != nil || claim == e1 {
		t.Fatalf("a claim kept the ETag %q (%v): a stale writer could still swap", e1, err)
	}
	if _, err := storage.SwapPointer(ctx, st, "state/r.current", "r@A", e1); !errors.Is(err, storage.ErrPrecondition) {
		t.Fatalf("a swap on the ETag before a claim: %v, want refused", err)
	}
	e2, err := storage.SwapPointer(ctx, st, "state/r.current", "r@2", claim)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := storage.SwapPointer(ctx, st, "state/r.current", "r@3", e2); err != nil {
		t.Fatal(err)
	}
	_, err = storage.SwapPointer(ctx, st, "state/r.current", "r@A", e1)
	var se *storage.StaleError
	if !errors.As(err, &se) || !errors.Is(err, storage.ErrPrecondition) || se.Expected != e1 || !strings.Contains(err.Error(), "412") {
		t.Fatalf("the cut-off writer's swap: %v, want a StaleError naming 412", err)
	}
	if _, err := storage.SwapPointer(ctx, st, "state/r.current", "r@A", ""); !errors.As(err, &se) {
		t.Fatalf("a writer expecting no pointer: %v, want a StaleError", err)
	}
	v, _, err := storage.ReadPointer(ctx, st, "state/r.current")
	if err != nil || v != "r@3" {
		t.Fatalf("pointer = %q, %v; want r@3 (the newest writer's)", v, err)
	}
}

func testPresign(t *testing.T, st storage.Storage, backend string) {
	ctx := context.Background()
	if _, err := put(t, st, "archives/x.tar", "archive bytes", storage.Cond{}); err != nil {
		t.Fatal(err)
	}
	u, err := st.PresignGet(ctx, "archives/x.tar", time.Minute)
	if backend == "dir" {
		if !errors.Is(err, storage.ErrNoPresign) {
			t.Fatalf("local presign: %q, %v; want ErrNoPresign", u, err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.PresignGet(ctx, "archives/x.tar", 48*time.Hour); err == nil {
		t.Fatal("a two-day presigned URL was made")
	}
	if _, err := st.PresignGet(ctx, "../x", time.Minute); !errors.Is(err, storage.ErrBadKey) {
		t.Fatalf("presigning a bad key: %v", err)
	}
	resp, err := http.Get(u) // no credentials: the URL's signature is all
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "archive bytes" {
		t.Fatalf("GET presigned URL: %d %q", resp.StatusCode, b)
	}
	// A tampered signature is refused by the server.
	bad := strings.Replace(u, "X-Amz-Signature=", "X-Amz-Signature=0", 1)
	resp, err = http.Get(bad)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("GET with a tampered signature: %d, want 403", resp.StatusCode)
	}
}

// A temporary file a killed writer left in the data directory's .tmp is swept once old; a young
// one (another process may be writing it) stays.
func TestDirSweepsOldTempFiles(t *testing.T) {
	d, err := storage.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	old, young := filepath.Join(d.Root(), ".tmp", "old"), filepath.Join(d.Root(), ".tmp", "young")
	for _, p := range []string{old, young} {
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	past := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(old, past, past); err != nil {
		t.Fatal(err)
	}
	if n := d.SweepTemp(time.Now(), time.Hour); n != 1 {
		t.Fatalf("swept %d files, want 1", n)
	}
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Fatalf("the old temp file is still there: %v", err)
	}
	if _, err := os.Stat(young); err != nil {
		t.Fatalf("the young temp file went: %v", err)
	}
}
