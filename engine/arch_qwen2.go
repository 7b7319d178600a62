package engine

// ArchQwen2 is Qwen2ForCausalLM: bias on the q, k and v projections.
const ArchQwen2 Arch = "qwen2"

type qwen2Family struct{ family }

var (
	_ finisher   = (*qwen2Family)(nil)
	_ tinyFamily = (*qwen2Family)(nil)
)

func init() {
	registerFamily(&qwen2Family{family{arch: ArchQwen2, hfClass: "Qwen2ForCausalLM", modelType: "qwen2"}})
}

// finish: Qwen2 always has the q, k and v biases; its config.json does not say.
func (*qwen2Family) finish(c *Config) { c.AttentionBias = true }
