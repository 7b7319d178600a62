package engine

import (
	"fmt"
	"math"
	"strings"
)

// ArchQwen3VL is Qwen3VLForConditionalGeneration (the dense variants): a vision tower
// (vision_tower.go) whose merged patch features replace the image pad tokens' embeddings and,
// through DeepStack, are added to the first LM layers' outputs; the LM is Qwen3 with
// interleaved multimodal RoPE (mrope.go). Its LM weights sit under model.language_model.,
// its tower under model.visual.; config.json keeps the LM's keys in text_config.
const ArchQwen3VL Arch = "qwen3_vl"

// VisionConfig is config.json's vision_config of Qwen3-VL.
type VisionConfig struct {
	Depth                  int    `json:"depth"`
	HiddenSize             int    `json:"hidden_size"`
	HiddenAct              string `json:"hidden_act"`
	IntermediateSize       int    `json:"intermediate_size"`
	NumHeads               int    `json:"num_heads"`
	InChannels             int    `json:"in_channels"`
	PatchSize              int    `json:"patch_size"`
	SpatialMergeSize       int    `json:"spatial_merge_size"`
	TemporalPatchSize      int    `json:"temporal_patch_size"`
	OutHiddenSize          int    `json:"out_hidden_size"`
	NumPositionEmbeddings  int    `json:"num_position_embeddings"`
	DeepstackVisualIndexes []int  `json:"deepstack_visual_indexes"`
}

// patchDim is the length of one pixel_values row: C·T·P·P.
func (v *VisionConfig) patchDim() int {
	return v.InChannels * v.TemporalPatchSize * v.PatchSize * v.PatchSize
}

// Vision special tokens of generated VL tokenizers (Qwen's names).
const (
	VisionStartToken = "<|vision_start|>"
	VisionEndToken   = "<|vision_end|>"
	ImagePadToken    = "<|image_pad|>"
)

// validate checks the vision tower's config and the LM's multimodal RoPE.
func (*qwen3VLFamily) validate(c *Config) error {
	if c.VisionConfig == nil {
		return fmt.Errorf("qwen3_vl: vision_config missing")
	}
	if err := validateVision(c, "qwen3_vl"); err != nil {
		return err
	}
	return validateMrope(c, "qwen3_vl")
}

// validateVision checks a Qwen3-VL-style vision tower's config (Qwen3-VL's, Qwen3.5's) against
// the LM it feeds.
func validateVision(c *Config, arch string) error {
	v := c.VisionConfig
	if c.ImageTokenID == nil || *c.ImageTokenID < 0 || *c.ImageTokenID >= c.VocabSize {
		return fmt.Errorf("%s: image_token_id missing or outside the vocabulary", arch)
	}
	const most = 1 << 16 // far beyond any released tower; keeps allocations bounded
	for _, d := range []int{v.Depth, v.HiddenSize, v.IntermediateSize, v.NumHeads, v.InChannels, v.PatchSize,
		v.SpatialMergeSize, v.TemporalPatchSize, v.OutHiddenSize, v.NumPositionEmbeddings} {
		if d <= 0 || d > most {
			return fmt.Errorf("%s: vision_config sizes must be in 1…%d", arch, most)
		}
	}
	if v.HiddenSize%v.NumHeads != 0 || (v.HiddenSize/v.NumHeads)%4 != 0 {
		return fmt.Errorf("%s: vision head dim must be a multiple of 4 (2D rotary)", arch)
	}
	if v.OutHiddenSize != c.HiddenSize {
		return fmt.Errorf("%s: vision out_hidden_size %d differs from the LM's hidden_size %d", arch, v.OutHiddenSize, c.HiddenSize)
	}
	side := int(math.Sqrt(float64(v.NumPositionEmbeddings)))
	if side*side != v.NumPositionEmbeddings {
		return fmt.Errorf("%s: num_position_embeddings %d is not a square", arch, v.NumPositionEmbeddings)
	}
	for i, l := range v.DeepstackVisualIndexes {
		if l < 0 || l >= v.Depth || i >= c.NumHiddenLayers || (i > 0 && l <= v.DeepstackVisualIndexes[i-1]) {
			return fmt.Errorf("%s: deepstack_visual_indexes %v must rise within the tower's %d blocks, at most one per LM layer", arch, v.DeepstackVisualIndexes, v.Depth)
		}
	}
	switch v.HiddenAct {
	case "gelu_pytorch_tanh", "gelu":
	default:
		return fmt.Errorf("%s: unsupported vision hidden_act %q", arch, v.HiddenAct)
	}
	return nil
}

