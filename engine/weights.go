package engine

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/skein-ai/skein/internal/filebound"
	"github.com/skein-ai/skein/safetensors"
)

// hostTensor is a tensor held in Go memory, row-major, in float64 so one code path serves
// the f32 engine and the f64 engine used by gradient checks. At load each weight is widened to
// one of these just long enough to be transposed and converted to the engine's dtype.
type hostTensor struct {
	shape []int
	data  []float64
}

// weightNames lists the HF tensor names the model needs, in a fixed order.
func (c *Config) weightNames() []string {
	names := []string{c.lm() + "embed_tokens.weight"}
	for l := range c.NumHiddenLayers {
		p := c.layerPrefix(l)
		names = append(names, p+"input_layernorm.weight")
		if c.isDeltaNet(l) {
			for _, m := range deltaNetWeights {
				names = append(names, p+"linear_attn."+m)
			}
			names = append(names, p+"post_attention_layernorm.weight")
			names = append(names, c.ffnWeights(l)...)
			continue
		}
		for _, m := range []string{"q_proj", "k_proj", "v_proj", "o_proj"} {
			names = append(names, p+"self_attn."+m+".weight")
		}
		if c.AttentionBias {
			for _, m := range []string{"q_proj", "k_proj", "v_proj"} {
				names = append(names, p+"self_attn."+m+".bias")
			}
		}
		if c.family().headNorm {
			names = append(names, p+"self_attn.q_norm.weight", p+"self_attn.k_norm.weight")
		}
		names = append(names, p+"post_attention_layernorm.weight")
		names = append(names, c.ffnWeights(l)...)
	}
	names = append(names, c.lm()+"norm.weight")
	if !c.TieWordEmbeddings {
		names = append(names, "lm_head.weight")
	}
	return names
}

// deltaNetWeights are a Gated DeltaNet layer's tensors as the checkpoint names them, after
// linear_attn. (in_proj_qkv is split at load into in_proj_q, in_proj_k and in_proj_v).
var deltaNetWeights = []string{"in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight",
	"conv1d.weight", "dt_bias", "A_log", "norm.weight", "out_proj.weight"}

// fusedParts are the row blocks of a DeltaNet's fused in_proj_qkv, in order: all query heads,
// all key heads, all value heads (blocked, not interleaved per head).
var fusedParts = []string{"in_proj_q", "in_proj_k", "in_proj_v"}

// modelWeightNames is weightNames with each fused in_proj_qkv replaced by its three parts: the
// names loadModel places (loadWeights splits the fused tensors).
func (c *Config) modelWeightNames() []string {
	var out []string
	for _, n := range c.weightNames() {
		if base, ok := strings.CutSuffix(n, "linear_attn.in_proj_qkv.weight"); ok {
			for _, part := range fusedParts {
				out = append(out, base+"linear_attn."+part+".weight")
			}
			continue
		}
		out = append(out, n)
	}
	return out
}

// splitFused replaces each fused in_proj_qkv of host by its query, key and value row blocks
// (views of the same bytes), so that each is an ordinary linear with its own LoRA, as Tinker
// trains them.
func (c *Config) splitFused(host map[string]safetensors.Tensor) error {
	Kd, Vd := c.LinearNumKeyHeads*c.LinearKeyHeadDim, c.LinearNumValueHeads*c.LinearValueHeadDim
	for l := range c.NumHiddenLayers {
		if !c.isDeltaNet(l) {
			continue
		}
		name := c.layerPrefix(l) + "linear_attn.in_proj_qkv.weight"
		t, ok := host[name]
		if !ok {
			continue
		}
		rows, cols := t.Shape[0], t.Shape[1]
		if rows*cols == 0 || len(t.Data)%(rows*cols) != 0 {
			return fmt.Errorf("engine: weight %s: %d bytes for shape %v", name, len(t.Data), t.Shape)
		}
		rowBytes := len(t.Data) / rows
		r0 := 0
		for i, n := range []int{Kd, Kd, Vd} {
			part := c.layerPrefix(l) + "linear_attn." + fusedParts[i] + ".weight"
			host[part] = safetensors.Tensor{DType: t.DType, Shape: []int{n, cols}, Data: t.Data[r0*rowBytes : (r0+n)*rowBytes]}
			r0 += n
		}
		delete(host, name)
	}
	return nil
}

// plusOneNorm reports the norm weights a zero-centred family multiplies as (1 + w): every
// RMSNorm but the DeltaNet's gated one.
func (c *Config) plusOneNorm(name string) bool {
	if !c.family().zeroCentredNorms || strings.Contains(name, ".linear_attn.") {
		return false
	}
	return strings.HasSuffix(name, "layernorm.weight") || strings.HasSuffix(name, "q_norm.weight") ||
		strings.HasSuffix(name, "k_norm.weight") || name == c.lm()+"norm.weight"
}

