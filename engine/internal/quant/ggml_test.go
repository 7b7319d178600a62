package quant

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"math"
	"math/big"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/skein-ai/skein/engine/internal/kernels"
)

// actFixture is what ggml-cpu's AVX2 build (libggml-cpu-haswell.so of node-llama-cpp's prebuilt)
// made of fixed activations and weight rows: scripts/ggml_act_fixture.c.
type actFixture struct {
	N       int      `json:"n"`
	Acts    []string `json:"acts"` // float32 rows, hex
	Q8_0    []string `json:"q8_0"` // quantize_row_q8_0 of each row
	Q8_K    []string `json:"q8_k"` // quantize_row_q8_K of each row (block_q8_K: f32 d, 256 int8, 16 int16)
	Weights []struct {
		Type   string   `json:"type"`
		Blocks string   `json:"blocks"` // one weight row, quantized by ggml's reference quantizer
		Dots   []uint32 `json:"dots"`   // vec_dot of the row with each activation row, float32 bits
	} `json:"weights"`
	// Repacked: 8 Q4_K weight rows as ggml-cpu repacks them for AVX2 (block_q4_Kx8), 8
	// activation rows, and the kernels' outputs [row][output]: gemm over groups of 4 rows, gemv
	// over each row alone.
	Repacked struct {
		Weights []string   `json:"weights"`
		Acts    []string   `json:"acts"`
		Gemm    [][]uint32 `json:"gemm"`
		Gemv    [][]uint32 `json:"gemv"`
	} `json:"repacked_q4_k"`
}

func loadActFixture(t *testing.T) *actFixture {
	t.Helper()
	raw, err := os.ReadFile("testdata/ggml_act.json")
	if err != nil {
		t.Fatal(err)
	}
	var f actFixture
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Acts) == 0 || len(f.Weights) == 0 {
		t.Fatal("empty fixture")
	}
	return &f
}

