package engine

import (
	"bytes"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/skein-ai/skein/engine/internal/num"
	"github.com/skein-ai/skein/engine/tokenizer"
	"github.com/skein-ai/skein/safetensors"
)

//go:embed corpus.txt
var corpus string

// Preset is a size for generated models.
type Preset struct {
	Hidden, Layers, Heads, KVHeads, FFN, Vocab, Context int
	// BF16 writes the weights as bfloat16, as real checkpoints ship (f32 otherwise).
	BF16 bool
	// FillVocab fills the tokenizer past what corpus.txt trains (a few hundred ids) with
	// generated words, so that every id of the vocab is text: a random model samples any id,
	// and without it chats with the small and 1b presets answered "". tiny keeps the plain
	// trained tokenizer: it covers nearly all of its 512 ids, and the reference fixtures (the
	// transformers.js token ids, the torch Qwen3-VL ones) are made with it.
	FillVocab bool
	// Sizes only some families read (0: the family's own choice from the sizes above): an
	// explicit head_dim, and a Gated DeltaNet's heads and head dims (arch_qwen3_5.go).
	HeadDim                                                        int
	LinearKeyHeads, LinearValueHeads, LinearKeyDim, LinearValueDim int
	// A mixture of experts (the MoE families; 0: their defaults for a tiny model): routed
	// experts, how many a token takes, each one's width, the shared expert's width (Qwen3.5-MoE),
	// and the layers kept dense (Qwen3-MoE's mlp_only_layers).
	Experts, ExpertsPerTok, ExpertFFN, SharedFFN int
	DenseLayers                                  []int
	// Vision: a vision tower where the family's is optional (Qwen3.5's VL class; Qwen3-VL
	// always has one).
	Vision bool
}

// Presets: tiny for tests, small for benchmarks, 1b for the shape of a 1B-parameter model
// (hidden 2048, 16 layers, GQA 32/8; 1.2B parameters, 2.4 GB of bf16).
var Presets = map[string]Preset{
	"tiny":  {Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, FFN: 128, Vocab: 512, Context: 1024},
	"small": {Hidden: 512, Layers: 8, Heads: 8, KVHeads: 2, FFN: 1536, Vocab: 8192, Context: 2048, FillVocab: true},
	// tiny-quant: as tiny, with rows of whole Q4_K blocks (256) for quantized-base tests.
	"tiny-quant": {Hidden: 256, Layers: 2, Heads: 4, KVHeads: 2, FFN: 512, Vocab: 512, Context: 1024},
	"1b":         {Hidden: 2048, Layers: 16, Heads: 32, KVHeads: 8, FFN: 8192, Vocab: 32768, Context: 4096, BF16: true, FillVocab: true},
	// qwen3_5-4b: Qwen3.5-4B's text shape (reference §1.2), for `skein bench engine` over
	// generated weights (init-tiny --arch qwen3_5 --preset qwen3_5-4b): 32 layers (24 DeltaNet
	// + 8 gated attention), tied head, 4,205,751,296 parameters, ≈8.4 GB in bf16.
	"qwen3_5-4b": {Hidden: 2560, Layers: 32, Heads: 16, KVHeads: 4, FFN: 9216, Vocab: 248320, Context: 8192, BF16: true, FillVocab: true,
		HeadDim: 256, LinearKeyHeads: 16, LinearValueHeads: 32, LinearKeyDim: 128, LinearValueDim: 128},
	// 8b: Llama-3.1-8B's shape with --arch llama (8.0B parameters, a 16 GB bf16 file), for
	// measuring training memory at 8B; written a chunk at a time, so generating it takes a few MB.
	"8b": {Hidden: 4096, Layers: 32, Heads: 32, KVHeads: 8, FFN: 14336, Vocab: 128256, Context: 8192, BF16: true, FillVocab: true},
	// tiny-vl: tiny with a vision tower (Qwen3.5's VL class: its tower and interleaved mRoPE).
	"tiny-vl": {Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, FFN: 128, Vocab: 512, Context: 1024, Vision: true},
	// tiny-moe: tiny with 8 experts of width 32, 2 a token, on layers 0 and 2 of 3 (layer 1 dense
	// under Qwen3-MoE's mlp_only_layers; every layer under Qwen3.5-MoE), a shared expert of 48.
	"tiny-moe": {Hidden: 64, Layers: 3, Heads: 4, KVHeads: 2, FFN: 128, Vocab: 512, Context: 1024,
		Experts: 8, ExpertsPerTok: 2, ExpertFFN: 32, SharedFFN: 48, DenseLayers: []int{1}},
	// small-moe: the small preset with its MLP as 8 experts of half the width, 2 a token: the same
	// active parameters a token, for comparing a mixture's step with a dense one's
	// (skein bench engine on each).
	"small-moe": {Hidden: 512, Layers: 8, Heads: 8, KVHeads: 2, FFN: 1536, Vocab: 8192, Context: 2048, FillVocab: true,
		Experts: 8, ExpertsPerTok: 2, ExpertFFN: 768, SharedFFN: 768},
	// tiny-quant-moe: rows of whole Q4_K blocks (256), 4 experts, every layer a mixture (as llama.cpp's
	// qwen3moe needs: the GGUF tests).
	"tiny-quant-moe": {Hidden: 256, Layers: 3, Heads: 4, KVHeads: 2, FFN: 512, Vocab: 512, Context: 1024,
		Experts: 4, ExpertsPerTok: 2, ExpertFFN: 256, SharedFFN: 256},
	// qwen3-30b-a3b: Qwen3-30B-A3B's shape (--arch qwen3_moe): 48 layers of 128 experts of 768,
	// 8 a token; 30.5B parameters, a 61 GB bf16 file written a chunk at a time.
	"qwen3-30b-a3b": {Hidden: 2048, Layers: 48, Heads: 32, KVHeads: 4, HeadDim: 128, FFN: 6144, Vocab: 151936, Context: 40960,
		BF16: true, FillVocab: true, Experts: 128, ExpertsPerTok: 8, ExpertFFN: 768},
	// qwen3_5-35b-a3b: Qwen3.5/3.6-35B-A3B's text shape (--arch qwen3_5_moe): 40 layers (30
	// DeltaNet, 10 gated attention), 256 experts of 512, 8 a token, a shared expert of 512.
	"qwen3_5-35b-a3b": {Hidden: 2048, Layers: 40, Heads: 16, KVHeads: 2, HeadDim: 256, FFN: 512, Vocab: 248320, Context: 8192,
		BF16: true, FillVocab: true, LinearKeyHeads: 16, LinearValueHeads: 32, LinearKeyDim: 128, LinearValueDim: 128,
		Experts: 256, ExpertsPerTok: 8, ExpertFFN: 512, SharedFFN: 512},
}

