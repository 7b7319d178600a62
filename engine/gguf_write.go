package engine

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/skein-ai/skein/engine/gguf"
	"github.com/skein-ai/skein/engine/internal/num"
	"github.com/skein-ai/skein/engine/internal/quant"
	"github.com/skein-ai/skein/internal/filebound"
	"github.com/skein-ai/skein/safetensors"
)

// Writing GGUF: a base model from a Hugging Face directory (for llama.cpp, Ollama and skein's own
// GGUF loader), and a trained LoRA adapter as llama.cpp's adapter format (Ollama's ADAPTER).

// ggufArchOf is the GGUF architecture name of a config's family.
func ggufArchOf(c *Config) (string, error) {
	for arch, class := range ggufArchs {
		if len(c.Architectures) > 0 && c.Architectures[0] == class {
			return arch, nil
		}
	}
	return "", fmt.Errorf("engine: a %s model has no GGUF architecture skein writes (llama, qwen2, qwen3, qwen3moe)", c.Arch)
}

// GGUFTypes are the tensor types WriteGGUF writes projections in, by name.
var GGUFTypes = map[string]gguf.GGMLType{"f32": gguf.F32, "f16": gguf.F16, "bf16": gguf.BF16, "q8_0": gguf.Q8_0, "q4_k": gguf.Q4_K,
	"q6_k": gguf.Q6_K, "q4_k_m": GGUFQ4_K_M}

// GGUFQ4_K_M stands for llama.cpp's Q4_K_M mix where WriteGGUF takes a tensor type: no ggml type
// itself, but each projection in the type the q4_k_m precision keeps it in (Q4_K, Q6_K, or
// Q8_0 for a head whose rows are not whole Q6_K blocks), as llama-quantize writes them.
const GGUFQ4_K_M gguf.GGMLType = 1 << 30

// llama_ftype of a file whose projections are of one type (LLAMA_FTYPE_MOSTLY_*; Q4_K_M's is 15).
var ggufFileType = map[gguf.GGMLType]uint32{gguf.F32: 0, gguf.F16: 1, gguf.Q8_0: 7, gguf.Q4_K: 15, gguf.Q6_K: 18,
	gguf.BF16: 32, GGUFQ4_K_M: 15}

// ggufTypeOfFormat is the ggml type of an engine block format.
var ggufTypeOfFormat = map[*quant.Format]gguf.GGMLType{quant.Q8_0: gguf.Q8_0, quant.Q4_K: gguf.Q4_K, quant.Q6_K: gguf.Q6_K}

// WriteGGUF writes the Hugging Face model in dir (config.json, safetensors, tokenizer.json and
// tokenizer_config.json) as one GGUF file, as llama.cpp's convert_hf_to_gguf lays it out: its
// names, its metadata keys, llama's q/k rows permuted, llama3 rope scaling as rope_freqs. The
// projections (and an untied head) and the embedding are written in typ, norms and biases F32.
// Q8_0, Q4_K and Q6_K blocks are the engine's quantizers' (bit for bit ggml's reference ones);
// GGUFQ4_K_M writes each projection, and the embedding, in its Q4_K_M type.
func WriteGGUF(dir, out string, typ gguf.GGMLType, name string) error {
	c, err := LoadConfig(dir)
	if err != nil {
		return err
	}
	arch, err := ggufArchOf(c)
	if err != nil {
		return err
	}
	host, _, err := loadWeights(dir, c, nil)
	if err != nil {
		return err
	}
	w := gguf.NewWriter()
	if err := ggufHyperparameters(w, c, arch, typ, name); err != nil {
		return err
	}
	if err := ggufTokenizer(w, dir, c); err != nil {
		return err
	}
	if err := ggufRopeFreqs(w, c); err != nil {
		return err
	}
	if err := ggufTensors(w, c, host, typ); err != nil {
		return err
	}
	return w.WriteFile(out)
}

