package engine

import (
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"

	"github.com/skein-ai/skein/internal/filebound"
)

// Arch names a model family (arch_*.go), which decides the small differences in the block.
type Arch string

// RopeScaling is the subset of HF rope_scaling that we honour.
type RopeScaling struct {
	Type                          string  `json:"type,omitempty"`
	RopeType                      string  `json:"rope_type,omitempty"`
	Factor                        float64 `json:"factor,omitempty"`
	LowFreqFactor                 float64 `json:"low_freq_factor,omitempty"`
	HighFreqFactor                float64 `json:"high_freq_factor,omitempty"`
	OriginalMaxPositionEmbeddings int     `json:"original_max_position_embeddings,omitempty"`
	// Multimodal RoPE (Qwen3-VL): frequencies split between the t, h and w position ids.
	MropeSection     []int `json:"mrope_section,omitempty"`
	MropeInterleaved bool  `json:"mrope_interleaved,omitempty"`
	// Partial rotary (Qwen3.5): only the first factor·head_dim dims of a head rotate.
	PartialRotaryFactor float64 `json:"partial_rotary_factor,omitempty"`
}

// RopeParameters is transformers 5's rope_parameters: rope_scaling's keys and rope_theta in one
// object, which its configs save in place of the two.
type RopeParameters struct {
	RopeScaling
	RopeTheta float64 `json:"rope_theta,omitempty"`
}

// Config is the HF config.json of a Llama/Qwen-family causal LM.
type Config struct {
	Architectures         []string     `json:"architectures"`
	ModelType             string       `json:"model_type"`
	VocabSize             int          `json:"vocab_size"`
	HiddenSize            int          `json:"hidden_size"`
	IntermediateSize      int          `json:"intermediate_size"`
	NumHiddenLayers       int          `json:"num_hidden_layers"`
	NumAttentionHeads     int          `json:"num_attention_heads"`
	NumKeyValueHeads      int          `json:"num_key_value_heads"`
	HeadDim               int          `json:"head_dim,omitempty"`
	RMSNormEps            float64      `json:"rms_norm_eps"`
	RopeTheta             float64      `json:"rope_theta"`
	RopeScaling           *RopeScaling `json:"rope_scaling,omitempty"`
	MaxPositionEmbeddings int          `json:"max_position_embeddings"`
	TieWordEmbeddings     bool         `json:"tie_word_embeddings"`
	AttentionBias         bool         `json:"attention_bias,omitempty"`
	TorchDType            string       `json:"torch_dtype,omitempty"`
	BOSTokenID            *int         `json:"bos_token_id,omitempty"`
	EOSTokenID            any          `json:"eos_token_id,omitempty"` // int or [int]
	HiddenAct             string       `json:"hidden_act,omitempty"`

	// transformers 5 saves rope_theta and rope_scaling together as rope_parameters (useRopeParameters).
	RopeParameters *RopeParameters `json:"rope_parameters,omitempty"`

	// Vision-language models (arch_qwen3vl.go): the LM's keys live in text_config.
	TextConfig         json.RawMessage `json:"text_config,omitempty"`
	VisionConfig       *VisionConfig   `json:"vision_config,omitempty"`
	ImageTokenID       *int            `json:"image_token_id,omitempty"`
	VisionStartTokenID *int            `json:"vision_start_token_id,omitempty"`
	VisionEndTokenID   *int            `json:"vision_end_token_id,omitempty"`

	// Hybrid models (arch_qwen3_5.go): which layers are Gated DeltaNet ("linear_attention") and
	// which softmax attention ("full_attention"), and the DeltaNet's sizes.
	LayerTypes            []string `json:"layer_types,omitempty"`
	FullAttentionInterval int      `json:"full_attention_interval,omitempty"`
	LinearNumKeyHeads     int      `json:"linear_num_key_heads,omitempty"`
	LinearNumValueHeads   int      `json:"linear_num_value_heads,omitempty"`
	LinearKeyHeadDim      int      `json:"linear_key_head_dim,omitempty"`
	LinearValueHeadDim    int      `json:"linear_value_head_dim,omitempty"`
	LinearConvKernelDim   int      `json:"linear_conv_kernel_dim,omitempty"`
	AttnOutputGate        *bool    `json:"attn_output_gate,omitempty"`
	PartialRotaryFactor   float64  `json:"partial_rotary_factor,omitempty"`

	// Mixtures of experts (moe.go, arch_qwen3_moe.go): num_experts routed experts of width
	// moe_intermediate_size, each token's num_experts_per_tok of them; which layers are sparse
	// (decoder_sparse_step, mlp_only_layers: Qwen3-MoE's; every layer in Qwen3.5-MoE); a shared
	// expert of width shared_expert_intermediate_size behind a sigmoid gate (Qwen3.5-MoE).
	NumExperts                   int   `json:"num_experts,omitempty"`
	NumExpertsPerTok             int   `json:"num_experts_per_tok,omitempty"`
	MoeIntermediateSize          int   `json:"moe_intermediate_size,omitempty"`
	NormTopkProb                 *bool `json:"norm_topk_prob,omitempty"`
	DecoderSparseStep            int   `json:"decoder_sparse_step,omitempty"`
	MlpOnlyLayers                []int `json:"mlp_only_layers,omitempty"`
	SharedExpertIntermediateSize int   `json:"shared_expert_intermediate_size,omitempty"`

	Arch Arch `json:"-"`
	// RopeFreqFactors divide the rotary inverse frequencies one by one (a GGUF's rope_freqs
	// tensor, which is how llama.cpp's converter stores llama3 scaling); nil: none.
	RopeFreqFactors []float64 `json:"-"`
	// RotaryDim is how many dims of each query and key head rotate: head_dim unless the family
	// says otherwise (finish).
	RotaryDim int `json:"-"`
	// deltaNet marks the Gated DeltaNet layers (nil: none; set by the family's finish).
	deltaNet []bool
	// moe marks the mixture-of-experts layers (nil: none; set by the family's finish), and
	// moeRenorm says whether a token's k routing weights are renormalised to sum 1.
	moe       []bool
	moeRenorm bool
}

