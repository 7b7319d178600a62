package quant

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"github.com/skein-ai/skein/engine/internal/kernels"
)

type ggmlCase struct {
	X      string `json:"x"`      // float32 inputs, little-endian, hex
	Blocks string `json:"blocks"` // ggml's blocks, hex
}

// fixtures are the blocks ggml's own reference quantizers made of fixed inputs
// (scripts/ggml_quant_fixture.c over the npm package's libggml-base.so).
func fixtures(t *testing.T) map[string][]ggmlCase {
	t.Helper()
	raw, err := os.ReadFile("testdata/ggml_blocks.json")
	if err != nil {
		t.Fatal(err)
	}
	var f map[string][]ggmlCase
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	return f
}

func floats(t *testing.T, h string) []float32 {
	t.Helper()
	b, err := hex.DecodeString(h)
	if err != nil {
		t.Fatal(err)
	}
	x := make([]float32, len(b)/4)
	for i := range x {
		x[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return x
}

// Q8_0 blocks equal ggml's bit for bit: normal weights, a zero block, exact half-way ties, tiny
// and huge magnitudes, outliers.
func TestQ8_0MatchesGGML(t *testing.T) {
	cases := fixtures(t)["q8_0"]
	if len(cases) == 0 {
		t.Fatal("no q8_0 fixtures")
	}
	for i, c := range cases {
		x := floats(t, c.X)
		want, _ := hex.DecodeString(c.Blocks)
		got, err := QuantizeQ8_0(x, len(x))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			for b := 0; b < len(got); b += BlockBytesQ8_0 {
				if !bytes.Equal(got[b:b+BlockBytesQ8_0], want[b:b+BlockBytesQ8_0]) {
					t.Fatalf("case %d block %d: %x, ggml %x", i, b/BlockBytesQ8_0, got[b:b+BlockBytesQ8_0], want[b:b+BlockBytesQ8_0])
				}
			}
		}
		// Dequantized, every weight is within half a step of its block's scale.
		back := make([]float32, len(x))
		DequantizeQ8_0(back, got)
		for j := range x {
			d := F16ToF32(uint16(got[j/32*34]) | uint16(got[j/32*34+1])<<8)
			if diff := math.Abs(float64(back[j] - x[j])); diff > 0.51*float64(d)+1e-3*math.Abs(float64(x[j])) && d != 0 && !math.IsInf(float64(d), 0) {
				t.Fatalf("case %d weight %d: %v back as %v (d %v)", i, j, x[j], back[j], d)
			}
		}
	}
	if _, err := QuantizeQ8_0(make([]float32, 48), 48); err == nil {
		t.Fatal("a row of 48 weights was quantized into blocks of 32")
	}
}

// Every half converts to float32 and back unchanged, and float32 rounds to the nearest half
// (ties to even) across the normal, subnormal and overflow ranges.
func TestHalfConversions(t *testing.T) {
	for h := range 1 << 16 {
		f := F16ToF32(uint16(h))
		// Its value from the fields, independently of both conversions.
		sign, exp, mant := 1.0, h>>10&0x1f, float64(h&0x3ff)
		if h&0x8000 != 0 {
			sign = -1
		}
		switch {
		case exp == 0x1f && mant == 0:
			if !math.IsInf(float64(f), int(sign)) {
				t.Fatalf("half %#04x → %v, want an infinity", h, f)
			}
		case exp == 0x1f:
			if want := uint32(h&0x8000)<<16 | 0x7f800000 | uint32(h&0x3ff)<<13; math.Float32bits(f) != want {
				t.Fatalf("half %#04x → %#08x, want the NaN %#08x", h, math.Float32bits(f), want)
			}
		case exp == 0:
			if want := sign * mant * 0x1p-24; float64(f) != want || math.Signbit(float64(f)) != (sign < 0) {
				t.Fatalf("half %#04x → %v, want %v", h, f, want)
			}
		default:
			if want := sign * (1 + mant/1024) * math.Ldexp(1, int(exp)-15); float64(f) != want {
				t.Fatalf("half %#04x → %v, want %v", h, f, want)
			}
		}
		if math.IsNaN(float64(f)) {
			continue
		}
		if back := F32ToF16(f); back != uint16(h) {
			t.Fatalf("half %#04x → %v → %#04x", h, f, back)
		}
	}
	for _, c := range []struct {
		f    float32
		want uint16
	}{
		{1 + 0x1p-11, 0x3c00},            // tie, rounds to even (down)
		{1 + 3*0x1p-11, 0x3c02},          // tie, rounds to even (up)
		{65504, 0x7bff}, {65520, 0x7c00}, // largest half; the tie above it overflows
		{0x1p-25, 0}, {0x1p-25 * 1.5, 1}, // half the smallest subnormal ties to 0; above it, up
		{-0x1p-24, 0x8001},
	} {
		if got := F32ToF16(c.f); got != c.want {
			t.Errorf("F32ToF16(%v) = %#04x, want %#04x", c.f, got, c.want)
		}
	}
}

// Q4_K blocks equal ggml's bit for bit (its weighted least-squares search, step for step).
func TestQ4_KMatchesGGML(t *testing.T) {
	cases := fixtures(t)["q4_k"]
	if len(cases) == 0 {
		t.Fatal("no q4_k fixtures")
	}
	for i, c := range cases {
		x := floats(t, c.X)
		want, _ := hex.DecodeString(c.Blocks)
		got, err := QuantizeQ4_K(x, len(x))
		if err != nil {
			t.Fatal(err)
		}
		for b := 0; b < len(got); b += BlockBytesQ4_K {
			if !bytes.Equal(got[b:b+BlockBytesQ4_K], want[b:b+BlockBytesQ4_K]) {
				t.Fatalf("case %d block %d:\n got %x\nggml %x", i, b/BlockBytesQ4_K, got[b:b+BlockBytesQ4_K], want[b:b+BlockBytesQ4_K])
			}
		}
	}
	if _, err := QuantizeQ4_K(make([]float32, 128), 128); err == nil {
		t.Fatal("a row of 128 weights was quantized into blocks of 256")
	}
}

// Q6_K blocks equal ggml's bit for bit (its symmetric search over 19 scales per 16 weights),
// and dequantized each weight is within two steps of its group's scale d·sc (half a step, but
// the search may scale the group's largest weight of the other sign past level 31, where it
// is clipped). A group whose scale rounds to 0 against its super-block's largest (below
// GROUP_MAX_EPS, or under an outlier 256 times its size) is zero, as in ggml.
func TestQ6_KMatchesGGML(t *testing.T) {
	cases := fixtures(t)["q6_k"]
	if len(cases) == 0 {
		t.Fatal("no q6_k fixtures")
	}
	for i, c := range cases {
		x := floats(t, c.X)
		want, _ := hex.DecodeString(c.Blocks)
		got, err := QuantizeQ6_K(x, len(x))
		if err != nil {
			t.Fatal(err)
		}
		for b := 0; b < len(got); b += BlockBytesQ6_K {
			if !bytes.Equal(got[b:b+BlockBytesQ6_K], want[b:b+BlockBytesQ6_K]) {
				t.Fatalf("case %d block %d:\n got %x\nggml %x", i, b/BlockBytesQ6_K, got[b:b+BlockBytesQ6_K], want[b:b+BlockBytesQ6_K])
			}
		}
		back := make([]float32, len(x))
		DequantizeQ6_K(back, got)
		for j := range x {
			blk := got[j/BlockQ6_K*BlockBytesQ6_K:]
			d := F16ToF32(uint16(blk[208])|uint16(blk[209])<<8) * float32(int8(blk[192+j%BlockQ6_K/16]))
			step := math.Abs(float64(d))
			if diff := math.Abs(float64(back[j] - x[j])); step != 0 && diff > 2*step+1e-3*math.Abs(float64(x[j])) {
				t.Fatalf("case %d weight %d: %v back as %v (step %v)", i, j, x[j], back[j], step)
			}
		}
	}
	if _, err := QuantizeQ6_K(make([]float32, 128), 128); err == nil {
		t.Fatal("a row of 128 weights was quantized into blocks of 256")
	}
}

// Each format's Pairs is kernels.PackPairs of its dequantized weight, transposed and rounded to
// bf16, including a last tile of fewer outputs; its Product, where it has its own, is the
// dequantized weight's product.
func TestFormatsPairsAndProduct(t *testing.T) {
	serial := func(n int, fn func(lo, hi int)) { fn(0, n) }
	for _, f := range []*Format{Q8_0, Q4_K, Q6_K} {
		K, N, R := 2*f.Block, 37, 19
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
		bits := make([]uint16, K*N) // Wᵀ [K, N] in bf16
		for o := range N {
			for k := range K {
				bits[k*N+o] = kernels.BF16Of(deq[o*K+k])
			}
		}
		want := kernels.PackPairs(bits, K, N)
		got := make([]uint32, K/2*N)
		f.Pairs(got, blocks, K, N, serial)
		if !slices.Equal(got, want) {
			t.Fatalf("%s: Pairs differs from PackPairs of the dequantized weight", f.Name)
		}
		x := make([]float32, R*K)
		for i := range x {
			x[i] = float32(math.Cos(float64(i) * 0.3))
		}
		if f.Product == nil { // a product over dequantized rows: the CPU backend's (rowsProduct)
			continue
		}
		y := make([]float32, R*N)
		f.Product(y, x, blocks, R, K, N, serial)
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

// The Q4_K and Q6_K vector kernels (a super-block dequantized, and widened into bf16 pairs) give
// the plain-Go floats and words bit for bit: random blocks (every scale and min byte, d and dmin
// over the normal and subnormal halves, both signs), and blocks from the quantizer.
func TestKBlockKernelsMatchScalar(t *testing.T) {
	for _, c := range []struct {
		name                string
		blockBytes          int
		halves              []int // byte offsets of the f16 scales (d, dmin)
		quantize            func([]float32, int) ([]byte, error)
		floats, floatsPlain func(*[256]float32, []byte) bool
		pairs, pairsPlain   func([]uint32, int, []byte)
	}{
		{"q4_k", BlockBytesQ4_K, []int{0, 2}, QuantizeQ4_K, q4KBlockFloats,
			func(f *[256]float32, x []byte) bool { q4KBlockFloatsScalar(f, x); return true },
			func(d []uint32, s int, x []byte) { q4KBlockPairs(d, s, x) }, q4KBlockPairsScalar},
		{"q6_k", BlockBytesQ6_K, []int{208}, QuantizeQ6_K, q6KBlockFloats,
			func(f *[256]float32, x []byte) bool { q6KBlockFloatsScalar(f, x); return true },
			func(d []uint32, s int, x []byte) { q6KBlockPairs(d, s, x) }, q6KBlockPairsScalar},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !c.floats(new([256]float32), make([]byte, c.blockBytes)) {
				t.Skip("no vector kernels on this path")
			}
			rng := rand.New(rand.NewPCG(5, 6))
			x := make([]byte, c.blockBytes)
			var got, want [256]float32
			var gotP, wantP [128]uint32
			check := func(what string) {
				t.Helper()
				c.floats(&got, x)
				c.floatsPlain(&want, x)
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%s, block % x: weight %d vector %v, scalar %v", what, x[:16], i, got[i], want[i])
					}
				}
				c.pairs(gotP[:], 1, x)
				c.pairsPlain(wantP[:], 1, x)
				if gotP != wantP {
					t.Fatalf("%s, block % x: pairs differ", what, x[:16])
				}
			}
		random:
			for i := range 20000 {
				for j := range x {
					x[j] = byte(rng.Uint32())
				}
				for _, h := range c.halves {
					if i%3 == 0 { // a subnormal scale
						x[h+1] &= 0x83
					}
					if v := uint16(x[h]) | uint16(x[h+1])<<8; v&0x7c00 == 0x7c00 {
						continue random // inf or NaN: a quantizer never writes one
					}
				}
				check("random")
			}
			w := make([]float32, 64*256)
			for i := range w {
				w[i] = float32(rng.NormFloat64() * math.Pow(10, float64(i/256%8)-6))
			}
			blocks, err := c.quantize(w, 256)
			if err != nil {
				t.Fatal(err)
			}
			for b := range 64 {
				copy(x, blocks[b*c.blockBytes:])
				check("quantized")
			}
		})
	}
}

