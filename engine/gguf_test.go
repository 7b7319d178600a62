package engine

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/skein-ai/skein/engine/gguf"
	"github.com/skein-ai/skein/engine/internal/backend/cpu"
	"github.com/skein-ai/skein/engine/internal/quant"
	"github.com/skein-ai/skein/engine/tokenizer"
	"github.com/skein-ai/skein/safetensors"
)

func maxAbsDiff(a, b []float64) float64 {
	worst := 0.0
	for i := range a {
		worst = math.Max(worst, math.Abs(a[i]-b[i]))
	}
	return worst
}

// ggufPair makes a tiny model directory and its GGUF (projections in typ).
func ggufPair(t *testing.T, arch Arch, preset string, typ gguf.GGMLType) (dir, file string) {
	t.Helper()
	dir = t.TempDir()
	if err := InitTiny(dir, arch, preset, 7); err != nil {
		t.Fatal(err)
	}
	file = filepath.Join(t.TempDir(), "model.gguf")
	if err := WriteGGUF(dir, file, typ, "tiny"); err != nil {
		t.Fatal(err)
	}
	return dir, file
}

var ggufTestTokens = []int{5, 77, 301, 12, 9, 410, 33, 200, 1, 64}

// A GGUF skein writes loads back to the model it came from: float32 tensors give the same
// logits bit for bit (qwen2, qwen3; llama within float32 rounding of rope_freqs, its llama3
// scaling stored as per-frequency divisors), with and without an adapter, so names, shapes, the
// llama q/k row permutation (written and undone), biases, head norms and the tied/untied head all
// come back where they were.
func TestGGUFRoundTripSameLogits(t *testing.T) {
	for _, arch := range []Arch{ArchLlama, ArchQwen2, ArchQwen3, ArchQwen3MoE} {
		t.Run(string(arch), func(t *testing.T) {
			preset := "tiny"
			if arch == ArchQwen3MoE {
				preset = "tiny-quant-moe" // every layer a mixture, as llama.cpp's qwen3moe has
			}
			dir, file := ggufPair(t, arch, preset, gguf.F32)
			st, err := Load(dir, Options{})
			if err != nil {
				t.Fatal(err)
			}
			gg, err := Load(file, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if !IsGGUF(file) || IsGGUF(dir) {
				t.Fatal("IsGGUF is wrong")
			}
			if gg.Config.Arch != arch || gg.Config.TieWordEmbeddings != st.Config.TieWordEmbeddings ||
				gg.Config.HeadDim != st.Config.HeadDim || gg.Config.NumKeyValueHeads != st.Config.NumKeyValueHeads {
				t.Fatalf("config from metadata %+v differs from config.json's %+v", gg.Config, st.Config)
			}
			tol := 0.0
			if arch == ArchLlama {
				tol = 1e-5
			}
			for _, withAdapter := range []bool{false, true} {
				id := ""
				if withAdapter {
					id = "a"
					for _, e := range []*Engine{st, gg} {
						referenceAdapter(t, e)
					}
					id = "ref"
				}
				want := logitsOf(t, st, id, ggufTestTokens)
				got := logitsOf(t, gg, id, ggufTestTokens)
				if d := maxAbsDiff(want, got); d > tol {
					t.Fatalf("adapter=%v: GGUF logits differ from safetensors' by %g (allowed %g)", withAdapter, d, tol)
				}
			}
		})
	}
}

// Q8_0 and Q4_K tensors of a GGUF are kept as the file's blocks under the matching precision:
// the same blocks the engine makes when it quantizes the safetensors at load (its quantizers are
// ggml's), so both engines hold the same bytes and give the same logits. Under f32 the blocks are
// dequantized, and the logits stay near the float model's.
//
// A Q4_K_M file (llama, so an untied head) keeps each tensor's own type: Q6_K for the head and
// layer 1's v and down projections (the last eighth of two layers), Q4_K elsewhere.
func TestGGUFQuantizedTensorsKeptAsBlocks(t *testing.T) {
	for _, c := range []struct {
		typ  gguf.GGMLType
		prec string
		tol  float64 // dequantized (f32 engine) vs the float model, mean |Δ logit|
		arch Arch
	}{{gguf.Q8_0, PrecisionQ8_0, 0.05, ArchQwen3}, {gguf.Q4_K, PrecisionQ4_K, 0.5, ArchQwen3},
		{gguf.Q6_K, PrecisionQ6_K, 0.1, ArchQwen3}, {GGUFQ4_K_M, PrecisionQ4_K_M, 0.5, ArchLlama},
		// A mixture's stacked experts, split back into each expert's blocks (and a router in float32).
		{gguf.Q4_K, PrecisionQ4_K, 0.5, ArchQwen3MoE}, {GGUFQ4_K_M, PrecisionQ4_K_M, 0.5, ArchQwen3MoE}} {
		t.Run(c.prec+"/"+string(c.arch), func(t *testing.T) {
			preset := "tiny-quant"
			if c.arch == ArchQwen3MoE {
				preset = "tiny-quant-moe"
			}
			dir, file := ggufPair(t, c.arch, preset, c.typ)
			st, err := Load(dir, Options{Precision: c.prec})
			if err != nil {
				t.Fatal(err)
			}
			gg, err := Load(file, Options{Precision: c.prec})
			if err != nil {
				t.Fatal(err)
			}
			if st.WeightBytes() != gg.WeightBytes() {
				t.Fatalf("resident bytes %d (safetensors, quantized at load) vs %d (GGUF blocks)", st.WeightBytes(), gg.WeightBytes())
			}
			ms, mg := modelOf[float32](st.base), modelOf[float32](gg.base)
			for i, l := range ms.linears {
				lw, gw := cpu.Inspect(l.w), cpu.Inspect(mg.linears[i].w)
				if lw.Blocks == nil {
					continue
				}
				if gw.Format != lw.Format || !slices.Equal(gw.Blocks, lw.Blocks) {
					t.Fatalf("%s: the GGUF's blocks are not the ones quantized at load", l.path)
				}
				if c.typ == GGUFQ4_K_M {
					// The head, and the last layer's v and down projections (every expert's down too): on
					// 2 and 3 layers, llama.cpp's use_more_bits picks only the last.
					last := fmt.Sprintf("model.layers.%d.", st.Config.NumHiddenLayers-1)
					want := quant.Q4_K
					if l.path == "lm_head" || strings.HasPrefix(l.path, last) &&
						(strings.HasSuffix(l.path, "self_attn.v_proj") || strings.HasSuffix(l.path, "down_proj")) {
						want = quant.Q6_K
					}
					if lw.Format != want {
						t.Fatalf("%s: %s, want %s", l.path, lw.Format.Name, want.Name)
					}
				}
			}
			// The embedding too (token_embd written in the file's type, loaded as its blocks).
			se, ge := cpu.Inspect(ms.embed), cpu.Inspect(mg.embed)
			if se.Blocks == nil || ge.Format != se.Format || !slices.Equal(ge.Blocks, se.Blocks) {
				t.Fatal("the GGUF's token_embd blocks are not the embedding's blocks quantized at load")
			}
			if c.typ == GGUFQ4_K_M && se.Format != quant.Q4_K { // an untied model: token_embd is Q4_K_M's default type
				t.Fatalf("embedding in %s, want Q4_K", se.Format.Name)
			}
			tol := 0.0
			if c.arch == ArchLlama {
				tol = 1e-5 // llama3 rope scaling stored as float32 divisors (TestGGUFRoundTripSameLogits)
			}
			if d := maxAbsDiff(logitsOf(t, st, "", ggufTestTokens), logitsOf(t, gg, "", ggufTestTokens)); d > tol {
				t.Fatalf("logits differ by %g (allowed %g)", d, tol)
			}
			// The same file under f32: dequantized, near the float model.
			f32, err := Load(file, Options{})
			if err != nil {
				t.Fatal(err)
			}
			ref, err := Load(dir, Options{})
			if err != nil {
				t.Fatal(err)
			}
			a, b := logitsOf(t, f32, "", ggufTestTokens), logitsOf(t, ref, "", ggufTestTokens)
			sum := 0.0
			for i := range a {
				sum += math.Abs(a[i] - b[i])
			}
			mean := sum / float64(len(a))
			t.Logf("%s weights vs float32: mean |Δ logit| %.3g", c.prec, mean)
			if mean > c.tol || mean == 0 {
				t.Fatalf("dequantized %s vs float: mean |Δ logit| %g (want in (0, %g])", c.prec, mean, c.tol)
			}
		})
	}
}

// F16 and BF16 files load (widened exactly) to logits within half/bfloat16 rounding of the float
// model's.
func TestGGUFHalfTypes(t *testing.T) {
	for _, typ := range []gguf.GGMLType{gguf.F16, gguf.BF16} {
		dir, file := ggufPair(t, ArchLlama, "tiny", typ)
		ref, err := Load(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		gg, err := Load(file, Options{})
		if err != nil {
			t.Fatal(err)
		}
		d := maxAbsDiff(logitsOf(t, ref, "", ggufTestTokens), logitsOf(t, gg, "", ggufTestTokens))
		if d == 0 || d > 0.05 {
			t.Fatalf("%s: max |Δ logit| %g, want rounding-sized and nonzero", typ, d)
		}
	}
}

// The tokenizer rebuilt from a GGUF's metadata gives the ids and text of the tokenizer.json it
// was written from, special tokens included, and the chat template comes back as a
// tokenizer_config.json.
func TestGGUFTokenizerMatchesTokenizerJSON(t *testing.T) {
	dir, file := ggufPair(t, ArchQwen3, "tiny", gguf.F32)
	want, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	e, err := Load(file, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{"The quick brown fox jumps over the lazy dog.", "  spaces\n\nand 12345 digits, café!",
		"<|im_start|>user\nhi<|im_end|>\n", "zzqx unknownish words"} {
		w, g := want.EncodeWithSpecialTokens(text), e.Tokenizer.EncodeWithSpecialTokens(text)
		if !slices.Equal(w, g) {
			t.Fatalf("%q: GGUF tokenizer %v, tokenizer.json %v", text, g, w)
		}
		if want.Decode(w) != e.Tokenizer.Decode(g) {
			t.Fatalf("%q: decodes differ", text)
		}
	}
	cfg, ok := TokenizerFile(file, "tokenizer_config.json")
	if !ok {
		t.Fatal("no tokenizer_config.json for the GGUF")
	}
	var c struct {
		ChatTemplate string `json:"chat_template"`
		EOS          string `json:"eos_token"`
	}
	if err := json.Unmarshal(cfg, &c); err != nil {
		t.Fatal(err)
	}
	if c.ChatTemplate != TinyChatTemplate {
		t.Fatalf("chat template %q", c.ChatTemplate)
	}
	if _, ok := TokenizerFile(file, "tokenizer.json"); !ok {
		t.Fatal("no tokenizer.json for the GGUF")
	}
}

// A SentencePiece (llama) vocabulary becomes BPE merges ranked by score: the piece of higher
// score merges first, as in llama.cpp's SPM tokenizer; byte tokens carry what no piece covers.
func TestGGUFSentencePieceTokenizer(t *testing.T) {
	tokens := []string{"<unk>", "<s>", "</s>", "▁", "a", "b", "c", "ab", "bc", "▁a", "▁abc", "abc"}
	scores := []float32{0, 0, 0, -1, -2, -2, -2, -5, -3, -4, -1, -6}
	types := []int32{2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1}
	for b := range 256 {
		tokens = append(tokens, "<0x"+strings.ToUpper(hex2(b))+">")
		scores = append(scores, 0)
		types = append(types, gguf.TokenByte)
	}
	w := gguf.NewWriter()
	w.Set("tokenizer.ggml.model", "llama")
	w.Set("tokenizer.ggml.tokens", tokens)
	w.Set("tokenizer.ggml.scores", scores)
	w.Set("tokenizer.ggml.token_type", types)
	w.Set("tokenizer.ggml.bos_token_id", uint32(1))
	w.Set("tokenizer.ggml.unknown_token_id", uint32(0))
	w.Set("tokenizer.ggml.add_bos_token", true)
	var buf strings.Builder
	if err := w.Write(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse([]byte(buf.String()))
	if err != nil {
		t.Fatal(err)
	}
	tj, _, err := gguf.TokenizerJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Parse(tj)
	if err != nil {
		t.Fatal(err)
	}
	// "abc" is "▁abc" after the prefix: of the pairs (▁,a) −4, (a,b) −5, (b,c) −3, bc (−3) merges
	// first, then ▁a (−4), then ▁a+bc into ▁abc (−1); abc (−6) is never reached.
	if got := tok.EncodeWithSpecialTokens("abc"); !slices.Equal(got, []int{1, 10}) {
		t.Fatalf("abc → %v, want [<s> ▁abc] = [1 10]", got)
	}
	// "cab": ▁c is no piece; (a,b) → ab; ▁ c ab. "é" has no piece: its two UTF-8 bytes.
	if got := tok.EncodeWithSpecialTokens("cab é"); !slices.Equal(got, []int{1, 3, 6, 7, 3, 12 + 0xC3, 12 + 0xA9}) {
		t.Fatalf("cab é → %v", got)
	}
	if got := tok.Decode([]int{3, 6, 7, 3, 12 + 0xC3, 12 + 0xA9}); got != "cab é" {
		t.Fatalf("decode: %q", got)
	}
}

func hex2(b int) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[b>>4], digits[b&15]})
}

// The exported GGUF adapter is llama.cpp's layout: its keys, one lora_a [r, in] and lora_b
// [out, r] per adapted module under the base's GGUF names (ggml dims reversed), alpha, and for
// llama the q/k lora_b rows in the base's permuted order, so that permuting W + s·B·A equals
// permuted W plus s·(permuted B)·A.
func TestExportAdapterGGUF(t *testing.T) {
	for _, arch := range []Arch{ArchLlama, ArchQwen3} {
		dir := t.TempDir()
		if err := InitTiny(dir, arch, "tiny", 3); err != nil {
			t.Fatal(err)
		}
		e, err := Load(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		cfg := LoraConfig{Rank: 4, Seed: 5, TrainAttn: true, TrainMLP: true, TrainUnembed: arch == ArchLlama, Alpha: 16}
		adapterWithB(t, e, "x", cfg, func(i, j int) float64 { return 0.01 * float64((i*7+j)%13-6) })
		ck := t.TempDir()
		if err := e.SaveAdapter(context.Background(), "x", ck, false); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), "adapter.gguf")
		if err := ExportAdapterGGUF(ck, e.Config, out); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		f, err := gguf.Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		for key, want := range map[string]any{"general.type": "adapter", "adapter.type": "lora", "general.architecture": string(arch), "adapter.lora.alpha": float32(16)} {
			if v, _ := f.Value(key); v != want {
				t.Fatalf("%s = %v, want %v", key, v, want)
			}
		}
		peft, err := safetensors.ReadFile(filepath.Join(ck, AdapterWeightsFile))
		if err != nil {
			t.Fatal(err)
		}
		mods := e.Config.loraModules(cfg.spec())
		if len(f.Tensors) != 2*len(mods) {
			t.Fatalf("%d tensors for %d modules", len(f.Tensors), len(mods))
		}
		for _, m := range mods {
			g, _ := ggufName(m.Path + ".weight")
			ta, okA := f.Tensor(g + ".lora_a")
			tb, okB := f.Tensor(g + ".lora_b")
			if !okA || !okB {
				t.Fatalf("%s: no %s.lora_a/b", m.Path, g)
			}
			if !slices.Equal(ta.Dims, []int{m.In, 4}) || !slices.Equal(tb.Dims, []int{4, m.Out}) {
				t.Fatalf("%s: ggml dims a %v b %v, want [%d 4] [4 %d]", g, ta.Dims, tb.Dims, m.In, m.Out)
			}
			if !slices.Equal(ta.Data, peft.Tensors["base_model.model."+m.Path+".lora_A.weight"].Data) {
				t.Fatalf("%s: lora_a is not PEFT's lora_A", g)
			}
			pb := peft.Tensors["base_model.model."+m.Path+".lora_B.weight"].Data
			permuted := arch == ArchLlama && (strings.HasSuffix(m.Path, "q_proj") || strings.HasSuffix(m.Path, "k_proj"))
			if permuted {
				heads := e.Config.NumAttentionHeads
				if strings.HasSuffix(m.Path, "k_proj") {
					heads = e.Config.NumKeyValueHeads
				}
				hd := m.Out / heads
				// GGUF row h·hd + 2j + i holds HF row h·hd + i·hd/2 + j.
				for h := range heads {
					for i := range 2 {
						for j := range hd / 2 {
							gr, hr := h*hd+2*j+i, h*hd+i*hd/2+j
							if string(tb.Data[gr*16:(gr+1)*16]) != string(pb[hr*16:(hr+1)*16]) {
								t.Fatalf("%s: lora_b row %d is not PEFT's row %d", g, gr, hr)
							}
						}
					}
				}
				if string(tb.Data) == string(pb) {
					t.Fatalf("%s: lora_b was not permuted", g)
				}
			} else if string(tb.Data) != string(pb) {
				t.Fatalf("%s: lora_b is not PEFT's lora_B", g)
			}
		}
	}
	// A head LoRA on a tied model has nowhere to go in llama.cpp.
	dir := t.TempDir()
	if err := InitTiny(dir, ArchQwen3, "tiny", 3); err != nil {
		t.Fatal(err)
	}
	e, err := Load(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.CreateAdapter("h", LoraConfig{Rank: 2, TrainUnembed: true, TrainAttn: true}); err != nil {
		t.Fatal(err)
	}
	ck := t.TempDir()
	if err := e.SaveAdapter(context.Background(), "h", ck, false); err != nil {
		t.Fatal(err)
	}
	if err := ExportAdapterGGUF(ck, e.Config, filepath.Join(ck, "a.gguf")); err == nil || !strings.Contains(err.Error(), "tied") {
		t.Fatalf("a head LoRA of a tied model exported: %v", err)
	}
}

// A GGUF is hostile input: a file cut anywhere, or with any header field made huge, is an error
// from Load, never a panic or an allocation of what it claims.
func TestGGUFHostileFiles(t *testing.T) {
	_, file := ggufPair(t, ArchQwen3, "tiny", gguf.Q8_0)
	good, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.gguf")
	try := func(what string, b []byte) {
		t.Helper()
		if err := os.WriteFile(bad, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(bad, Options{Precision: PrecisionQ8_0}); err == nil {
			t.Fatalf("%s: loaded", what)
		}
	}
	f, err := gguf.Parse(good)
	if err != nil {
		t.Fatal(err)
	}
	// Cut at many lengths through the header and into the data.
	for n := 4; n < len(good); n += 1 + n/3 {
		try("cut", good[:n])
	}
	// Counts far over what the file holds.
	for _, off := range []int{8, 16} {
		b := slices.Clone(good)
		binary.LittleEndian.PutUint64(b[off:], 1<<40)
		try("huge count", b)
	}
	b := slices.Clone(good)
	binary.LittleEndian.PutUint64(b[24:], 1<<62) // the first key's length
	try("huge string", b)
	// A tensor offset past the data, or misaligned, and a data section that is too short.
	last := f.Tensors[len(f.Tensors)-1]
	idx := strings.Index(string(good), last.Name) // first in the tensor infos (no key names it)
	if idx < 0 {
		t.Fatal("tensor name not found")
	}
	offPos := idx + len(last.Name) + 4 + 8*len(last.Dims) + 4
	if binary.LittleEndian.Uint64(good[offPos:]) != last.Offset {
		t.Fatal("test located the offset wrongly")
	}
	for _, off := range []uint64{last.Offset + 32, last.Offset + 1, 1 << 63} {
		b := slices.Clone(good)
		binary.LittleEndian.PutUint64(b[offPos:], off)
		try("bad offset", b)
	}
	b = slices.Clone(good)
	binary.LittleEndian.PutUint32(b[offPos-4:], 99) // an unknown ggml type
	try("unknown type", b)
	// A vocabulary with a token far longer than any real one.
	w := gguf.NewWriter()
	w.Set("tokenizer.ggml.model", "llama")
	w.Set("tokenizer.ggml.tokens", []string{"a", strings.Repeat("é", 100000)})
	w.Set("tokenizer.ggml.scores", []float32{0, 0})
	var tb strings.Builder
	if err := w.Write(&tb); err != nil {
		t.Fatal(err)
	}
	tf, err := gguf.Parse([]byte(tb.String()))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := gguf.TokenizerJSON(tf); err == nil || !strings.Contains(err.Error(), "bytes, over") {
		t.Fatalf("a 200 kB token: %v", err)
	}
	// Metadata the layer cannot honour: experts, partial rotary dims, a non-dividing head count.
	for key, c := range map[string]struct {
		v    any
		says string
	}{"qwen3.expert_count": {uint32(8), "mixture-of-experts"}, "qwen3.rope.dimension_count": {uint32(8), "partial rotary"},
		"qwen3.attention.head_count_kv": {uint32(3), "not a multiple"}} {
		w := gguf.NewWriter()
		for _, kv := range f.KVs {
			if kv.Key != key {
				w.Set(kv.Key, kv.Value)
			}
		}
		w.Set(key, c.v)
		for _, tn := range f.Tensors {
			w.AddTensor(tn.Name, tn.Type, tn.Dims, tn.Data)
		}
		if err := w.WriteFile(bad); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(bad, Options{}); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Fatalf("%s: %v, want an error saying %q", key, err, c.says)
		}
	}
	// An architecture skein does not serve.
	w = gguf.NewWriter()
	w.Set("general.architecture", "mamba")
	var sb strings.Builder
	_ = w.Write(&sb)
	try("unknown architecture", []byte(sb.String()))
}

// FuzzGGUFParse: no input makes the parser panic, and what it accepts has tensors inside the file.
func FuzzGGUFParse(f *testing.F) {
	w := gguf.NewWriter()
	w.Set("general.architecture", "qwen3")
	w.Set("tokenizer.ggml.tokens", []string{"a", "b"})
	w.AddF32("x", []int{2, 32}, make([]float32, 64))
	var sb strings.Builder
	_ = w.Write(&sb)
	f.Add([]byte(sb.String()))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := gguf.Parse(b)
		if err != nil {
			return
		}
		for _, tn := range g.Tensors {
			if len(tn.Data) > len(b) {
				t.Fatal("tensor data larger than the file")
			}
		}
	})
}

