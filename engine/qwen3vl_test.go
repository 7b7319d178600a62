package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/skein-ai/skein/engine/tokenizer"
	"github.com/skein-ai/skein/safetensors"
)

// init-tiny --arch qwen3_vl writes a Qwen3VLForConditionalGeneration directory as HF lays it
// out: the LM's keys in text_config, a vision_config, the vision token ids, HF's tensor names,
// a tokenizer with the vision tokens, a chat template and a preprocessor config; the same seed
// writes the same bytes.
func TestInitTinyQwen3VLWritesHFFormat(t *testing.T) {
	dir := tinyModel(t, ArchQwen3VL)
	var cfg map[string]any
	b, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	if a := cfg["architectures"].([]any); a[0] != "Qwen3VLForConditionalGeneration" || cfg["model_type"] != "qwen3_vl" {
		t.Fatalf("architectures %v, model_type %v", a, cfg["model_type"])
	}
	text, _ := cfg["text_config"].(map[string]any)
	if text == nil || text["hidden_size"] == nil || cfg["hidden_size"] != nil {
		t.Fatalf("LM keys not in text_config: %v", cfg)
	}
	if rs, _ := text["rope_scaling"].(map[string]any); rs == nil || rs["mrope_interleaved"] != true || len(rs["mrope_section"].([]any)) != 3 {
		t.Fatalf("rope_scaling %v", text["rope_scaling"])
	}
	if _, ok := cfg["vision_config"].(map[string]any)["deepstack_visual_indexes"]; !ok {
		t.Fatalf("vision_config %v", cfg["vision_config"])
	}
	tok, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	for key, name := range map[string]string{"image_token_id": ImagePadToken, "vision_start_token_id": VisionStartToken, "vision_end_token_id": VisionEndToken} {
		id, ok := tok.TokenID(name)
		if !ok || cfg[key] != float64(id) {
			t.Errorf("%s = %v, tokenizer has %s at %d (%v)", key, cfg[key], name, id, ok)
		}
	}
	var tc map[string]any
	b, _ = os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err := json.Unmarshal(b, &tc); err != nil || !strings.Contains(tc["chat_template"].(string), "<|vision_start|><|image_pad|><|vision_end|>") {
		t.Fatalf("tokenizer_config.json: %v %v", tc, err)
	}
	var pre map[string]any
	b, _ = os.ReadFile(filepath.Join(dir, "preprocessor_config.json"))
	if err := json.Unmarshal(b, &pre); err != nil || pre["patch_size"] != 16.0 || pre["merge_size"] != 2.0 || pre["temporal_patch_size"] != 2.0 {
		t.Fatalf("preprocessor_config.json: %v %v", pre, err)
	}
	st, err := safetensors.ReadFile(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"model.visual.patch_embed.proj.weight", "model.visual.pos_embed.weight",
		"model.visual.blocks.0.attn.qkv.weight", "model.visual.merger.linear_fc2.weight",
		"model.visual.deepstack_merger_list.1.norm.weight", "model.language_model.embed_tokens.weight",
		"model.language_model.layers.1.self_attn.q_norm.weight", "model.language_model.norm.weight"} {
		if _, ok := st.Tensors[name]; !ok {
			t.Errorf("no tensor %s", name)
		}
	}
	if s := st.Tensors["model.visual.patch_embed.proj.weight"].Shape; len(s) != 5 || s[1] != 3 || s[2] != 2 || s[3] != 16 {
		t.Errorf("patch embedding shape %v, want [D, 3, 2, 16, 16]", s)
	}
	for name := range st.Tensors {
		if strings.HasPrefix(name, "model.layers.") || strings.HasPrefix(name, "model.embed_tokens") {
			t.Errorf("tensor %s has a text model's name", name)
		}
	}
	again := t.TempDir()
	if err := InitTiny(again, ArchQwen3VL, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "preprocessor_config.json"} {
		x, _ := os.ReadFile(filepath.Join(dir, f))
		y, _ := os.ReadFile(filepath.Join(again, f))
		if len(x) == 0 || !bytes.Equal(x, y) {
			t.Errorf("%s differs between two runs with the same seed", f)
		}
	}
}

