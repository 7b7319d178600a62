package engine

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/skein-ai/skein/engine/gguf"
	"github.com/skein-ai/skein/engine/internal/quant"
	"github.com/skein-ai/skein/engine/tokenizer"
	"github.com/skein-ai/skein/safetensors"
)

// Loading a base model from one GGUF file (what llama.cpp and Ollama keep on disk): the config
// from its metadata, its tensors renamed to Hugging Face's names (with llama's q/k row
// permutation undone), and its tokenizer rebuilt from tokenizer.ggml.* (gguf_tokenizer.go).
// From there the model loads as a safetensors one does: float tensors through the same
// conversions, Q8_0 and Q4_K tensors kept as the file's blocks when --precision names that format
// (no requantization: the blocks are the engine's own, internal/quant), dequantized to float32
// otherwise (and then quantized to --precision's format if it names another).

// ggufArchs are the GGUF architectures skein loads, with their Hugging Face class.
var ggufArchs = map[string]string{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
	"qwen3moe": "Qwen3MoeForCausalLM"}

// IsGGUF reports whether path is a regular file that starts with GGUF's magic.
func IsGGUF(path string) bool {
	fi, err := os.Stat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return false
	}
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var b [4]byte
	n, _ := f.Read(b[:])
	return n == 4 && string(b[:]) == gguf.Magic
}

// ggufDType marks a host tensor that holds a GGUF block type's raw bytes (the safetensors
// dtypes are float ones): "gguf:Q8_0", "gguf:Q4_K", …
const ggufDType = "gguf:"

// ggufSidecars holds the tokenizer files rebuilt from each loaded GGUF's metadata, by the file's
// path (Engine.Dir), for the gateway, which serves a model directory's tokenizer.json and reads its
// tokenizer_config.json's chat template.
var ggufSidecars sync.Map // path → map[string][]byte

// TokenizerFile is a tokenizer file (tokenizer.json, tokenizer_config.json) of the GGUF model
// loaded from path, rebuilt from its metadata; false when path is no GGUF loaded here or has none.
func TokenizerFile(path, name string) ([]byte, bool) {
	v, ok := ggufSidecars.Load(path)
	if !ok {
		return nil, false
	}
	b, ok := v.(map[string][]byte)[name]
	return b, ok
}

// loadGGUF is Load for a GGUF file.
func loadGGUF(path string, opts Options) (*Engine, error) {
	progress := newLoadProgress(opts.Logger, path, []string{path})
	b, release, err := mapReadOnly(path)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	defer release()
	progress.add(len(b))
	f, err := gguf.Parse(b)
	if err != nil {
		return nil, fmt.Errorf("engine: %s: %w", path, err)
	}
	cfg, err := configFromGGUF(f)
	if err != nil {
		return nil, fmt.Errorf("engine: %s: %w", path, err)
	}
	host, err := hostFromGGUF(f, cfg)
	if err != nil {
		return nil, fmt.Errorf("engine: %s: %w", path, err)
	}
	tokJSON, cfgJSON, err := gguf.TokenizerJSON(f)
	if err != nil {
		return nil, fmt.Errorf("engine: %s: tokenizer: %w", path, err)
	}
	var tok *tokenizer.Tokenizer
	if tokJSON != nil {
		if tok, err = tokenizer.Parse(tokJSON); err != nil {
			return nil, fmt.Errorf("engine: %s: tokenizer: %w", path, err)
		}
	}
	tensors := len(host)
	e, err := newEngine(path, cfg, host, tok, opts)
	if err != nil {
		return nil, err
	}
	if tokJSON != nil {
		ggufSidecars.Store(path, map[string][]byte{"tokenizer.json": tokJSON, "tokenizer_config.json": cfgJSON})
	}
	progress.done(path, tensors)
	return e, nil
}

