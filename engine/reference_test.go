package engine

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// referenceCase is one entry of testdata/reference_logits.json.
type referenceCase struct {
	Arch    Arch      `json:"arch"`
	Tokens  []int     `json:"tokens"`
	Adapter bool      `json:"adapter"`
	Vocab   int       `json:"vocab"`
	Logits  []float64 `json:"logits"`
}

var referenceTokens = []int{5, 17, 300, 42, 7, 99, 256, 3, 64, 128, 11, 500}

// referenceAdapter makes the deterministic adapter the fixture was computed with: PEFT init
// from seed 11, then B set to a fixed pattern so the LoRA path contributes.
func referenceAdapter(t testing.TB, e *Engine) {
	adapterWithB(t, e, "ref", LoraConfig{Rank: 4, Seed: 11, TrainAttn: true, TrainMLP: true, TrainUnembed: true}, func(i, j int) float64 { return 0.05 * math.Sin(float64(j+3*i)) })
}

// logitsOf runs the sampler's prefill over tokens and returns logits [T×V].
func logitsOf(t testing.TB, e *Engine, id string, tokens []int) []float64 {
	var a *Adapter
	if id != "" {
		a, _ = e.adapter(id)
	}
	T := len(tokens)
	S := bucket(T, 16)
	pos := make([]int, S)
	tok := make([]int, S)
	for i := range S {
		pos[i] = i
		if i < T {
			tok[i] = tokens[i]
		}
	}
	step, done := e.newDecodeStep(a, 1, S)
	defer done()
	rows, err := step([][]int{tok}, [][]int{pos}, func(_, t int) bool { return t < T }, nil)
	if err != nil {
		t.Fatal(err)
	}
	var logits []float64
	for _, r := range rows[:T] {
		logits = append(logits, r...)
	}
	return logits
}

// Writes the inputs for scripts/reference_logits.py (development time only).
func TestWriteReferenceInputs(t *testing.T) {
	dir := os.Getenv("SKEIN_REFERENCE_INPUTS")
	if dir == "" {
		t.Skip("set SKEIN_REFERENCE_INPUTS=DIR to write the reference inputs")
	}
	var cases []referenceCase
	for _, arch := range []Arch{ArchLlama, ArchQwen2, ArchQwen3} {
		md := filepath.Join(dir, string(arch))
		if err := InitTiny(md, arch, "tiny", 1); err != nil {
			t.Fatal(err)
		}
		e, err := Load(md, Options{})
		if err != nil {
			t.Fatal(err)
		}
		referenceAdapter(t, e)
		if err := e.SaveAdapter(context.Background(), "ref", filepath.Join(md, "adapter"), false); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, referenceCase{Arch: arch, Tokens: referenceTokens}, referenceCase{Arch: arch, Tokens: referenceTokens, Adapter: true})
	}
	b, _ := json.Marshal(map[string]any{"cases": cases})
	if err := os.WriteFile(filepath.Join(dir, "inputs.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// The engine's logits equal an independent float64 torch transcription of the Hugging Face
// models (scripts/reference_logits.py), for Llama (llama3 RoPE scaling, untied head), Qwen2
// (q/k/v bias, tied) and Qwen3 (q/k norm, explicit head_dim), with and without a PEFT adapter.
func TestLogitsMatchReference(t *testing.T) {
	b, err := os.ReadFile("testdata/reference_logits.json")
	if err != nil {
		t.Fatal(err)
	}
	var fix struct {
		Cases []referenceCase `json:"cases"`
	}
	if err := json.Unmarshal(b, &fix); err != nil {
		t.Fatal(err)
	}
	if len(fix.Cases) != 6 {
		t.Fatalf("fixture has %d cases", len(fix.Cases))
	}
	for _, c := range fix.Cases {
		e := loadTiny(t, c.Arch, Options{})
		id := ""
		if c.Adapter {
			if !e.HasAdapter(context.Background(), "ref") {
				referenceAdapter(t, e)
			}
			id = "ref"
		}
		got := logitsOf(t, e, id, c.Tokens)
		if len(got) != len(c.Logits) {
			t.Fatalf("%s: %d logits, fixture %d", c.Arch, len(got), len(c.Logits))
		}
		var worst float64
		for i := range got {
			worst = math.Max(worst, math.Abs(got[i]-c.Logits[i]))
		}
		if worst > 1e-4 {
			t.Fatalf("%s adapter=%v: max |logit - reference| = %.3g", c.Arch, c.Adapter, worst)
		}
		// The training pass is separate code: its logprobs of each next token must equal the
		// reference log-softmax too.
		V := e.Config.VocabSize
		n := len(c.Tokens) - 1
		targets := make([]float64, n)
		for i := range targets {
			targets[i] = float64(c.Tokens[i+1])
		}
		d := Datum{Tokens: c.Tokens[:n], Inputs: map[string]TensorInput{"target_tokens": {DType: "int64", Data: targets}}}
		fwd, err := e.Forward(context.Background(), id, []Datum{d}, "cross_entropy", nil)
		if err != nil {
			t.Fatal(err)
		}
		var worstLP float64
		for i := range n {
			row := c.Logits[i*V : (i+1)*V]
			m := row[0]
			for _, v := range row {
				m = math.Max(m, v)
			}
			var se float64
			for _, v := range row {
				se += math.Exp(v - m)
			}
			want := row[c.Tokens[i+1]] - m - math.Log(se)
			worstLP = math.Max(worstLP, math.Abs(fwd.Logprobs[0][i]-want))
		}
		if worstLP > 1e-4 {
			t.Fatalf("%s adapter=%v: max |logprob - reference| = %.3g", c.Arch, c.Adapter, worstLP)
		}
		t.Logf("%s adapter=%v: max abs diff %.2g (logits), %.2g (training-pass logprobs)", c.Arch, c.Adapter, worst, worstLP)
	}
}
