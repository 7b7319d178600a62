package engine

import (
	"context"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/skein-ai/skein/engine/internal/kernels"
)

// Prompt logprobs are reduced as the head's tiles of rows are computed (promptLogprobs.take):
// the prefill of a request asking for them keeps only the logits it samples from, not the
// [prompt × vocabulary] float64 logits it once returned whole (39 MB here; 7.5 GB for 4096
// tokens of Qwen3's vocabulary), and its logprobs and top-k are those of one tile over the whole
// prompt (to float32 rounding: a short tile's product may take the few-row kernels).
func TestPromptLogprobsInHeadTiles(t *testing.T) {
	Presets["test-prompt-vocab"] = Preset{Hidden: 64, Layers: 1, Heads: 2, KVHeads: 1, FFN: 128, Vocab: 16384, Context: 1024}
	defer delete(Presets, "test-prompt-vocab")
	dir := filepath.Join(t.TempDir(), "m")
	if err := InitTiny(dir, ArchQwen3, "test-prompt-vocab", 1); err != nil {
		t.Fatal(err)
	}
	prompt := make([]int, 300)
	for i := range prompt {
		prompt[i] = (i*7919)%16000 + 3
	}
	seed := int64(1)
	req := SampleRequest{Prompt: prompt, NumSamples: 1, PromptLogprobs: true, TopKPromptLogprobs: 5, Params: SampleParams{MaxTokens: 1, Seed: &seed}}
	sample := func(e *Engine) *SampleResult {
		t.Helper()
		res, err := e.SampleBatch(context.Background(), "", []SampleRequest{req})
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Err != nil {
			t.Fatal(res[0].Err)
		}
		return res[0]
	}
	whole, err := Load(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	tiled, err := Load(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	tiled.headTile = 32 // ten tiles of the prompt's 300 rows
	if whole.headTileRows() < len(prompt) {
		t.Fatalf("the default tile (%d rows) should hold the whole prompt", whole.headTileRows())
	}
	want := sample(whole)
	got := sample(tiled)
	// The prefill keeps no prompt position's logits: only the row the sample draws from.
	reqs := []SampleRequest{req}
	rows, maxPrompt, maxLen := tiled.sampleRows(reqs)
	step, done := tiled.newDecodeStepRows(context.Background(), []*Adapter{nil}, 1, bucket(maxLen, 16), nil)
	defer done()
	first := firstRows(rows)
	prompts := tiled.newPromptLogprobs(reqs, first)
	logits, T, err := prefill(step, reqs, rows, first, maxPrompt, 0, prompts.take, nil)
	if err != nil {
		t.Fatal(err)
	}
	kept := 0
	for n, row := range logits {
		if row != nil {
			kept++
			if n != len(prompt)-1 {
				t.Errorf("the prefill kept the logits of position %d (of %d, T %d)", n, len(prompt), T)
			}
		}
	}
	if kept != 1 {
		t.Errorf("the prefill kept %d rows of logits, want the last prompt position's only", kept)
	}
	if len(got.PromptLogprobs) != len(prompt) || !math.IsNaN(got.PromptLogprobs[0]) {
		t.Fatalf("prompt logprobs: %d values, first %v", len(got.PromptLogprobs), got.PromptLogprobs[0])
	}
	for p := 1; p < len(prompt); p++ {
		if d := math.Abs(got.PromptLogprobs[p] - want.PromptLogprobs[p]); !(d <= 1e-5) || got.PromptLogprobs[p] >= 0 {
			t.Fatalf("position %d: logprob %v in tiles, %v in one", p, got.PromptLogprobs[p], want.PromptLogprobs[p])
		}
		if len(got.TopKPrompt[p]) != 5 {
			t.Fatalf("position %d: top-%d", p, len(got.TopKPrompt[p]))
		}
		for k, tl := range got.TopKPrompt[p] {
			if w := want.TopKPrompt[p][k]; math.Abs(tl.Logprob-w.Logprob) > 1e-5 {
				t.Fatalf("position %d: top-%d %v in tiles, %v in one", p, k, tl, w)
			}
		}
	}
	if got.Sequences[0].Tokens[0] != want.Sequences[0].Tokens[0] {
		t.Fatalf("the sampled token differs: %d in tiles, %d in one", got.Sequences[0].Tokens[0], want.Sequences[0].Tokens[0])
	}
}

// A forward-only pass whose attention probabilities would be large (a long prompt's prefill)
// computes them a chunk of query rows of one kv head at a time: the sample's prompt logprobs and
// tokens and a forward pass's logprobs are those of one product, and the pass holds one chunk's
// probabilities rather than every head's [T × S].
func TestForwardAttentionInChunks(t *testing.T) {
	if !kernels.HaveGEMM() {
		t.Skip("attention runs in chunks only on a path with the float32 GEMM (without one the backend's matmuls take whole buffers)")
	}
	prompt := make([]int, 300)
	for i := range prompt {
		prompt[i] = (i*37)%400 + 3
	}
	seed := int64(3)
	req := SampleRequest{Prompt: prompt, NumSamples: 2, PromptLogprobs: true, Params: SampleParams{MaxTokens: 6, Temperature: 1, Seed: &seed}}
	for _, arch := range []Arch{ArchLlama, ArchQwen3} {
		var res [2]*SampleResult
		var fwd [2][][]float64
		var peaks [2]int
		for k, chunk := range []int{0, 40} {
			e := loadTiny(t, arch, Options{})
			e.attnChunk = chunk
			out, err := e.SampleBatch(context.Background(), "", []SampleRequest{req})
			if err != nil || out[0].Err != nil {
				t.Fatal(err, out[0].Err)
			}
			res[k] = out[0]
			peaks[k] = e.PeakStepBytes()
			f, err := e.Forward(context.Background(), "", []Datum{textDatum(prompt)}, "cross_entropy", nil)
			if err != nil {
				t.Fatal(err)
			}
			fwd[k] = f.Logprobs
		}
		t.Logf("%s: step peak %d B in one product, %d B in chunks", arch, peaks[0], peaks[1])
		// Bit for bit where it was measured (AVX2); within 1e-5 asked of every path, whose GEMMs
		// could in principle sum a row otherwise for another row count.
		near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-5 }
		for p := 1; p < len(prompt); p++ {
			if !near(res[0].PromptLogprobs[p], res[1].PromptLogprobs[p]) {
				t.Fatalf("%s: prompt logprob %d: %v in one product, %v in chunks", arch, p, res[0].PromptLogprobs[p], res[1].PromptLogprobs[p])
			}
		}
		for i := range res[0].Sequences {
			if !slices.Equal(res[0].Sequences[i].Tokens, res[1].Sequences[i].Tokens) || !slices.EqualFunc(res[0].Sequences[i].Logprobs, res[1].Sequences[i].Logprobs, near) {
				t.Fatalf("%s: sample %d: %v %v in one product, %v %v in chunks", arch, i, res[0].Sequences[i].Tokens, res[0].Sequences[i].Logprobs, res[1].Sequences[i].Tokens, res[1].Sequences[i].Logprobs)
			}
		}
		if !slices.EqualFunc(fwd[0], fwd[1], func(a, b []float64) bool { return slices.EqualFunc(a, b, near) }) {
			t.Fatalf("%s: a forward pass's logprobs differ in chunks", arch)
		}
		if peaks[1] >= peaks[0] {
			t.Errorf("%s: the step's peak did not fall in chunks (%d, %d)", arch, peaks[0], peaks[1])
		}
	}
}
