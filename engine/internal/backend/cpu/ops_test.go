package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/quant"
)

// Op tests: each op of the CPU backend against a float64 reference written from its doc, on
// shapes with tails. A device backend's op tests compare against these ops.

func newTestStep[E backend.Float](t *testing.T) backend.Step[E] {
	t.Helper()
	b, err := New(0)
	if err != nil {
		t.Fatal(err)
	}
	s := NewStep[E](b, backend.StepOptions{})
	t.Cleanup(s.Free)
	return s
}

func randn(rng *rand.Rand, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = rng.NormFloat64()
	}
	return v
}

// HeadLoss gives each row's log softmax at its target and, with grad, the loss's gradient in the
// logits: dlp·(onehot − softmax), zero on padding rows, for every loss.
func TestHeadLossMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const rows, V, r0 = 7, 131, 3
	for _, kind := range []string{backend.LossCrossEntropy, backend.LossImportance, backend.LossPPO, backend.LossCISPO, backend.LossDRO} {
		s := newTestStep[float64](t)
		logits := randn(rng, rows*V)
		in := &backend.LossInputs{LossParams: backend.LossParams{Kind: kind, Lo: 0.8, Hi: 1.2, Beta: 0.05},
			Target: make([]int, r0+rows), Weight: make([]float64, r0+rows), OldLP: make([]float64, r0+rows),
			Adv: make([]float64, r0+rows), Live: make([]bool, r0+rows)}
		for n := range r0 + rows {
			in.Target[n], in.Weight[n], in.OldLP[n], in.Adv[n] = rng.IntN(V), rng.Float64(), -4+rng.Float64(), rng.NormFloat64()
			in.Live[n] = n != r0+2 // one padding row
		}
		x := s.From(logits, rows, V)
		lp := make([]float64, r0+rows)
		s.HeadLoss(x, in, r0, lp, true)
		got := s.Download(x)
		for r := range rows {
			n := r0 + r
			row := logits[r*V : (r+1)*V]
			m := math.Inf(-1)
			for _, v := range row {
				m = max(m, v)
			}
			var se float64
			for _, v := range row {
				se += math.Exp(v - m)
			}
			want := row[in.Target[n]] - m - math.Log(se)
			if math.Abs(lp[n]-want) > 1e-12 {
				t.Fatalf("%s row %d: logprob %v, reference %v", kind, r, lp[n], want)
			}
			var g float64
			if in.Live[n] {
				_, g = in.TokenLoss(want, in.Weight[n], in.OldLP[n], in.Adv[n])
			}
			for i, v := range row {
				d := -g * math.Exp(v-m) / se
				if i == in.Target[n] {
					d += g
				}
				if math.Abs(got[r*V+i]-d) > 1e-12 {
					t.Fatalf("%s row %d logit %d: gradient %v, reference %v", kind, r, i, got[r*V+i], d)
				}
			}
		}
	}
}

// RMSNorm and its backward against float64 references, in float32 (the kernels' rows).
func TestRMSNormMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const rows, D = 5, 77
	s := newTestStep[float32](t)
	xv, wv, dyv := randn(rng, rows*D), randn(rng, D), randn(rng, rows*D)
	x, w, dy := s.From(xv, rows, D), s.From(wv, D), s.From(dyv, rows, D)
	y, inv := s.Alloc(rows, D), s.Alloc(rows)
	s.RMSNorm(x, w, 1e-6, y, inv, false)
	dx := s.Alloc(rows, D)
	s.RMSNormBack(dy, x, inv, w, dx, false)
	yv, dxv := s.Download(y), s.Download(dx)
	for r := range rows {
		xr := xv[r*D : (r+1)*D]
		var ss float64
		for _, v := range xr {
			ss += float64(float32(v)) * float64(float32(v))
		}
		iv := 1 / math.Sqrt(ss/D+1e-6)
		var dot float64
		for i := range D {
			dot += float64(float32(dyv[r*D+i])) * float64(float32(wv[i])) * float64(float32(xr[i]))
		}
		for i := range D {
			want := float64(float32(xr[i])) * iv * float64(float32(wv[i]))
			if math.Abs(float64(yv[r*D+i])-want) > 1e-5*(1+math.Abs(want)) {
				t.Fatalf("row %d dim %d: y %v, reference %v", r, i, yv[r*D+i], want)
			}
			wantDX := iv*float64(float32(dyv[r*D+i]))*float64(float32(wv[i])) - float64(float32(xr[i]))*iv*iv*iv*dot/D
			if math.Abs(float64(dxv[r*D+i])-wantDX) > 1e-4*(1+math.Abs(wantDX)) {
				t.Fatalf("row %d dim %d: dx %v, reference %v", r, i, dxv[r*D+i], wantDX)
			}
		}
	}
}

// The product over block formats without a kernel of their own (Q4_K, Q6_K: decode steps over
// their rows) is the dequantized weight's product, a last tile of fewer outputs included.
func TestRowsProductIsTheDequantizedProduct(t *testing.T) {
	serial := func(n int, fn func(lo, hi int)) { fn(0, n) }
	for _, f := range []*quant.Format{quant.Q4_K, quant.Q6_K} {
		K, N, R := 2*f.Block, 37, 3
		w := make([]float32, N*K)
		for i := range w {
			w[i] = float32(math.Sin(float64(i)*0.7)) * 0.05
		}
		blocks, err := f.Quantize(w, K)
		if err != nil {
			t.Fatal(err)
		}
		deq := make([]float32, N*K)
		f.Dequantize(deq, blocks)
		x := make([]float32, R*K)
		for i := range x {
			x[i] = float32(math.Cos(float64(i) * 0.3))
		}
		y := make([]float32, R*N)
		rowsProduct(f.Dequantize, f.Block, f.BlockBytes)(y, x, blocks, R, K, N, serial)
		for r := range R {
			for o := range N {
				var ref float64
				for k := range K {
					ref += float64(x[r*K+k]) * float64(deq[o*K+k])
				}
				if d := math.Abs(float64(y[r*N+o]) - ref); d > 1e-4*(1+math.Abs(ref)) {
					t.Fatalf("%s: y[%d,%d] = %v, want %v", f.Name, r, o, y[r*N+o], ref)
				}
			}
		}
	}
}

