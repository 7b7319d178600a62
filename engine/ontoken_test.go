package engine

import (
	"reflect"
	"testing"
)

// OnToken sees every drawn token in order, per sample, and a false answer ends only that sample:
// the other samples of the batch decode on to their length.
func TestOnTokenStreamsAndStopsOneSample(t *testing.T) {
	e := loadTiny(t, ArchQwen3, Options{})
	seed := int64(5)
	seen := map[int][]int{}
	req := SampleRequest{Prompt: e.Tokenizer.Encode("The quick brown fox"), NumSamples: 2,
		Params: SampleParams{MaxTokens: 8, Temperature: 1, TopK: -1, TopP: 1, Seed: &seed, StopTokens: nil},
		OnToken: func(sample, token int, _ float64) bool {
			seen[sample] = append(seen[sample], token)
			return sample != 0 || len(seen[0]) < 3
		}}
	eos := map[int]bool{}
	for _, t := range e.Config.EOSTokens() {
		eos[t] = true
	}
	res, err := e.Sample("", req)
	if err != nil {
		t.Fatal(err)
	}
	for i, q := range res.Sequences {
		if !reflect.DeepEqual(seen[i], q.Tokens) {
			t.Fatalf("sample %d: OnToken saw %v, result %v", i, seen[i], q.Tokens)
		}
	}
	if got := res.Sequences[0].Tokens; len(got) > 3 {
		t.Fatalf("sample 0 went on after OnToken said stop: %v", got)
	}
	if q := res.Sequences[1]; len(q.Tokens) != 8 && !eos[q.Tokens[len(q.Tokens)-1]] {
		t.Fatalf("sample 1 stopped early with its neighbour: %v", q.Tokens)
	}
}