// ggufHyperparameters sets the file's general.* keys and the architecture's shape, attention,
// rope and (Qwen3-MoE) expert keys.
func ggufHyperparameters(w *gguf.Writer, c *Config, arch string, typ gguf.GGMLType, name string) error {
	w.Set("general.architecture", arch)
	w.Set("general.type", "model")
	w.Set("general.name", name)
	w.Set("general.file_type", ggufFileType[typ])
	if typ == gguf.Q8_0 || typ == gguf.Q4_K || typ == gguf.Q6_K || typ == GGUFQ4_K_M {
		w.Set("general.quantization_version", uint32(2))
	}
	u := func(key string, v int) { w.Set(arch+"."+key, uint32(v)) }
	u("context_length", c.MaxPositionEmbeddings)
	u("embedding_length", c.HiddenSize)
	u("block_count", c.NumHiddenLayers)
	u("feed_forward_length", c.IntermediateSize)
	u("attention.head_count", c.NumAttentionHeads)
	u("attention.head_count_kv", c.NumKeyValueHeads)
	u("attention.key_length", c.HeadDim)
	u("attention.value_length", c.HeadDim)
	u("rope.dimension_count", c.HeadDim)
	u("vocab_size", c.VocabSize)
	if c.NumExperts > 0 {
		// llama.cpp's qwen3moe: a mixture on every layer, its weights renormalised.
		if !c.moeRenorm {
			return fmt.Errorf("engine: llama.cpp's qwen3moe renormalises the routing weights; this model's norm_topk_prob is false")
		}
		for l := range c.NumHiddenLayers {
			if !c.isMoE(l) {
				return fmt.Errorf("engine: layer %d is dense (mlp_only_layers or decoder_sparse_step): llama.cpp's qwen3moe has a mixture of experts on every layer", l)
			}
		}
		u("expert_count", c.NumExperts)
		u("expert_used_count", c.NumExpertsPerTok)
		u("expert_feed_forward_length", c.MoeIntermediateSize)
	}
	w.Set(arch+".rope.freq_base", float32(c.RopeTheta))
	w.Set(arch+".attention.layer_norm_rms_epsilon", float32(c.RMSNormEps))
	return nil
}

// ggufTokenizer writes the tokenizer (tokenizer.json, and tokenizer_config.json's chat template
// and special tokens when there is one) as tokenizer.ggml.* keys.
func ggufTokenizer(w *gguf.Writer, dir string, c *Config) error {
	tokJSON, err := filebound.Read(filepath.Join(dir, "tokenizer.json"), maxTokenizerBytes)
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	cfgJSON, err := filebound.Read(filepath.Join(dir, "tokenizer_config.json"), maxTokenizerBytes)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("engine: %w", err)
	}
	if err := gguf.WriteTokenizer(w, tokJSON, cfgJSON, c.VocabSize); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	return nil
}

// ggufRopeFreqs writes llama3 rope scaling as llama.cpp takes it: per-frequency divisors of the
// inverse frequencies (rope_freqs.weight). Other scalings are refused, not silently dropped.
func ggufRopeFreqs(w *gguf.Writer, c *Config) error {
	rs := c.RopeScaling
	if rs != nil && (rs.RopeType == "llama3" || rs.Type == "llama3") {
		scaled := c.invFreq()
		plain := *c
		plain.RopeScaling = nil
		base := plain.invFreq()
		f := make([]float32, len(base))
		for i := range f {
			f[i] = float32(base[i] / scaled[i])
		}
		w.AddF32("rope_freqs.weight", []int{len(f)}, f)
	} else if rs != nil && (rs.RopeType != "" && rs.RopeType != "default" || rs.Type != "" && rs.Type != "default") {
		return fmt.Errorf("engine: rope_scaling %+v is not written to GGUF", *rs)
	}
	return nil
}

