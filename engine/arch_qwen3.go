package engine

// ArchQwen3 is Qwen3ForCausalLM: RMSNorm on every query and key head, head_dim set explicitly.
const ArchQwen3 Arch = "qwen3"

type qwen3Family struct{ family }

var _ tinyFamily = (*qwen3Family)(nil)

func init() {
	registerFamily(&qwen3Family{family{arch: ArchQwen3, hfClass: "Qwen3ForCausalLM", modelType: "qwen3", headNorm: true}})
}
