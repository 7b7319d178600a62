package kernels

import "math"

// ggml-cpu's own float32 arithmetic where engine's differs from it by an ulp now and then
// (Options.GGMLActivations over quantized bases: an ulp can move one of llama.cpp's activation
// roundings by a step).

// FMA32 is a·b + c rounded once to float32, as VFMADD does: the product is exact in float64, the
// sum is rounded to odd in float64 (53 ≥ 2·24+2 bits, so rounding that to float32 is rounding the
// exact value once; Go's float32(math.FMA(…)) would round twice).
func FMA32(a, b, c float32) float32 {
	p := float64(float64(a) * float64(b)) // exact: 48 bits
	cf := float64(c)
	s := p + cf
	bb := s - p
	e := (p - (s - bb)) + (cf - bb) // the addition's exact error (TwoSum)
	if e != 0 {
		bits := math.Float64bits(s)
		if bits&1 == 0 { // step to the odd neighbour on the exact value's side
			if (e > 0) == (s > 0) {
				bits++
			} else {
				bits--
			}
			s = math.Float64frombits(bits)
		}
	}
	return float32(s)
}

// expfGGML is one lane of ggml-cpu's ggml_v_expf (AVX2 with FMA): exp by 2^n·p(b), a
// polynomial of the reduced argument, every step as the intrinsics round it.
func expfGGML(x float32) float32 {
	const r = 0x1.8p23
	z := FMA32(x, 0x1.715476p+0, r)
	n := z - r
	b := FMA32(-n, 0x1.7f7d1cp-20, FMA32(-n, 0x1.62e4p-1, x))
	e := math.Float32bits(z) << 23
	k := math.Float32frombits(e + math.Float32bits(1))
	u := b * b
	j := FMA32(FMA32(FMA32(0x1.0e4020p-7, b, 0x1.573e2ep-5), u, FMA32(0x1.555e66p-3, b, 0x1.fffdb6p-2)), u, 0x1.ffffecp-1*b)
	an := float32(math.Abs(float64(n)))
	if !(an > 126) {
		return FMA32(k, j, k)
	}
	var g uint32
	if n <= 0 {
		g = 0x82000000
	}
	s1 := math.Float32frombits(g + 0x7f000000)
	s2 := math.Float32frombits(e - g)
	if an > 192 {
		return s1 * s1
	}
	return FMA32(s2, j, s2) * s1
}

// SiluGateGGML is SiluGate with out as ggml_vec_swiglu_f32 computes it, over rows of width
// values: silu(g) = g/(1 + expfGGML(−g)) times u in groups of 8, the rest of a row through expf
// (libm's in ggml; here float64's exp rounded, which can differ from it by an ulp).
func SiluGateGGML(g, u, sig, out []float32, width int) {
	sigmoids(sig, g)
	ParallelRows(len(g)/width, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			o := r * width
			vec := width - width%8
			i := 0
			for ; i < vec; i++ {
				x := g[o+i]
				out[o+i] = x / (1 + expfGGML(0-x)) * u[o+i]
			}
			for ; i < width; i++ {
				x := g[o+i]
				out[o+i] = x / (1 + float32(math.Exp(float64(-x)))) * u[o+i]
			}
		}
	})
}
