package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"testing"
)

// Requests of several adapters (and of the base model) in one SampleBatch are served in shared
// decode loops, each row with its own adapter's LoRA: every request's answer equals the answer
// it gets sampling its adapter alone.
func TestSampleBatchAcrossAdapters(t *testing.T) {
	for _, tc := range []struct {
		name string
		arch Arch
		opts Options
		tol  float64
	}{{"f32", ArchQwen3, Options{}, 1e-4}, {"f64", ArchQwen3, Options{Float64: true}, 1e-9},
		// A mixture of experts: each row's experts add its own adapter's expert LoRA (moe.go's runs).
		{"moe-f32", ArchQwen3MoE, Options{}, 1e-4}, {"moe-f64", ArchQwen3_5MoE, Options{Float64: true}, 1e-9}} {
		t.Run(tc.name, func(t *testing.T) {
			e := loadTiny(t, tc.arch, tc.opts)
			prompts := []string{"The quick brown fox", "A language model reads", "Once upon a time"}
			ids := []string{"a", "b", "c"}
			for i, id := range ids {
				if _, err := e.CreateAdapter(id, LoraConfig{Rank: 4, Seed: int64(i + 1), TrainAttn: true, TrainMLP: true, TrainUnembed: i == 2}); err != nil {
					t.Fatal(err)
				}
				trainSteps(t, e, id, e.Tokenizer.Encode(prompts[i]+" jumps over the lazy dog"), 3+i)
			}
			seed := int64(5)
			var reqs []SampleRequest
			for i, name := range []string{"b", "", "a", "c", "b", "a"} {
				reqs = append(reqs, SampleRequest{Adapter: name, Prompt: e.Tokenizer.Encode(prompts[i%3]),
					NumSamples: 1 + i%2, PromptLogprobs: i == 0, TopKPromptLogprobs: 2 * (i % 2),
					Params: SampleParams{MaxTokens: 5 + i, Temperature: float64(i % 2), TopK: -1, TopP: 1, Seed: &seed}})
			}
			batched, err := e.SampleBatch(context.Background(), "", append([]SampleRequest(nil), reqs...))
			if err != nil {
				t.Fatal(err)
			}
			differ := false
			for i, r := range reqs {
				alone, err := e.SampleBatch(context.Background(), r.Adapter, []SampleRequest{{Prompt: r.Prompt, NumSamples: r.NumSamples,
					PromptLogprobs: r.PromptLogprobs, TopKPromptLogprobs: r.TopKPromptLogprobs, Params: r.Params}})
				if err != nil {
					t.Fatal(err)
				}
				if err := sameSample(batched[i], alone[0], tc.tol); err != nil {
					t.Fatalf("request %d (adapter %q): %v", i, r.Adapter, err)
				}
				base, err := e.SampleBatch(context.Background(), "", []SampleRequest{{Prompt: r.Prompt, NumSamples: r.NumSamples, Params: r.Params}})
				if err != nil {
					t.Fatal(err)
				}
				if r.Adapter != "" && math.Abs(base[0].Sequences[0].Logprobs[0]-alone[0].Sequences[0].Logprobs[0]) > 1e-3 {
					differ = true
				}
			}
			if !differ {
				t.Fatal("the adapters sample like the base model: the test shows nothing")
			}
			if _, err := e.SampleBatch(context.Background(), "", []SampleRequest{reqs[0], {Adapter: "missing", Prompt: []int{1}}}); err == nil {
				t.Fatal("a request for a missing adapter was served")
			}
		})
	}
}

