package engine

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/skein-ai/skein/engine/internal/kernels"
	"github.com/skein-ai/skein/engine/internal/tensor"
	"github.com/skein-ai/skein/safetensors"
)

// The Qwen3-VL vision tower (transformers' Qwen3VLVisionModel), frozen: it runs once per image
// per request, in the engine's dtype with the backend's matmuls, and no gradient goes through it. Its output replaces the
// image pad tokens' embeddings; DeepStack's features are added to the first LM layers' outputs
// at the same positions (vlpass.go).
//
// One image of grid (t, h, w) is t·h·w patch rows of pixel_values, ordered as the image
// processor cuts them: frame, then 2×2 merge block in raster order, then the patch within the
// block. A block of merge² patches becomes one LM token.

// visionTower holds the tower's weights: linears as backend buffers in the engine's dtype,
// transposed to [in, out] as the LM's are; norms, biases and the position table in Go memory.
type visionTower[E float] struct {
	cfg       VisionConfig
	lmHidden  int
	patch     vlinear[E] // the Conv3d over [C, T, P, P] patches with stride = kernel: a linear
	pos       []E
	side      int // the position table is side×side
	blocks    []visionBlock[E]
	merger    visionMerger[E]
	deepstack []visionMerger[E]
}

type vlinear[E float] struct {
	w mat[E] // [in, out]
	b []E    // [out]
}

type visionBlock[E float] struct {
	norm1w, norm1b, norm2w, norm2b []E
	qkv, proj, fc1, fc2            vlinear[E]
}

// visionMerger is the 2×2 patch merger: LayerNorm per patch (the main merger) or over the
// merged row (DeepStack's, postShuffle), then fc1, GELU, fc2 into the LM's hidden size.
type visionMerger[E float] struct {
	normW, normB []E
	fc1, fc2     vlinear[E]
	postShuffle  bool
}

// loadVisionTower takes the tower's weights out of host (checked by loadWeights).
func loadVisionTower[E float](c *Config, host map[string]safetensors.Tensor) (*visionTower[E], int, error) {
	v := c.VisionConfig
	var err error
	bytes := 0
	get := func(name string) []float64 {
		if err != nil {
			return nil
		}
		var x []float64
		if x, err = host[name].Float64(); err != nil {
			err = fmt.Errorf("engine: weight %s: %w", name, err)
		}
		delete(host, name)
		return x
	}
	vec := func(name string) []E {
		x := get(name)
		out := make([]E, len(x))
		for i, f := range x {
			out[i] = E(f)
		}
		bytes += len(out) * int(unsafe.Sizeof(E(0)))
		return out
	}
	lin := func(p string) vlinear[E] {
		s := c.expectedShape(p + ".weight")
		out, in := s[0], tensor.Prod(s[1:])
		x := get(p + ".weight")
		l := vlinear[E]{b: vec(p + ".bias")}
		if err != nil {
			return l
		}
		t, size, e := tensor.NewWeight[E](in, out)
		if e != nil {
			err = fmt.Errorf("engine: placing weight %s: %w", p, e)
			return l
		}
		f := t.V
		for o := range out {
			for i := range in {
				f[i*out+o] = E(x[o*in+i])
			}
		}
		bytes += size
		l.w = t
		return l
	}
	vt := &visionTower[E]{cfg: *v, lmHidden: c.HiddenSize}
	vt.patch = lin("model.visual.patch_embed.proj")
	vt.pos = vec("model.visual.pos_embed.weight")
	vt.side = int(math.Sqrt(float64(v.NumPositionEmbeddings)))
	for i := range v.Depth {
		p := fmt.Sprintf("model.visual.blocks.%d.", i)
		vt.blocks = append(vt.blocks, visionBlock[E]{
			norm1w: vec(p + "norm1.weight"), norm1b: vec(p + "norm1.bias"),
			norm2w: vec(p + "norm2.weight"), norm2b: vec(p + "norm2.bias"),
			qkv: lin(p + "attn.qkv"), proj: lin(p + "attn.proj"),
			fc1: lin(p + "mlp.linear_fc1"), fc2: lin(p + "mlp.linear_fc2"),
		})
	}
	merger := func(p string, post bool) visionMerger[E] {
		return visionMerger[E]{normW: vec(p + "norm.weight"), normB: vec(p + "norm.bias"),
			fc1: lin(p + "linear_fc1"), fc2: lin(p + "linear_fc2"), postShuffle: post}
	}
	vt.merger = merger("model.visual.merger.", false)
	for j := range v.DeepstackVisualIndexes {
		vt.deepstack = append(vt.deepstack, merger(fmt.Sprintf("model.visual.deepstack_merger_list.%d.", j), true))
	}
	return vt, bytes, err
}

