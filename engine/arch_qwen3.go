package engine

// ArchQwen3 is Qwen3ForCausalLM: RMSNorm on every query and key head, head_dim set explicitly.
const ArchQwen3 Arch = "qwen3"

type qwen3Family struct{ family }

var _ tinyFamily = (*qwen3Family)(nil)

func init() {
	registerFamily(&qwen3Family{family{arch: ArchQwen3, hfClass: "Qwen3ForCausalLM", modelType: "qwen3", headNorm: true}})
}

func (*qwen3Family) tinyConfig(cfg map[string]any, p Preset) {
	cfg["tie_word_embeddings"] = true
	cfg["head_dim"] = 2 * p.Hidden / p.Heads // Qwen3 decouples head_dim from hidden/heads
	cfg["attention_bias"] = false
}