func unhex(t *testing.T, h string) []byte {
	t.Helper()
	b, err := hex.DecodeString(h)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// q8KBytes lays blocks out as ggml's block_q8_K (little-endian).
func q8KBytes(blocks []BlockQ8_K) []byte {
	var buf bytes.Buffer
	for i := range blocks {
		_ = binary.Write(&buf, binary.LittleEndian, &blocks[i])
	}
	return buf.Bytes()
}

// Activations round to ggml's Q8_0 and Q8_K blocks bit for bit: normals of two sizes, a zero
// super-block, exact .5 ties (where AVX2's ties-to-even and the reference's away-from-zero part),
// tiny and huge values, outliers, ±max both present, a single nonzero.
func TestActivationQuantizationMatchesGGML(t *testing.T) {
	f := loadActFixture(t)
	for i, h := range f.Acts {
		x := floats(t, h)
		q8 := make([]byte, len(x)/BlockQ8_0*BlockBytesQ8_0)
		QuantizeActQ8_0(q8, x)
		if want := unhex(t, f.Q8_0[i]); !bytes.Equal(q8, want) {
			t.Errorf("row %d: Q8_0 activation blocks differ from ggml's", i)
		}
		qk := make([]BlockQ8_K, len(x)/256)
		QuantizeActQ8_K(qk, x)
		if want := unhex(t, f.Q8_K[i]); !bytes.Equal(q8KBytes(qk), want) {
			t.Errorf("row %d: Q8_K activation blocks differ from ggml's", i)
		}
	}
	// The ties row is there to tell the two Q8_0 roundings apart: the weights' reference
	// quantizer (ties away from zero) gives other blocks.
	x := floats(t, f.Acts[3])
	ref, err := QuantizeQ8_0(x, len(x))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(ref[:len(x)/BlockQ8_0*BlockBytesQ8_0], unhex(t, f.Q8_0[3])) {
		t.Error("the ties row rounds alike under both rules: it tests nothing")
	}
}

// The dot products of ggml's activation blocks with Q8_0, Q4_K and Q6_K weight rows are ggml's
// vec_dot results bit for bit (integer lanes, float32 fused multiply-adds, hsum_float_8).
func TestDotsMatchGGML(t *testing.T) {
	f := loadActFixture(t)
	n := 0
	for _, w := range f.Weights {
		blocks := unhex(t, w.Blocks)
		for a, bits := range w.Dots {
			var got float32
			switch w.Type {
			case "q8_0":
				got = DotQ8_0(blocks, unhex(t, f.Q8_0[a]), f.N/BlockQ8_0)
			case "q4_k", "q6_k":
				qk := make([]BlockQ8_K, f.N/256)
				QuantizeActQ8_K(qk, floats(t, f.Acts[a]))
				if w.Type == "q4_k" {
					got = DotQ4_K(blocks, qk)
				} else {
					got = DotQ6_K(blocks, qk)
				}
			default:
				t.Fatalf("fixture type %q", w.Type)
			}
			if want := math.Float32frombits(bits); math.Float32bits(got) != bits {
				t.Errorf("%s row, activation %d: %g, ggml %g", w.Type, a, got, want)
			}
			n++
		}
	}
	t.Logf("%d dot products equal ggml's", n)
}

// The products of a repacked Q4_K weight are ggml's gemm and gemv kernels' bit for bit.
func TestRepackedQ4_KMatchesGGML(t *testing.T) {
	f := loadActFixture(t)
	rp := f.Repacked
	if len(rp.Weights) != 8 || len(rp.Acts) == 0 {
		t.Fatal("no repacked fixture")
	}
	for r, h := range rp.Acts {
		x := floats(t, h)
		a := make([]BlockQ8_K, len(x)/256)
		QuantizeActQ8_K(a, x)
		for o, wh := range rp.Weights {
			w := unhex(t, wh)
			if got := DotQ4_KGemm(w, a); math.Float32bits(got) != rp.Gemm[r][o] {
				t.Errorf("gemm row %d output %d: %g, ggml %g", r, o, got, math.Float32frombits(rp.Gemm[r][o]))
			}
			if got := DotQ4_KGemv(w, a); math.Float32bits(got) != rp.Gemv[r][o] {
				t.Errorf("gemv row %d output %d: %g, ggml %g", r, o, got, math.Float32frombits(rp.Gemv[r][o]))
			}
		}
	}
}

// fma32 rounds a·b + c once: against the exactly rounded big-float value, on random operands
// including the cancelling ones where rounding twice goes wrong.
func TestFMA32RoundsOnce(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 200000 {
		a := float32(r.NormFloat64())
		b := float32(r.NormFloat64())
		c := float32(r.NormFloat64())
		if i%2 == 1 { // c close to −a·b: cancellation
			c = -float32(float64(a)*float64(b)) * (1 + float32(r.NormFloat64())*1e-6)
		}
		want := exactFMA32(a, b, c)
		if got := fma32(a, b, c); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("fma32(%g, %g, %g) = %g, want %g", a, b, c, got, want)
		}
	}
}

// exactFMA32 is a·b + c computed exactly in big floats and rounded once to float32.
func exactFMA32(a, b, c float32) float32 {
	x := new(big.Float).SetPrec(256).SetFloat64(float64(a))
	x.Mul(x, new(big.Float).SetPrec(256).SetFloat64(float64(b)))
	x.Add(x, new(big.Float).SetPrec(256).SetFloat64(float64(c)))
	f, _ := x.Float32()
	return f
}