// LoadConfig reads and validates DIR/config.json.
func LoadConfig(dir string) (*Config, error) {
	b, err := filebound.Read(filepath.Join(dir, "config.json"), maxConfigBytes)
	if err != nil {
		return nil, fmt.Errorf("engine: reading model config: %w", err)
	}
	var c Config
	if err := parseConfig(b, &c); err != nil {
		return nil, fmt.Errorf("engine: parsing %s/config.json: %w", dir, err)
	}
	if err := c.finish(); err != nil {
		return nil, fmt.Errorf("engine: %s/config.json: %w", dir, err)
	}
	return &c, nil
}

// parseConfig reads a config.json. A composite (vision-language) config keeps its LM's keys in
// text_config: those are read too, and the top level's keys win where both have one, as in HF.
func parseConfig(b []byte, c *Config) error {
	if err := json.Unmarshal(b, c); err != nil {
		return err
	}
	if len(c.TextConfig) == 0 {
		return nil
	}
	if err := json.Unmarshal(c.TextConfig, c); err != nil {
		return fmt.Errorf("text_config: %w", err)
	}
	if err := json.Unmarshal(b, c); err != nil {
		return err
	}
	// Except the head's tying: HF ties by the text config's flag
	// (get_text_config(decoder=True).tie_word_embeddings) where it states one.
	var text struct {
		Tie *bool `json:"tie_word_embeddings"`
	}
	if json.Unmarshal(c.TextConfig, &text) == nil && text.Tie != nil {
		c.TieWordEmbeddings = *text.Tie
	}
	return nil
}

func (c *Config) finish() error {
	arch := ""
	if len(c.Architectures) > 0 {
		arch = c.Architectures[0]
	}
	a, err := familyOf(arch, c.ModelType)
	if err != nil {
		return err
	}
	f := a.desc()
	c.Arch = f.arch
	if c.HiddenAct != "" && c.HiddenAct != "silu" {
		return fmt.Errorf("unsupported hidden_act %q (only silu)", c.HiddenAct)
	}
	if c.NumKeyValueHeads == 0 {
		c.NumKeyValueHeads = c.NumAttentionHeads
	}
	if c.VocabSize <= 0 || c.HiddenSize <= 0 || c.NumHiddenLayers <= 0 || c.NumAttentionHeads <= 0 || (c.IntermediateSize <= 0 && c.NumExperts == 0) {
		// A mixture of experts on every layer needs no dense width (checkDenseWidth).
		return fmt.Errorf("vocab_size, hidden_size, intermediate_size, num_hidden_layers and num_attention_heads must be positive")
	}
	// Sizes become allocations and loop bounds: bound them far above any real model, so that a
	// hostile config.json is an error at load, not an overflow or an endless loop later.
	for _, b := range []struct {
		name   string
		v, max int
	}{{"vocab_size", c.VocabSize, 1 << 24}, {"hidden_size", c.HiddenSize, 1 << 17}, {"intermediate_size", c.IntermediateSize, 1 << 20},
		{"num_hidden_layers", c.NumHiddenLayers, 1 << 12}, {"num_attention_heads", c.NumAttentionHeads, 1 << 12},
		{"num_key_value_heads", c.NumKeyValueHeads, 1 << 12}, {"head_dim", c.HeadDim, 1 << 12},
		{"max_position_embeddings", c.MaxPositionEmbeddings, 1 << 24}} {
		if b.v < 0 || b.v > b.max {
			return fmt.Errorf("%s %d is outside [0, %d]", b.name, b.v, b.max)
		}
	}
	if c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
		return fmt.Errorf("num_attention_heads %d is not a multiple of num_key_value_heads %d", c.NumAttentionHeads, c.NumKeyValueHeads)
	}
	if c.HeadDim == 0 {
		if c.HiddenSize%c.NumAttentionHeads != 0 {
			return fmt.Errorf("hidden_size %d not divisible by num_attention_heads %d", c.HiddenSize, c.NumAttentionHeads)
		}
		c.HeadDim = c.HiddenSize / c.NumAttentionHeads
	}
	if c.HeadDim%2 != 0 {
		return fmt.Errorf("head_dim %d must be even for rotary embeddings", c.HeadDim)
	}
	if c.RMSNormEps == 0 {
		c.RMSNormEps = 1e-6
	}
	c.useRopeParameters()
	if c.RopeTheta == 0 {
		if f.statedRopeTheta {
			return fmt.Errorf("rope_theta missing (neither it nor rope_parameters.rope_theta is given)")
		}
		c.RopeTheta = 10000
	}
	if c.MaxPositionEmbeddings == 0 {
		c.MaxPositionEmbeddings = 2048
	}
	c.RotaryDim = c.HeadDim
	if fi, ok := a.(finisher); ok {
		fi.finish(c)
	}
	if v, ok := a.(validator); ok {
		if err := v.validate(c); err != nil {
			return err
		}
	}
	return c.checkDenseWidth()
}