// deltaNetShape is the HF shape of a DeltaNet tensor (nil: not one).
func (c *Config) deltaNetShape(name string) []int {
	i := strings.Index(name, ".linear_attn.")
	if i < 0 {
		return nil
	}
	D := c.HiddenSize
	Hv, Kd, Vd := c.LinearNumValueHeads, c.LinearNumKeyHeads*c.LinearKeyHeadDim, c.LinearNumValueHeads*c.LinearValueHeadDim
	switch name[i+len(".linear_attn."):] {
	case "in_proj_qkv.weight":
		return []int{2*Kd + Vd, D}
	case "in_proj_q.weight", "in_proj_k.weight":
		return []int{Kd, D}
	case "in_proj_v.weight", "in_proj_z.weight":
		return []int{Vd, D}
	case "in_proj_a.weight", "in_proj_b.weight":
		return []int{Hv, D}
	case "conv1d.weight":
		return []int{2*Kd + Vd, 1, c.LinearConvKernelDim}
	case "dt_bias", "A_log":
		return []int{Hv}
	case "norm.weight":
		return []int{c.LinearValueHeadDim}
	case "out_proj.weight":
		return []int{D, Vd}
	}
	return nil
}

// allWeightNames is weightNames and the family's other weights (a vision tower's).
func (c *Config) allWeightNames() []string {
	names := c.weightNames()
	if f, ok := c.architecture().(extraWeighter); ok {
		names = append(names, f.extraWeights(c)...)
	}
	return names
}

// expectedShape gives the HF shape of a named weight.
func (c *Config) expectedShape(name string) []int {
	D, F, hd := c.HiddenSize, c.IntermediateSize, c.HeadDim
	qd, kvd := c.NumAttentionHeads*hd, c.NumKeyValueHeads*hd
	suffix := func(s string) bool { return len(name) >= len(s) && name[len(name)-len(s):] == s }
	if f, ok := c.architecture().(extraWeighter); ok {
		if s := f.extraShape(c, name); s != nil {
			return s
		}
	}
	if s := c.deltaNetShape(name); s != nil {
		return s
	}
	if s := c.moeShape(name); s != nil {
		return s
	}
	if c.family().gatedAttention && suffix("q_proj.weight") {
		return []int{2 * qd, D} // each head's queries, then its gate rows
	}
	switch {
	case name == c.lm()+"embed_tokens.weight", name == "lm_head.weight":
		return []int{c.VocabSize, D}
	case suffix("layernorm.weight"), name == c.lm()+"norm.weight":
		return []int{D}
	case suffix("q_norm.weight"), suffix("k_norm.weight"):
		return []int{hd}
	case suffix("q_proj.weight"):
		return []int{qd, D}
	case suffix("k_proj.weight"), suffix("v_proj.weight"):
		return []int{kvd, D}
	case suffix("o_proj.weight"):
		return []int{D, qd}
	case suffix("q_proj.bias"):
		return []int{qd}
	case suffix("k_proj.bias"), suffix("v_proj.bias"):
		return []int{kvd}
	case suffix("gate_proj.weight"), suffix("up_proj.weight"):
		return []int{F, D}
	case suffix("down_proj.weight"):
		return []int{D, F}
	}
	return nil
}

// loadWeights reads model.safetensors or the shards named in model.safetensors.index.json and
// checks every weight's shape. The tensors alias the file bytes: widening happens one weight at a
// time in newEngine, so loading never holds a float64 copy of the whole model.
func loadWeights(dir string, c *Config, log *slog.Logger) (map[string]safetensors.Tensor, *loadProgress, error) {
	files := []string{"model.safetensors"}
	if index := filepath.Join(dir, "model.safetensors.index.json"); fileExists(index) {
		b, err := filebound.Read(index, maxIndexBytes)
		if err != nil {
			return nil, nil, fmt.Errorf("engine: %w", err)
		}
		var idx struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(b, &idx); err != nil {
			return nil, nil, fmt.Errorf("engine: parsing safetensors index: %w", err)
		}
		seen := map[string]bool{}
		files = files[:0]
		for _, f := range idx.WeightMap {
			if !seen[f] {
				seen[f] = true
				files = append(files, f)
			}
		}
		sort.Strings(files)
	}
	want := map[string]bool{}
	for _, n := range c.allWeightNames() {
		want[n] = true
	}
	paths := make([]string, len(files))
	for i, f := range files {
		paths[i] = filepath.Join(dir, f)
	}
	progress := newLoadProgress(log, dir, paths)
	out := map[string]safetensors.Tensor{}
	skipped := 0
	for _, path := range paths {
		st, err := readWeightsFile(path, progress)
		if err != nil {
			return nil, nil, fmt.Errorf("engine: %w", err)
		}
		tensors, err := c.splitFusedExperts(st.Tensors)
		if err != nil {
			return nil, nil, err
		}
		for name, t := range tensors {
			if !want[name] {
				if skippedWeight(name) && c.family().zeroCentredNorms {
					skipped++
				}
				continue // e.g. rotary_emb.inv_freq in old checkpoints
			}
			exp := c.expectedShape(name)
			if !slices.Equal(exp, t.Shape) {
				return nil, nil, fmt.Errorf("engine: weight %s has shape %v, config implies %v", name, t.Shape, exp)
			}
			out[name] = t
		}
	}
	for n := range want {
		if _, ok := out[n]; !ok {
			return nil, nil, fmt.Errorf("engine: weight %s missing from %s", n, dir)
		}
	}
	if skipped > 0 && log != nil {
		log.Info("not loading the vision tower (model.visual.*) and MTP draft block (mtp.*): skein serves Qwen3.5 text-only",
			"tensors", skipped)
	}
	if err := c.splitFused(out); err != nil {
		return nil, nil, err
	}
	return out, progress, nil
}
