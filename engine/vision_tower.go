package engine

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/skein-ai/skein/engine/internal/backend/cpu"
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
// transposed to [in, out] as the LM's are, norms and biases, as backend tensors; the position
// table in Go memory (interpolated per image on the host).
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
	b mat[E] // [out]
}

type visionBlock[E float] struct {
	norm1w, norm1b, norm2w, norm2b mat[E]
	qkv, proj, fc1, fc2            vlinear[E]
}

// visionMerger is the 2×2 patch merger: LayerNorm per patch (the main merger) or over the
// merged row (DeepStack's, postShuffle), then fc1, GELU, fc2 into the LM's hidden size.
type visionMerger[E float] struct {
	normW, normB mat[E]
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
	vec := func(name string) mat[E] {
		x := get(name)
		t, size, e := cpu.NewValues[E](x, len(x))
		if e != nil && err == nil {
			err = fmt.Errorf("engine: placing weight %s: %w", name, e)
		}
		bytes += size
		return t
	}
	lin := func(p string) vlinear[E] {
		s := c.expectedShape(p + ".weight")
		out, in := s[0], s[1]
		for _, d := range s[2:] {
			in *= d
		}
		x := get(p + ".weight")
		l := vlinear[E]{b: vec(p + ".bias")}
		if err != nil {
			return l
		}
		f := make([]float64, len(x)) // [in, out]
		for o := range out {
			for i := range in {
				f[i*out+o] = x[o*in+i]
			}
		}
		t, size, e := cpu.NewValues[E](f, in, out)
		if e != nil {
			err = fmt.Errorf("engine: placing weight %s: %w", p, e)
			return l
		}
		bytes += size
		l.w = t
		return l
	}
	vt := &visionTower[E]{cfg: *v, lmHidden: c.HiddenSize}
	vt.patch = lin("model.visual.patch_embed.proj")
	for _, x := range get("model.visual.pos_embed.weight") { // interpolated on the host per image (positions)
		vt.pos = append(vt.pos, E(x))
	}
	bytes += len(vt.pos) * int(unsafe.Sizeof(E(0)))
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
	ar.Add(h, ar.From(vt.positions(rowCol, gh, gw), n, D))

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
		att := b.proj.apply(ar, ar.FrameAttention(b.qkv.apply(ar, ar.LayerNorm(h, b.norm1w, b.norm1b, 1e-6)), gt, v.NumHeads, cos, sin))
		ar.Add(h, att)
		u := b.fc1.apply(ar, ar.LayerNorm(h, b.norm2w, b.norm2b, 1e-6))
		ar.GELU(u, v.HiddenAct != "gelu")
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

// positions is the learned position table, bilinearly interpolated to the gh×gw grid at each
// patch's row and column (HF's fast_pos_embed_interpolate: linspace over the table,
// floor/ceil neighbours): [n, D], added to the patches' embeddings.
func (vt *visionTower[E]) positions(rowCol [][2]int, gh, gw int) []float64 {
	D, S := vt.cfg.HiddenSize, vt.side
	coord := func(i, n int) (lo, hi int, d float64) {
		x := 0.0
		if n > 1 {
			x = float64(i) * float64(S-1) / float64(n-1)
		}
		lo = int(x)
		return lo, min(lo+1, S-1), x - float64(lo)
	}
	out := make([]float64, len(rowCol)*D)
	for i, rc := range rowCol {
		r0, r1, dr := coord(rc[0], gh)
		c0, c1, dc := coord(rc[1], gw)
		corners := [4]struct {
			idx int
			w   float64
		}{{r0*S + c0, (1 - dr) * (1 - dc)}, {r0*S + c1, (1 - dr) * dc}, {r1*S + c0, dr * (1 - dc)}, {r1*S + c1, dr * dc}}
		for k := range D {
			var s float64
			for _, c := range corners {
				s += c.w * float64(vt.pos[c.idx*D+k])
			}
			out[i*D+k] = float64(E(s))
		}
	}
	return out
}

// merge turns n patches [n, D] into n/unit LM tokens [n/unit, lmHidden], widened to float64.
func (mg *visionMerger[E]) merge(ar step[E], h mat[E], unit int) []float64 {
	n, D := h.Dims[0], h.Dims[1]
	x := ar.LayerNorm(h, mg.normW, mg.normB, 1e-6) // per patch, or over the merged row
	merged := ar.Reshape(x, n/unit, D*unit)        // the same values, as the matmul's shape
	u := mg.fc1.apply(ar, merged)
	ar.GELU(u, false)
	host := ar.Download(mg.fc2.apply(ar, u))
	out := make([]float64, len(host))
	for i, v := range host {
		out[i] = float64(v)
	}
	return out
}
