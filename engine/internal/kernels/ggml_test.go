package kernels

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"math"
	"os"
	"testing"
)

// SiluGateGGML's products are ggml_vec_swiglu_f32's bit for bit (AVX2 build; the fixture is
// scripts/ggml_act_fixture.c's, kept with the quant package's): rows of 40 and of 37 values, the
// last group of 8 through exp's overflow and underflow branches. The tail of 37 goes through libm's
// expf in ggml, float64's exp rounded here: it is compared too.
func TestSiluGateGGMLMatchesGGML(t *testing.T) {
	raw, err := os.ReadFile("../quant/testdata/ggml_act.json")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Swiglu struct{ X, G, Y40, Y37 string } `json:"swiglu"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	floats := func(h string) []float32 {
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
	x, g := floats(f.Swiglu.X), floats(f.Swiglu.G)
	if len(x) != 40 || len(g) != 40 {
		t.Fatal("no swiglu fixture")
	}
	for _, tc := range []struct {
		n    int
		want []float32
	}{{40, floats(f.Swiglu.Y40)}, {37, floats(f.Swiglu.Y37)}} {
		sig, out := make([]float32, tc.n), make([]float32, tc.n)
		SiluGateGGML(x[:tc.n], g[:tc.n], sig, out, tc.n)
		for i := range tc.n {
			if math.Float32bits(out[i]) != math.Float32bits(tc.want[i]) {
				t.Errorf("row of %d, [%d] silu(%g)·%g: %g, ggml %g", tc.n, i, x[i], g[i], out[i], tc.want[i])
			}
		}
	}
}

// vecDotF32GGML is ggml_vec_dot_f32's AVX2 build bit for bit at lengths through each of its
// tails (the 4×8-lane body, groups of 8 and of 4 of rounded products, fused last ≤ 3).
func TestVecDotF32MatchesGGML(t *testing.T) {
	raw, err := os.ReadFile("../quant/testdata/ggml_act.json")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		V struct {
			X, Y string
			Dots [][2]uint32
		} `json:"vec_dot_f32"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	x, y := fixtureFloats(t, f.V.X), fixtureFloats(t, f.V.Y)
	if len(f.V.Dots) == 0 || len(x) != 100 {
		t.Fatal("no vec_dot_f32 fixture")
	}
	for _, d := range f.V.Dots {
		n := int(d[0])
		if got := vecDotF32GGML(x[:n], y[:n]); math.Float32bits(got) != d[1] {
			t.Errorf("n=%d: %g, ggml %g", n, got, math.Float32frombits(d[1]))
		}
	}
}

func fixtureFloats(t *testing.T, h string) []float32 {
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
