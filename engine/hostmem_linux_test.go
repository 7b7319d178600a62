package engine

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// A mapped weight file loads the model a read one does, and giving back a converted tensor's
// pages neither changes what the mapping reads (the pages come back from the file) nor touches
// heap bytes.
func TestMappedWeightsLoadAsRead(t *testing.T) {
	ids := []int{5, 9, 14, 3, 77, 21, 8}
	var lps [2][][]float64
	for k, from := range []int64{1 << 62, 0} {
		old := mapFrom
		mapFrom = from
		e, err := Load(tinyModel(t, ArchLlama), Options{})
		mapFrom = old
		if err != nil {
			t.Fatal(err)
		}
		r, err := e.Forward(context.Background(), "", []Datum{textDatum(ids)}, "cross_entropy", nil)
		if err != nil {
			t.Fatal(err)
		}
		lps[k] = r.Logprobs
	}
	if !reflect.DeepEqual(lps[0], lps[1]) {
		t.Fatalf("logprobs read %v, mapped %v", lps[0], lps[1])
	}
	path := filepath.Join(t.TempDir(), "f")
	want := make([]byte, 5*os.Getpagesize()+123)
	for i := range want {
		want[i] = byte(i*7 + 1)
	}
	if err := os.WriteFile(path, want, 0o644); err != nil {
		t.Fatal(err)
	}
	b, ok := mapFile(path)
	if !ok {
		t.Fatal("mapFile failed")
	}
	if !reflect.DeepEqual(b, want) {
		t.Fatal("mapped bytes differ from the file")
	}
	releaseHost(b[100:])
	if !reflect.DeepEqual(b, want) {
		t.Fatal("after releaseHost the mapping reads other bytes")
	}
	heap := append([]byte(nil), want...)
	releaseHost(heap)
	if !reflect.DeepEqual(heap, want) {
		t.Fatal("releaseHost changed heap bytes")
	}
}