// The Q8_0 dot on the active kernel path (AVX2's integer instructions where the path has them)
// is the plain-Go one bit for bit: weights over the whole int8 range (a GGUF may hold −128),
// activations as QuantizeActQ8_0 makes them (±127), scales over f16's range, 1 to 130 blocks.
func TestDotQ8_0KernelMatchesScalar(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	block := func(dst []byte, lo int) {
		h := F32ToF16(float32(math.Exp(rng.NormFloat64() * 4)))
		dst[0], dst[1] = byte(h), byte(h>>8)
		for j := range BlockQ8_0 {
			dst[2+j] = byte(int8(lo + rng.IntN(128-lo)))
		}
	}
	for trial := range 300 {
		nb := 1 + rng.IntN(130)
		w, a := make([]byte, nb*BlockBytesQ8_0), make([]byte, nb*BlockBytesQ8_0)
		for b := range nb {
			block(w[b*BlockBytesQ8_0:], -128)
			block(a[b*BlockBytesQ8_0:], -127)
			if trial%10 == 0 { // blocks of one extreme value: the pair sums' largest
				for j := range BlockQ8_0 {
					w[b*BlockBytesQ8_0+2+j], a[b*BlockBytesQ8_0+2+j] = 0x80, 0x81
				}
			}
		}
		got, want := DotQ8_0(w, a, nb), dotQ8_0Scalar(w, a, nb)
		if math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("trial %d, %d blocks: %g, plain Go %g", trial, nb, got, want)
		}
	}
}

// A Q4_K super-block's scaled lanes on the active path (AVX2's where it has them) equal the
// plain-Go ones: nibbles of every byte value, activations over the whole int8 range, 6-bit scales.
func TestQ4_KScaledLanesMatchScalar(t *testing.T) {
	var sc [8]int32
	if !q4KScaledLanesSIMD(make([]byte, 128), new([256]int8), &sc, new([4][8]int32)) {
		t.Skip("no SIMD lanes on this path")
	}
	rng := rand.New(rand.NewPCG(9, 10))
	q := make([]byte, 128)
	var qs [256]int8
	for trial := range 200 {
		for i := range q {
			q[i] = byte(rng.IntN(256))
		}
		for i := range qs {
			qs[i] = int8(rng.IntN(256) - 128)
			if trial%10 == 0 {
				q[i/2], qs[i] = 0xff, -128 // the largest pair sums
			}
		}
		for j := range sc {
			sc[j] = int32(rng.IntN(64))
			if trial%10 == 0 {
				sc[j] = 63
			}
		}
		var got, want [4][8]int32
		q4KScaledLanesSIMD(q, &qs, &sc, &got)
		q4KScaledLanesScalar(q, &qs, &sc, &want)
		if got != want {
			t.Fatalf("trial %d: %v, plain Go %v", trial, got, want)
		}
	}
}

// A Q6_K super-block's scaled lanes on the active path equal the plain-Go ones: random bytes for
// the bits and scales (int8 scales of both signs), activations over the whole int8 range.
func TestQ6_KLanesMatchScalar(t *testing.T) {
	if !q6KLanesSIMD(make([]byte, BlockBytesQ6_K), new([256]int8), new([8]int32)) {
		t.Skip("no SIMD lanes on this path")
	}
	rng := rand.New(rand.NewPCG(11, 12))
	x := make([]byte, BlockBytesQ6_K)
	var qs [256]int8
	for trial := range 200 {
		for i := range x {
			x[i] = byte(rng.IntN(256))
		}
		for i := range qs {
			qs[i] = int8(rng.IntN(256) - 128)
		}
		if trial%10 == 0 { // every 6-bit value 63, scales −128, activations −128
			for i := range 192 {
				x[i] = 0xff
			}
			for i := 192; i < 208; i++ {
				x[i] = 0x80
			}
			for i := range qs {
				qs[i] = -128
			}
		}
		var got, want [8]int32
		q6KLanesSIMD(x, &qs, &got)
		q6KLanesScalar(x, &qs, &want)
		if got != want {
			t.Fatalf("trial %d: %v, plain Go %v", trial, got, want)
		}
	}
}