// The vector widening of a Q8_0 block into bf16 pairs gives the scalar one's bits for any
// block: random scales over the whole finite f16 range (subnormal ones included) and random
// quants.
func TestQ8BlockPairsMatchesScalar(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	w := make([]byte, BlockBytesQ8_0, BlockBytesQ8_0+16)
	var got, want [BlockQ8_0 / 2]uint32
	for i := range 20000 {
		for j := range w {
			w[j] = byte(rng.Uint32())
		}
		if i%7 == 0 { // halfway cases: d a power of two and q odd multiples that round on ties
			w[0], w[1] = 0, byte(0x3c-4*(i%5))
		}
		if h := uint16(w[0]) | uint16(w[1])<<8; h&0x7c00 == 0x7c00 {
			continue // inf or NaN: a quantizer never writes one
		}
		q8BlockPairs(got[:], 1, w, 0)
		q8BlockPairsScalar(want[:], 1, w, 0)
		if got != want {
			t.Fatalf("block % x: vector %x, scalar %x", w, got, want)
		}
	}
}

// BenchmarkQ8_0Pairs times widening a 1b-shaped FFN weight (8192 outputs × 2048 inputs) into
// bf16 pairs: once per product of a training pass over a Q8_0 base.
func BenchmarkQ8_0Pairs(b *testing.B) {
	K, N := 2048, 8192
	x := make([]float32, K*N)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range x {
		x[i] = float32(rng.NormFloat64() * 0.02)
	}
	blocks, err := QuantizeQ8_0(x, K)
	if err != nil {
		b.Fatal(err)
	}
	dst := make([]uint32, K/2*N)
	b.SetBytes(int64(K * N))
	for b.Loop() {
		Q8_0Pairs(dst, blocks, K, N, kernels.ParallelRows)
	}
}

