package engine

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// Each architecture's part in generating a tiny model (tiny.go): its config.json keys, and for
// a vision-language family its special tokens, token ids and preprocessor file. Kept apart
// from the architecture files, which say only how a family loads and runs.

func (*llamaFamily) tinyConfig(cfg map[string]any, _ Preset) {
	cfg["attention_bias"] = false
	cfg["mlp_bias"] = false
	cfg["tie_word_embeddings"] = false
	cfg["rope_theta"] = 500000.0
	cfg["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
		"high_freq_factor": 4.0, "original_max_position_embeddings": 256}
}

func (*qwen2Family) tinyConfig(cfg map[string]any, _ Preset) {
	cfg["tie_word_embeddings"] = true
	cfg["use_sliding_window"] = false
}

func (*qwen3Family) tinyConfig(cfg map[string]any, p Preset) {
	cfg["tie_word_embeddings"] = true
	cfg["head_dim"] = 2 * p.Hidden / p.Heads // Qwen3 decouples head_dim from hidden/heads
	cfg["attention_bias"] = false
}

// tinyConfig is a generated Qwen3.5 in the VL checkpoint's shape: the LM's keys in text_config.
// Key heads fewer than value heads and dk ≠ dv, so that a tiling or a dk/dv mix-up shows; three
// DeltaNet layers and one attention layer at the 4-layer presets (the released 3:1 pattern).
func (f *qwen3_5Family) tinyConfig(cfg map[string]any, p Preset) {
	hd := 2 * p.Hidden / p.Heads
	text := map[string]any{}
	for k, v := range cfg {
		if k != "architectures" && k != "transformers_version" {
			text[k] = v
		}
	}
	text["model_type"] = "qwen3_5_text"
	text["attention_bias"] = false
	text["attn_output_gate"] = true
	text["tie_word_embeddings"] = true
	text["full_attention_interval"] = 4
	var types []string
	for l := range p.Layers {
		if (l+1)%4 == 0 {
			types = append(types, "full_attention")
		} else {
			types = append(types, "linear_attention")
		}
	}
	if p.Layers < 4 {
		// The small presets: DeltaNet, attention, DeltaNet, so that gradients and decode state
		// cross both kinds in both orders.
		types = []string{"linear_attention", "full_attention", "linear_attention"}
		text["num_hidden_layers"] = 3
	}
	if p.HeadDim > 0 {
		hd = p.HeadDim
	}
	text["layer_types"] = types
	text["head_dim"] = hd
	visionKeys := p.Vision && f.lmPrefix != ""
	kd, vd, hk, hv := p.Hidden/8, p.Hidden/8+p.Hidden/32, p.Heads/2, p.Heads
	if p.LinearKeyHeads > 0 {
		kd, vd, hk, hv = p.LinearKeyDim, p.LinearValueDim, p.LinearKeyHeads, p.LinearValueHeads
	}
	text["linear_num_key_heads"], text["linear_num_value_heads"] = hk, hv
	text["linear_key_head_dim"], text["linear_value_head_dim"] = kd, vd
	text["linear_conv_kernel_dim"] = 4
	text["mamba_ssm_dtype"] = "float32"
	delete(text, "rope_theta")
	rope := map[string]any{"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}
	if visionKeys {
		// Interleaved mRoPE over the rotating quarter: Qwen3.5's [11, 11, 10] of 32, scaled.
		half := int(float64(hd)*0.25) / 2
		hs := half * 11 / 32
		rope["mrope_interleaved"], rope["mrope_section"] = true, []int{half - 2*hs, hs, hs}
		if hs == 0 {
			rope["mrope_section"] = []int{half - 2, 1, 1}
		}
	}
	text["rope_parameters"] = rope
	if f.lmPrefix == "" {
		// The text-only class generates the untied shape (Qwen3.5-9B's), the VL one the tied (4B's).
		text["tie_word_embeddings"] = false
		for k := range cfg {
			delete(cfg, k)
		}
		for k, v := range text {
			cfg[k] = v
		}
		cfg["architectures"] = []string{f.hfClass}
		cfg["model_type"] = f.modelType
		return
	}
	for k := range cfg {
		if k != "architectures" && k != "model_type" && k != "transformers_version" {
			delete(cfg, k)
		}
	}
	cfg["text_config"] = text
	cfg["tie_word_embeddings"] = true
	if visionKeys {
		vc := tinyVision
		vc.OutHiddenSize = p.Hidden
		cfg["vision_config"] = map[string]any{"model_type": "qwen3_5", "depth": vc.Depth, "hidden_size": vc.HiddenSize,
			"hidden_act": vc.HiddenAct, "intermediate_size": vc.IntermediateSize, "num_heads": vc.NumHeads,
			"in_channels": vc.InChannels, "patch_size": vc.PatchSize, "spatial_merge_size": vc.SpatialMergeSize,
			"temporal_patch_size": vc.TemporalPatchSize, "out_hidden_size": vc.OutHiddenSize,
			"num_position_embeddings": vc.NumPositionEmbeddings, "deepstack_visual_indexes": []int{},
			"initializer_range": 0.02}
	}
}

// The VL class's generated model with a vision tower (the tiny-vl preset) has Qwen3-VL's extras:
// vision tokens, their ids, the image processor's config and a chat template for images.
var (
	_ tinyExtras     = (*qwen3_5Family)(nil)
	_ optionalExtras = (*qwen3_5Family)(nil)
)

func (f *qwen3_5Family) hasExtras(p Preset) bool { return p.Vision && f.lmPrefix != "" }

func (*qwen3_5Family) tinySpecials() []string { return (*qwen3VLFamily)(nil).tinySpecials() }

func (*qwen3_5Family) tinyTokens(cfg map[string]any, id func(string) int) {
	(*qwen3VLFamily)(nil).tinyTokens(cfg, id)
}

func (*qwen3_5Family) tinyFiles(dir string, c *Config) error {
	return (*qwen3VLFamily)(nil).tinyFiles(dir, c)
}

// Tiny VL tower: 16×16 patches over 2 frames as real checkpoints have, a 4×4 table of learned
// position embeddings (interpolated to every grid), three blocks of which two feed DeepStack.
var tinyVision = VisionConfig{Depth: 3, HiddenSize: 32, HiddenAct: "gelu_pytorch_tanh", IntermediateSize: 64,
	NumHeads: 2, InChannels: 3, PatchSize: 16, SpatialMergeSize: 2, TemporalPatchSize: 2,
	NumPositionEmbeddings: 16, DeepstackVisualIndexes: []int{0, 1}}

type qwen3VLFamily struct{ family }

var (
	_ validator     = (*qwen3VLFamily)(nil)
	_ extraWeighter = (*qwen3VLFamily)(nil)
	_ tinyFamily    = (*qwen3VLFamily)(nil)
	_ tinyExtras    = (*qwen3VLFamily)(nil)
)

func init() {
	registerFamily(&qwen3VLFamily{family{arch: ArchQwen3VL, hfClass: "Qwen3VLForConditionalGeneration", modelType: "qwen3_vl",
		headNorm: true, lmPrefix: "model.language_model.", statedRopeTheta: true}})
}

// tinyTopLevel are the keys a Qwen3-VL config.json keeps at its top level; the rest go to
// text_config.
var tinyTopLevel = map[string]bool{"architectures": true, "model_type": true, "transformers_version": true}

// tinyConfig moves the LM's keys to text_config and adds a tiny vision_config.
func (*qwen3VLFamily) tinyConfig(cfg map[string]any, p Preset) {
	cfg["head_dim"] = 2 * p.Hidden / p.Heads
	cfg["attention_bias"] = false
	cfg["rope_theta"] = 5000000.0
	half := p.Hidden / p.Heads // head_dim/2
	hs := half * 5 / 16        // Qwen3-VL's 24/20/20 of 64, scaled
	cfg["rope_scaling"] = map[string]any{"rope_type": "default", "mrope_interleaved": true,
		"mrope_section": []int{half - 2*hs, hs, hs}}
	text := map[string]any{"model_type": "qwen3_vl_text"}
	for k, v := range cfg {
		if !tinyTopLevel[k] {
			text[k] = v
			delete(cfg, k)
		}
	}
	cfg["text_config"] = text
	vc := tinyVision
	vc.OutHiddenSize = p.Hidden
	cfg["vision_config"] = map[string]any{"model_type": "qwen3_vl", "depth": vc.Depth, "hidden_size": vc.HiddenSize,
		"hidden_act": vc.HiddenAct, "intermediate_size": vc.IntermediateSize, "num_heads": vc.NumHeads,
		"in_channels": vc.InChannels, "patch_size": vc.PatchSize, "spatial_merge_size": vc.SpatialMergeSize,
		"temporal_patch_size": vc.TemporalPatchSize, "out_hidden_size": vc.OutHiddenSize,
		"num_position_embeddings": vc.NumPositionEmbeddings, "deepstack_visual_indexes": vc.DeepstackVisualIndexes,
		"initializer_range": 0.02}
	// In both places, as released configs have it: HF ties by text_config's flag.
	cfg["tie_word_embeddings"], text["tie_word_embeddings"] = true, true
}

// tinySpecials are the vision special tokens of a generated tokenizer.
func (*qwen3VLFamily) tinySpecials() []string {
	return []string{VisionStartToken, VisionEndToken, ImagePadToken}
}

// tinyTokens sets the vision token ids of a generated config from its tokenizer.
func (*qwen3VLFamily) tinyTokens(cfg map[string]any, id func(string) int) {
	cfg["image_token_id"] = id(ImagePadToken)
	cfg["vision_start_token_id"] = id(VisionStartToken)
	cfg["vision_end_token_id"] = id(VisionEndToken)
}

// tinyFiles writes a generated VL model's preprocessor_config.json (Qwen2-VL's image
// processor with Qwen3-VL's 16-pixel patches and mean/std of 0.5) and tokenizer_config.json.
func (*qwen3VLFamily) tinyFiles(dir string, c *Config) error {
	v := c.VisionConfig
	pre := map[string]any{
		"image_processor_type": "Qwen2VLImageProcessorFast", "processor_class": "Qwen3VLProcessor",
		"patch_size": v.PatchSize, "temporal_patch_size": v.TemporalPatchSize, "merge_size": v.SpatialMergeSize,
		"image_mean": []float64{0.5, 0.5, 0.5}, "image_std": []float64{0.5, 0.5, 0.5},
		"do_rescale": true, "rescale_factor": 1.0 / 255, "do_normalize": true, "do_resize": true,
		"do_convert_rgb": true, "resample": 3,
		"size":       map[string]int{"shortest_edge": 4 * 32 * 32, "longest_edge": 64 * 32 * 32},
		"min_pixels": 4 * 32 * 32, "max_pixels": 64 * 32 * 32,
	}
	pb, _ := json.MarshalIndent(pre, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "preprocessor_config.json"), pb, 0o644); err != nil {
		return err
	}
	tc := map[string]any{
		"tokenizer_class": "Qwen2TokenizerFast", "chat_template": qwen3VLChatTemplate,
		"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "model_max_length": c.MaxPositionEmbeddings,
		"errors": "replace", "add_prefix_space": false, "clean_up_tokenization_spaces": false,
	}
	tb, _ := json.MarshalIndent(tc, "", "  ")
	return os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), tb, 0o644)
}

