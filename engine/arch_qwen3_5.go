package engine

import (
	"fmt"
	"strings"
)

// ArchQwen3_5 is Qwen3.5 dense (Qwen3_5ForConditionalGeneration, served text-only, and
// Qwen3_5ForCausalLM): a hybrid of Gated DeltaNet layers (deltanet.go) and gated softmax
// attention layers (q_proj doubled into queries and per-head gate rows, σ(gate) on the attention
// output, q/k norm, partial rotary), every RMSNorm but the DeltaNet's gated one zero-centred
// ((1 + w), added at load). The VL checkpoint's vision tower (model.visual.*) and its MTP draft
// block (mtp.*) are not loaded. See /work/shared/reference/qwen35.md and docs/design-notes.md.
const ArchQwen3_5 Arch = "qwen3_5"

// ArchQwen3_5Text is Qwen3_5ForCausalLM: the same LM under model. (no vision tower).
const ArchQwen3_5Text Arch = "qwen3_5_text"

type qwen3_5Family struct{ family }

var (
	_ finisher      = (*qwen3_5Family)(nil)
	_ extraWeighter = (*qwen3_5Family)(nil)
	_ validator     = (*qwen3_5Family)(nil)
	_ tinyFamily    = (*qwen3_5Family)(nil)
)

func init() {
	registerFamily(&qwen3_5Family{family{arch: ArchQwen3_5, hfClass: "Qwen3_5ForConditionalGeneration", modelType: "qwen3_5",
		headNorm: true, statedRopeTheta: true, lmPrefix: "model.language_model.", zeroCentredNorms: true, gatedAttention: true}})
	registerFamily(&qwen3_5Family{family{arch: ArchQwen3_5Text, hfClass: "Qwen3_5ForCausalLM", modelType: "qwen3_5_text",
		headNorm: true, statedRopeTheta: true, zeroCentredNorms: true, gatedAttention: true}})
}

// finish fills HF's defaults (Qwen3_5TextConfig) and marks the DeltaNet layers. The VL class's
// vision tower is Qwen3-VL's without DeepStack (reference §1.3: Qwen3_5VisionModel has no
// deepstack_merger_list); the text-only class, and a VL config without vision_config, have none.
func (fam *qwen3_5Family) finish(c *Config) {
	if fam.lmPrefix == "" || c.VisionConfig == nil {
		c.VisionConfig, c.ImageTokenID = nil, nil
	} else {
		c.VisionConfig.DeepstackVisualIndexes = nil
	}
	if c.FullAttentionInterval == 0 {
		c.FullAttentionInterval = 4
	}
	if c.LinearConvKernelDim == 0 {
		c.LinearConvKernelDim = 4
	}
	if c.LinearKeyHeadDim == 0 {
		c.LinearKeyHeadDim = 128
	}
	if c.LinearValueHeadDim == 0 {
		c.LinearValueHeadDim = 128
	}
	if c.LinearNumKeyHeads == 0 {
		c.LinearNumKeyHeads = 16
	}
	if c.LinearNumValueHeads == 0 {
		c.LinearNumValueHeads = 32
	}
	f := c.PartialRotaryFactor
	if f == 0 && c.RopeScaling != nil {
		f = c.RopeScaling.PartialRotaryFactor
	}
	if f == 0 {
		f = 0.25
	}
	c.PartialRotaryFactor = f
	c.RotaryDim = int(float64(c.HeadDim) * f)
	if c.LayerTypes == nil && c.FullAttentionInterval > 0 {
		for l := range c.NumHiddenLayers {
			kind := "linear_attention"
			if (l+1)%c.FullAttentionInterval == 0 {
				kind = "full_attention"
			}
			c.LayerTypes = append(c.LayerTypes, kind)
		}
	}
	c.deltaNet = make([]bool, len(c.LayerTypes))
	for l, t := range c.LayerTypes {
		// HF's remap_legacy_layer_types: mamba → linear_attention, attention → full_attention.
		c.deltaNet[l] = t == "linear_attention" || t == "mamba"
	}
}

func (*qwen3_5Family) validate(c *Config) error {
	if c.NumExperts > 0 {
		return fmt.Errorf("qwen3_5: num_experts %d in a dense Qwen3.5 config (the mixture-of-experts checkpoints name Qwen3_5MoeForConditionalGeneration, model_type qwen3_5_moe)", c.NumExperts)
	}
	return validateHybrid(c)
}

