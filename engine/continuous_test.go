package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
)

// A continuous loop (issue 39 item 3): requests join while others decode (in finished rows'
// places when there are enough), a long prompt's prefill runs in chunks with a decode step of
// the running rows after each, finished rows leave the loop, and every request is answered as it ends with exactly what it draws sampled
// alone (the same tokens; logprobs within float32 rounding, or float64's). On an attention model
// and a hybrid one (whose DeltaNet states move between loops with the keys and values), with an
// adapter's rows beside the base model's, a request that fails validation and one whose client
// has gone (each answered with its error, the others served).
func TestContinuousLoopSamplesAsAlone(t *testing.T) {
	for _, c := range []struct {
		arch Arch
		f64  bool
		tol  float64
	}{{ArchQwen3, false, 1e-4}, {ArchQwen3, true, 1e-9}, {ArchQwen3_5, false, 1e-4}, {ArchQwen3MoE, false, 1e-4}} {
		t.Run(fmt.Sprintf("%s/f64=%v", c.arch, c.f64), func(t *testing.T) {
			e := loadTiny(t, c.arch, Options{Float64: c.f64, PrefillChunk: 16})
			if _, err := e.CreateAdapter("a", LoraConfig{Rank: 4, Seed: 1, TrainAttn: true, TrainMLP: true}); err != nil {
				t.Fatal(err)
			}
			trainSteps(t, e, "a", tokensFrom(7, 30), 2)
			seed := int64(9)
			long := SampleRequest{Prompt: tokensFrom(1, 20), NumSamples: 2, Params: SampleParams{MaxTokens: 40, Temperature: 1, Seed: &seed}}
			joining := []SampleRequest{
				// a long prompt: 70 positions, in chunks of 16 while the first request decodes
				{Prompt: tokensFrom(2, 70), NumSamples: 3, PromptLogprobs: true, Params: SampleParams{MaxTokens: 4, Temperature: 1, Seed: &seed}},
				{Prompt: tokensFrom(3, 9), NumSamples: 1, Adapter: "a", Params: SampleParams{MaxTokens: 6, Temperature: 0.7, TopK: 20, Seed: &seed}},
				{Prompt: tokensFrom(4, 12), NumSamples: 1, Params: SampleParams{MaxTokens: 3}},
				{Prompt: tokensFrom(5, 33), NumSamples: 2, Adapter: "a", Params: SampleParams{MaxTokens: 5, Temperature: 1, Seed: &seed}},
			}
			gone, cancel := context.WithCancel(context.Background())
			cancel()
			type answer struct {
				res *SampleResult
				err error
			}
			answers := map[string]answer{}
			var order []string
			fed := func(name string, r SampleRequest, ctx context.Context) FedRequest {
				return FedRequest{Req: r, Ctx: ctx, Done: func(res *SampleResult, err error) {
					if _, ok := answers[name]; ok {
						t.Errorf("%s answered twice", name)
					}
					answers[name] = answer{res, err}
					order = append(order, name)
				}}
			}
			var passes [][2]int
			e.stepHook = func(B, T int) { passes = append(passes, [2]int{B, T}) }
			calls := 0
			feed := func(rows int) []FedRequest {
				calls++
				switch calls { // call 1 comes with the first request, before its prefill
				case 2:
					return []FedRequest{fed("join0", joining[0], nil)}
				case 3:
					bad := SampleRequest{Prompt: []int{1, 1 << 30}, NumSamples: 1}
					return []FedRequest{fed("join1", joining[1], context.Background()), fed("bad", bad, nil), fed("gone", joining[2], gone)}
				case 6:
					return []FedRequest{fed("join2", joining[2], nil), fed("join3", joining[3], nil)}
				}
				return nil
			}
			err := e.SampleContinuous(context.Background(), []FedRequest{fed("first", long, nil)}, feed)
			e.stepHook = nil
			if err != nil {
				t.Fatal(err)
			}
			if a := answers["bad"]; a.err == nil || a.res != nil {
				t.Fatalf("an invalid request was answered %+v", a)
			}
			if a := answers["gone"]; !errors.Is(a.err, context.Canceled) {
				t.Fatalf("a request whose client had gone was answered %+v", a)
			}
			if len(answers) != 2+len(joining)+1 {
				t.Fatalf("%d answers (%v), want every request answered", len(answers), order)
			}
			if order[len(order)-1] != "first" {
				t.Fatalf("answers in the order %v: the first request, the longest, should end last", order)
			}
			check := func(name string, r SampleRequest) {
				t.Helper()
				a := answers[name]
				if a.err != nil {
					t.Fatalf("%s: %v", name, a.err)
				}
				alone, err := e.SampleBatch(context.Background(), "", []SampleRequest{r})
				if err != nil {
					t.Fatal(err)
				}
				sameSamples(t, name, alone[0], a.res, c.tol)
			}
			check("first", long)
			for i, r := range joining[:2] {
				check(fmt.Sprintf("join%d", i), r)
			}
			check("join2", joining[2])
			check("join3", joining[3])

			// The long prompt's chunks each had a decode step of the running rows after them, the
			// joined rows decoded in the running loop, and the finished ones left it.
			chunks, most := 0, 0
			for i, p := range passes {
				if p[1] == 1 {
					most = max(most, p[0])
					continue
				}
				if p[1] == 16 && p[0] == 1 {
					chunks++
					if i+1 < len(passes) && chunks < 5 && passes[i+1][1] != 1 {
						t.Fatalf("passes %v: chunk %d of the long prompt was not followed by a decode step", passes, chunks)
					}
				}
			}
			if chunks < 5 {
				t.Fatalf("passes %v: the 70-token prompt was prefilled in %d chunks of 16, want 5", passes, chunks)
			}
			if most < 2+3 {
				t.Fatalf("passes %v: the joined rows never decoded beside the first request's (most rows %d)", passes, most)
			}
			if last := passes[len(passes)-1]; last[1] != 1 || last[0] != 2 {
				t.Fatalf("passes %v: the last steps ran %d rows, want the first request's 2 alone (finished rows compacted away)", passes, last[0])
			}
			if !slices.ContainsFunc(passes, func(p [2]int) bool { return p[1] == 1 && p[0] > 2 }) {
				t.Fatal("no step decoded more rows than the first request's")
			}
		})
	}
}