// ggufTensors writes every weight under its GGUF name in its type (ggufTensorType), llama's q/k
// rows permuted, ggml's dims reversed from torch's, and a layer's experts stacked after its router.
func ggufTensors(w *gguf.Writer, c *Config, host map[string]safetensors.Tensor, typ gguf.GGMLType) error {
	for _, hf := range c.weightNames() {
		if strings.Contains(hf, ".mlp.experts.") {
			continue // written stacked, after the layer's router
		}
		g, ok := ggufName(hf)
		if !ok {
			return fmt.Errorf("engine: weight %s has no GGUF name", hf)
		}
		t := host[hf]
		v, err := t.Float32()
		if err != nil {
			return fmt.Errorf("engine: weight %s: %w", hf, err)
		}
		shape := t.Shape
		tt := ggufTensorType(c, hf, typ)
		data, err := encodeGGUF(v, shape, tt)
		if err != nil {
			return fmt.Errorf("engine: weight %s: %w", hf, err)
		}
		if c.Arch == ArchLlama && (strings.HasSuffix(hf, "q_proj.weight") || strings.HasSuffix(hf, "k_proj.weight")) {
			heads := c.NumAttentionHeads
			if strings.HasSuffix(hf, "k_proj.weight") {
				heads = c.NumKeyValueHeads
			}
			data = permuteRows(data, shape[0], heads, false)
		}
		dims := make([]int, len(shape))
		for i, d := range shape {
			dims[len(shape)-1-i] = d
		}
		w.AddTensor(g, tt, dims, data)
		if strings.HasSuffix(hf, ".mlp.gate.weight") {
			if err := addStackedExperts(w, c, host, hf, typ); err != nil {
				return err
			}
		}
	}
	return nil
}

// ggufTensorType is the type weight hf is written in for a file of type typ: projections (and
// an untied head) in typ (Q4_K_M: each in its mix's type), the embedding in typ in a quantized
// file (the blocks the engine's load makes), routers, norms and biases in F32.
func ggufTensorType(c *Config, hf string, typ gguf.GGMLType) gguf.GGMLType {
	switch {
	case isRouterWeight(hf): // float32, as llama.cpp keeps ffn_gate_inp
	case isLinearWeight(hf) && typ == GGUFQ4_K_M:
		return ggufTypeOfFormat[q4KMFormat(c, hf)]
	case isLinearWeight(hf):
		return typ
	case hf == c.lm()+"embed_tokens.weight" && typ == GGUFQ4_K_M:
		return ggufTypeOfFormat[embeddingFormat(Options{Precision: PrecisionQ4_K_M}, c)]
	case hf == c.lm()+"embed_tokens.weight" && typ != gguf.F32:
		return typ // in a quantized file the blocks the engine's load makes (precision.go), as Q4_K_M files keep token_embd
	}
	return gguf.F32
}

// addStackedExperts writes a layer's experts (after its router routerName) as llama.cpp's
// stacked tensors: ffn_{gate,up,down}_exps [E, out, in] in torch's order (ggml dims [in, out, E]),
// each expert's rows in typ (under Q4_K_M, the down projections' type by layer).
func addStackedExperts(w *gguf.Writer, c *Config, host map[string]safetensors.Tensor, routerName string, typ gguf.GGMLType) error {
	p := strings.TrimSuffix(routerName, "gate.weight") + "experts."
	blk := strings.TrimSuffix(strings.TrimPrefix(routerName, "model.layers."), ".mlp.gate.weight")
	for _, gp := range [][2]string{{"ffn_gate_exps.weight", "gate_proj"}, {"ffn_up_exps.weight", "up_proj"}, {"ffn_down_exps.weight", "down_proj"}} {
		g, proj := gp[0], gp[1]
		var all []float32
		var shape []int
		for e := range c.NumExperts {
			name := p + strconv.Itoa(e) + "." + proj + ".weight"
			v, err := host[name].Float32()
			if err != nil {
				return fmt.Errorf("engine: weight %s: %w", name, err)
			}
			all = append(all, v...)
			shape = host[name].Shape
		}
		tt := typ
		if typ == GGUFQ4_K_M {
			tt = ggufTypeOfFormat[q4KMFormat(c, p+"0."+proj+".weight")]
		}
		data, err := encodeGGUF(all, []int{c.NumExperts * shape[0], shape[1]}, tt)
		if err != nil {
			return fmt.Errorf("engine: %s experts: %w", p+proj, err)
		}
		w.AddTensor("blk."+blk+"."+g, tt, []int{shape[1], shape[0], c.NumExperts}, data)
	}
	return nil
}