// moeTinyKeys are a generated mixture of experts' config keys: the preset's sizes, or a tiny
// model's (8 experts of a quarter of the dense width, 2 a token).
func moeTinyKeys(cfg map[string]any, p Preset) {
	e, k, f := p.Experts, p.ExpertsPerTok, p.ExpertFFN
	if e == 0 {
		e, k, f = 8, 2, max(p.FFN/4, 1)
	}
	cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"] = e, k, f
	cfg["norm_topk_prob"] = true // the released checkpoints'
	cfg["router_aux_loss_coef"] = 0.001
	cfg["output_router_logits"] = false
}

// tinyConfig is Qwen3's with a mixture of experts on every layer but the preset's dense ones.
func (*qwen3MoEFamily) tinyConfig(cfg map[string]any, p Preset) {
	(*qwen3Family)(nil).tinyConfig(cfg, p)
	if p.HeadDim > 0 {
		cfg["head_dim"] = p.HeadDim
	}
	cfg["tie_word_embeddings"] = false // Qwen3-30B-A3B's
	moeTinyKeys(cfg, p)
	cfg["decoder_sparse_step"] = 1
	cfg["mlp_only_layers"] = append([]int{}, p.DenseLayers...)
}

// tinyConfig is dense Qwen3.5's with a mixture of experts and a shared expert on every layer.
func (f *qwen3_5MoEFamily) tinyConfig(cfg map[string]any, p Preset) {
	f.qwen3_5Family.tinyConfig(cfg, p)
	text := cfg
	if t, ok := cfg["text_config"].(map[string]any); ok {
		text = t
		text["model_type"] = "qwen3_5_moe_text"
	}
	moeTinyKeys(text, p)
	delete(text, "norm_topk_prob") // Qwen3.5-MoE always renormalises; its config has no such key
	s := p.SharedFFN
	if s == 0 {
		s = max(p.FFN/2, 1)
	}
	text["shared_expert_intermediate_size"] = s
}