// checkDenseWidth: every layer that is not a mixture of experts runs the dense MLP, whose
// width intermediate_size must then be positive.
func (c *Config) checkDenseWidth() error {
	for l := range c.NumHiddenLayers {
		if !c.isMoE(l) && c.IntermediateSize <= 0 {
			return fmt.Errorf("intermediate_size %d: layer %d is dense and needs a positive width", c.IntermediateSize, l)
		}
	}
	return nil
}

// EOSTokens lists the configured end-of-sequence ids.
func (c *Config) EOSTokens() []int {
	switch v := c.EOSTokenID.(type) {
	case float64:
		return []int{int(v)}
	case []any:
		var out []int
		for _, x := range v {
			if f, ok := x.(float64); ok {
				out = append(out, int(f))
			}
		}
		return out
	}
	return nil
}

// invFreq returns the rotary inverse frequencies, with llama3 scaling applied if configured.
func (c *Config) invFreq() []float64 {
	// Frequencies over the rotating dims only, as HF's default rope init with a partial factor.
	rd := c.rotaryDim()
	half := rd / 2
	inv := make([]float64, half)
	for i := range half {
		inv[i] = 1 / math.Pow(c.RopeTheta, float64(2*i)/float64(rd))
	}
	if len(c.RopeFreqFactors) == half {
		for i := range inv {
			inv[i] /= c.RopeFreqFactors[i]
		}
		return inv
	}
	rs := c.RopeScaling
	if rs == nil {
		return inv
	}
	kind := rs.RopeType
	if kind == "" {
		kind = rs.Type
	}
	if kind != "llama3" {
		return inv
	}
	// Same as transformers' _compute_llama3_parameters.
	factor, low, high := rs.Factor, rs.LowFreqFactor, rs.HighFreqFactor
	orig := float64(rs.OriginalMaxPositionEmbeddings)
	lowWave, highWave := orig/low, orig/high
	for i, f := range inv {
		wave := 2 * math.Pi / f
		switch {
		case wave < highWave:
			// unchanged
		case wave > lowWave:
			inv[i] = f / factor
		default:
			smooth := (orig/wave - low) / (high - low)
			inv[i] = (1-smooth)*f/factor + smooth*f
		}
	}
	return inv
}

// useRopeParameters takes the rotary settings from rope_parameters where rope_scaling is absent,
// as transformers' convert_rope_params_to_dict does: rope_scaling, the legacy name, wins; else
// rope_parameters, whose rope_theta wins over a top-level one.
func (c *Config) useRopeParameters() {
	p := c.RopeParameters
	if p == nil || c.RopeScaling != nil {
		return
	}
	rs := p.RopeScaling
	c.RopeScaling = &rs
	if p.RopeTheta != 0 {
		c.RopeTheta = p.RopeTheta
	}
}

// rotaryDim is RotaryDim, or head_dim for a config never finished.
func (c *Config) rotaryDim() int {
	if c.RotaryDim > 0 {
		return c.RotaryDim
	}
	return c.HeadDim
}

// isDeltaNet reports whether layer l is a Gated DeltaNet layer (else softmax attention).
func (c *Config) isDeltaNet(l int) bool { return l < len(c.deltaNet) && c.deltaNet[l] }

// isMoE reports whether layer l's feed-forward block is a mixture of experts.
func (c *Config) isMoE(l int) bool { return l < len(c.moe) && c.moe[l] }

// hasDeltaNet reports whether any layer is a Gated DeltaNet layer (a hybrid model).
func (c *Config) hasDeltaNet() bool {
	for _, d := range c.deltaNet {
		if d {
			return true
		}
	}
	return false
}