// apply is x [n, in] · W + b.
func (l *vlinear[E]) apply(ar step[E], x mat[E]) mat[E] {
	y := ar.MatMul(x, l.w, 0, false)
	ar.AddBias(y, l.b)
	return y
}

func layerNorm[E float](ar step[E], x mat[E], w, b []E, eps float64) mat[E] {
	dim := len(w)
	y := ar.Alloc(x.Dims...)
	kernels.ParallelRows(len(x.V)/dim, func(r0, r1 int) {
		for r := r0; r < r1; r++ {
			xr, yr := x.V[r*dim:(r+1)*dim], y.V[r*dim:(r+1)*dim]
			var mean, vr float64
			for _, v := range xr {
				mean += float64(v)
			}
			mean /= float64(dim)
			for _, v := range xr {
				vr += (float64(v) - mean) * (float64(v) - mean)
			}
			inv := 1 / math.Sqrt(vr/float64(dim)+eps)
			for i, v := range xr {
				yr[i] = E((float64(v)-mean)*inv)*w[i] + b[i]
			}
		}
	})
	return y
}

func geluTanh(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

func geluErf(x float64) float64 { return 0.5 * x * (1 + math.Erf(x/math.Sqrt2)) }

func applyGELU[E float](x []E, f func(float64) float64) {
	kernels.ParallelRows(len(x)/256+1, func(lo, hi int) {
		for i := lo * 256; i < min(hi*256, len(x)); i++ {
			x[i] = E(f(float64(x[i])))
		}
	})
}

// imageFeatures is one image's tower output: the merged embeddings [tokens, D] and DeepStack's
// features, one [tokens, D] per entry of deepstack_visual_indexes.
type imageFeatures struct {
	embeds    []float64
	deepstack [][]float64
	tokens    int
}

// forward runs the tower over one image: patches [t·h·w, C·T·P·P] of grid (t, h, w).
func (vt *visionTower[E]) forward(e *Engine, patches []float64, grid [3]int) (_ imageFeatures, err error) {
	defer recoverCompute(&err)
	ar := newStep[E](e)
	defer ar.Free()
	v := &vt.cfg
	gt, gh, gw := grid[0], grid[1], grid[2]
	m := v.SpatialMergeSize
	n, D := gt*gh*gw, v.HiddenSize
	h := vt.patch.apply(ar, ar.From(patches, n, v.patchDim()))
	rowCol := make([][2]int, n) // each patch's full-resolution row and column
	for i := range n {
		j := i % (gh * gw)
		blk, in := j/(m*m), j%(m*m)
		bh, bw := blk/(gw/m), blk%(gw/m)
		rowCol[i] = [2]int{bh*m + in/m, bw*m + in%m}
	}
	vt.addPositions(h.V, rowCol, gh, gw)

	// 2D rotary: the first half of each head's angles turn with the row, the second with the
	// column (HF's rot_pos_emb, then cat(emb, emb) and rotate_half).
	hd := D / v.NumHeads
	quarter := hd / 4
	cos, sin := make([]E, n*hd/2), make([]E, n*hd/2)
	for i, rc := range rowCol {
		for k := range quarter {
			f := 1 / math.Pow(10000, float64(2*k)/float64(hd/2))
			for a := range 2 {
				ang := float64(rc[a]) * f
				cos[i*hd/2+a*quarter+k], sin[i*hd/2+a*quarter+k] = E(math.Cos(ang)), E(math.Sin(ang))
			}
		}
	}

	var deep [][]float64
	for bi := range vt.blocks {
		b := &vt.blocks[bi]
		mk := ar.Mark()
		att := vt.attention(ar, b, layerNorm(ar, h, b.norm1w, b.norm1b, 1e-6), gt, cos, sin)
		ar.Add(h, att)
		u := b.fc1.apply(ar, layerNorm(ar, h, b.norm2w, b.norm2b, 1e-6))
		if v.HiddenAct == "gelu" {
			applyGELU(u.V, geluErf)
		} else {
			applyGELU(u.V, geluTanh)
		}
		ar.Add(h, b.fc2.apply(ar, u))
		for j, l := range v.DeepstackVisualIndexes {
			if l == bi {
				deep = append(deep, vt.deepstack[j].merge(ar, h, m*m))
			}
		}
		ar.ReleaseExcept(mk, h)
	}
	out := imageFeatures{embeds: vt.merger.merge(ar, h, m*m), deepstack: deep, tokens: n / (m * m)}
	return out, ar.Err()
}

// addPositions adds the learned position table, bilinearly interpolated to the gh×gw grid
// (HF's fast_pos_embed_interpolate: linspace over the table, floor/ceil neighbours).
func (vt *visionTower[E]) addPositions(h []E, rowCol [][2]int, gh, gw int) {
	D, S := vt.cfg.HiddenSize, vt.side
	coord := func(i, n int) (lo, hi int, d float64) {
		x := 0.0
		if n > 1 {
			x = float64(i) * float64(S-1) / float64(n-1)
		}
		lo = int(x)
		return lo, min(lo+1, S-1), x - float64(lo)
	}
	for i, rc := range rowCol {
		r0, r1, dr := coord(rc[0], gh)
		c0, c1, dc := coord(rc[1], gw)
		corners := [4]struct {
			idx int
			w   float64
		}{{r0*S + c0, (1 - dr) * (1 - dc)}, {r0*S + c1, (1 - dr) * dc}, {r1*S + c0, dr * (1 - dc)}, {r1*S + c1, dr * dc}}
		hr := h[i*D : (i+1)*D]
		for k := range hr {
			var s float64
			for _, c := range corners {
				s += c.w * float64(vt.pos[c.idx*D+k])
			}
			hr[k] += E(s)
		}
	}
}

// attention is full (non-causal) attention within each frame of the image: heads batched
// through the backend's matmuls.
func (vt *visionTower[E]) attention(ar step[E], b *visionBlock[E], x mat[E], frames int, cos, sin []E) mat[E] {
	D, H := vt.cfg.HiddenSize, vt.cfg.NumHeads
	n := x.Dims[0]
	hd, per := D/H, n/frames
	qkv := b.qkv.apply(ar, x)
	BH := frames * H
	q, k, v := ar.Alloc(BH, per, hd), ar.Alloc(BH, per, hd), ar.Alloc(BH, per, hd)
	kernels.ParallelRows(n, func(r0, r1 int) {
		for i := r0; i < r1; i++ {
			f, t := i/per, i%per
			cs, sn := cos[i*hd/2:(i+1)*hd/2], sin[i*hd/2:(i+1)*hd/2]
			for hh := range H {
				dst := ((f*H+hh)*per + t) * hd
				src := qkv.V[i*3*D+hh*hd:]
				ropeRow(src[:hd], q.V[dst:dst+hd], cs, sn)
				ropeRow(src[D:D+hd], k.V[dst:dst+hd], cs, sn)
				copy(v.V[dst:dst+hd], src[2*D:2*D+hd])
			}
		}
	})
	p := ar.MatMul(q, k, BH, true) // [BH, per, per]
	scale := E(1 / math.Sqrt(float64(hd)))
	kernels.ParallelRows(BH*per, func(r0, r1 int) {
		for r := r0; r < r1; r++ {
			kernels.SoftmaxRow(p.V[r*per:(r+1)*per], per-1, scale)
		}
	})
	o := ar.MatMul(p, v, BH, false) // [BH, per, hd]
	ot := ar.Alloc(n, D)
	kernels.ParallelRows(n, func(r0, r1 int) {
		for i := r0; i < r1; i++ {
			f, t := i/per, i%per
			for hh := range H {
				src := ((f*H+hh)*per + t) * hd
				copy(ot.V[i*D+hh*hd:i*D+(hh+1)*hd], o.V[src:src+hd])
			}
		}
	})
	return b.proj.apply(ar, ot)
}

// merge turns n patches [n, D] into n/unit LM tokens [n/unit, lmHidden], widened to float64.
func (mg *visionMerger[E]) merge(ar step[E], h mat[E], unit int) []float64 {
	n, D := h.Dims[0], h.Dims[1]
	x := layerNorm(ar, h, mg.normW, mg.normB, 1e-6) // per patch, or over the merged row
	merged := ar.Alloc(n/unit, D*unit)              // the same values, as the matmul's shape
	copy(merged.V, x.V)
	u := mg.fc1.apply(ar, merged)
	applyGELU(u.V, geluErf)
	y := mg.fc2.apply(ar, u)
	out := make([]float64, len(y.V))
	for i, v := range y.V {
		out[i] = float64(v)
	}
	return out
}