// BenchmarkRowsProducts times the few-row products (decode steps) over a 1b shape's FFN weight in
// Q4_K and Q6_K, one core: go test ./engine/internal/backend/cpu -run X -bench RowsProducts.
func BenchmarkRowsProducts(b *testing.B) {
	K, N := 2048, 8192
	w := make([]float32, K*N)
	for i := range w {
		w[i] = float32(math.Sin(float64(i))) * 0.02
	}
	serial := func(n int, fn func(lo, hi int)) { fn(0, n) }
	for _, f := range []*quant.Format{quant.Q4_K, quant.Q6_K} {
		blocks, err := f.Quantize(w, K)
		if err != nil {
			b.Fatal(err)
		}
		product := rowsProduct(f.Dequantize, f.Block, f.BlockBytes)
		for _, R := range []int{1, 4} {
			x := make([]float32, R*K)
			for i := range x {
				x[i] = float32(math.Cos(float64(i)))
			}
			y := make([]float32, R*N)
			b.Run(fmt.Sprintf("%s/rows=%d", f.Name, R), func(b *testing.B) {
				b.SetBytes(int64(K * N))
				for b.Loop() {
					product(y, x, blocks, R, K, N, serial)
				}
			})
		}
	}
}

// CopySlots moves exactly the named heads' slots between stores of different slot counts (a
// prefix cache's 16-slot block and a sampler's row of S slots), keys transposed and values
// alike, and nothing else: every other number of the destination keeps its value.
func TestCopySlotsMovesOnlyTheNamedSlots(t *testing.T) {
	s := newTestStep[float32](t)
	const hd, srcS, dstS, srcHeads, dstHeads = 3, 5, 9, 4, 6
	rng := rand.New(rand.NewPCG(3, 4))
	src := backend.KV[float32]{KeysT: s.From(randn(rng, srcHeads*hd*srcS), srcHeads, hd, srcS), Values: s.From(randn(rng, srcHeads*srcS*hd), srcHeads, srcS, hd)}
	dst := backend.KV[float32]{KeysT: s.From(randn(rng, dstHeads*hd*dstS), dstHeads, hd, dstS), Values: s.From(randn(rng, dstHeads*dstS*hd), dstHeads, dstS, hd)}
	before := backend.KV[float32]{KeysT: s.Copy(dst.KeysT), Values: s.Copy(dst.Values)}
	const dstHead, dstSlot, srcHead, srcSlot, heads, n = 2, 4, 1, 2, 3, 3
	s.CopySlots(dst, src, dstHead, dstSlot, srcHead, srcSlot, heads, n)
	if s.Err() != nil {
		t.Fatal(s.Err())
	}
	k, v, k0, v0 := s.Download(dst.KeysT), s.Download(dst.Values), s.Download(before.KeysT), s.Download(before.Values)
	sk, sv := s.Download(src.KeysT), s.Download(src.Values)
	for h := range dstHeads {
		for slot := range dstS {
			copied := h >= dstHead && h < dstHead+heads && slot >= dstSlot && slot < dstSlot+n
			sh, ss := h-dstHead+srcHead, slot-dstSlot+srcSlot
			for d := range hd {
				want, wantV := k0[(h*hd+d)*dstS+slot], v0[(h*dstS+slot)*hd+d]
				if copied {
					want, wantV = sk[(sh*hd+d)*srcS+ss], sv[(sh*srcS+ss)*hd+d]
				}
				if got := k[(h*hd+d)*dstS+slot]; got != want {
					t.Fatalf("key head %d dim %d slot %d: %v, want %v", h, d, slot, got, want)
				}
				if got := v[(h*dstS+slot)*hd+d]; got != wantV {
					t.Fatalf("value head %d slot %d dim %d: %v, want %v", h, slot, d, got, wantV)
				}
			}
		}
	}
	// Slots past either store's end are refused, not written out of bounds.
	s.CopySlots(dst, src, 0, dstS-1, 0, 0, 1, 2)
	if s.Err() == nil {
		t.Fatal("a copy past the destination's slots was not refused")
	}
}

// CopyRows sets exactly the named rows of the destination from the source's (tensors of
// different row counts, rows of the same size), and refuses rows past either end.
func TestCopyRowsSetsOnlyTheNamedRows(t *testing.T) {
	s := newTestStep[float64](t)
	rng := rand.New(rand.NewPCG(5, 6))
	src, dst := s.From(randn(rng, 2*3*4), 2, 3, 4), s.From(randn(rng, 5*12), 5, 12)
	before := append([]float64(nil), s.Download(dst)...)
	s.CopyRows(dst, 3, src, 0, 2)
	if s.Err() != nil {
		t.Fatal(s.Err())
	}
	got, sv := s.Download(dst), s.Download(src)
	for i, v := range got {
		want := before[i]
		if r := i / 12; r >= 3 {
			want = sv[(r-3)*12+i%12]
		}
		if v != want {
			t.Fatalf("element %d (row %d): %v, want %v", i, i/12, v, want)
		}
	}
	s.CopyRows(dst, 4, src, 0, 2)
	if s.Err() == nil {
		t.Fatal("a copy past the destination's rows was not refused")
	}
}
