package gateway

import (
	"errors"
	"testing"
)

// A snapshot of a row that reaches the store after a newer one of the same row is dropped: the
// store never goes back to an older state. A failed write does not count as written.
func TestRowVersionKeepsTheNewestWrite(t *testing.T) {
	var v rowVersion
	older, newer := v.bump(), v.bump()
	var stored []uint64
	put := func(n uint64) func() error { return func() error { stored = append(stored, n); return nil } }
	if err := v.write(newer, put(newer)); err != nil {
		t.Fatal(err)
	}
	if err := v.write(older, put(older)); err != nil {
		t.Fatal(err)
	}
	if len(stored) != 1 || stored[0] != newer {
		t.Fatalf("stored %v, want only snapshot %d", stored, newer)
	}
	failed, last := v.bump(), v.bump()
	if err := v.write(failed, func() error { return errors.New("store down") }); err == nil {
		t.Fatal("a failed write reported success")
	}
	if err := v.write(failed, put(failed)); err != nil || stored[len(stored)-1] != failed {
		t.Fatalf("retrying the failed snapshot: %v, stored %v", err, stored)
	}
	if err := v.write(last, put(last)); err != nil || stored[len(stored)-1] != last {
		t.Fatalf("a newer snapshot after it: %v, stored %v", err, stored)
	}
}