// A loop whose context ends answers every request it took, and those it had not yet taken,
// with the context's error.
func TestContinuousLoopStopsWithItsContext(t *testing.T) {
	e := loadTiny(t, ArchQwen3, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	var errs []error
	done := func(res *SampleResult, err error) { errs = append(errs, err) }
	r := SampleRequest{Prompt: tokensFrom(1, 10), NumSamples: 2, Params: SampleParams{MaxTokens: 50}}
	steps := 0
	e.stepHook = func(B, T int) {
		if steps++; steps == 3 {
			cancel()
		}
	}
	err := e.SampleContinuous(ctx, []FedRequest{{Req: r, Done: done}, {Req: r, Done: done}}, func(int) []FedRequest {
		return []FedRequest{{Req: r, Done: done}}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("the loop ended with %v, want the context's error", err)
	}
	if len(errs) < 3 {
		t.Fatalf("%d answers, want every request taken answered", len(errs))
	}
	for _, err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("a request was answered %v", err)
		}
	}
}

// A request of few rows joining a loop of many waits for more newcomers (a join moves every
// running row), but never more than joinWaitSteps decode steps; one that is a fair share of the
// loop joins at once.
func TestContinuousLoopBatchesJoins(t *testing.T) {
	e := loadTiny(t, ArchQwen3, Options{})
	big := SampleRequest{Prompt: tokensFrom(1, 10), NumSamples: 16, Params: SampleParams{MaxTokens: 40, Temperature: 1}}
	for _, c := range []struct {
		samples  int
		min, max int // decode steps between its arrival and its prefill
	}{{1, 0, joinWaitSteps}, {16 / joinShare, 0, 0}} { // 1 row: at once only if finished rows free a place (unseeded rows may draw EOS)
		var passes [][2]int
		e.stepHook = func(B, T int) { passes = append(passes, [2]int{B, T}) }
		arrived, calls := -1, 0
		small := SampleRequest{Prompt: tokensFrom(2, 20), NumSamples: c.samples, Params: SampleParams{MaxTokens: 2}}
		err := e.SampleContinuous(context.Background(), []FedRequest{{Req: big, Done: func(*SampleResult, error) {}}}, func(int) []FedRequest {
			if calls++; calls == 3 {
				arrived = len(passes)
				return []FedRequest{{Req: small, Done: func(*SampleResult, error) {}}}
			}
			return nil
		})
		e.stepHook = nil
		if err != nil {
			t.Fatal(err)
		}
		steps := -1
		for i := arrived; i < len(passes); i++ {
			if passes[i] == [2]int{1, 32} { // its prompt's prefill, a row for its samples
				steps = i - arrived
				break
			}
		}
		if steps < c.min || steps > c.max {
			t.Fatalf("%d samples joining 16: prefilled %d steps after arriving, want [%d, %d] (passes %v)", c.samples, steps, c.min, c.max, passes)
		}
	}
}

// A request of more samples than a loop holds is answered with an error at once (it could never
// be admitted), and the loop serves the others.
func TestContinuousLoopRefusesRequestsItCannotHold(t *testing.T) {
	e := loadTiny(t, ArchQwen3, Options{})
	var errs []error
	done := func(_ *SampleResult, err error) { errs = append(errs, err) }
	r := SampleRequest{Prompt: tokensFrom(1, 10), NumSamples: MaxFedSamples + 1, Params: SampleParams{MaxTokens: 2}}
	ok := SampleRequest{Prompt: tokensFrom(2, 10), NumSamples: 1, Params: SampleParams{MaxTokens: 2}}
	if err := e.SampleContinuous(context.Background(), []FedRequest{{Req: r, Done: done}, {Req: ok, Done: done}}, nil); err != nil {
		t.Fatal(err)
	}
	if len(errs) != 2 || errs[0] == nil || errs[1] != nil {
		t.Fatalf("answers %v, want the big request refused and the other served", errs)
	}
}