// encodeGGUF writes float32 values of a tensor (rows along its last dimension) as type t.
func encodeGGUF(v []float32, shape []int, t gguf.GGMLType) ([]byte, error) {
	switch t {
	case gguf.F32:
		b := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
		}
		return b, nil
	case gguf.F16:
		b := make([]byte, 2*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint16(b[2*i:], quant.F32ToF16(x))
		}
		return b, nil
	case gguf.BF16:
		b := make([]byte, 2*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint16(b[2*i:], num.BF16Of(x))
		}
		return b, nil
	case gguf.Q8_0:
		return quant.QuantizeQ8_0(v, shape[len(shape)-1])
	case gguf.Q4_K:
		return quant.QuantizeQ4_K(v, shape[len(shape)-1])
	case gguf.Q6_K:
		return quant.QuantizeQ6_K(v, shape[len(shape)-1])
	}
	return nil, fmt.Errorf("cannot write type %s", t)
}

// ExportAdapterGGUF writes the PEFT adapter saved in adapterDir (adapter_model.safetensors,
// adapter_config.json) as a llama.cpp LoRA adapter for base, the config of the model it was
// trained on: general.type adapter, adapter.type lora, adapter.lora.alpha, and per adapted module
// <GGUF weight name>.lora_a [r, in] and .lora_b [out, r] in float32 (torch order: ggml's ne are
// the reverse), llama's q/k lora_b rows permuted as the base's q/k rows are. llama.cpp scales the
// product by alpha/r, as PEFT does. A mixture's expert LoRAs become LoRAs of its stacked expert
// tensors (addExpertLoRA). A LoRA on the head of a tied model is refused: llama.cpp's model has
// no output weight to put it on.
func ExportAdapterGGUF(adapterDir string, base *Config, out string) error {
	w, err := adapterGGUF(adapterDir, base)
	if err != nil {
		return err
	}
	return w.WriteFile(out)
}

// WriteAdapterGGUF is ExportAdapterGGUF to a writer: everything is read and checked before the
// first byte is written, so an error before any write means nothing was sent.
func WriteAdapterGGUF(adapterDir string, base *Config, out io.Writer) error {
	w, err := adapterGGUF(adapterDir, base)
	if err != nil {
		return err
	}
	return w.Write(out)
}