// qwen3TwinOf writes the VL model's LM as a plain Qwen3 model: the same weights under
// Qwen3ForCausalLM's names, the config's text_config at the top level.
func qwen3TwinOf(t *testing.T, vlDir string) string {
	dir := t.TempDir()
	var cfg map[string]any
	b, _ := os.ReadFile(filepath.Join(vlDir, "config.json"))
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	text := cfg["text_config"].(map[string]any)
	delete(text, "rope_scaling")
	text["architectures"], text["model_type"], text["tie_word_embeddings"] = []string{"Qwen3ForCausalLM"}, "qwen3", cfg["tie_word_embeddings"]
	cb, _ := json.Marshal(text)
	st, err := safetensors.ReadFile(filepath.Join(vlDir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]safetensors.Tensor{}
	for name, x := range st.Tensors {
		if rest, ok := strings.CutPrefix(name, "model.language_model."); ok {
			out["model."+rest] = x
		}
	}
	tj, _ := os.ReadFile(filepath.Join(vlDir, "tokenizer.json"))
	if os.WriteFile(filepath.Join(dir, "config.json"), cb, 0o644) != nil || os.WriteFile(filepath.Join(dir, "tokenizer.json"), tj, 0o644) != nil {
		t.Fatal("writing the twin")
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), out, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Text-only, a VL model is its Qwen3 LM: forward, training and sampling give the same numbers
// as the same weights loaded as Qwen3ForCausalLM, and its LoRA modules carry the LM's HF names.
func TestQwen3VLTextOnlyIsQwen3(t *testing.T) {
	vlDir := tinyModel(t, ArchQwen3VL)
	vl, err := Load(vlDir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	q3, err := Load(qwen3TwinOf(t, vlDir), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if vl.base.vision == nil || q3.base.vision != nil {
		t.Fatal("vision tower: VL model without, or text model with one")
	}
	ids := vl.Tokenizer.Encode("The quick brown fox jumps over the lazy dog.")
	lc := LoraConfig{Rank: 4, Seed: 5, TrainAttn: true, TrainMLP: true}
	p := DefaultAdamParams()
	p.LearningRate = 1e-2
	var losses [2][]float64
	for k, e := range []*Engine{vl, q3} {
		if _, err := e.CreateAdapter("a", lc); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			r, err := e.ForwardBackward(context.Background(), "a", []Datum{textDatum(ids)}, "cross_entropy", nil)
			if err != nil {
				t.Fatal(err)
			}
			losses[k] = append(losses[k], r.Loss)
			if _, err := e.OptimStep(context.Background(), "a", p); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range losses[0] {
		if losses[0][i] != losses[1][i] {
			t.Fatalf("training losses differ: VL %v, Qwen3 %v", losses[0], losses[1])
		}
	}
	if !(losses[0][2] < losses[0][0]) {
		t.Fatalf("loss did not fall: %v", losses[0])
	}
	seed := int64(9)
	req := SampleRequest{Prompt: ids[:6], NumSamples: 2, Params: SampleParams{MaxTokens: 8, Temperature: 1, Seed: &seed}}
	a, err := vl.Sample("a", req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := q3.Sample("a", req)
	if err != nil {
		t.Fatal(err)
	}
	for i := range a.Sequences {
		if !slices.Equal(a.Sequences[i].Tokens, b.Sequences[i].Tokens) || math.Abs(a.Sequences[i].Logprobs[0]-b.Sequences[i].Logprobs[0]) > 0 {
			t.Fatalf("samples differ: %v vs %v", a.Sequences[i], b.Sequences[i])
		}
	}
	dir := t.TempDir()
	if err := vl.SaveAdapter(context.Background(), "a", dir, false); err != nil {
		t.Fatal(err)
	}
	st, err := safetensors.ReadFile(filepath.Join(dir, AdapterWeightsFile))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := st.Tensors["base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight"]; !ok {
		var names []string
		for n := range st.Tensors {
			names = append(names, n)
		}
		t.Fatalf("PEFT names %v lack the LM's module path", names)
	}
	if err := vl.LoadAdapter(context.Background(), "b", dir, false); err != nil {
		t.Fatal(err)
	}
}

// Qwen3-VL-2B-Instruct's config.json (as published; keys we do not read left out) loads: the
// LM's shape from text_config, the vision tower's, the token ids, mRoPE.
func TestLoadsQwen3VL2BConfig(t *testing.T) {
	const cfg = `{
  "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
  "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
  "tie_word_embeddings": true, "transformers_version": "4.57.0.dev0",
  "text_config": {
    "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643, "dtype": "bfloat16", "eos_token_id": 151645,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
    "max_position_embeddings": 262144, "model_type": "qwen3_vl_text", "num_attention_heads": 16, "num_hidden_layers": 28,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": {"mrope_interleaved": true, "mrope_section": [24, 20, 20], "rope_type": "default"},
    "rope_theta": 5000000, "tie_word_embeddings": true, "use_cache": true, "vocab_size": 151936
  },
  "vision_config": {
    "deepstack_visual_indexes": [5, 11, 17], "depth": 24, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 1024,
    "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 4096, "model_type": "qwen3_vl", "num_heads": 16,
    "num_position_embeddings": 2304, "out_hidden_size": 2048, "patch_size": 16, "spatial_merge_size": 2,
    "temporal_patch_size": 2
  }
}`
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.Arch != ArchQwen3VL || c.HiddenSize != 2048 || c.NumHiddenLayers != 28 || c.HeadDim != 128 || c.VocabSize != 151936 ||
		!c.TieWordEmbeddings || *c.ImageTokenID != 151655 || c.VisionConfig.Depth != 24 || c.RopeTheta != 5e6 {
		t.Fatalf("config %+v", c)
	}
	if got := c.allWeightNames(); len(got) != len(c.weightNames())+3+24*12+6*4 {
		t.Fatalf("%d weight names", len(got))
	}
	if s := c.expectedShape("model.visual.deepstack_merger_list.2.linear_fc1.weight"); s[0] != 4096 || s[1] != 4096 {
		t.Fatalf("deepstack fc1 shape %v", s)
	}
	if s := c.expectedShape("model.language_model.layers.0.self_attn.q_proj.weight"); s[0] != 2048 || s[1] != 2048 {
		t.Fatalf("q_proj shape %v", s)
	}
	// Every vision_config size is checked before it becomes an allocation.
	bad := strings.Replace(cfg, `"depth": 24`, `"depth": 100000000`, 1)
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(bad), 0o644)
	if _, err := LoadConfig(dir); err == nil {
		t.Fatal("a tower of 10⁸ blocks loaded")
	}
}
