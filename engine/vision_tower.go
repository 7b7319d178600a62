package engine

import (
	"fmt"
	"math"

	"github.com/skein-ai/skein/safetensors"
)

// The Qwen3-VL vision tower (transformers' Qwen3VLVisionModel), frozen: it runs once per image
// per request, in float64 on the host, and no gradient goes through it. Its output replaces the
// image pad tokens' embeddings; DeepStack's features are added to the first LM layers' outputs
// at the same positions (vlpass.go).
//
// One image of grid (t, h, w) is t·h·w patch rows of pixel_values, ordered as the image
// processor cuts them: frame, then 2×2 merge block in raster order, then the patch within the
// block. A block of merge² patches becomes one LM token.

// visionTower holds the tower's weights in HF layout ([out, in] for linears).
type visionTower struct {
	cfg       VisionConfig
	lmHidden  int
	patch     vlinear // the Conv3d over [C, T, P, P] patches with stride = kernel: a linear
	pos       []float64
	side      int // the position table is side×side
	blocks    []visionBlock
	merger    visionMerger
	deepstack []visionMerger
}

type vlinear struct {
	w, b    []float64 // [out, in], [out]
	in, out int
}

type visionBlock struct {
	norm1w, norm1b, norm2w, norm2b []float64
	qkv, proj, fc1, fc2            vlinear
}

// visionMerger is the 2×2 patch merger: LayerNorm per patch (the main merger) or over the
// merged row (DeepStack's, postShuffle), then fc1, GELU, fc2 into the LM's hidden size.
type visionMerger struct {
	normW, normB []float64
	fc1, fc2     vlinear
	postShuffle  bool
}

// loadVisionTower takes the tower's weights out of host (checked by loadWeights).
func loadVisionTower(c *Config, host map[string]safetensors.Tensor) (*visionTower, error) {
	v := c.VisionConfig
	var err error
	get := func(name string) []float64 {
		if err != nil {
			return nil
		}
		var x []float64
		x, err = host[name].Float64()
		if err != nil {
			err = fmt.Errorf("engine: weight %s: %w", name, err)
		}
		delete(host, name)
		return x
	}
	lin := func(p string) vlinear {
		s := c.expectedShape(p + ".weight")
		return vlinear{w: get(p + ".weight"), b: get(p + ".bias"), out: s[0], in: s[1]}
	}
	vt := &visionTower{cfg: *v, lmHidden: c.HiddenSize}
	vt.patch = vlinear{w: get("model.visual.patch_embed.proj.weight"), b: get("model.visual.patch_embed.proj.bias"),
		in: v.patchDim(), out: v.HiddenSize}
	vt.pos = get("model.visual.pos_embed.weight")
	vt.side = int(math.Sqrt(float64(v.NumPositionEmbeddings)))
	for i := range v.Depth {
		p := fmt.Sprintf("model.visual.blocks.%d.", i)
		vt.blocks = append(vt.blocks, visionBlock{
			norm1w: get(p + "norm1.weight"), norm1b: get(p + "norm1.bias"),
			norm2w: get(p + "norm2.weight"), norm2b: get(p + "norm2.bias"),
			qkv: lin(p + "attn.qkv"), proj: lin(p + "attn.proj"),
			fc1: lin(p + "mlp.linear_fc1"), fc2: lin(p + "mlp.linear_fc2"),
		})
	}
	merger := func(p string, post bool) visionMerger {
		return visionMerger{normW: get(p + "norm.weight"), normB: get(p + "norm.bias"),
			fc1: lin(p + "linear_fc1"), fc2: lin(p + "linear_fc2"), postShuffle: post}
	}
	vt.merger = merger("model.visual.merger.", false)
	for j := range v.DeepstackVisualIndexes {
		vt.deepstack = append(vt.deepstack, merger(fmt.Sprintf("model.visual.deepstack_merger_list.%d.", j), true))
	}
	return vt, err
}

// apply is x [n, in] · Wᵀ + b.
func (l *vlinear) apply(x []float64, n int) []float64 {
	y := make([]float64, n*l.out)
	parallelRows(n, func(r0, r1 int) {
		for r := r0; r < r1; r++ {
			xr := x[r*l.in : (r+1)*l.in]
			for o := range l.out {
				w := l.w[o*l.in : (o+1)*l.in]
				s := l.b[o]
				for i, xv := range xr {
					s += xv * w[i]
				}
				y[r*l.out+o] = s
			}
		}
	})
	return y
}

func layerNorm(x, w, b []float64, dim int, eps float64) []float64 {
	y := make([]float64, len(x))
	for r := 0; r < len(x)/dim; r++ {
		xr, yr := x[r*dim:(r+1)*dim], y[r*dim:(r+1)*dim]
		var mean, vr float64
		for _, v := range xr {
			mean += v
		}
		mean /= float64(dim)
		for _, v := range xr {
			vr += (v - mean) * (v - mean)
		}
		inv := 1 / math.Sqrt(vr/float64(dim)+eps)
		for i, v := range xr {
			yr[i] = (v-mean)*inv*w[i] + b[i]
		}
	}
	return y
}

