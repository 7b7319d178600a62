package imageproc

import (
	"fmt"
	"math"
)

// SmartResize is HF's smart_resize (transformers' image_processing_qwen2_vl.py): height and
// width rounded to multiples of factor, then scaled, keeping the aspect ratio, so that
// height·width lies within [minPixels, maxPixels]. Python's round() rounds half to even, and so
// does this. Dimensions must be positive; an aspect ratio over 200 is refused, as HF refuses it.
func SmartResize(height, width, factor, minPixels, maxPixels int) (int, int, error) {
	if height < 1 || width < 1 || factor < 1 {
		return 0, 0, fmt.Errorf("%w: image of %d×%d pixels", ErrBadImage, width, height)
	}
	h, w := float64(height), float64(width)
	if ratio := math.Max(h, w) / math.Min(h, w); ratio > 200 {
		return 0, 0, fmt.Errorf("%w: absolute aspect ratio must be smaller than 200, got %g (%d×%d)", ErrBadImage, ratio, width, height)
	}
	f := float64(factor)
	hBar := int(math.RoundToEven(h/f)) * factor
	wBar := int(math.RoundToEven(w/f)) * factor
	switch {
	case int64(hBar)*int64(wBar) > int64(maxPixels):
		beta := math.Sqrt(h * w / float64(maxPixels))
		hBar = max(factor, int(math.Floor(h/beta/f))*factor)
		wBar = max(factor, int(math.Floor(w/beta/f))*factor)
	case int64(hBar)*int64(wBar) < int64(minPixels):
		beta := math.Sqrt(float64(minPixels) / (h * w))
		hBar = int(math.Ceil(h*beta/f)) * factor
		wBar = int(math.Ceil(w*beta/f)) * factor
	}
	return hBar, wBar, nil
}

// PIL's fixed-point resampling (libImaging/Resample.c): coefficients in 22 fractional bits,
// each pass rounded and clipped to uint8.
const precisionBits = 32 - 8 - 2

// bicubic is PIL's bicubic filter, a = -0.5, support 2.
func bicubic(x float64) float64 {
	const a = -0.5
	if x < 0 {
		x = -x
	}
	if x < 1 {
		return ((a+2)*x-(a+3))*x*x + 1
	}
	if x < 2 {
		return (((x-5)*x+8)*x - 4) * a
	}
	return 0
}

// resampleCoeffs are one axis's filter taps: for output i, taps k[i*ksize:][:count[i]] over
// inputs first[i]…first[i]+count[i]-1.
type resampleCoeffs struct {
	ksize        int
	first, count []int
	k            []int32
}

// precomputeCoeffs is PIL's precompute_coeffs followed by normalize_coeffs_8bpc, for the full
// input range: the filter widens with the downscale factor (antialiasing).
func precomputeCoeffs(inSize, outSize int) resampleCoeffs {
	const support0 = 2.0
	scale := float64(inSize) / float64(outSize)
	filterscale := math.Max(scale, 1)
	support := support0 * filterscale
	ksize := int(math.Ceil(support))*2 + 1
	c := resampleCoeffs{ksize: ksize, first: make([]int, outSize), count: make([]int, outSize), k: make([]int32, outSize*ksize)}
	w := make([]float64, ksize)
	ss := 1 / filterscale
	for xx := range outSize {
		center := (float64(xx) + 0.5) * scale
		xmin := max(int(center-support+0.5), 0) // C's (int) truncates toward zero, as Go's int() does
		xmax := min(int(center+support+0.5), inSize) - xmin
		ww := 0.0
		for x := range xmax {
			w[x] = bicubic((float64(x+xmin) - center + 0.5) * ss)
			ww += w[x]
		}
		for x := range xmax {
			v := w[x]
			if ww != 0 {
				v /= ww
			}
			if v < 0 {
				c.k[xx*ksize+x] = int32(-0.5 + v*(1<<precisionBits))
			} else {
				c.k[xx*ksize+x] = int32(0.5 + v*(1<<precisionBits))
			}
		}
		c.first[xx], c.count[xx] = xmin, xmax
	}
	return c
}

// clip8 is PIL's rounding of a fixed-point sum to uint8.
func clip8(ss int64) uint8 {
	v := ss >> precisionBits
	if v < 0 {
		return 0
	}
	if v > 255 {
		return 255
	}
	return uint8(v)
}

// resizeBicubic resizes interleaved RGB pixels (w×h) to outW×outH as PIL's
// Image.resize(..., BICUBIC) does: horizontal pass first, then vertical, each skipped when that
// axis keeps its size, with rounding to uint8 between the passes.
func resizeBicubic(src []uint8, w, h, outW, outH int) []uint8 {
	const half = int64(1) << (precisionBits - 1)
	cur, curW := src, w
	if outW != w {
		c := precomputeCoeffs(w, outW)
		tmp := make([]uint8, outW*h*3)
		for y := range h {
			row := cur[y*w*3:]
			for x := range outW {
				k := c.k[x*c.ksize:]
				first := c.first[x]
				var s0, s1, s2 = half, half, half
				for i := range c.count[x] {
					p := row[(first+i)*3:]
					ki := int64(k[i])
					s0 += int64(p[0]) * ki
					s1 += int64(p[1]) * ki
					s2 += int64(p[2]) * ki
				}
				o := tmp[(y*outW+x)*3:]
				o[0], o[1], o[2] = clip8(s0), clip8(s1), clip8(s2)
			}
		}
		cur, curW = tmp, outW
	}
	if outH != h {
		c := precomputeCoeffs(h, outH)
		out := make([]uint8, curW*outH*3)
		stride := curW * 3
		for y := range outH {
			k := c.k[y*c.ksize:]
			first := c.first[y]
			o := out[y*stride:]
			for xc := range stride {
				s := half
				for i := range c.count[y] {
					s += int64(cur[(first+i)*stride+xc]) * int64(k[i])
				}
				o[xc] = clip8(s)
			}
		}
		cur = out
	}
	return cur
}
