package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// productKind is one weight type's direct product, its scalar loops and how to read its weights.
type productKind struct {
	name    string
	product func(y, x []float32, R, K, N int, transB bool)
	scalar  func(y, x []float32, R, K, N int, transB bool)
	weight  func(i int) float64 // element i of the weight, as the product reads it
}

func productKinds(rng *rand.Rand, size int) []productKind {
	w16 := make([]uint16, size)
	w32 := make([]float32, size)
	for i := range w16 {
		v := float32(rng.NormFloat64())
		w16[i], w32[i] = BF16Of(v), v
	}
	return []productKind{
		{"bf16", func(y, x []float32, R, K, N int, t bool) { widenedProduct(y, x, w16, R, K, N, t) }, // BF16Product on a path without pairs
			func(y, x []float32, R, K, N int, t bool) {
				if t {
					bf16NTScalar(y, x, w16, R, K, N, 0, N)
				} else {
					bf16NNScalar(y, x, w16, R, K, N, 0, N)
				}
			}, func(i int) float64 { return float64(BF16To32(w16[i])) }},
		{"f32", func(y, x []float32, R, K, N int, t bool) { F32Product(y, x, w32, R, K, N, t) },
			func(y, x []float32, R, K, N int, t bool) {
				if t {
					f32NTScalar(y, x, w32, R, K, N, 0, N)
				} else {
					f32NNScalar(y, x, w32, R, K, N, 0, N)
				}
			}, func(i int) float64 { return float64(w32[i]) }},
	}
}

// The direct few-row products over bf16 and over float32 weights (x·W and x·Wᵀ, vector kernel
// and scalar loops) agree with a float64 reference over shapes that leave tails everywhere: rows
// 1…70 (every row tiling and its remainder), K and N not multiples of 8, N spanning partial
// panels, and products big enough to be split across cores. The bound is float32 summation's:
// K·2⁻²³ of Σ|x·w|.
func TestDirectProductsMatchFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	type shape struct{ R, K, N int }
	var shapes []shape
	for R := 1; R <= 70; R++ {
		shapes = append(shapes, shape{R, 67, 83})
	}
	for _, R := range []int{1, 3, 4, 5, 9, 64, 70} {
		for _, K := range []int{1, 7, 9, 130} {
			for _, N := range []int{1, 5, 8, 17, 64, 65, 200} {
				shapes = append(shapes, shape{R, K, N})
			}
		}
	}
	for _, sh := range shapes {
		R, K, N := sh.R, sh.K, sh.N
		x := make([]float32, R*K)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		for _, kind := range productKinds(rng, K*N) {
			for _, transB := range []bool{false, true} {
				// W is [K, N], or [N, K] when transB.
				at := func(k, n int) float64 {
					if transB {
						return kind.weight(n*K + k)
					}
					return kind.weight(k*N + n)
				}
				fast, slow := make([]float32, R*N), make([]float32, R*N)
				for i := range fast {
					fast[i], slow[i] = float32(math.NaN()), float32(math.NaN()) // every output must be written
				}
				kind.product(fast, x, R, K, N, transB)
				kind.scalar(slow, x, R, K, N, transB)
				for r := range R {
					for n := range N {
						var ref, abs float64
						for k := range K {
							p := float64(x[r*K+k]) * at(k, n)
							ref += p
							abs += math.Abs(p)
						}
						tol := float64(K) * 0x1p-23 * abs
						for name, got := range map[string]float32{"kernel": fast[r*N+n], "scalar": slow[r*N+n]} {
							if d := math.Abs(float64(got) - ref); !(d <= tol) {
								t.Fatalf("%s %s %s: y[%d,%d] = %v, float64 %v (off by %.3g, bound %.3g)",
									kind.name, name, shapeName(R, K, N, transB), r, n, got, ref, d, tol)
							}
						}
					}
				}
			}
		}
	}
}

func shapeName(R, K, N int, transB bool) string {
	if transB {
		return fmt.Sprintf("[%d,%d]·[%d,%d]ᵀ", R, K, N, K)
	}
	return fmt.Sprintf("[%d,%d]·[%d,%d]", R, K, K, N)
}

