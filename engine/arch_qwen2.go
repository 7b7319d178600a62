package engine

// ArchQwen2 is Qwen2ForCausalLM: bias on the q, k and v projections.
const ArchQwen2 Arch = "qwen2"

func init() {
	registerFamily(&family{arch: ArchQwen2, hfClass: "Qwen2ForCausalLM", modelType: "qwen2",
		finish: func(c *Config) { c.AttentionBias = true }, // Qwen2 always has them; its config.json does not say
		tinyConfig: func(cfg map[string]any, _ Preset) {
			cfg["tie_word_embeddings"] = true
			cfg["use_sliding_window"] = false
		}})
}
