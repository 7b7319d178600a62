package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/skein-ai/skein/engine/internal/backend"
)

// A forward pass of few tokens a row (a decode step) attends over the slots each row sees only:
// its output is softmax(q·kᵀ/√HD over slots 0…Slot)·v from a float64 reference, for rows whose
// spans differ (a batch mixing a long request with short ones), and it reads nothing past a
// row's span: NaN keys and values there change nothing (a cache's unseen slots hold whatever
// the previous row left; a product over every slot turns 0·NaN into NaN).
func TestAttendReadsEachRowsSpanOnly(t *testing.T) {
	t.Run("float32", func(t *testing.T) { testAttendSpans[float32](t, 1e-5) })
	t.Run("float64", func(t *testing.T) { testAttendSpans[float64](t, 1e-12) })
}

func testAttendSpans[E backend.Float](t *testing.T, tol float64) {
	s := newTestStep[E](t)
	const B, H, KVH, hd, S = 3, 6, 2, 19, 37
	G := H / KVH
	for _, T := range []int{1, 3} {
		rng := rand.New(rand.NewPCG(uint64(T), 9))
		slot := make([]int, B*T)
		last := []int{4, S - 1, 0} // a short row, the longest, a row at its first token
		for b := range B {
			for t := range T {
				slot[b*T+t] = max(0, last[b]-(T-1-t))
			}
		}
		q, k, v := randn(rng, B*KVH*G*T*hd), randn(rng, B*KVH*hd*S), randn(rng, B*KVH*S*hd)
		for bk := range B * KVH {
			span := slot[(bk/KVH)*T+T-1] + 1
			for j := span; j < S; j++ {
				for d := range hd {
					k[(bk*hd+d)*S+j] = math.NaN()
					v[(bk*S+j)*hd+d] = math.NaN()
				}
			}
		}
		a := &backend.Attention[E]{Heads: backend.Heads{B: B, T: T, H: H, KVH: KVH, HD: hd},
			QH: s.From(q, B*KVH, G*T, hd), KeysT: s.From(k, B*KVH, hd, S), Values: s.From(v, B*KVH, S, hd), Slot: slot}
		_, ot := s.Attend(a)
		if s.Err() != nil {
			t.Fatal(s.Err())
		}
		got := s.Download(ot)
		for b := range B {
			for h := range H {
				bk, g := b*KVH+h/G, h%G
				for tt := range T {
					n := slot[b*T+tt]
					qr := q[((bk*G+g)*T+tt)*hd:][:hd]
					p := make([]float64, n+1)
					m := math.Inf(-1)
					for j := range p {
						for d := range hd {
							p[j] += qr[d] * k[(bk*hd+d)*S+j]
						}
						p[j] /= math.Sqrt(hd)
						m = max(m, p[j])
					}
					sum := 0.0
					for j := range p {
						p[j] = math.Exp(p[j] - m)
						sum += p[j]
					}
					for d := range hd {
						want := 0.0
						for j := range p {
							want += p[j] / sum * v[(bk*S+j)*hd+d]
						}
						if g := float64(got[((b*T+tt)*H+h)*hd+d]); math.Abs(g-want) > tol || math.IsNaN(g) {
							t.Fatalf("T %d row %d head %d token %d dim %d: %v, want %v", T, b, h, tt, d, g, want)
						}
					}
				}
			}
		}
	}
}

// BenchmarkAttendDecode: one decode step's attention of the small preset's shape (8 rows, 8
// heads over 2 kv heads of 128, a cache of 576 slots), by the GEMM over every slot (the path of a
// pass that keeps its probabilities) and by each row's span, with every row at the cache's end
// (the spans' worst case) and with one long row among short ones (a mixed batch).
func BenchmarkAttendDecode(b *testing.B) {
	const B, H, KVH, hd, S = 8, 8, 2, 128, 576
	G := H / KVH
	for _, mix := range []string{"full", "mixed"} {
		for _, path := range []string{"gemm", "spans"} {
			b.Run(mix+"/"+path, func(b *testing.B) {
				be, err := New(0)
				if err != nil {
					b.Fatal(err)
				}
				s := NewStep[float32](be, backend.StepOptions{})
				defer s.Free()
				rng := rand.New(rand.NewPCG(1, 2))
				slot := make([]int, B)
				for i := range slot {
					slot[i] = S - 1
					if mix == "mixed" && i > 0 {
						slot[i] = 60 + 10*i
					}
				}
				a := &backend.Attention[float32]{Heads: backend.Heads{B: B, T: 1, H: H, KVH: KVH, HD: hd},
					QH: s.From(randn(rng, B*H*hd), B*KVH, G, hd), KeysT: s.From(randn(rng, B*KVH*hd*S), B*KVH, hd, S),
					Values: s.From(randn(rng, B*KVH*S*hd), B*KVH, S, hd), Slot: slot, KeepProbs: path == "gemm"}
				for b.Loop() {
					m := s.Mark()
					s.Attend(a)
					s.Release(m, s.Mark())
				}
			})
		}
	}
}
