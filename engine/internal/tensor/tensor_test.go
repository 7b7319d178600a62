package tensor

import (
	"testing"
	"time"

	"github.com/gomlx/compute/dtypes"
)

// Free step buffers stay under their byte cap, the least recently returned going first, and
// none is kept once idle for maxIdle; a kept buffer is handed out again for its shape.
func TestFreeBuffersAreBounded(t *testing.T) {
	mm, err := NewPool(3 * 4096 * 4) // three [64, 64] float32 buffers
	if err != nil {
		t.Fatal(err)
	}
	take := func(dims ...int) sharedBuf {
		sb, err := mm.takeShared(dtypes.Float32, dims)
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	old := []sharedBuf{take(64, 64), take(64, 64)}
	mm.giveBack(old, nil, true)
	newer := []sharedBuf{take(32, 128), take(32, 128)} // a different shape: the old ones stay free
	mm.giveBack(newer, nil, true)
	if mm.freeBytes > mm.maxFree {
		t.Fatalf("%d bytes free, cap %d", mm.freeBytes, mm.maxFree)
	}
	if n, m := len(mm.free[bufKey{dtypes.Float32, "[64 64]"}]), len(mm.free[bufKey{dtypes.Float32, "[32 128]"}]); n != 1 || m != 2 {
		t.Fatalf("free lists hold %d old and %d newer buffers, want 1 and 2", n, m)
	}
	again := take(32, 128)
	if again.buf != newer[1].buf {
		t.Fatal("a free buffer of the shape was not reused")
	}
	mm.giveBack([]sharedBuf{again}, nil, false)
	mm.mu.Lock()
	mm.trimFree(time.Now().Add(maxIdle + time.Second))
	mm.mu.Unlock()
	if len(mm.free) != 0 || mm.freeBytes != 0 {
		t.Fatalf("after %v idle: %d lists, %d bytes free", maxIdle, len(mm.free), mm.freeBytes)
	}
}
