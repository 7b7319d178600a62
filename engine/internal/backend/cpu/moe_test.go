package cpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/skein-ai/skein/engine/internal/backend"
)

// Route picks the k most probable experts in decreasing order, a tie to the lower expert, with
// softmax weights (renormalised or not); RouteBack is its gradient, checked against finite
// differences of a scalar function of the weights.
func TestRouteAndItsGradient(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const N, E, k = 5, 7, 3
	logits := randn(rng, N*E)
	// Row 1: experts 2 and 5 tie for first place, 4 and 6 for third.
	for e := range E {
		logits[E+e] = -1 - float64(e)/10
	}
	logits[E+2], logits[E+5], logits[E+4], logits[E+6] = 3, 3, 1, 1
	for _, renorm := range []bool{false, true} {
		s := newTestStep[float64](t)
		w, experts := s.Route(s.From(logits, N, E), k, renorm)
		if got := experts[k : 2*k]; !slices.Equal(got, []int{2, 5, 4}) {
			t.Fatalf("renorm %v: row with ties routed to %v, want [2 5 4]", renorm, got)
		}
		for n := range N {
			row := logits[n*E : (n+1)*E]
			p := softmax(row)
			var sum float64
			for j := range k {
				e := experts[n*k+j]
				if j > 0 && p[e] > p[experts[n*k+j-1]] {
					t.Fatalf("row %d: experts %v out of order", n, experts[n*k:(n+1)*k])
				}
				sum += p[e]
			}
			for e := range E { // no expert left out beats a chosen one
				if !slices.Contains(experts[n*k:(n+1)*k], e) && p[e] > p[experts[n*k+k-1]] {
					t.Fatalf("row %d: expert %d (p %.3f) left out", n, e, p[e])
				}
			}
			for j := range k {
				want := p[experts[n*k+j]]
				if renorm {
					want /= sum
				}
				if math.Abs(w.V[n*k+j]-want) > 1e-15 {
					t.Fatalf("row %d weight %d: %v, want %v", n, j, w.V[n*k+j], want)
				}
			}
		}
		// f(logits) = Σ c·w with fixed experts (away from ties: rows 0, 2, 3, 4).
		c := randn(rng, N*k)
		dw := s.From(c, N, k)
		d := s.RouteBack(s.From(logits, N, E), w, experts, dw, renorm)
		f := func(l []float64) float64 {
			s2 := newTestStep[float64](t)
			w2, e2 := s2.Route(s2.From(l, N, E), k, renorm)
			if !slices.Equal(e2, experts) {
				t.Fatal("a finite difference moved the routing")
			}
			var v float64
			for i := range c {
				v += c[i] * w2.V[i]
			}
			return v
		}
		for _, n := range []int{0, 2, 3, 4} {
			for e := range E {
				l := slices.Clone(logits)
				const h = 1e-6
				l[n*E+e] += h
				up := f(l)
				l[n*E+e] -= 2 * h
				fd := (up - f(l)) / (2 * h)
				if math.Abs(fd-d.V[n*E+e]) > 1e-8 {
					t.Fatalf("renorm %v, row %d expert %d: gradient %v, finite difference %v", renorm, n, e, d.V[n*E+e], fd)
				}
			}
		}
	}
}

func softmax(x []float64) []float64 {
	m := slices.Max(x)
	p := make([]float64, len(x))
	var s float64
	for i, v := range x {
		p[i] = math.Exp(v - m)
		s += p[i]
	}
	for i := range p {
		p[i] /= s
	}
	return p
}

// MixRows sums each token's experts' rows by its weights; MixRowsBack and ScatterAdd are its
// transposes: ⟨dOut, MixRows(y, w)⟩ = ⟨MixRowsBack's dy, y⟩ = ⟨MixRowsBack's dw, w⟩.
func TestMixRowsAndScatterAdd(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const N, k, C = 4, 2, 3
	pos := []int{3, 0, 5, 1, 2, 7, 6, 4} // a permutation of the grouped rows
	s := newTestStep[float64](t)
	y, w := s.From(randn(rng, N*k*C), N*k, C), s.From(randn(rng, N*k), N, k)
	out := s.MixRows(y, w, pos)
	for n := range N {
		for c := range C {
			want := w.V[n*k]*y.V[pos[n*k]*C+c] + w.V[n*k+1]*y.V[pos[n*k+1]*C+c]
			if math.Abs(out.V[n*C+c]-want) > 1e-14 {
				t.Fatalf("out[%d][%d] = %v, want %v", n, c, out.V[n*C+c], want)
			}
		}
	}
	dOut := s.From(randn(rng, N*C), N, C)
	dy, dw := s.MixRowsBack(dOut, y, w, pos)
	dot := func(a, b []float64) (v float64) {
		for i := range a {
			v += a[i] * b[i]
		}
		return v
	}
	lhs := dot(dOut.V, out.V)
	if r := dot(dy.V, y.V); math.Abs(lhs-r) > 1e-12 {
		t.Fatalf("⟨dOut, out⟩ %v, ⟨dy, y⟩ %v", lhs, r)
	}
	if r := dot(dw.V, w.V); math.Abs(lhs-r) > 1e-12 {
		t.Fatalf("⟨dOut, out⟩ %v, ⟨dw, w⟩ %v", lhs, r)
	}
	dst := s.Zeros(N, C)
	src := s.From(randn(rng, 3*C), 3, C)
	s.ScatterAdd(dst, src, []int{2, 0, 2})
	for c := range C {
		if dst.V[2*C+c] != src.V[c]+src.V[2*C+c] || dst.V[c] != src.V[C+c] || dst.V[C+c] != 0 {
			t.Fatalf("ScatterAdd: %v from %v", dst.V, src.V)
		}
	}
}