// BenchmarkGGMLDots times one output of each llama.cpp-rounded product (a row of 4096 weights
// against one activation row) on the active kernel path and on the plain-Go one, side by side:
// go test ./engine/internal/quant -run X -bench GGMLDots.
func BenchmarkGGMLDots(b *testing.B) {
	const n = 4096
	rng := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	a8 := make([]byte, n/BlockQ8_0*BlockBytesQ8_0)
	QuantizeActQ8_0(a8, x)
	ak := make([]BlockQ8_K, n/256)
	QuantizeActQ8_K(ak, x)
	w8, _ := QuantizeQ8_0(x, n)
	w4, _ := QuantizeQ4_K(x, n)
	w6, _ := QuantizeQ6_K(x, n)
	dots := []struct {
		name string
		dot  func() float32
	}{
		{"q8_0", func() float32 { return DotQ8_0(w8, a8, n/BlockQ8_0) }},
		{"q4_k", func() float32 { return DotQ4_K(w4, ak) }},
		{"q4_k_gemm", func() float32 { return DotQ4_KGemm(w4, ak) }},
		{"q6_k", func() float32 { return DotQ6_K(w6, ak) }},
	}
	for _, d := range dots {
		for _, path := range []kernels.Path{kernels.Active(), kernels.Scalar} {
			b.Run(d.name+"/"+path.String(), func(b *testing.B) {
				undo, err := useKernels(path)
				if err != nil {
					b.Skip(err)
				}
				defer undo()
				var s float32
				for b.Loop() {
					s += d.dot()
				}
				b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gweights/s")
			})
		}
	}
}

// The vector Q4_K dot and the instruction FMA are the plain-Go ones bit for bit: random weights
// and activations (QuantizeQ4_K and QuantizeActQ8_K of random rows, 1 to 9 super-blocks, values
// over many magnitudes so that the lanes' float sums round), and FMA32 on random triples.
func TestQ4_KDotKernelMatchesScalar(t *testing.T) {
	if _, ok := fmaHW(1, 1, 1); !ok {
		t.Skip("no vector kernels on this path")
	}
	rng := rand.New(rand.NewPCG(13, 14))
	for trial := range 300 {
		nb := 1 + rng.IntN(9)
		x, act := make([]float32, nb*256), make([]float32, nb*256)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * math.Exp(rng.NormFloat64()*3))
			act[i] = float32(rng.NormFloat64() * math.Exp(rng.NormFloat64()*3))
		}
		w, err := QuantizeQ4_K(x, len(x))
		if err != nil {
			t.Fatal(err)
		}
		a := make([]BlockQ8_K, nb)
		QuantizeActQ8_K(a, act)
		got, _ := dotQ4_KSIMD(w, a)
		if want := dotQ4_KScalar(w, a); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("trial %d, %d blocks: %g, plain Go %g", trial, nb, got, want)
		}
		p, q, r := float32(rng.NormFloat64()), float32(rng.NormFloat64()*1e3), float32(rng.NormFloat64()*1e-3)
		if f, _ := fmaHW(p, q, r); math.Float32bits(f) != math.Float32bits(kernels.FMA32(p, q, r)) {
			t.Fatalf("fma(%g, %g, %g): instruction %g, emulation %g", p, q, r, f, kernels.FMA32(p, q, r))
		}
	}
}

// The packed unpacking of a Q4_K super-block's scales and mins (the vector kernel's) gives
// scaleMinK4's: random scale bytes, and every byte value in every position.
func TestQ4_KScalesMinsPackedMatchesScaleMinK4(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	x := make([]byte, BlockBytesQ4_K)
	check := func() {
		t.Helper()
		var sc, mn [8]int32
		q4KScalesMins(x, &sc, &mn)
		psc, pmn := q4KScalesMinsPacked(x)
		for j := range 8 {
			if got, gotM := int32(psc>>(8*j)&0xff), int32(pmn>>(8*j)&0xff); got != sc[j] || gotM != mn[j] {
				t.Fatalf("scales % x: j %d packed (%d, %d), scaleMinK4 (%d, %d)", x[4:16], j, got, gotM, sc[j], mn[j])
			}
		}
	}
	for range 20000 {
		for i := 4; i < 16; i++ {
			x[i] = byte(rng.Uint32())
		}
		check()
	}
	for pos := 4; pos < 16; pos++ {
		clear(x[4:16])
		for v := range 256 {
			x[pos] = byte(v)
			check()
		}
	}
}
