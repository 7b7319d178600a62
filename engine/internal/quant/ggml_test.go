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