// SpecialTokens of generated tokenizers (ChatML, as Qwen uses).
var SpecialTokens = []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}

// TinyChatTemplate is the chat template generated models ship in tokenizer_config.json: ChatML
// as Qwen's templates write it (without tools or thinking), so chat clients work with them.
const TinyChatTemplate = `{%- for message in messages %}
    {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}`

// tinyFamily is a family InitTiny can generate: it sets its own keys of the generated
// config.json.
type tinyFamily interface {
	architecture
	tinyConfig(cfg map[string]any, p Preset)
}

// tinyExtras is a tinyFamily whose generated model has more than the others': special tokens
// beside SpecialTokens, config keys naming their ids, and files beside config, weights and
// tokenizer.
type tinyExtras interface {
	tinySpecials() []string
	tinyTokens(cfg map[string]any, id func(string) int)
	tinyFiles(dir string, c *Config) error
}

// optionalExtras is a tinyExtras family whose extras only some presets ask for.
type optionalExtras interface {
	hasExtras(p Preset) bool
}

// InitTiny writes a deterministic random model in Hugging Face format to dir:
// config.json, model.safetensors (f32), a byte-level BPE tokenizer.json trained on corpus.txt and a
// tokenizer_config.json with a ChatML chat template.
func InitTiny(dir string, arch Arch, presetName string, seed uint64) error {
	return InitTinyLogged(dir, arch, presetName, seed, nil)
}