func geluTanh(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

func geluErf(x float64) float64 { return 0.5 * x * (1 + math.Erf(x/math.Sqrt2)) }

// imageFeatures is one image's tower output: the merged embeddings [tokens, D] and DeepStack's
// features, one [tokens, D] per entry of deepstack_visual_indexes.
type imageFeatures struct {
	embeds    []float64
	deepstack [][]float64
	tokens    int
}

// forward runs the tower over one image: patches [t·h·w, C·T·P·P] of grid (t, h, w).
func (vt *visionTower) forward(patches []float64, grid [3]int) imageFeatures {
	v := &vt.cfg
	gt, gh, gw := grid[0], grid[1], grid[2]
	m := v.SpatialMergeSize
	n, D := gt*gh*gw, v.HiddenSize
	h := vt.patch.apply(patches, n)
	rowCol := make([][2]int, n) // each patch's full-resolution row and column
	for i := range n {
		j := i % (gh * gw)
		blk, in := j/(m*m), j%(m*m)
		bh, bw := blk/(gw/m), blk%(gw/m)
		rowCol[i] = [2]int{bh*m + in/m, bw*m + in%m}
	}
	vt.addPositions(h, rowCol, gh, gw)

	// 2D rotary: the first half of each head's angles turn with the row, the second with the
	// column (HF's rot_pos_emb, then cat(emb, emb) and rotate_half).
	hd := D / v.NumHeads
	quarter := hd / 4
	cos, sin := make([]float64, n*hd/2), make([]float64, n*hd/2)
	for i, rc := range rowCol {
		for k := range quarter {
			f := 1 / math.Pow(10000, float64(2*k)/float64(hd/2))
			for a := range 2 {
				ang := float64(rc[a]) * f
				cos[i*hd/2+a*quarter+k], sin[i*hd/2+a*quarter+k] = math.Cos(ang), math.Sin(ang)
			}
		}
	}

	var deep [][]float64
	for bi := range vt.blocks {
		b := &vt.blocks[bi]
		x := layerNorm(h, b.norm1w, b.norm1b, D, 1e-6)
		att := vt.attention(b, x, n, gt, cos, sin)
		for i, a := range att {
			h[i] += a
		}
		x = layerNorm(h, b.norm2w, b.norm2b, D, 1e-6)
		u := b.fc1.apply(x, n)
		for i, a := range u {
			if v.HiddenAct == "gelu" {
				u[i] = geluErf(a)
			} else {
				u[i] = geluTanh(a)
			}
		}
		for i, a := range b.fc2.apply(u, n) {
			h[i] += a
		}
		for j, l := range v.DeepstackVisualIndexes {
			if l == bi {
				deep = append(deep, vt.deepstack[j].merge(h, n, D, m*m))
			}
		}
	}
	return imageFeatures{embeds: vt.merger.merge(h, n, D, m*m), deepstack: deep, tokens: n / (m * m)}
}

// addPositions adds the learned position table, bilinearly interpolated to the gh×gw grid
// (HF's fast_pos_embed_interpolate: linspace over the table, floor/ceil neighbours).
func (vt *visionTower) addPositions(h []float64, rowCol [][2]int, gh, gw int) {
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
		for _, c := range corners {
			p := vt.pos[c.idx*D : (c.idx+1)*D]
			for k := range hr {
				hr[k] += c.w * p[k]
			}
		}
	}
}

// attention is full (non-causal) attention within each frame of the image.
func (vt *visionTower) attention(b *visionBlock, x []float64, n, frames int, cos, sin []float64) []float64 {
	D, H := vt.cfg.HiddenSize, vt.cfg.NumHeads
	hd := D / H
	qkv := b.qkv.apply(x, n)
	q, k := make([]float64, n*D), make([]float64, n*D)
	for i := range n {
		cs, sn := cos[i*hd/2:(i+1)*hd/2], sin[i*hd/2:(i+1)*hd/2]
		for hh := range H {
			ropeRow(qkv[i*3*D+hh*hd:i*3*D+(hh+1)*hd], q[i*D+hh*hd:i*D+(hh+1)*hd], cs, sn)
			ropeRow(qkv[i*3*D+D+hh*hd:i*3*D+D+(hh+1)*hd], k[i*D+hh*hd:i*D+(hh+1)*hd], cs, sn)
		}
	}
	o := make([]float64, n*D)
	per := n / frames
	scale := 1 / math.Sqrt(float64(hd))
	parallelRows(n*H, func(r0, r1 int) {
		p := make([]float64, per)
		for r := r0; r < r1; r++ {
			i, hh := r/H, r%H
			f0 := i / per * per
			qi := q[i*D+hh*hd : i*D+(hh+1)*hd]
			mx := math.Inf(-1)
			for j := range per {
				kj := k[(f0+j)*D+hh*hd : (f0+j)*D+(hh+1)*hd]
				var s float64
				for d, qv := range qi {
					s += qv * kj[d]
				}
				p[j] = s * scale
				mx = max(mx, p[j])
			}
			var sum float64
			for j := range p {
				p[j] = math.Exp(p[j] - mx)
				sum += p[j]
			}
			oi := o[i*D+hh*hd : i*D+(hh+1)*hd]
			for j, pj := range p {
				vj := qkv[(f0+j)*3*D+2*D+hh*hd : (f0+j)*3*D+2*D+(hh+1)*hd]
				for d, vv := range vj {
					oi[d] += pj / sum * vv
				}
			}
		}
	})
	return b.proj.apply(o, n)
}

// merge turns n patches [n, D] into n/unit LM tokens [n/unit, lmHidden].
func (mg *visionMerger) merge(h []float64, n, D, unit int) []float64 {
	var x []float64
	if mg.postShuffle {
		x = layerNorm(h, mg.normW, mg.normB, D*unit, 1e-6)
	} else {
		x = layerNorm(h, mg.normW, mg.normB, D, 1e-6)
	}
	u := mg.fc1.apply(x, n/unit)
	for i, a := range u {
		u[i] = geluErf(a)
	}
	return mg.fc2.apply(u, n/unit)
}
