package engine

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// loadConfigJSON writes cfg as a model directory's config.json and loads it.
func loadConfigJSON(t *testing.T, cfg string) (*Config, error) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return LoadConfig(dir)
}

// qwen3VL2BConfig is Qwen3-VL-2B's config.json with text_config's rotary keys replaced by rope.
func qwen3VL2BConfig(rope string) string {
	return `{
  "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
  "image_token_id": 151655, "vision_start_token_id": 151652, "vision_end_token_id": 151653, "tie_word_embeddings": true,
  "text_config": {
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144,
    "max_position_embeddings": 262144, "model_type": "qwen3_vl_text", "num_attention_heads": 16, "num_hidden_layers": 28,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, ` + rope + `"vocab_size": 151936
  },
  "vision_config": {
    "deepstack_visual_indexes": [5, 11, 17], "depth": 24, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 1024,
    "in_channels": 3, "intermediate_size": 4096, "num_heads": 16, "num_position_embeddings": 2304,
    "out_hidden_size": 2048, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2
  }
}`
}

// transformers 5 (modeling_qwen3_vl at 68a7b7e, Qwen3VLTextRotaryEmbedding) reads the rotary
// settings from rope_parameters, which its configs save in place of rope_theta and
// rope_scaling: such a config.json loads with the same theta and mRoPE sections.
func TestQwen3VLConfigWithRopeParameters(t *testing.T) {
	c, err := loadConfigJSON(t, qwen3VL2BConfig(`"rope_parameters": {"mrope_interleaved": true, "mrope_section": [24, 20, 20], "rope_type": "default", "rope_theta": 5000000}, `))
	if err != nil {
		t.Fatal(err)
	}
	if c.RopeTheta != 5e6 || c.RopeScaling == nil || !c.RopeScaling.MropeInterleaved || len(c.RopeScaling.MropeSection) != 3 || c.RopeScaling.MropeSection[0] != 24 {
		t.Fatalf("rope_theta %v, rope_scaling %+v", c.RopeTheta, c.RopeScaling)
	}
	// The legacy keys, where given, win as in HF's convert_rope_params_to_dict.
	c, err = loadConfigJSON(t, qwen3VL2BConfig(`"rope_scaling": {"mrope_interleaved": true, "mrope_section": [24, 20, 20]}, "rope_theta": 1000000, "rope_parameters": {"mrope_section": [64, 0, 0], "rope_theta": 7}, `))
	if err != nil {
		t.Fatal(err)
	}
	if c.RopeTheta != 1e6 || c.RopeScaling.MropeSection[0] != 24 {
		t.Fatalf("rope_theta %v, rope_scaling %+v: rope_parameters overrode rope_scaling", c.RopeTheta, c.RopeScaling)
	}
}

// HF's default rotary base for Qwen3-VL's LM (Qwen3VLTextConfig.default_theta, 500000 at 68a7b7e) is
// not what the released checkpoints state (5000000): a Qwen3-VL config.json without one is refused
// rather than run at a guessed base (the engine used 10000, neither of the two).
func TestQwen3VLConfigNeedsRopeTheta(t *testing.T) {
	_, err := loadConfigJSON(t, qwen3VL2BConfig(`"rope_scaling": {"mrope_interleaved": true, "mrope_section": [24, 20, 20], "rope_type": "default"}, `))
	if err == nil || !strings.Contains(err.Error(), "rope_theta") {
		t.Fatalf("err %v, want one naming rope_theta", err)
	}
}

// A text model's config.json in transformers 5's form: rope_parameters' theta and llama3
// scaling are honoured (they were ignored: plain RoPE at base 10000).
func TestTextConfigWithRopeParameters(t *testing.T) {
	c, err := loadConfigJSON(t, `{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256,
  "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
  "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}`)
	if err != nil {
		t.Fatal(err)
	}
	if c.RopeTheta != 500000 || c.RopeScaling == nil || c.RopeScaling.RopeType != "llama3" || c.RopeScaling.Factor != 8 {
		t.Fatalf("rope_theta %v, rope_scaling %+v", c.RopeTheta, c.RopeScaling)
	}
	inv := c.invFreq()
	n := len(inv) - 1 // the slowest frequency, which llama3 divides by factor
	if want := math.Pow(500000, -float64(2*n)/float64(c.HeadDim)) / 8; math.Abs(inv[n]-want) > 1e-12*want {
		t.Fatalf("slowest inverse frequency %g, want %g", inv[n], want)
	}
}

// HF ties a composite model's head by its text config's flag
// (get_text_config(decoder=True).tie_word_embeddings), so text_config's tie_word_embeddings
// wins over the top level's, and generated VL models state it in both places, as the
// released ones do.
func TestQwen3VLTiesByTextConfig(t *testing.T) {
	rope := `"rope_scaling": {"mrope_interleaved": true, "mrope_section": [24, 20, 20]}, "rope_theta": 5000000, `
	c, err := loadConfigJSON(t, qwen3VL2BConfig(rope+`"tie_word_embeddings": false, `))
	if err != nil {
		t.Fatal(err)
	}
	if c.TieWordEmbeddings {
		t.Fatal("tied by the top level's flag; text_config says false")
	}
	if c, err = loadConfigJSON(t, qwen3VL2BConfig(rope)); err != nil || !c.TieWordEmbeddings {
		t.Fatalf("without a text_config flag the top level's (true) holds: tied %v, %v", c != nil && c.TieWordEmbeddings, err)
	}
	dir := tinyModel(t, ArchQwen3VL)
	var cfg struct {
		Tie  *bool `json:"tie_word_embeddings"`
		Text struct {
			Tie *bool `json:"tie_word_embeddings"`
		} `json:"text_config"`
	}
	b, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Tie == nil || cfg.Text.Tie == nil || *cfg.Tie != *cfg.Text.Tie {
		t.Fatalf("generated config.json: tie_word_embeddings %v at the top, %v in text_config", cfg.Tie, cfg.Text.Tie)
	}
}