// validateMrope checks the LM's interleaved multimodal RoPE: three sections over the rotary
// half (all of head_dim in Qwen3-VL; Qwen3.5 rotates a quarter).
func validateMrope(c *Config, arch string) error {
	rs := c.RopeScaling
	if rs == nil || len(rs.MropeSection) != 3 {
		return fmt.Errorf("%s: rope_scaling.mrope_section must have 3 entries", arch)
	}
	if !rs.MropeInterleaved {
		return fmt.Errorf("%s: only interleaved mRoPE (rope_scaling.mrope_interleaved) is supported", arch)
	}
	sum := 0
	for _, s := range rs.MropeSection {
		if s < 0 {
			return fmt.Errorf("%s: negative mrope_section", arch)
		}
		sum += s
	}
	if sum != c.rotaryDim()/2 {
		return fmt.Errorf("%s: mrope_section %v must sum to the rotary dims/2 = %d", arch, rs.MropeSection, c.rotaryDim()/2)
	}
	return nil
}

// visionMergerNames are a patch merger's weights under prefix p.
func visionMergerNames(p string) []string {
	return []string{p + "norm.weight", p + "norm.bias", p + "linear_fc1.weight", p + "linear_fc1.bias",
		p + "linear_fc2.weight", p + "linear_fc2.bias"}
}

// extraWeights are the vision tower's weights.
func (*qwen3VLFamily) extraWeights(c *Config) []string {
	v := c.VisionConfig
	names := []string{"model.visual.patch_embed.proj.weight", "model.visual.patch_embed.proj.bias", "model.visual.pos_embed.weight"}
	for i := range v.Depth {
		p := fmt.Sprintf("model.visual.blocks.%d.", i)
		for _, n := range []string{"norm1", "norm2", "attn.qkv", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2"} {
			names = append(names, p+n+".weight", p+n+".bias")
		}
	}
	names = append(names, visionMergerNames("model.visual.merger.")...)
	for j := range v.DeepstackVisualIndexes {
		names = append(names, visionMergerNames(fmt.Sprintf("model.visual.deepstack_merger_list.%d.", j))...)
	}
	return names
}

func (*qwen3VLFamily) extraShape(c *Config, name string) []int {
	if !strings.HasPrefix(name, "model.visual.") {
		return nil
	}
	v := c.VisionConfig
	Dv, F, M := v.HiddenSize, v.IntermediateSize, v.HiddenSize*v.SpatialMergeSize*v.SpatialMergeSize
	rest := strings.TrimPrefix(name, "model.visual.")
	switch rest {
	case "patch_embed.proj.weight":
		return []int{Dv, v.InChannels, v.TemporalPatchSize, v.PatchSize, v.PatchSize}
	case "patch_embed.proj.bias":
		return []int{Dv}
	case "pos_embed.weight":
		return []int{v.NumPositionEmbeddings, Dv}
	}
	if strings.HasPrefix(rest, "blocks.") {
		switch {
		case strings.HasSuffix(rest, "norm1.weight"), strings.HasSuffix(rest, "norm1.bias"),
			strings.HasSuffix(rest, "norm2.weight"), strings.HasSuffix(rest, "norm2.bias"),
			strings.HasSuffix(rest, "attn.proj.bias"), strings.HasSuffix(rest, "mlp.linear_fc2.bias"):
			return []int{Dv}
		case strings.HasSuffix(rest, "attn.qkv.weight"):
			return []int{3 * Dv, Dv}
		case strings.HasSuffix(rest, "attn.qkv.bias"):
			return []int{3 * Dv}
		case strings.HasSuffix(rest, "attn.proj.weight"):
			return []int{Dv, Dv}
		case strings.HasSuffix(rest, "mlp.linear_fc1.weight"):
			return []int{F, Dv}
		case strings.HasSuffix(rest, "mlp.linear_fc1.bias"):
			return []int{F}
		case strings.HasSuffix(rest, "mlp.linear_fc2.weight"):
			return []int{Dv, F}
		}
		return nil
	}
	// A merger: the main one normalises each patch before the 2×2 shuffle, DeepStack's after.
	normDim := Dv
	if strings.HasPrefix(rest, "deepstack_merger_list.") {
		normDim = M
	}
	switch {
	case strings.HasSuffix(rest, "norm.weight"), strings.HasSuffix(rest, "norm.bias"):
		return []int{normDim}
	case strings.HasSuffix(rest, "linear_fc1.weight"):
		return []int{M, M}
	case strings.HasSuffix(rest, "linear_fc1.bias"):
		return []int{M}
	case strings.HasSuffix(rest, "linear_fc2.weight"):
		return []int{c.HiddenSize, M}
	case strings.HasSuffix(rest, "linear_fc2.bias"):
		return []int{c.HiddenSize}
	}
	return nil
}

// qwen3VLChatTemplate is a ChatML template that renders image content parts the way Qwen-VL's
// does: <|vision_start|><|image_pad|><|vision_end|> (the processor expands the pad to the
// image's token count).
const qwen3VLChatTemplate = `{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\n' }}` +
	`{%- if message['content'] is string %}{{- message['content'] }}{%- else %}{%- for part in message['content'] %}` +
	`{%- if part['type'] == 'image' or 'image' in part %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}` +
	`{%- elif part['type'] == 'text' %}{{- part['text'] }}{%- endif %}{%- endfor %}{%- endif %}` +
	`{{- '<|im_end|>\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}`
