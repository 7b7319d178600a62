package engine

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/skein-ai/skein/engine/internal/par"
)

// Sampling: a batch of requests becomes rows (a request's samples each a row), their prompts are
// prefilled (prefill.go), and decode steps draw every row's tokens until each stops. The loop
// that holds the rows' caches and runs the passes is kvdecoder.go's.

// sampleRow is one sequence being generated.
type sampleRow struct {
	req      int // index of its request
	prompt   []int
	params   SampleParams
	rng      *rand.Rand
	seq      SampledSequence
	done     bool
	stopTok  map[int]bool
	err      error // the draw failed (non-finite logits): the row's request fails
	sample   int   // index among its request's samples, for OnToken
	onToken  func(sample, token int, logprob float64) bool
	reported int         // tokens handed to onToken so far
	owner    *fedRequest // its request in a continuous loop (continuous.go); nil elsewhere
}

// decode runs one batched prefill + decode loop over the rows of some requests, request i
// sampling adapters[i] (nil: the base model).
func (e *Engine) decode(ctx context.Context, adapters []*Adapter, reqs []SampleRequest) ([]*SampleResult, error) {
	c, err := e.prefillCohort(ctx, adapters, reqs, nil)
	if err != nil {
		return nil, err
	}
	defer c.loop.free()
	if err := e.decodeSteps(ctx, c.loop.step, c.rows, c.next); err != nil {
		return nil, err
	}
	return gatherSequences(c.results, c.rows), nil
}

// sampleRows makes the rows of a decode loop, NumSamples of each request in order, each with
// its stop tokens (the request's and the model's end-of-sequence ids) and its random stream; with
// the longest prompt and the longest prompt plus its MaxTokens.
func (e *Engine) sampleRows(reqs []SampleRequest) (rows []*sampleRow, maxPrompt, maxLen int) {
	eos := e.Config.EOSTokens()
	for ri, r := range reqs {
		stop := map[int]bool{}
		for _, t := range r.Params.StopTokens {
			stop[t] = true
		}
		for _, t := range eos {
			stop[t] = true
		}
		for i := range r.NumSamples {
			seed := rand.Uint64()
			if r.Params.Seed != nil {
				seed = uint64(*r.Params.Seed)
			}
			k := r.firstSample + i // the sample's index in its request, also in a part of one
			rows = append(rows, &sampleRow{req: ri, prompt: r.Prompt, params: r.Params,
				rng: rand.New(rand.NewPCG(seed, uint64(k))), stopTok: stop, sample: k, onToken: r.OnToken})
		}
		maxPrompt = max(maxPrompt, len(r.Prompt))
		maxLen = max(maxLen, len(r.Prompt)+r.Params.MaxTokens)
	}
	return rows, maxPrompt, maxLen
}

// decodeSteps draws every running row's next token from next, hands it to OnToken and feeds it
// back for the following logits, until every row is done (or ctx ends, between steps).
func (e *Engine) decodeSteps(ctx context.Context, step stepFunc, rows []*sampleRow, next [][]float64) error {
	for {
		feed, fpos := e.drawTokens(rows, next)
		reportTokens(rows)
		stopFailed(rows)
		active := false
		for _, r := range rows {
			active = active || !r.done
		}
		if !active {
			return nil
		}
		if err := stopped(ctx); err != nil {
			return err
		}
		logits, err := step(feed, fpos, func(b, _ int) bool { return !rows[b].done }, nil)
		if err != nil {
			return err
		}
		for b := range rows {
			next[b] = logits[b]
		}
	}
}

// drawTokens draws the next token of every running row, and returns the step that feeds them:
// each row's token and its position (0 and 0 for a row that is done). Rows draw in parallel:
// each has its own random stream and state, so the outcome does not depend on scheduling.
func (e *Engine) drawTokens(rows []*sampleRow, next [][]float64) (feed, fpos [][]int) {
	B := len(rows)
	feed = make([][]int, B)
	fpos = make([][]int, B)
	par.Rows(B, func(b0, b1 int) {
		for b := b0; b < b1; b++ {
			feed[b], fpos[b] = []int{0}, []int{0}
			if rows[b].done {
				continue
			}
			if t, ok := e.drawToken(rows[b], next[b]); ok {
				feed[b][0] = t
				fpos[b][0] = len(rows[b].prompt) + len(rows[b].seq.Tokens) - 1
			}
		}
	})
	return feed, fpos
}

// drawToken draws row r's next token from the logits that predict it and appends it to the
// row's sequence, ending the row on a stop token or string or at MaxTokens. A failed draw
// (non-finite logits) ends the row with its error and reports false.
func (e *Engine) drawToken(r *sampleRow, logits []float64) (int, bool) {
	t, lp, err := sampleToken(logits, r.params, r.rng)
	if err != nil {
		r.err = fmt.Errorf("sampling token %d: %w", len(r.seq.Tokens), err)
		r.done = true
		return 0, false
	}
	r.seq.Tokens = append(r.seq.Tokens, t)
	r.seq.Logprobs = append(r.seq.Logprobs, lp)
	switch {
	case r.stopTok[t] || e.hitsStopString(r.seq.Tokens, r.params.StopStrings):
		r.seq.StopReason, r.done = "stop", true
	case len(r.seq.Tokens) == r.params.MaxTokens:
		r.seq.StopReason, r.done = "length", true
	}
	return t, true
}

// gatherSequences adds each row's sequence to its request's result, in row order; a request
// one of whose rows failed is answered by the error of its first failed row alone.
func gatherSequences(results []*SampleResult, rows []*sampleRow) []*SampleResult {
	for _, r := range rows {
		results[r.req].Sequences = append(results[r.req].Sequences, r.seq)
	}
	for _, r := range rows {
		if r.err != nil && results[r.req].Err == nil {
			results[r.req] = &SampleResult{Err: r.err}
		}
	}
	return results
}

// reportTokens hands each row's newly drawn token to its request's OnToken, one row after the
// other (the callback need not be safe for concurrent use); a false answer ends the row.
func reportTokens(rows []*sampleRow) {
	for _, r := range rows {
		n := len(r.seq.Tokens)
		if r.onToken == nil || r.err != nil || n == r.reported {
			continue
		}
		r.reported = n
		if !r.onToken(r.sample, r.seq.Tokens[n-1], r.seq.Logprobs[n-1]) && !r.done {
			r.seq.StopReason, r.done = "stop", true
		}
	}
}

// stopFailed ends every row of a request one of whose rows failed: the request's answer is its
// error, so decoding the others would be wasted.
func stopFailed(rows []*sampleRow) {
	failed := map[int]error{}
	for _, r := range rows {
		if r.err != nil {
			failed[r.req] = r.err
		}
	}
	for _, r := range rows {
		if _, ok := failed[r.req]; ok {
			r.done = true
		}
	}
}