// A gate of one number a row scales the whole row; its gradient sums over the row.
func TestGateOfOneNumberARow(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	const N, D = 3, 5
	s := newTestStep[float64](t)
	o, g := s.From(randn(rng, N*D), N, D), s.From(randn(rng, N), N, 1)
	out := s.Gate(o, g)
	do := s.From(randn(rng, N*D), N, D)
	orig := slices.Clone(do.V)
	dg := s.Alloc(N, 1)
	s.GateBack(do, o, g, dg)
	for n := range N {
		sg := 1 / (1 + math.Exp(-g.V[n]))
		var want float64
		for i := range D {
			if math.Abs(out.V[n*D+i]-o.V[n*D+i]*sg) > 1e-15 || math.Abs(do.V[n*D+i]-orig[n*D+i]*sg) > 1e-15 {
				t.Fatalf("row %d: not scaled by σ(g)", n)
			}
			want += orig[n*D+i] * o.V[n*D+i]
		}
		if want *= sg * (1 - sg); math.Abs(dg.V[n]-want) > 1e-14 {
			t.Fatalf("row %d: dgate %v, want %v", n, dg.V[n], want)
		}
	}
}

// The grouped products equal their groups multiplied one by one (the same bits: each group's
// rows go through the same product), in float32 (views of the grouped tensors, outputs written
// in place) and float64 (groups copied out and back), an empty group included.
func TestGroupedProductsEqualEachGroupAlone(t *testing.T) {
	testGrouped[float32](t)
	testGrouped[float64](t)
}

func testGrouped[E interface{ float32 | float64 }](t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	s := newTestStep[E](t)
	const in, out, r = 24, 40, 3
	offs := []int{0, 5, 5, 17, 80} // 4 groups, group 1 empty, group 3 past the GEMM's row blocks
	P, G := offs[len(offs)-1], len(offs)-1
	var ws []backend.Weight
	for range G {
		wt, _, err := NewValues[E](randn(rng, in*out), in, out)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, NewWeight(Host[E]{F: wt}))
	}
	x := s.From(randn(rng, P*in), P, in)
	dy := s.From(randn(rng, P*out), P, out)
	same := func(name string, got []E, g int, want []E) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Fatalf("%T %s group %d: not the group's own product", got, name, g)
		}
	}
	fwd := s.ProductGrouped(x, ws, offs, false)
	back := s.ProductGrouped(dy, ws, offs, true)
	yb := s.From(randn(rng, G*out*r), G*out, r) // blocks [out, r]
	mg := s.MatMulGrouped(fwd, yb, offs, out, false)
	ya := s.From(randn(rng, G*r*in), G*r, in) // blocks [r, in], multiplied transposed
	mt := s.MatMulGrouped(x, ya, offs, r, true)
	tn := s.MatMulGroupedTN(x, dy, offs)
	for g := range G {
		r0, r1 := offs[g], offs[g+1]
		if r0 == r1 {
			for _, v := range tn.V[g*in*out : (g+1)*in*out] {
				if v != 0 {
					t.Fatal("an empty group's TN block is not zero")
				}
			}
			continue
		}
		xg, dyg := s.Rows(x, r0, r1), s.Rows(dy, r0, r1)
		same("x·W", fwd.V[r0*out:r1*out], g, s.Product(xg, ws[g], false).V)
		same("x·Wᵀ", back.V[r0*in:r1*in], g, s.Product(dyg, ws[g], true).V)
		same("x·y_g", mg.V[r0*r:r1*r], g, s.MatMul(s.Rows(fwd, r0, r1), s.Rows(yb, g*out, (g+1)*out), 0, false).V)
		same("xᵀ·y", tn.V[g*in*out:(g+1)*in*out], g, s.MatMul(s.Transpose(xg, 1), dyg, 0, false).V)
		same("x·y_gᵀ", mt.V[r0*r:r1*r], g, s.MatMul(xg, s.Rows(ya, g*r, (g+1)*r), 0, true).V)
	}
}
