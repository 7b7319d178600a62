package engine

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/skein-ai/skein/engine/internal/kernels"
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
}

// Presets: tiny for tests, small for benchmarks, 1b for the shape of a 1B-parameter model
// (hidden 2048, 16 layers, GQA 32/8; 1.2B parameters, 2.4 GB of bf16 in two shards).
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
		return fmt.Errorf("unknown preset %q (tiny, tiny-quant, small, 1b, qwen3_5-4b)", presetName)
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
	size, count, err := writeTinyWeights(dir, c, p.BF16, seed, progress)
	if err != nil {
		return err
	}
	progress.logf("model generated", "dir", dir, "bytes", size, "size", sizeString(size), "tensors", count,
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

// tinyWeights are a generated model's weights, drawn from seed (as bfloat16 with bf16).
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

// progress hears of each tensor drawn.
func tinyWeights(c *Config, bf16 bool, seed uint64, progress *loadProgress) map[string]safetensors.Tensor {
	d := newTinyDrawer(c, bf16, seed, progress)
	tensors := map[string]safetensors.Tensor{}
	for _, name := range d.names {
		tensors[name] = d.draw(name)
	}
	return tensors
}

// tinyDrawer draws a generated model's tensors one at a time, in allWeightNames order from one
// random stream, so that a model written in shards has the values of one written whole.
type tinyDrawer struct {
	c        *Config
	bf16     bool
	rng      *rand.Rand
	names    []string
	drawn    int
	progress *loadProgress
}

func newTinyDrawer(c *Config, bf16 bool, seed uint64, progress *loadProgress) *tinyDrawer {
	return &tinyDrawer{c: c, bf16: bf16, rng: rand.New(rand.NewPCG(seed, 0x5ce1)), names: c.allWeightNames(), progress: progress}
}

// draw is the next tensor, which must be name (the names are drawn in order).
func (d *tinyDrawer) draw(name string) safetensors.Tensor {
	c, rng, progress := d.c, d.rng, d.progress
	if now := time.Now(); progress.log != nil && now.Sub(progress.last) >= loadProgressEvery {
		progress.last = now
		progress.logf("generating model: drawing weights", "tensors", d.drawn, "of", len(d.names), "seconds", now.Sub(progress.start).Seconds())
	}
	if d.names[d.drawn] != name {
		panic("engine: tiny tensors drawn out of order: " + name)
	}
	d.drawn++
	shape := c.expectedShape(name)
	n := 1
	for _, x := range shape {
		n *= x
	}
	v := make([]float32, n)
	switch {
	case c.plusOneNorm(name):
		for i := range v { // zero-centred (Qwen3.5): (1 + w) near one
			v[i] = float32(0.1 * rng.NormFloat64())
		}
	case len(shape) == 1 && (filepath.Ext(name) == ".weight"):
		for i := range v { // norms start near one, as trained models have them
			v[i] = float32(1 + 0.1*rng.NormFloat64())
		}
	case filepath.Ext(name) == ".bias":
		for i := range v {
			v[i] = float32(0.02 * rng.NormFloat64())
		}
	default:
		// Unit-variance projections and modest embeddings: a random model whose attention
		// and logits are not flat, so tests exercise every part of the network.
		std := 1 / math.Sqrt(float64(n/shape[0])) // 1/√fan-in (a conv's too)
		if strings.HasSuffix(name, "embed_tokens.weight") || name == "lm_head.weight" || strings.HasSuffix(name, "pos_embed.weight") {
			std = 0.1
		}
		for i := range v {
			v[i] = float32(std * rng.NormFloat64())
		}
	}
	if d.bf16 {
		return bf16Tensor(v, shape)
	}
	return safetensors.FromFloat32(v, shape...)
}

// tinyShardBytes is the most a generated model writes into one file: bigger models (the
// qwen3_5-4b preset, 8.4 GB) go into shards with an index, as Hugging Face's checkpoints do, and
// are drawn a shard at a time, so generating one holds a shard (twice, while it is encoded)
// rather than the whole model.
var tinyShardBytes int64 = 2 << 30

// writeTinyWeights draws and writes a generated model's weights: model.safetensors, or shards
// model-0000i-of-0000n.safetensors and model.safetensors.index.json when bigger than
// tinyShardBytes. It returns the bytes written and the tensor count.
func writeTinyWeights(dir string, c *Config, bf16 bool, seed uint64, progress *loadProgress) (int64, int, error) {
	d := newTinyDrawer(c, bf16, seed, progress)
	elem := int64(4)
	if bf16 {
		elem = 2
	}
	var shards [][]string
	var size, total int64
	for _, name := range d.names {
		n := elem
		for _, x := range c.expectedShape(name) {
			n *= int64(x)
		}
		if len(shards) == 0 || (size > 0 && size+n > tinyShardBytes) {
			shards, size = append(shards, nil), 0
		}
		shards[len(shards)-1] = append(shards[len(shards)-1], name)
		size += n
		total += n
	}
	meta := map[string]string{"format": "pt"}
	if len(shards) == 1 {
		path := filepath.Join(dir, "model.safetensors")
		progress.logf("generating model: writing weights", "file", path)
		if err := safetensors.WriteFile(path, tinyWeights(c, bf16, seed, progress), meta); err != nil {
			return 0, 0, err
		}
		st, err := os.Stat(path)
		if err != nil {
			return 0, 0, err
		}
		return st.Size(), len(d.names), nil
	}
	weightMap := map[string]string{}
	var written int64
	for i, names := range shards {
		file := fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(shards))
		tensors := map[string]safetensors.Tensor{}
		for _, name := range names {
			tensors[name] = d.draw(name)
			weightMap[name] = file
		}
		path := filepath.Join(dir, file)
		progress.logf("generating model: writing weights", "file", path, "shard", i+1, "of", len(shards))
		if err := safetensors.WriteFile(path, tensors, meta); err != nil {
			return 0, 0, err
		}
		if st, err := os.Stat(path); err == nil {
			written += st.Size()
		}
	}
	idx, _ := json.MarshalIndent(map[string]any{"metadata": map[string]any{"total_size": total}, "weight_map": weightMap}, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), idx, 0o644); err != nil {
		return 0, 0, err
	}
	return written, len(d.names), nil
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

// bf16Tensor rounds v to a BF16 tensor (to nearest, ties to even).
func bf16Tensor(v []float32, shape []int) safetensors.Tensor {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		h := kernels.BF16Of(x)
		b[2*i], b[2*i+1] = byte(h), byte(h>>8)
	}
	return safetensors.Tensor{DType: "BF16", Shape: shape, Data: b}
}