// InitTinyLogged is InitTiny telling log what it makes, how far it has got (the 1b preset
// takes a while) and what it wrote; nil log: nothing.
func InitTinyLogged(dir string, arch Arch, presetName string, seed uint64, log *slog.Logger) error {
	start := time.Now()
	p, ok := Presets[presetName]
	if !ok {
		return fmt.Errorf("unknown preset %q (tiny, tiny-quant, tiny-vl, tiny-moe, tiny-quant-moe, small, small-moe, 1b, 8b, qwen3_5-4b, qwen3-30b-a3b, qwen3_5-35b-a3b)", presetName)
	}
	a, ok := families[arch]
	if !ok {
		return fmt.Errorf("unknown architecture %q (%s)", arch, strings.Join(familyNames(), ", "))
	}
	f, ok := a.(tinyFamily)
	if !ok {
		return fmt.Errorf("architecture %q has no generated models", arch)
	}
	extras, _ := a.(tinyExtras)
	if o, ok := a.(optionalExtras); ok && !o.hasExtras(p) {
		extras = nil
	}
	specials := slices.Clone(SpecialTokens)
	if extras != nil {
		specials = append(specials, extras.tinySpecials()...)
	}
	tokJSON, tok, err := tinyTokenizer(p, specials)
	if err != nil {
		return err
	}
	eos, _ := tok.TokenID("<|endoftext|>")
	imEnd, _ := tok.TokenID("<|im_end|>")
	cb, c, err := tinyConfigFile(f, extras, p, tok, eos, imEnd)
	if err != nil {
		return err
	}
	progress := &loadProgress{log: log, start: start, last: start}
	progress.logf("generating model", "dir", dir, "arch", arch, "preset", presetName, "parameters", tinyParams(c), "vocab", p.Vocab)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cb, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tokJSON, 0o644); err != nil {
		return err
	}
	if err := writeTinyTokenizerConfig(dir); err != nil {
		return err
	}
	gen := map[string]any{"bos_token_id": eos, "eos_token_id": []int{eos, imEnd}}
	gb, _ := json.MarshalIndent(gen, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "generation_config.json"), gb, 0o644); err != nil {
		return err
	}
	if extras != nil {
		if err := extras.tinyFiles(dir, c); err != nil {
			return err
		}
	}
	weights := filepath.Join(dir, "model.safetensors")
	progress.logf("generating model: writing weights", "file", weights)
	tensors, err := writeTinyWeights(weights, c, p.BF16, seed, progress)
	if err != nil {
		return err
	}
	var size int64
	if st, err := os.Stat(weights); err == nil {
		size = st.Size()
	}
	progress.logf("model generated", "dir", dir, "bytes", size, "size", sizeString(size), "tensors", tensors,
		"seconds", time.Since(start).Seconds())
	return nil
}

// tinyTokenizer trains a generated model's tokenizer on corpus.txt, within the preset's vocab.
func tinyTokenizer(p Preset, specials []string) ([]byte, *tokenizer.Tokenizer, error) {
	train := tokenizer.Train
	if p.FillVocab {
		train = tokenizer.TrainFull
	}
	tokJSON, err := train(corpus, p.Vocab, specials)
	if err != nil {
		return nil, nil, err
	}
	tok, err := tokenizer.Parse(tokJSON)
	if err != nil {
		return nil, nil, err
	}
	if tok.VocabSize() > p.Vocab {
		return nil, nil, fmt.Errorf("tokenizer has %d ids, more than the preset's vocab %d", tok.VocabSize(), p.Vocab)
	}
	return tokJSON, tok, nil
}

// tinyConfigFile is a generated model's config.json, and the config it parses to.
func tinyConfigFile(f tinyFamily, extras tinyExtras, p Preset, tok *tokenizer.Tokenizer, eos, imEnd int) ([]byte, *Config, error) {
	cfg := map[string]any{
		"vocab_size": p.Vocab, "hidden_size": p.Hidden, "intermediate_size": p.FFN,
		"num_hidden_layers": p.Layers, "num_attention_heads": p.Heads, "num_key_value_heads": p.KVHeads,
		"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": p.Context,
		"hidden_act": "silu", "torch_dtype": map[bool]string{false: "float32", true: "bfloat16"}[p.BF16], "bos_token_id": eos, "eos_token_id": []int{eos, imEnd},
		"initializer_range": 0.02, "use_cache": true, "transformers_version": "4.51.0",
	}
	cfg["architectures"] = []string{f.desc().hfClass}
	cfg["model_type"] = f.desc().modelType
	f.tinyConfig(cfg, p)
	if extras != nil {
		extras.tinyTokens(cfg, func(s string) int { id, _ := tok.TokenID(s); return id })
	}
	cb, _ := json.MarshalIndent(cfg, "", "  ")
	var c Config
	if err := parseConfig(cb, &c); err != nil {
		return nil, nil, err
	}
	if err := c.finish(); err != nil {
		return nil, nil, err
	}
	return cb, &c, nil
}