// configFromGGUF reads the model's config from the metadata keys llama.cpp's converter writes.
func configFromGGUF(f *gguf.File) (*Config, error) {
	arch, _, err := f.String("general.architecture")
	if err != nil {
		return nil, err
	}
	class, ok := ggufArchs[arch]
	if !ok {
		return nil, fmt.Errorf("general.architecture %q: skein loads llama, qwen2, qwen3 and qwen3moe GGUFs", arch)
	}
	if t, _, _ := f.String("general.type"); t != "" && t != "model" {
		return nil, fmt.Errorf("general.type is %q: not a model (an adapter loads as one, not as a base)", t)
	}
	var firstErr error
	num := func(key string, required bool) int {
		v, ok, err := f.Int(arch + "." + key)
		switch {
		case err != nil:
			firstErr = cmpErr(firstErr, err)
		case !ok && required:
			firstErr = cmpErr(firstErr, fmt.Errorf("%s.%s missing", arch, key))
		case v < 0 || v > 1<<30:
			firstErr = cmpErr(firstErr, fmt.Errorf("%s.%s = %d is out of range", arch, key, v))
		}
		return int(v)
	}
	flt := func(key string) float64 {
		v, _, err := f.Float(arch + "." + key)
		firstErr = cmpErr(firstErr, err)
		return v
	}
	c := &Config{Architectures: []string{class}, ModelType: arch,
		HiddenSize: num("embedding_length", true), IntermediateSize: num("feed_forward_length", true),
		NumHiddenLayers: num("block_count", true), NumAttentionHeads: num("attention.head_count", true),
		NumKeyValueHeads: num("attention.head_count_kv", false), HeadDim: num("attention.key_length", false),
		MaxPositionEmbeddings: num("context_length", false), RMSNormEps: flt("attention.layer_norm_rms_epsilon"),
		RopeTheta: flt("rope.freq_base"), VocabSize: num("vocab_size", false)}
	if vl := num("attention.value_length", false); vl != 0 && vl != c.HeadDim {
		firstErr = cmpErr(firstErr, fmt.Errorf("%s.attention.value_length %d differs from key_length %d", arch, vl, c.HeadDim))
	}
	if n := num("expert_count", false); n > 0 && arch != "qwen3moe" {
		firstErr = cmpErr(firstErr, fmt.Errorf("%s.expert_count is %d: mixture-of-experts GGUFs (Mixtral-style) are not served", arch, n))
	} else if arch == "qwen3moe" {
		// Every layer a mixture, its weights renormalised (llama.cpp's qwen3moe graph: norm_w).
		c.NumExperts, c.NumExpertsPerTok = num("expert_count", true), num("expert_used_count", true)
		c.MoeIntermediateSize = num("expert_feed_forward_length", true)
		renorm := true
		c.NormTopkProb = &renorm
	}
	if firstErr != nil {
		return nil, firstErr
	}
	if s, _, _ := f.String(arch + ".rope.scaling.type"); s != "" && s != "none" {
		return nil, fmt.Errorf("%s.rope.scaling.type %q: skein reads GGUFs without rope scaling (llama3's comes as rope_freqs)", arch, s)
	}
	if c.RopeTheta == 0 {
		c.RopeTheta = 10000 // llama.cpp's default when the key is absent
	}
	emb, ok := f.Tensor("token_embd.weight")
	if !ok || len(emb.Dims) != 2 {
		return nil, fmt.Errorf("token_embd.weight missing or not a matrix")
	}
	if c.VocabSize == 0 {
		c.VocabSize = emb.Dims[1]
	}
	_, hasOutput := f.Tensor("output.weight")
	c.TieWordEmbeddings = !hasOutput
	_, c.AttentionBias = f.Tensor("blk.0.attn_q.bias")
	if id, ok, err := f.Int("tokenizer.ggml.bos_token_id"); err == nil && ok {
		v := int(id)
		c.BOSTokenID = &v
	}
	if id, ok, err := f.Int("tokenizer.ggml.eos_token_id"); err == nil && ok {
		c.EOSTokenID = float64(id) // as config.json's JSON number decodes
	}
	if err := c.finish(); err != nil {
		return nil, err
	}
	// Partial rotary embeddings (rope over fewer dims than a head) are not the layer skein has.
	if d, ok, err := f.Int(arch + ".rope.dimension_count"); err != nil {
		return nil, err
	} else if ok && int(d) != c.HeadDim {
		return nil, fmt.Errorf("%s.rope.dimension_count %d differs from the head size %d (partial rotary embeddings are not served)", arch, d, c.HeadDim)
	}
	if t, ok := f.Tensor("rope_freqs.weight"); ok {
		if t.Type != gguf.F32 || len(t.Dims) != 1 || t.Dims[0] != c.HeadDim/2 {
			return nil, fmt.Errorf("rope_freqs.weight must be %d float32 factors", c.HeadDim/2)
		}
		v, err := gguf.Float32s(t)
		if err != nil {
			return nil, err
		}
		c.RopeFreqFactors = make([]float64, len(v))
		for i, x := range v {
			if !(x > 0) {
				return nil, fmt.Errorf("rope_freqs.weight[%d] = %v is not positive", i, x)
			}
			c.RopeFreqFactors[i] = float64(x)
		}
	}
	return c, nil
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// ggufNames maps GGUF tensor names to Hugging Face ones ("blk.N." prefixes stripped first).
var ggufLayerNames = map[string]string{
	"attn_norm.weight":    "input_layernorm.weight",
	"attn_q.weight":       "self_attn.q_proj.weight",
	"attn_k.weight":       "self_attn.k_proj.weight",
	"attn_v.weight":       "self_attn.v_proj.weight",
	"attn_output.weight":  "self_attn.o_proj.weight",
	"attn_q.bias":         "self_attn.q_proj.bias",
	"attn_k.bias":         "self_attn.k_proj.bias",
	"attn_v.bias":         "self_attn.v_proj.bias",
	"attn_q_norm.weight":  "self_attn.q_norm.weight",
	"attn_k_norm.weight":  "self_attn.k_norm.weight",
	"ffn_norm.weight":     "post_attention_layernorm.weight",
	"ffn_gate.weight":     "mlp.gate_proj.weight",
	"ffn_up.weight":       "mlp.up_proj.weight",
	"ffn_down.weight":     "mlp.down_proj.weight",
	"ffn_gate_inp.weight": "mlp.gate.weight", // a mixture's router
}

// ggufExpertNames are a mixture's stacked expert tensors [E, out, in], by the per-expert
// projection skein keeps (mlp.experts.N.<proj>.weight).
var ggufExpertNames = map[string]string{"ffn_gate_exps.weight": "gate_proj", "ffn_up_exps.weight": "up_proj",
	"ffn_down_exps.weight": "down_proj"}

var ggufTopNames = map[string]string{
	"token_embd.weight":  "model.embed_tokens.weight",
	"output_norm.weight": "model.norm.weight",
	"output.weight":      "lm_head.weight",
}

// hfName is the Hugging Face name of a GGUF tensor ("" if it is none skein knows), and its layer.
func hfName(name string) (string, int) {
	if n, ok := ggufTopNames[name]; ok {
		return n, -1
	}
	rest, ok := strings.CutPrefix(name, "blk.")
	if !ok {
		return "", -1
	}
	num, suffix, ok := strings.Cut(rest, ".")
	l, err := strconv.Atoi(num)
	if !ok || err != nil || l < 0 || strconv.Itoa(l) != num {
		return "", -1
	}
	n, ok := ggufLayerNames[suffix]
	if !ok {
		return "", -1
	}
	return fmt.Sprintf("model.layers.%d.%s", l, n), l
}

// ggufName is the GGUF name of a Hugging Face weight (the inverse of hfName).
func ggufName(name string) (string, bool) {
	for g, h := range ggufTopNames {
		if h == name {
			return g, true
		}
	}
	rest, ok := strings.CutPrefix(name, "model.layers.")
	if !ok {
		return "", false
	}
	num, suffix, ok := strings.Cut(rest, ".")
	if !ok {
		return "", false
	}
	for g, h := range ggufLayerNames {
		if h == suffix {
			return "blk." + num + "." + g, true
		}
	}
	return "", false
}

// hostFromGGUF makes the loader's host tensors of a GGUF's tensors: every weight the config
// needs, of its expected shape, and nothing else (rope_freqs aside, read by configFromGGUF).
func hostFromGGUF(f *gguf.File, c *Config) (map[string]safetensors.Tensor, error) {
	want := map[string]bool{}
	for _, n := range c.weightNames() {
		want[n] = true
	}
	host := map[string]safetensors.Tensor{}
	for i := range f.Tensors {
		t := &f.Tensors[i]
		if t.Name == "rope_freqs.weight" {
			continue
		}
		if ok, err := expertsFromGGUF(t, c, want, host); ok || err != nil {
			if err != nil {
				return nil, err
			}
			continue
		}
		name, _ := hfName(t.Name)
		if name == "" || !want[name] {
			return nil, fmt.Errorf("tensor %s is not one of a %s model's (config: %d layers)", t.Name, c.Arch, c.NumHiddenLayers)
		}
		shape := t.Shape()
		if exp := c.expectedShape(name); !slices.Equal(exp, shape) {
			return nil, fmt.Errorf("tensor %s has shape %v, the metadata implies %v", t.Name, shape, exp)
		}
		ht := safetensors.Tensor{Shape: shape, Data: t.Data}
		switch t.Type {
		case gguf.F32:
			ht.DType = "F32"
		case gguf.F16:
			ht.DType = "F16"
		case gguf.BF16:
			ht.DType = "BF16"
		default:
			ht.DType = ggufDType + t.Type.String()
			if len(shape) != 2 {
				// Norms and biases are small; llama.cpp keeps them in float32.
				return nil, fmt.Errorf("tensor %s: a %s vector (skein reads vectors in F32, F16 or BF16)", t.Name, t.Type)
			}
		}
		if c.Arch == ArchLlama && (strings.HasSuffix(name, "q_proj.weight") || strings.HasSuffix(name, "k_proj.weight") ||
			strings.HasSuffix(name, "q_proj.bias") || strings.HasSuffix(name, "k_proj.bias")) {
			heads := c.NumAttentionHeads
			if strings.Contains(name, "k_proj") {
				heads = c.NumKeyValueHeads
			}
			rows := shape[0]
			ht.Data = permuteRows(ht.Data, rows, heads, true)
		}
		host[name] = ht
	}
	for n := range want {
		if _, ok := host[n]; !ok {
			g, _ := ggufName(n)
			return nil, fmt.Errorf("tensor %s missing", g)
		}
	}
	return host, nil
}

// permuteRows reorders the rows of a q or k projection (or its bias) between Hugging Face's
// layout and llama.cpp's for llama-architecture GGUFs. convert_hf_to_gguf's permute reshapes the
// rows of each head as [2, hd/2] and swaps the two axes, so that the rotary pairs, (j, j+hd/2) in
// Hugging Face's rotate-half, become adjacent rows (2j, 2j+1) for ggml's NORM rope. toHF undoes it:
// Hugging Face row h·hd + i·hd/2 + j is GGUF row h·hd + 2j + i. Rows are moved as bytes, so this
// serves every tensor type (a block type's rows are whole blocks).
func permuteRows(data []byte, rows, heads int, toHF bool) []byte {
	rowBytes := len(data) / rows
	hd := rows / heads
	out := make([]byte, len(data))
	for h := range heads {
		for i := range 2 {
			for j := range hd / 2 {
				hf, gg := h*hd+i*hd/2+j, h*hd+2*j+i
				src, dst := gg, hf
				if !toHF {
					src, dst = hf, gg
				}
				copy(out[dst*rowBytes:(dst+1)*rowBytes], data[src*rowBytes:(src+1)*rowBytes])
			}
		}
	}
	return out
}

// ggufHostTensor prepares host[name] for loadModel when it holds a GGUF block type: the blocks
// themselves when the engine keeps weight name in that format (qf, a projection; under a mix,
// mixed, any block format the engine has, as the file's own mix chose it), copied out of the
// file with the vector kernel's spare bytes, and their format; else the tensor dequantized to
// float32 in host[name]'s place, for the float paths. Tensors of float types are left as they are.
func ggufHostTensor(host map[string]safetensors.Tensor, name string, qf *quant.Format, mixed bool) ([]byte, *quant.Format, error) {
	t := host[name]
	typ, ok := strings.CutPrefix(t.DType, ggufDType)
	if !ok {
		return nil, nil, nil
	}
	if kept := keptGGUFFormat(typ, qf, mixed); kept != nil && isLinearWeight(name) {
		out := make([]byte, len(t.Data), len(t.Data)+16) // Q8_0's kernel loads 16 bytes past a block's last quarter
		copy(out, t.Data)
		return out, kept, nil
	}
	var gt gguf.GGMLType
	for _, c := range []gguf.GGMLType{gguf.Q4_0, gguf.Q8_0, gguf.Q4_K, gguf.Q6_K} {
		if c.String() == typ {
			gt = c
		}
	}
	if gt == 0 {
		return nil, nil, fmt.Errorf("engine: weight %s: unknown GGUF type %s", name, typ)
	}
	dims := make([]int, len(t.Shape))
	for i, d := range t.Shape {
		dims[len(t.Shape)-1-i] = d
	}
	v, err := gguf.Float32s(&gguf.TensorInfo{Name: name, Dims: dims, Type: gt, Data: t.Data})
	if err != nil {
		return nil, nil, err
	}
	host[name] = safetensors.FromFloat32(v, t.Shape...)
	return nil, nil, nil
}

// keptGGUFFormat is the engine's format for a file's block type typ when its blocks are kept as
// they are: qf's own type, or under a mix any of the engine's block formats (nil: dequantize).
func keptGGUFFormat(typ string, qf *quant.Format, mixed bool) *quant.Format {
	if qf == nil {
		return nil
	}
	if strings.EqualFold(typ, qf.Name) {
		return qf
	}
	if mixed {
		for _, f := range []*quant.Format{quant.Q8_0, quant.Q4_K, quant.Q6_K} {
			if strings.EqualFold(typ, f.Name) {
				return f
			}
		}
	}
	return nil
}

// expertsFromGGUF splits a stacked expert tensor (blk.L.ffn_*_exps.weight: ggml dims [in, out,
// E], torch [E, out, in]) into one host tensor per expert, views of its bytes (a block type's
// rows are whole blocks, so each expert's rows are too); it reports whether t was one.
func expertsFromGGUF(t *gguf.TensorInfo, c *Config, want map[string]bool, host map[string]safetensors.Tensor) (bool, error) {
	rest, ok := strings.CutPrefix(t.Name, "blk.")
	if !ok {
		return false, nil
	}
	num, suffix, _ := strings.Cut(rest, ".")
	proj, ok := ggufExpertNames[suffix]
	if !ok {
		return false, nil
	}
	l, err := strconv.Atoi(num)
	if err != nil || l < 0 || l >= c.NumHiddenLayers || !c.isMoE(l) || strconv.Itoa(l) != num {
		return true, fmt.Errorf("tensor %s is not one of a %s model's (config: %d layers)", t.Name, c.Arch, c.NumHiddenLayers)
	}
	shape := t.Shape()
	first := fmt.Sprintf("model.layers.%d.mlp.experts.0.%s.weight", l, proj)
	exp := c.expectedShape(first)
	if len(shape) != 3 || shape[0] != c.NumExperts || !slices.Equal(shape[1:], exp) || len(t.Data)%c.NumExperts != 0 {
		return true, fmt.Errorf("tensor %s has shape %v, the metadata implies [%d %d %d]", t.Name, shape, c.NumExperts, exp[0], exp[1])
	}
	dtype := ""
	switch t.Type {
	case gguf.F32:
		dtype = "F32"
	case gguf.F16:
		dtype = "F16"
	case gguf.BF16:
		dtype = "BF16"
	default:
		dtype = ggufDType + t.Type.String()
	}
	per := len(t.Data) / c.NumExperts
	for e := range c.NumExperts {
		name := fmt.Sprintf("model.layers.%d.mlp.experts.%d.%s.weight", l, e, proj)
		if !want[name] {
			return true, fmt.Errorf("tensor %s: %s is not one of the model's", t.Name, name)
		}
		host[name] = safetensors.Tensor{DType: dtype, Shape: slices.Clone(exp), Data: t.Data[e*per : (e+1)*per]}
	}
	return true, nil
}