// sameSample compares two answers to one request: the same tokens and stop reasons, logprobs
// within tol.
func sameSample(got, want *SampleResult, tol float64) error {
	if len(got.Sequences) != len(want.Sequences) {
		return fmt.Errorf("%d sequences, want %d", len(got.Sequences), len(want.Sequences))
	}
	for j := range got.Sequences {
		g, w := got.Sequences[j], want.Sequences[j]
		if !reflect.DeepEqual(g.Tokens, w.Tokens) || g.StopReason != w.StopReason {
			return fmt.Errorf("sample %d: %v (%s), want %v (%s)", j, g.Tokens, g.StopReason, w.Tokens, w.StopReason)
		}
		for k := range g.Logprobs {
			if math.Abs(g.Logprobs[k]-w.Logprobs[k]) > tol {
				return fmt.Errorf("sample %d token %d: logprob %v, want %v", j, k, g.Logprobs[k], w.Logprobs[k])
			}
		}
	}
	if len(got.PromptLogprobs) != len(want.PromptLogprobs) || len(got.TopKPrompt) != len(want.TopKPrompt) {
		return fmt.Errorf("prompt logprobs: %d and %d top-k rows, want %d and %d", len(got.PromptLogprobs), len(got.TopKPrompt), len(want.PromptLogprobs), len(want.TopKPrompt))
	}
	for k := 1; k < len(got.PromptLogprobs); k++ {
		if math.Abs(got.PromptLogprobs[k]-want.PromptLogprobs[k]) > tol {
			return fmt.Errorf("prompt token %d: %v, want %v", k, got.PromptLogprobs[k], want.PromptLogprobs[k])
		}
	}
	for k := 1; k < len(got.TopKPrompt); k++ {
		for x := range got.TopKPrompt[k] {
			if got.TopKPrompt[k][x].Token != want.TopKPrompt[k][x].Token || math.Abs(got.TopKPrompt[k][x].Logprob-want.TopKPrompt[k][x].Logprob) > tol {
				return fmt.Errorf("prompt token %d top-k %d: %v, want %v", k, x, got.TopKPrompt[k][x], want.TopKPrompt[k][x])
			}
		}
	}
	return nil
}

// Long work gives a turn between layers (WithTurns): every layer of a training pass's forward
// and backward, and every layer of each prefill and decode step.
func TestLongWorkGivesTurnsBetweenLayers(t *testing.T) {
	e := loadTiny(t, ArchQwen3, Options{})
	if _, err := e.CreateAdapter("a", LoraConfig{Rank: 2, TrainAttn: true, TrainMLP: true}); err != nil {
		t.Fatal(err)
	}
	turns := 0
	ctx := WithTurns(context.Background(), func() { turns++ })
	L := e.Config.NumHiddenLayers
	if _, err := e.ForwardBackward(ctx, "a", []Datum{textDatum([]int{1, 2, 3, 4})}, "cross_entropy", nil); err != nil {
		t.Fatal(err)
	}
	if turns != 2*L {
		t.Fatalf("a one-chunk forward_backward gave %d turns, want %d (each layer forward and backward)", turns, 2*L)
	}
	turns = 0
	res, err := e.SampleBatch(ctx, "a", []SampleRequest{{Prompt: []int{1, 2}, Params: SampleParams{MaxTokens: 4}}})
	if err != nil {
		t.Fatal(err)
	}
	// The prefill draws the first token, and each decode step one more: n tokens, n passes.
	if n := len(res[0].Sequences[0].Tokens); turns != n*L {
		t.Fatalf("sampling %d tokens gave %d turns, want %d", n, turns, n*L)
	}
}

// A sampler snapshot holds its weights only: a quarter of a training adapter's memory, it samples
// as the adapter it was saved from, and it refuses what needs optimizer state.
func TestSnapshotsHoldWeightsOnly(t *testing.T) {
	e := loadTiny(t, ArchQwen3, Options{})
	if _, err := e.CreateAdapter("a", LoraConfig{Rank: 4, TrainAttn: true, TrainMLP: true}); err != nil {
		t.Fatal(err)
	}
	trainSteps(t, e, "a", []int{5, 6, 7, 8, 9}, 2)
	dir := t.TempDir()
	if err := e.SaveAdapter(context.Background(), "a", dir, false); err != nil {
		t.Fatal(err)
	}
	training := e.AdapterBytes()
	if err := e.LoadSnapshot(context.Background(), "s", dir); err != nil {
		t.Fatal(err)
	}
	if snap := e.AdapterBytes() - training; snap*4 != training {
		t.Fatalf("the snapshot holds %d bytes, the training adapter %d: want a quarter", snap, training)
	}
	req := SampleRequest{Prompt: []int{5, 6}, Params: SampleParams{MaxTokens: 4}}
	a, err := e.SampleBatch(context.Background(), "a", []SampleRequest{req})
	if err != nil {
		t.Fatal(err)
	}
	s, err := e.SampleBatch(context.Background(), "s", []SampleRequest{req})
	if err != nil {
		t.Fatal(err)
	}
	if err := sameSample(s[0], a[0], 1e-6); err != nil {
		t.Fatalf("the snapshot samples otherwise than its adapter: %v", err)
	}
	if err := e.SaveAdapter(context.Background(), "s", t.TempDir(), true); !errors.Is(err, ErrSnapshot) {
		t.Fatalf("saving a snapshot's optimizer state: %v", err)
	}
}