// The float32-weight kernels are derived from the bf16 ones by gen_f32_kernels.go: the checked-in
// files are what it makes from the bf16 sources now (run `go generate ./engine` after changing a
// bf16 kernel).
func TestF32KernelsAreGenerated(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the generator")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool")
	}
	dir := t.TempDir()
	for _, f := range []string{"gen_f32_kernels.go", "bf16.go", "bf16_avx2_amd64.go", "bf16_other.go"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(goTool, "run", "gen_f32_kernels.go")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GO111MODULE=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("generator: %v\n%s", err, out)
	}
	for _, f := range []string{"f32_kernels_gen.go", "f32_avx2_amd64_gen.go", "f32_other_gen.go"} {
		want, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%s is stale: run go generate ./engine/internal/kernels", f)
		}
	}
}

// Widening is exact on every bit pattern (the 8-lane kernel as the scalar loop, NaNs included),
// and rounding to bf16 is to nearest with ties to even.
func TestBF16Conversions(t *testing.T) {
	src := make([]uint16, 1<<16+5) // a tail the lanes do not cover
	for i := range src {
		src[i] = uint16(i)
	}
	fast, slow := make([]float32, len(src)), make([]float32, len(src))
	WidenBF16(fast, src)
	widenBF16Scalar(slow, src)
	for i := range src {
		if math.Float32bits(fast[i]) != math.Float32bits(slow[i]) || math.Float32bits(slow[i]) != uint32(src[i])<<16 {
			t.Fatalf("bits %#04x widened to %#08x (scalar %#08x)", src[i], math.Float32bits(fast[i]), math.Float32bits(slow[i]))
		}
	}
	// Short rows: scalar under 8, a last vector overlapping the loop's from 9 on. Nothing past
	// the row is written.
	for n := range 41 {
		dst := make([]float32, n+1)
		dst[n] = -1
		widenBF16To32(dst[:n], src[1000:1000+n])
		for i := range n {
			if math.Float32bits(dst[i]) != uint32(src[1000+i])<<16 {
				t.Fatalf("row of %d: element %d widened to %#08x", n, i, math.Float32bits(dst[i]))
			}
		}
		if dst[n] != -1 {
			t.Fatalf("row of %d: wrote past its end", n)
		}
	}
	for _, c := range []struct {
		f    uint32
		want uint16
	}{
		{0x3f800000, 0x3f80}, // 1
		{0x3f808000, 0x3f80}, // halfway, even below
		{0x3f818000, 0x3f82}, // halfway, even above
		{0x3f808001, 0x3f81}, // above halfway
		{0x7f7fffff, 0x7f80}, // max float rounds to +Inf
		{0x7fc00001, 0x7fc0}, // NaN stays NaN
		{0xff810000, 0xffc1}, // signalling NaN stays NaN
	} {
		if got := BF16Of(math.Float32frombits(c.f)); got != c.want {
			t.Fatalf("BF16Of(%#08x) = %#04x, want %#04x", c.f, got, c.want)
		}
	}
}

// Every path rounds to bf16 as BF16Of does, on bit patterns that cover every high half with
// ties, NaNs (quiet and signalling), infinities and denormals, in rows of every tail length.
func TestRoundBF16PathsMatchBF16Of(t *testing.T) {
	src := make([]float32, 0, 1<<18+37)
	for hi := range uint32(1 << 16) {
		for _, lo := range []uint32{0, 0x7fff, 0x8000, 0x8001, 0xffff} {
			src = append(src, math.Float32frombits(hi<<16|lo))
		}
	}
	for _, p := range rowPaths {
		t.Run(p.String(), func(t *testing.T) {
			usePath(t, p)
			for _, n := range []int{len(src), 15, 16, 17, 33} {
				dst := make([]uint16, n+1)
				dst[n] = 0xabcd
				rows.roundBF16(dst[:n], src[:n])
				for i := range n {
					if want := BF16Of(src[i]); dst[i] != want {
						t.Fatalf("n=%d: %#08x rounds to %#04x, want %#04x", n, math.Float32bits(src[i]), dst[i], want)
					}
				}
				if dst[n] != 0xabcd {
					t.Fatalf("n=%d: wrote past the row", n)
				}
			}
		})
	}
}
