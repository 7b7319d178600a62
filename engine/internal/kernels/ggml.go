package kernels

import (
	"math"

	"github.com/skein-ai/skein/engine/internal/num"
)

// ggml-cpu's own float32 arithmetic where engine's differs from it by an ulp now and then
// (Options.GGMLActivations over quantized bases: an ulp can move one of llama.cpp's activation
// roundings by a step).

// FMA32 is a·b + c rounded once to float32 (num.FMA32).
func FMA32(a, b, c float32) float32 { return num.FMA32(a, b, c) }

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

// hsum8GGML is ggml's horizontal sum of eight float32 lanes (hsum_float_8, tinyBLAS's hsum): the
// high half added to the low, then lanes 0+2 and 1+3, then the two.
func hsum8GGML(v *[8]float32) float32 {
	r0, r1, r2, r3 := v[4]+v[0], v[5]+v[1], v[6]+v[2], v[7]+v[3]
	return (r0 + r2) + (r1 + r3)
}

// dotTinyBLAS is one output of llamafile's tinyBLAS (AVX2, FMA) over float32 rows of a multiple
// of 8: lane l fused-multiply-adds elements l, l+8, l+16, … in order, then hsum8GGML.
func dotTinyBLAS(x, y []float32) float32 {
	var acc [8]float32
	for i := 0; i < len(x); i += 8 {
		for l := range 8 {
			acc[l] = FMA32(x[i+l], y[i+l], acc[l])
		}
	}
	return hsum8GGML(&acc)
}

// vecDotF32GGML is ggml_vec_dot_f32 as the AVX2 build compiles it: four 8-lane FMA accumulators
// over the first n&^31 elements, reduced as (s0+s2)+(s1+s3), high half plus low, two hadds; then
// the rest as the compiler vectorized that loop: groups of 8 and then one of 4 of rounded
// products added one by one, the last ≤ 3 fused-multiply-added.
func vecDotF32GGML(x, y []float32) float32 {
	n := len(x)
	np := n &^ 31
	var s [4][8]float32
	for i := 0; i < np; i += 32 {
		for j := range 4 {
			for l := range 8 {
				s[j][l] = FMA32(x[i+8*j+l], y[i+8*j+l], s[j][l])
			}
		}
	}
	var sum float32
	if np > 0 {
		var v [8]float32
		for l := range 8 {
			v[l] = (s[0][l] + s[2][l]) + (s[1][l] + s[3][l])
		}
		h := [4]float32{v[4] + v[0], v[5] + v[1], v[6] + v[2], v[7] + v[3]}
		sum = (h[0] + h[1]) + (h[2] + h[3])
	}
	i := np
	for ; n-i >= 8; i += 8 {
		for l := range 8 {
			sum += float32(x[i+l] * y[i+l]) // rounded: no fused multiply-add (arm64 would fuse)
		}
	}
	if n-i >= 4 {
		for l := range 4 {
			sum += float32(x[i+l] * y[i+l])
		}
		i += 4
	}
	for ; i < n; i++ {
		sum = FMA32(x[i], y[i], sum)
	}
	return sum
}

// dotF32GGML is a float32 mat-mul output as ggml-cpu takes it for contiguous rows: tinyBLAS when
// the length is a multiple of 8 (llamafile_sgemm), else vec_dot_f32.
func dotF32GGML(x, y []float32) float32 {
	if len(x)%8 == 0 {
		return dotTinyBLAS(x, y)
	}
	return vecDotF32GGML(x, y)
}

// LoRARowsGGML adds an adapter's term to rows of y as llama.cpp's build_lora_mm does:
// t = x·Aᵀ and u = t·Bᵀ as ggml-cpu's float32 mat-muls (dotF32GGML), then u·scale, then y + that.
// x [rows, in], a = A [r, in], b = B [out, r], y [rows, out].
func LoRARowsGGML(y, x, a, b []float32, rows, in, r, out int, scale float32) {
	ParallelRows(rows, func(lo, hi int) {
		t := make([]float32, r)
		for n := lo; n < hi; n++ {
			xn := x[n*in : (n+1)*in]
			for j := range r {
				t[j] = dotF32GGML(a[j*in:(j+1)*in], xn)
			}
			yn := y[n*out : (n+1)*out]
			for o := range out {
				yn[o] += float32(dotF32GGML(b[o*r:(o+1)*r], t) * scale)
			}
		}
	})
}