// BenchmarkQ4_KPairs times the widening of a 1b shape's FFN weight over Q4_K and Q6_K into bf16
// pairs (one core), by super-blocks on the active path and in plain Go, and Q4_K as it was done
// before the vector kernels (each row dequantized, then every weight rounded: rowsPairs).
func BenchmarkQ4_KPairs(b *testing.B) {
	K, N := 2048, 8192
	x := make([]float32, K*N)
	for i := range x {
		x[i] = float32(math.Sin(float64(i))) * 0.02
	}
	q4, err := QuantizeQ4_K(x, K)
	if err != nil {
		b.Fatal(err)
	}
	q6, err := QuantizeQ6_K(x, K)
	if err != nil {
		b.Fatal(err)
	}
	dst := make([]uint32, K/2*N)
	serial := func(n int, fn func(lo, hi int)) { fn(0, n) }
	for _, v := range []struct {
		name   string
		path   kernels.Path
		blocks []byte
		fn     func(dst []uint32, w []byte, K, N int, parallel func(n int, fn func(lo, hi int)))
	}{
		{"q4_k-blocks-" + kernels.Active().String(), kernels.Active(), q4, Q4_KPairs},
		{"q4_k-blocks-scalar", kernels.Scalar, q4, Q4_KPairs},
		{"q4_k-rows-scalar", kernels.Scalar, q4, rowsPairs(DequantizeQ4_K, BlockQ4_K, BlockBytesQ4_K)},
		{"q6_k-blocks-" + kernels.Active().String(), kernels.Active(), q6, Q6_KPairs},
		{"q6_k-blocks-scalar", kernels.Scalar, q6, Q6_KPairs},
		{"q6_k-rows-scalar", kernels.Scalar, q6, rowsPairs(DequantizeQ6_K, BlockQ6_K, BlockBytesQ6_K)},
	} {
		b.Run(v.name, func(b *testing.B) {
			undo, err := useKernels(v.path)
			if err != nil {
				b.Skip(err)
			}
			defer undo()
			b.SetBytes(int64(K * N))
			for b.Loop() {
				v.fn(dst, v.blocks, K, N, serial)
			}
		})
	}
}