// validateHybrid checks what a Qwen3.5 config (dense or MoE) adds to config.json.
func validateHybrid(c *Config) error {
	if len(c.LayerTypes) != c.NumHiddenLayers {
		return fmt.Errorf("qwen3_5: layer_types has %d entries for %d layers", len(c.LayerTypes), c.NumHiddenLayers)
	}
	for l, t := range c.LayerTypes {
		switch t {
		case "linear_attention", "mamba", "full_attention", "attention":
		default:
			return fmt.Errorf("qwen3_5: layer %d has unknown layer type %q", l, t)
		}
	}
	if c.AttnOutputGate != nil && !*c.AttnOutputGate {
		return fmt.Errorf("qwen3_5: attn_output_gate false is not supported (Qwen3.5's attention is always gated)")
	}
	if c.AttentionBias {
		return fmt.Errorf("qwen3_5: attention_bias is not supported")
	}
	for _, b := range []struct {
		name string
		v    int
	}{{"linear_num_key_heads", c.LinearNumKeyHeads}, {"linear_num_value_heads", c.LinearNumValueHeads},
		{"linear_key_head_dim", c.LinearKeyHeadDim}, {"linear_value_head_dim", c.LinearValueHeadDim},
		{"linear_conv_kernel_dim", c.LinearConvKernelDim}} {
		// Bounded far above any release: they size the per-sequence state and its loops.
		if b.v <= 0 || b.v > 1<<12 {
			return fmt.Errorf("qwen3_5: %s %d is outside [1, %d]", b.name, b.v, 1<<12)
		}
	}
	if c.LinearNumValueHeads%c.LinearNumKeyHeads != 0 {
		return fmt.Errorf("qwen3_5: linear_num_value_heads %d is not a multiple of linear_num_key_heads %d", c.LinearNumValueHeads, c.LinearNumKeyHeads)
	}
	if d := c.dnDims(); d.Hv*d.dk*d.dv > 1<<26 || d.C > 1<<20 {
		// The state is Hv·dk·dv per row and layer: bounded at 256 MiB of float32 (Qwen3.5's is 2 MiB).
		return fmt.Errorf("qwen3_5: a DeltaNet state of %d×%d×%d or %d conv channels is beyond any release", d.Hv, d.dk, d.dv, d.C)
	}
	if c.LinearConvKernelDim > 64 {
		return fmt.Errorf("qwen3_5: linear_conv_kernel_dim %d is above 64", c.LinearConvKernelDim)
	}
	if !(c.PartialRotaryFactor > 0 && c.PartialRotaryFactor <= 1) || c.RotaryDim%2 != 0 || c.RotaryDim == 0 {
		return fmt.Errorf("qwen3_5: partial_rotary_factor %v of head_dim %d gives rotary dim %d (must be even and positive)", c.PartialRotaryFactor, c.HeadDim, c.RotaryDim)
	}
	if c.VisionConfig != nil {
		// Images: the tower, and interleaved mRoPE over the rotating quarter of each head.
		if err := validateVision(c, string(c.Arch)); err != nil {
			return err
		}
		if err := validateMrope(c, string(c.Arch)); err != nil {
			return err
		}
	}
	if rs := c.RopeScaling; rs != nil && len(rs.MropeSection) > 0 {
		sum := 0
		for _, s := range rs.MropeSection {
			sum += s
		}
		if sum != c.RotaryDim/2 {
			return fmt.Errorf("qwen3_5: mrope_section %v must sum to rotary_dim/2 = %d", rs.MropeSection, c.RotaryDim/2)
		}
	}
	return nil
}

// skippedWeight reports the checkpoint tensors a Qwen3.5 model deliberately does not load: the
// vision tower and the multi-token-prediction draft block.
func skippedWeight(name string) bool {
	return strings.HasPrefix(name, "model.visual.") || strings.HasPrefix(name, "mtp.")
}

// extraWeights are the vision tower's weights (Qwen3-VL's names, no DeepStack mergers), when the
// model has one.
func (*qwen3_5Family) extraWeights(c *Config) []string {
	if c.VisionConfig == nil {
		return nil
	}
	return (*qwen3VLFamily)(nil).extraWeights(c)
}

func (*qwen3_5Family) extraShape(c *Config, name string) []int {
	if c.VisionConfig == nil {
		return nil
	}
	return (*qwen3VLFamily)(nil).extraShape(c, name)
}
