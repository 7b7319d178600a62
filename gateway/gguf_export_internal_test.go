package gateway

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/replica"
)

// GGUF exports are bounded, all tenants together: with every slot taken the next one is a 429
// and converts nothing.
func TestGGUFExportsAreBounded(t *testing.T) {
	dir := t.TempDir()
	if err := engine.InitTiny(dir, engine.ArchQwen3, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Load(dir, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep := replica.New("r0", "tiny", e, 1)
	s, err := New(Options{DataDir: t.TempDir()}, rep)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); rep.Close() })
	for range cap(ggufExports) {
		ggufExports <- struct{}{}
	}
	defer func() {
		for range cap(ggufExports) {
			<-ggufExports
		}
	}()
	rec := httptest.NewRecorder()
	_, err = s.downloadGGUF(rec, httptest.NewRequest("GET", "/", nil), &ckptMeta{BaseModel: "tiny", Path: "tinker://x/weights/y"})
	var he *httpError
	if !errors.As(err, &he) || he.status != http.StatusTooManyRequests {
		t.Fatalf("with every export slot taken: %v", err)
	}
	if rec.Body.Len() != 0 {
		t.Fatal("something was written")
	}
}