// BenchmarkQ8BlockPairs times the block kernel alone, vector against scalar, over the same
// weight as BenchmarkQ8_0Pairs (one core).
func BenchmarkQ8BlockPairs(b *testing.B) {
	K, N := 2048, 8192
	x := make([]float32, K*N)
	for i := range x {
		x[i] = float32(math.Sin(float64(i))) * 0.02
	}
	blocks, err := QuantizeQ8_0(x, K)
	if err != nil {
		b.Fatal(err)
	}
	nb := K * N / BlockQ8_0
	for _, k := range []struct {
		name string
		fn   func([]uint32, int, []byte, int)
	}{{"vector", q8BlockPairs}, {"scalar", q8BlockPairsScalar}} {
		b.Run(k.name, func(b *testing.B) {
			var tile [BlockQ8_0 / 2]uint32
			var sink uint32
			b.SetBytes(int64(K * N))
			for b.Loop() {
				for i := range nb {
					k.fn(tile[:], 1, blocks, i*BlockBytesQ8_0)
					sink += tile[0]
				}
			}
			_ = sink
		})
	}
}

// rowsPairs is how Q4_K and Q6_K were widened into pairs before blockPairs (each row of W
// dequantized, then written as a column of the pairs, tiles of 16 outputs): BenchmarkQ4_KPairs's
// reference.
func rowsPairs(deq func([]float32, []byte), block, blockBytes int) func(dst []uint32, w []byte, K, N int, parallel func(int, func(int, int))) {
	const pairsTile = 16
	return func(dst []uint32, w []byte, K, N int, parallel func(int, func(int, int))) {
		rowBytes := K / block * blockBytes
		parallel((N+pairsTile-1)/pairsTile, func(lo, hi int) {
			buf := make([]float32, pairsTile*K)
			for t := lo; t < hi; t++ {
				o0, o1 := t*pairsTile, min((t+1)*pairsTile, N)
				for o := o0; o < o1; o++ {
					deq(buf[(o-o0)*K:(o-o0+1)*K], w[o*rowBytes:(o+1)*rowBytes])
				}
				for p := range K / 2 {
					row := dst[p*N:]
					for o := o0; o < o1; o++ {
						r := buf[(o-o0)*K:]
						row[o] = uint32(kernels.BF16Of(r[2*p])) | uint32(kernels.BF16Of(r[2*p+1]))<<16
					}
				}
			}
		})
	}
}

// BenchmarkFewRowProducts times the few-row products (decode steps) over a 1b shape's FFN
// weight in each format, one core: go test ./engine/internal/quant -run X -bench FewRowProducts.
func BenchmarkFewRowProducts(b *testing.B) {
	K, N := 2048, 8192
	w := make([]float32, K*N)
	for i := range w {
		w[i] = float32(math.Sin(float64(i))) * 0.02
	}
	serial := func(n int, fn func(lo, hi int)) { fn(0, n) }
	for _, f := range []*Format{Q8_0} { // Q4_K's and Q6_K's: backend/cpu BenchmarkRowsProducts
		blocks, err := f.Quantize(w, K)
		if err != nil {
			b.Fatal(err)
		}
		for _, R := range []int{1, 4} {
			x := make([]float32, R*K)
			for i := range x {
				x[i] = float32(math.Cos(float64(i)))
			}
			y := make([]float32, R*N)
			b.Run(fmt.Sprintf("%s/rows=%d", f.Name, R), func(b *testing.B) {
				b.SetBytes(int64(K * N))
				for b.Loop() {
					f.Product(y, x, blocks, R, K, N, serial)
				}
			})
		}
	}
}
