package engine

import "fmt"

// ArchQwen3MoE is Qwen3MoeForCausalLM (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention with
// a sparse mixture-of-experts block (moe.go) in place of the dense MLP on the layers
// decoder_sparse_step and mlp_only_layers select; routing weights renormalised when
// norm_topk_prob (transformers' default: false; the released checkpoints set it true). See
// /work/shared/reference/moe-and-quantized-bases.md §1.
const ArchQwen3MoE Arch = "qwen3_moe"

// ArchQwen3_5MoE is Qwen3.5/3.6-MoE (Qwen3_5MoeForConditionalGeneration: Qwen3.5-35B-A3B,
// Qwen3.6-35B-A3B), served text-only as dense Qwen3.5 is: the Gated DeltaNet / gated attention
// hybrid with a mixture of experts on every layer, its routing weights always renormalised, and
// a shared expert behind a sigmoid gate. ArchQwen3_5MoEText is its ForCausalLM form.
const (
	ArchQwen3_5MoE     Arch = "qwen3_5_moe"
	ArchQwen3_5MoEText Arch = "qwen3_5_moe_text"
)

type qwen3MoEFamily struct{ family }

type qwen3_5MoEFamily struct{ qwen3_5Family }

var (
	_ finisher   = (*qwen3MoEFamily)(nil)
	_ validator  = (*qwen3MoEFamily)(nil)
	_ tinyFamily = (*qwen3MoEFamily)(nil)
	_ finisher   = (*qwen3_5MoEFamily)(nil)
	_ validator  = (*qwen3_5MoEFamily)(nil)
	_ tinyFamily = (*qwen3_5MoEFamily)(nil)
)

func init() {
	registerFamily(&qwen3MoEFamily{family{arch: ArchQwen3MoE, hfClass: "Qwen3MoeForCausalLM", modelType: "qwen3_moe", headNorm: true}})
	registerFamily(&qwen3_5MoEFamily{qwen3_5Family{family{arch: ArchQwen3_5MoE, hfClass: "Qwen3_5MoeForConditionalGeneration",
		modelType: "qwen3_5_moe", headNorm: true, statedRopeTheta: true, lmPrefix: "model.language_model.",
		zeroCentredNorms: true, gatedAttention: true}}})
	registerFamily(&qwen3_5MoEFamily{qwen3_5Family{family{arch: ArchQwen3_5MoEText, hfClass: "Qwen3_5MoeForCausalLM",
		modelType: "qwen3_5_moe_text", headNorm: true, statedRopeTheta: true, zeroCentredNorms: true, gatedAttention: true}}})
}

// finish marks the sparse layers: layer l is a mixture of experts when it is not in
// mlp_only_layers and (l+1) is a multiple of decoder_sparse_step (Qwen3MoeDecoderLayer).
func (*qwen3MoEFamily) finish(c *Config) {
	if c.DecoderSparseStep == 0 {
		c.DecoderSparseStep = 1
	}
	c.moeRenorm = c.NormTopkProb != nil && *c.NormTopkProb
	if c.DecoderSparseStep < 1 || c.NumExperts <= 0 {
		return // validate refuses it
	}
	c.moe = make([]bool, c.NumHiddenLayers)
	for l := range c.moe {
		c.moe[l] = (l+1)%c.DecoderSparseStep == 0
	}
	for _, l := range c.MlpOnlyLayers {
		if l >= 0 && l < len(c.moe) {
			c.moe[l] = false
		}
	}
}

func (*qwen3MoEFamily) validate(c *Config) error {
	if c.SharedExpertIntermediateSize != 0 {
		return fmt.Errorf("qwen3_moe: shared_expert_intermediate_size %d: Qwen3-MoE has no shared expert", c.SharedExpertIntermediateSize)
	}
	for _, l := range c.MlpOnlyLayers {
		if l < 0 || l >= c.NumHiddenLayers {
			return fmt.Errorf("qwen3_moe: mlp_only_layers names layer %d of %d", l, c.NumHiddenLayers)
		}
	}
	if c.DecoderSparseStep < 1 || c.DecoderSparseStep > 1<<12 {
		return fmt.Errorf("qwen3_moe: decoder_sparse_step %d is outside [1, %d]", c.DecoderSparseStep, 1<<12)
	}
	return validateMoE(c)
}

// finish is dense Qwen3.5's, then every layer a mixture of experts, renormalised
// (Qwen3_5MoeTopKRouter divides by the sum whatever the config says).
func (f *qwen3_5MoEFamily) finish(c *Config) {
	f.qwen3_5Family.finish(c)
	c.moeRenorm = true
	if c.NumExperts > 0 {
		c.moe = make([]bool, c.NumHiddenLayers)
		for l := range c.moe {
			c.moe[l] = true
		}
	}
}

func (*qwen3_5MoEFamily) validate(c *Config) error {
	if err := validateHybrid(c); err != nil {
		return err
	}
	if c.SharedExpertIntermediateSize < 0 || c.SharedExpertIntermediateSize > 1<<20 {
		return fmt.Errorf("qwen3_5_moe: shared_expert_intermediate_size %d is outside [0, %d]", c.SharedExpertIntermediateSize, 1<<20)
	}
	return validateMoE(c)
}

// validateMoE bounds the sizes a mixture of experts turns into allocations and loops.
func validateMoE(c *Config) error {
	switch {
	case c.NumExperts < 1 || c.NumExperts > 1<<12:
		return fmt.Errorf("%s: num_experts %d is outside [1, %d]", c.Arch, c.NumExperts, 1<<12)
	case c.NumExpertsPerTok < 1 || c.NumExpertsPerTok > c.NumExperts:
		return fmt.Errorf("%s: num_experts_per_tok %d is outside [1, num_experts %d]", c.Arch, c.NumExpertsPerTok, c.NumExperts)
	case c.MoeIntermediateSize < 1 || c.MoeIntermediateSize > 1<<20:
		return fmt.Errorf("%s: moe_intermediate_size %d is outside [1, %d]", c.Arch, c.MoeIntermediateSize, 1<<20)
	}
	return nil
}
