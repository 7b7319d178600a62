package engine

// ArchLlama is LlamaForCausalLM: the shared layer as it is (llama3 RoPE scaling comes from the
// config, see Config.invFreq).
const ArchLlama Arch = "llama"

type llamaFamily struct{ family }

var _ tinyFamily = (*llamaFamily)(nil)

func init() {
	registerFamily(&llamaFamily{family{arch: ArchLlama, hfClass: "LlamaForCausalLM", modelType: "llama"}})
}

func (*llamaFamily) tinyConfig(cfg map[string]any, _ Preset) {
	cfg["attention_bias"] = false
	cfg["mlp_bias"] = false
	cfg["tie_word_embeddings"] = false
	cfg["rope_theta"] = 500000.0
	cfg["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
		"high_freq_factor": 4.0, "original_max_position_embeddings": 256}
}