// Llama 2's real vocabulary (SKEIN_LLAMA2_TOKENIZER, a tokenizer.json; .ci/run installs it) as a
// llama-model GGUF stores it: pieces by id with scores and types. tokenizer.json has no scores
// (its merges were made from tokenizer.model's by transformers' extractor, whose ranking
// mergesFromScores follows), so each merged piece here scores minus the rank of the first merge
// that makes it, the order tokenizer.model's scores put them in. The tokenizer rebuilt from that
// (merges, Prepend/Replace normalizer, byte fallback, decoder, BOS) gives Hugging Face's ids and
// text on every sample.
func TestGGUFSentencePieceMatchesLlama2(t *testing.T) {
	path := os.Getenv("SKEIN_LLAMA2_TOKENIZER")
	if path == "" {
		t.Skip("SKEIN_LLAMA2_TOKENIZER is not set (Llama 2's tokenizer.json; .ci/run installs it)")
	}
	want, err := tokenizer.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var tf tokenizer.File
	if err := json.Unmarshal(b, &tf); err != nil {
		t.Fatal(err)
	}
	var merges []string
	if err := json.Unmarshal(tf.Model.Merges, &merges); err != nil {
		t.Fatal(err)
	}
	rank := map[string]int{}
	for i, m := range merges {
		l, r, _ := strings.Cut(m, " ")
		if _, ok := rank[l+r]; !ok {
			rank[l+r] = i
		}
	}
	n := len(tf.Model.Vocab)
	tokens, scores, types := make([]string, n), make([]float32, n), make([]int32, n)
	for s, id := range tf.Model.Vocab {
		r, ok := rank[s]
		if !ok {
			r = len(merges) // a piece no merge makes: never ranked
		}
		tokens[id], scores[id], types[id] = s, float32(-r), gguf.TokenNormal
		if strings.HasPrefix(s, "<0x") && len(s) == 6 {
			types[id], scores[id] = gguf.TokenByte, 0
		}
	}
	types[0], types[1], types[2] = gguf.TokenUnknown, gguf.TokenControl, gguf.TokenControl
	w := gguf.NewWriter()
	w.Set("tokenizer.ggml.model", "llama")
	w.Set("tokenizer.ggml.tokens", tokens)
	w.Set("tokenizer.ggml.scores", scores)
	w.Set("tokenizer.ggml.token_type", types)
	w.Set("tokenizer.ggml.bos_token_id", uint32(1))
	w.Set("tokenizer.ggml.eos_token_id", uint32(2))
	w.Set("tokenizer.ggml.unknown_token_id", uint32(0))
	w.Set("tokenizer.ggml.add_bos_token", true)
	var buf strings.Builder
	if err := w.Write(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse([]byte(buf.String()))
	if err != nil {
		t.Fatal(err)
	}
	tj, _, err := gguf.TokenizerJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tokenizer.Parse(tj)
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{"Hello world", "The quick brown fox jumps over the lazy dog.", "  leading and  double spaces",
		"naïve café 日本語 🤖 emoji", "code: for (int i = 0; i < n; i++) { x += y[i]; }\n\ttabs\n", "1234567890 3.14159",
		"<s>special</s> in text", "Don't stop—won't stop; it's fine!"} {
		w, g := want.EncodeWithSpecialTokens(text), got.EncodeWithSpecialTokens(text)
		if !slices.Equal(w, g) {
			t.Fatalf("%q: GGUF tokenizer %v, tokenizer.json %v", text, g, w)
		}
		if dw, dg := want.Decode(w[1:]), got.Decode(g[1:]); dw != dg {
			t.Fatalf("%q: decodes %q vs %q", text, dg, dw)
		}
	}
}
