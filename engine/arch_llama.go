package engine

// ArchLlama is LlamaForCausalLM: the shared layer as it is (llama3 RoPE scaling comes from the
// config, see Config.invFreq).
const ArchLlama Arch = "llama"

type llamaFamily struct{ family }

var _ tinyFamily = (*llamaFamily)(nil)

func init() {
	registerFamily(&llamaFamily{family{arch: ArchLlama, hfClass: "LlamaForCausalLM", modelType: "llama"}})
}
