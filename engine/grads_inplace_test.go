package engine

import (
	"context"
	"runtime"
	"testing"
)

// The first forward_backward after an optim_step sums its gradients into the adapter's zero
// accumulator in place: it allocates no buffer of the adapter's size, where a second one before
// the optim_step (gradient accumulation) does, and the two give the same batch gradients, so the
// accumulator ends at exactly twice the first's.
func TestFirstForwardBackwardSumsInPlace(t *testing.T) {
	e := loadTiny(t, ArchQwen3, Options{})
	a := adapterWithB(t, e, "a", LoraConfig{Rank: 64, TrainAttn: true, TrainMLP: true}, func(i, j int) float64 { return 0.01 * float64((i+j)%7-3) })
	ids := make([]int, 64)
	for i := range ids {
		ids[i] = (7*i)%200 + 3
	}
	data := []Datum{textDatum(ids)}
	gradBytes := uint64(0)
	for _, p := range a.params {
		gradBytes += 4 * uint64(p.size())
	}
	allocated := func() uint64 {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.TotalAlloc
	}
	fb := func() uint64 {
		t.Helper()
		before := allocated()
		if _, err := e.ForwardBackward(context.Background(), "a", data, "cross_entropy", nil); err != nil {
			t.Fatal(err)
		}
		return allocated() - before
	}
	// Warm the pass's buffers, and take a step: the accumulator is zero again.
	fb()
	if _, err := e.OptimStep(context.Background(), "a", DefaultAdamParams()); err != nil {
		t.Fatal(err)
	}
	first := fb()
	g1 := gradsOf(a)
	second := fb()
	g2 := gradsOf(a)
	t.Logf("allocated: first %d B, second %d B; the adapter's gradients %d B", first, second, gradBytes)
	if second < first+gradBytes/2 {
		t.Errorf("the first forward_backward allocated %d B and the second %d B: the first should allocate about %d B (the batch's sums) less", first, second, gradBytes)
	}
	nonzero := 0
	for i := range g1 {
		for j := range g1[i] {
			if g2[i][j] != 2*g1[i][j] {
				t.Fatalf("param %d[%d]: accumulated %v after two equal batches, want 2 × %v", i, j, g2[i][j], g1[i][j])
			}
			if g1[i][j] != 0 {
				nonzero++
			}
		}
	}
	if nonzero == 0 {
		t.Fatal("the batch's gradients are all zero: the check would be blind")
	}
	if !a.pendingGrads {
		t.Fatal("gradients summed in place are not marked pending")
	}
}

func gradsOf(a *Adapter) [][]float64 {
	g := make([][]float64, len(a.params))
	for i, p := range a.params {
		g[i] = p.float64s('g')
	}
	return g
}
