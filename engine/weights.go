package engine

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"

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
		for _, m := range []string{"gate_proj", "up_proj", "down_proj"} {
			names = append(names, p+"mlp."+m+".weight")
		}
	}
	names = append(names, c.lm()+"norm.weight")
	if !c.TieWordEmbeddings {
		names = append(names, "lm_head.weight")
	}
	return names
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
	if b, err := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json")); err == nil {
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
	for _, path := range paths {
		st, err := readWeightsFile(path, progress)
		if err != nil {
			return nil, nil, fmt.Errorf("engine: %w", err)
		}
		for name, t := range st.Tensors {
			if !want[name] {
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
	return out, progress, nil
}