// tinyParams is the parameter count of a generated model's weights.
func tinyParams(c *Config) int {
	total := 0
	for _, name := range c.allWeightNames() {
		n := 1
		for _, d := range c.expectedShape(name) {
			n *= d
		}
		total += n
	}
	return total
}

// writeTinyWeights writes a generated model's weights to path, drawn from seed (as bfloat16
// with bf16), a tensor at a time and within a tensor a chunk at a time, straight into the file:
// generating an 8B model needs a few megabytes, not its 16 GB. It returns the tensor count.
// progress hears of each tensor drawn.
func writeTinyWeights(path string, c *Config, bf16 bool, seed uint64, progress *loadProgress) (int, error) {
	rng := rand.New(rand.NewPCG(seed, 0x5ce1))
	names := c.allWeightNames()
	specs := make([]safetensors.Spec, len(names))
	for i, name := range names {
		specs[i] = safetensors.Spec{Name: name, DType: "F32", Shape: c.expectedShape(name)}
		if bf16 {
			specs[i].DType = "BF16"
		}
	}
	const chunk = 1 << 16
	v := make([]float32, chunk)
	buf := make([]byte, 4*chunk)
	err := safetensors.WriteStream(path, specs, map[string]string{"format": "pt"}, func(i int, w io.Writer) error {
		if now := time.Now(); progress.log != nil && now.Sub(progress.last) >= loadProgressEvery {
			progress.last = now
			progress.logf("generating model: drawing weights", "tensors", i, "of", len(names), "seconds", now.Sub(progress.start).Seconds())
		}
		name, shape := names[i], specs[i].Shape
		n := 1
		for _, d := range shape {
			n *= d
		}
		draw := tinyDraw(c, name, shape, n)
		for off := 0; off < n; off += chunk {
			part := v[:min(chunk, n-off)]
			for j := range part {
				part[j] = float32(draw(rng))
			}
			var b []byte
			if bf16 {
				b = buf[:2*len(part)]
				for j, x := range part {
					h := num.BF16Of(x)
					b[2*j], b[2*j+1] = byte(h), byte(h>>8)
				}
			} else {
				b = buf[:4*len(part)]
				for j, x := range part {
					binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(x))
				}
			}
			if _, err := w.Write(b); err != nil {
				return err
			}
		}
		return nil
	})
	return len(names), err
}

// tinyDraw is how one tensor's values are drawn: norms near one, as trained models have them,
// small biases, and unit-variance projections with modest embeddings (a random model whose
// attention and logits are not flat, so tests exercise every part of the network).
func tinyDraw(c *Config, name string, shape []int, n int) func(*rand.Rand) float64 {
	switch {
	case c.plusOneNorm(name): // zero-centred (Qwen3.5): (1 + w) near one
		return func(r *rand.Rand) float64 { return 0.1 * r.NormFloat64() }
	case len(shape) == 1 && (filepath.Ext(name) == ".weight"):
		return func(r *rand.Rand) float64 { return 1 + 0.1*r.NormFloat64() }
	case filepath.Ext(name) == ".bias":
		return func(r *rand.Rand) float64 { return 0.02 * r.NormFloat64() }
	}
	std := 1 / math.Sqrt(float64(n/shape[0])) // 1/√fan-in (a conv's too)
	if strings.HasSuffix(name, "embed_tokens.weight") || name == "lm_head.weight" || strings.HasSuffix(name, "pos_embed.weight") {
		std = 0.1
	}
	return func(r *rand.Rand) float64 { return std * r.NormFloat64() }
}

func writeTinyTokenizerConfig(dir string) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // the template's <|im_start|> stays readable
	enc.SetIndent("", "  ")
	if err := enc.Encode(map[string]any{"chat_template": TinyChatTemplate, "eos_token": "<|im_end|>",
		"pad_token": "<|endoftext|>", "bos_token": nil, "add_bos_token": false}); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), b.Bytes(), 0o644)
}

// AddTinyChatTemplate gives a generated model made before generated models had a chat template
// its tokenizer_config.json; a directory that has one is left as it is.
func AddTinyChatTemplate(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, "tokenizer_config.json")); err == nil {
		return nil
	}
	return writeTinyTokenizerConfig(dir)
}