func adapterGGUF(adapterDir string, base *Config) (*gguf.Writer, error) {
	arch, err := ggufArchOf(base)
	if err != nil {
		return nil, err
	}
	lc, err := ReadAdapterConfig(adapterDir)
	if err != nil {
		return nil, fmt.Errorf("engine: reading adapter: %w", err)
	}
	if lc.Rank < 1 || lc.Rank > 1<<16 {
		return nil, fmt.Errorf("engine: adapter rank %d is out of range", lc.Rank)
	}
	alpha := lc.Alpha
	if alpha == 0 {
		alpha = 32 // the engine's default, which a saved adapter always states
	}
	mods := base.loraModules(lc.spec())
	if len(mods) == 0 {
		return nil, fmt.Errorf("engine: the adapter in %s adapts no module", adapterDir)
	}
	want := map[string][]int{}
	for _, m := range mods {
		if m.Experts > 0 {
			want["base_model.model."+m.Path+".lora_A.weight"] = m.aFile(lc.Rank)
			want["base_model.model."+m.Path+".lora_B.weight"] = m.bFile(lc.Rank)
			continue
		}
		if m.Path == "lm_head" && base.TieWordEmbeddings {
			return nil, fmt.Errorf("engine: the adapter has a LoRA on lm_head, which a tied-embedding model does not have in GGUF (llama.cpp refuses it too)")
		}
		want["base_model.model."+m.Path+".lora_A.weight"] = []int{lc.Rank, m.In}
		want["base_model.model."+m.Path+".lora_B.weight"] = []int{m.Out, lc.Rank}
	}
	tensors, err := readTensors(filepath.Join(adapterDir, AdapterWeightsFile), want, nil)
	if err != nil {
		return nil, fmt.Errorf("engine: reading adapter %s: %w", adapterDir, err)
	}
	w := gguf.NewWriter()
	w.Set("general.architecture", arch)
	w.Set("general.type", "adapter")
	w.Set("adapter.type", "lora")
	w.Set("adapter.lora.alpha", float32(alpha))
	for _, m := range mods {
		if m.Experts > 0 {
			addExpertLoRA(w, m, lc.Rank, tensors)
			continue
		}
		g, ok := ggufName(m.Path + ".weight")
		if !ok {
			return nil, fmt.Errorf("engine: module %s has no GGUF name", m.Path)
		}
		a := tensors["base_model.model."+m.Path+".lora_A.weight"]
		b := tensors["base_model.model."+m.Path+".lora_B.weight"]
		af, bf := make([]float32, len(a)), make([]float32, len(b))
		for i, x := range a {
			af[i] = float32(x)
		}
		for i, x := range b {
			bf[i] = float32(x)
		}
		bb, _ := encodeGGUF(bf, []int{m.Out, lc.Rank}, gguf.F32)
		if base.Arch == ArchLlama && (strings.HasSuffix(m.Path, "q_proj") || strings.HasSuffix(m.Path, "k_proj")) {
			heads := base.NumAttentionHeads
			if strings.HasSuffix(m.Path, "k_proj") {
				heads = base.NumKeyValueHeads
			}
			bb = permuteRows(bb, m.Out, heads, false)
		}
		w.AddF32(g+".lora_a", []int{lc.Rank, m.In}, af)
		w.AddTensor(g+".lora_b", gguf.F32, []int{lc.Rank, m.Out}, bb)
	}
	return w, nil
}

// LoadModelConfig reads the config of a model directory or GGUF file, as Load would.
func LoadModelConfig(path string) (*Config, error) {
	if !IsGGUF(path) {
		return LoadConfig(path)
	}
	b, release, err := mapReadOnly(path)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	defer release()
	f, err := gguf.Parse(b)
	if err != nil {
		return nil, fmt.Errorf("engine: %s: %w", path, err)
	}
	return configFromGGUF(f)
}

// addExpertLoRA writes a mixture's expert LoRA (Tinker's shared-outer layout, moe.go) as
// llama.cpp's LoRA of a stacked expert tensor (its build_lora_mm_id): lora_a [E, r, in] and
// lora_b [E, out, r] in torch order, the shared factor repeated for every expert.
func addExpertLoRA(w *gguf.Writer, m loraModule, r int, tensors map[string][]float64) {
	E := m.Experts
	a, b := tensors["base_model.model."+m.Path+".lora_A.weight"], tensors["base_model.model."+m.Path+".lora_B.weight"]
	in, out := m.In, m.Out
	if !m.ExpertA {
		out = m.Out / E // gate, up: A [r, D] shared, B_e [I, r]
	}
	af, bf := make([]float32, E*r*in), make([]float32, E*out*r)
	for e := range E {
		for i := range r * in {
			if m.ExpertA {
				af[e*r*in+i] = float32(a[e*r*in+i])
			} else {
				af[e*r*in+i] = float32(a[i])
			}
		}
		for i := range out * r {
			if m.ExpertA {
				bf[e*out*r+i] = float32(b[i])
			} else {
				bf[e*out*r+i] = float32(b[e*out*r+i])
			}
		}
	}
	_, name, _ := cutLast(m.Path, ".")
	layer := strings.TrimSuffix(strings.TrimPrefix(m.Path, "model.layers."), ".mlp.experts."+name)
	g := "blk." + layer + "." + map[string]string{"w1": "ffn_gate_exps", "w3": "ffn_up_exps", "w2": "ffn_down_exps"}[name] + ".weight"
	w.AddF32(g+".lora_a", []int{E, r, in}, af)
	w.AddF32(g+".lora_b", []int{E, out, r}, bf)
}
