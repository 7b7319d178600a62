package engine

import (
	"context"
	"fmt"
	"testing"
)

// There is one layer implementation: the sampler's prefill reports prompt logprobs equal, bit
// for bit in float32, to the logprobs of the training pass (forward_backward) and of a
// forward-only pass over the same tokens, on every architecture, with a LoRA whose B is not
// zero: at 16 tokens every module of the tiny model adds its LoRA after the base product, at 64
// every module merges it into the weight.
func TestSamplingAndTrainingRunOneLayer(t *testing.T) {
	for _, arch := range []Arch{ArchLlama, ArchQwen2, ArchQwen3, ArchQwen3_5} {
		e := loadTiny(t, arch, Options{})
		adapterWithB(t, e, "one", LoraConfig{Rank: 4, Seed: 5, TrainAttn: true, TrainMLP: true, TrainUnembed: true},
			func(i, j int) float64 { return 0.04 * float64((i+3*j)%7-3) })
		for _, P := range []int{16, 64} { // a multiple of 16 and a power of two: both passes have P rows
			t.Run(fmt.Sprintf("%s/%d", arch, P), func(t *testing.T) {
				prompt := make([]int, P)
				for i := range prompt {
					prompt[i] = (i*37+11)%400 + 3
				}
				seed := int64(1)
				res, err := e.Sample("one", SampleRequest{Prompt: prompt, NumSamples: 1, PromptLogprobs: true,
					Params: SampleParams{MaxTokens: 1, Seed: &seed}})
				if err != nil {
					t.Fatal(err)
				}
				data := []Datum{textDatum(append(append([]int{}, prompt...), 7))}
				fb, err := e.ForwardBackward(context.Background(), "one", data, "cross_entropy", nil)
				if err != nil {
					t.Fatal(err)
				}
				fw, err := e.Forward(context.Background(), "one", data, "cross_entropy", nil)
				if err != nil {
					t.Fatal(err)
				}
				for i := 1; i < P; i++ {
					got := res.PromptLogprobs[i]
					if got != fb.Logprobs[0][i-1] || got != fw.Logprobs[0][i-1] {
						t.Fatalf("prompt token %d: sampler %v, forward_backward %v, forward %v", i, got, fb.Logprobs[0][i-1], fw.Logprobs[0][i-1])
					}
				}
			})
		}
	}
}

// The lengths above exercise both ways of applying a LoRA on the tiny model.
func TestLoraWayDependsOnRows(t *testing.T) {
	m := modelOf[float32](loadTiny(t, ArchQwen3, Options{}).base)
	s := &pass[float32]{}
	for _, c := range []struct {
		lin    *linear[float32]
		rows   int
		merged bool
	}{
		{m.byPath["model.layers.0.self_attn.q_proj"], 16, false}, {m.byPath["model.layers.0.mlp.up_proj"], 16, false}, {m.head, 16, false},
		{m.byPath["model.layers.0.self_attn.q_proj"], 64, true}, {m.byPath["model.layers.0.mlp.up_proj"], 64, true}, {m.head, 64, true},
	} {
		_, merged := s.loraWay(c.lin, c.rows).(mergedLoRA[float32])
		if merged != c.merged {
			t.Fatalf("%s over %d rows: merged %v, want %v", c.lin.path, c.rows, merged, c.merged)
		}
	}
}

// Forward-only passes (forward, a sampler's prefill) hold one layer's tensors at a time: their
// peak stays below one layer's training activations plus the logits, which two layers' worth
// would exceed.
func TestForwardOnlyPassesHoldOneLayer(t *testing.T) {
	for _, kind := range []string{"forward", "prefill"} {
		e := loadTiny(t, ArchQwen3, Options{})
		c := e.Config
		const T = 256
		ids := make([]int, T+1)
		for i := range ids {
			ids[i] = (i*37)%400 + 3
		}
		if kind == "forward" {
			if _, err := e.Forward(context.Background(), "", []Datum{textDatum(ids)}, "cross_entropy", nil); err != nil {
				t.Fatal(err)
			}
		} else if _, err := e.Sample("", SampleRequest{Prompt: ids[:T], Params: SampleParams{MaxTokens: 1}}); err != nil {
			t.Fatal(err)
		}
		oneLayer := c.layerElemsPerToken() + c.NumAttentionHeads*T
		bound := 4 * T * (oneLayer + c.VocabSize + 2*c.HiddenSize)
		if got := e.PeakStepBytes(); got > bound {
			t.Fatalf("%s of %d tokens held %d bytes, more than one layer's training activations and the logits (%d)", kind, T, got, bound)
		}
	}
}

// An adapter whose module does not fit the model (a path it lacks, or other dimensions) fails
// the pass with an error instead of being silently ignored or panicking.
func TestAdapterModuleMustFitTheModel(t *testing.T) {
	e := loadTiny(t, ArchQwen2, Options{})
	for i, break_ := range []func(m *loraModule){
		func(m *loraModule) { m.Path = "model.layers.9.self_attn.q_proj" },
		func(m *loraModule) { m.Out++ },
	} {
		id := fmt.Sprintf("bad%d", i)
		a, err := e.CreateAdapter(id, LoraConfig{Rank: 2, TrainAttn: true})
		if err != nil {
			t.Fatal(err)
		}
		break_(&a.mods[0])
		if _, err := e.Forward(context.Background(), id, []Datum{textDatum([]int{5, 6, 7, 8})}, "cross_entropy", nil); err == nil {
			t.Fatalf("case %d: a pass with a module that does not fit the model succeeded", i)
		}
		if _, err := e.Sample(id, SampleRequest{Prompt: []int{5, 6, 7}}); err == nil {
			t.Fatalf("case %d: sampling with a module that does not fit the model succeeded", i)
		}
	}
}
