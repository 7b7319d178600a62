package engine

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"

	"github.com/skein-ai/skein/engine/internal/par"
)

// SampleParams are Tinker's SamplingParams.
type SampleParams struct {
	MaxTokens   int      // default 16 when 0
	Temperature float64  // 0 = greedy
	TopK        int      // -1 or 0 = off
	TopP        float64  // 1 = off
	Seed        *int64   // nil = random
	StopStrings []string // stop when the generated text contains one of these
	StopTokens  []int    // stop after generating one of these
}

// SampleRequest asks for NumSamples continuations of Prompt.
type SampleRequest struct {
	Prompt             []int
	NumSamples         int
	Params             SampleParams
	PromptLogprobs     bool
	TopKPromptLogprobs int
	// Images of a vision-language prompt (vlpass.go): the prompt holds their pad tokens.
	Images *Images
	// Adapter names the adapter this request samples, when requests of several adapters share
	// one call (SampleBatch); "" takes the call's id.
	Adapter string `json:",omitempty"`
	// OnToken, if set, is called on the decode loop's goroutine with every token as it is drawn
	// (sample is the index among the request's NumSamples); returning false ends that sample
	// there, e.g. when a streaming client has gone. It must not block: every row of the batch
	// waits for it. It does not cross a worker's HTTP boundary.
	OnToken func(sample, token int, logprob float64) bool `json:"-"`

	// validFor is the model ValidateSample passed this request for: the engine of that model
	// does not check it again. A request changed after ValidateSample must be validated again.
	validFor *Config
}

// SampledSequence is one continuation. Logprobs are the model's own (temperature 1) log-probabilities
// of the sampled tokens, the quantity a trainer's forward pass recomputes, so on-policy ratios are 1.
type SampledSequence struct {
	Tokens     []int
	Logprobs   []float64
	StopReason string // "stop" or "length"
}

// TokenLogprob is one entry of a top-k list.
type TokenLogprob struct {
	Token   int
	Logprob float64
}

// SampleResult is the answer to a SampleRequest.
type SampleResult struct {
	Sequences      []SampledSequence
	PromptLogprobs []float64        // NaN for the first token; nil unless asked
	TopKPrompt     [][]TokenLogprob // nil row for the first token; nil unless asked
	// Err is set, and nothing else, when this request failed on its own (non-finite logits,
	// ErrNonFinite) while the other requests of its batch were served.
	Err error
}

// DefaultMaxTokens is used when a request sets no max_tokens.
const DefaultMaxTokens = 16

// Bounds on the lists a sampling request may carry: every stop sequence is checked after every
// generated token, and top-k prompt logprobs are a row per prompt token.
const (
	MaxStopSequences      = 64  // stop strings and stop tokens together
	MaxStopStringBytes    = 256 // the longest stop string
	MaxTopKPromptLogprobs = 20  // as OpenAI's top_logprobs and vLLM's default max_logprobs
)

// validateSample checks a request unless ValidateSample already passed it for this model (at the
// gateway, in the same process: a request from a worker's peer is decoded fresh, unstamped).
func (e *Engine) validateSample(r *SampleRequest) error {
	if r.validFor == e.Config {
		return nil
	}
	return e.Info().ValidateSample(r)
}

// ValidateSample checks (and fills defaults of) a sampling request against the model.
func (m ModelInfo) ValidateSample(r *SampleRequest) error {
	V, ctx := m.Config.VocabSize, m.Config.MaxPositionEmbeddings
	if len(r.Prompt) == 0 {
		return inputErr(-1, "prompt", "empty prompt")
	}
	if len(r.Prompt) >= ctx {
		return inputErr(-1, "prompt", "%d tokens leave no room in the model's context of %d", len(r.Prompt), ctx)
	}
	for i, t := range r.Prompt {
		if t < 0 || t >= V {
			return inputErr(-1, "prompt", "token %d at position %d is outside the vocabulary [0, %d)", t, i, V)
		}
	}
	if r.NumSamples == 0 {
		r.NumSamples = 1
	}
	if r.NumSamples < 0 || r.NumSamples > 128 {
		return inputErr(-1, "num_samples", "%d out of range [1, 128]", r.NumSamples)
	}
	p := &r.Params
	if p.MaxTokens == 0 {
		p.MaxTokens = DefaultMaxTokens
	}
	if p.MaxTokens < 0 {
		return inputErr(-1, "sampling_params.max_tokens", "must be positive, got %d", p.MaxTokens)
	}
	p.MaxTokens = min(p.MaxTokens, ctx-len(r.Prompt))
	if math.IsNaN(p.Temperature) || p.Temperature < 0 || math.IsInf(p.Temperature, 0) {
		return inputErr(-1, "sampling_params.temperature", "must be a finite number ≥ 0, got %v", p.Temperature)
	}
	if p.TopP == 0 {
		p.TopP = 1
	}
	if math.IsNaN(p.TopP) || p.TopP < 0 || p.TopP > 1 {
		return inputErr(-1, "sampling_params.top_p", "must be in (0, 1], got %v", p.TopP)
	}
	if p.TopK < -1 {
		return inputErr(-1, "sampling_params.top_k", "must be -1 (off) or positive, got %d", p.TopK)
	}
	if n := len(p.StopStrings) + len(p.StopTokens); n > MaxStopSequences {
		return inputErr(-1, "sampling_params.stop", "%d stop sequences, at most %d", n, MaxStopSequences)
	}
	for _, s := range p.StopStrings {
		if len(s) > MaxStopStringBytes {
			return inputErr(-1, "sampling_params.stop", "a stop string of %d bytes, at most %d", len(s), MaxStopStringBytes)
		}
	}
	for _, s := range p.StopTokens {
		if s < 0 || s >= V {
			return inputErr(-1, "sampling_params.stop", "stop token %d outside the vocabulary", s)
		}
	}
	if len(p.StopStrings) > 0 && !m.HasTokenizer {
		return inputErr(-1, "sampling_params.stop", "stop strings need a tokenizer and this model has none")
	}
	if r.TopKPromptLogprobs < 0 || r.TopKPromptLogprobs > min(V, MaxTopKPromptLogprobs) {
		return inputErr(-1, "topk_prompt_logprobs", "%d out of range [0, %d]", r.TopKPromptLogprobs, min(V, MaxTopKPromptLogprobs))
	}
	if err := checkImages(m.Config, -1, r.Prompt, r.Images, "images."); err != nil {
		return err
	}
	r.validFor = m.Config
	return nil
}

// Sample generates continuations with a KV cache; all samples of the request decode together.
// id "" samples from the base model.
func (e *Engine) Sample(id string, r SampleRequest) (*SampleResult, error) {
	res, err := e.SampleBatch(context.Background(), id, []SampleRequest{r})
	if err != nil {
		return nil, err
	}
	if res[0].Err != nil {
		return nil, res[0].Err
	}
	return res[0], nil
}

// MaxSampleRows bounds the sequences decoded together; bigger batches run in several loops.
const MaxSampleRows = 64

// SampleBatch serves several sampling requests with shared decode loops: every sample of every
// request is a row of one batch, each at its own position with its own sampling parameters and
// random stream. Each request samples the adapter it names (Adapter), or id when it names none
// ("" = the base model): rows of different adapters share the base model's products, and each
// run of rows adds only its own adapter's low-rank terms (segmentedLinear). Requests are
// validated first; one bad request (or a missing adapter) fails the whole call and nothing runs.
// A request whose logits turn out non-finite fails alone, in its result's Err; the others are
// served.
//
// A cancelled ctx stops decoding between steps (and a step between layers): the call returns
// the wrapped ctx error and no results; sampling changes no adapter.
func (e *Engine) SampleBatch(ctx context.Context, id string, reqs []SampleRequest) ([]*SampleResult, error) {
	if err := stopped(ctx); err != nil {
		return nil, err
	}
	adapters := make([]*Adapter, len(reqs))
	names := make([]string, len(reqs))
	for i := range reqs {
		names[i] = cmp.Or(reqs[i].Adapter, id)
		if names[i] == "" {
			continue
		}
		a, err := e.adapter(names[i])
		if err != nil {
			return nil, err
		}
		adapters[i] = a
	}
	for i := range reqs {
		if err := e.validateSample(&reqs[i]); err != nil {
			return nil, err
		}
	}
	// Each adapter's requests side by side (in the order they came), so that its rows form one
	// run of the batch.
	order := make([]int, len(reqs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(i, j int) int { return strings.Compare(names[i], names[j]) })
	out := make([]*SampleResult, len(reqs))
	// Group requests into loops of at most MaxSampleRows rows (a request is never split).
	for start := 0; start < len(order); {
		end, rows := start, 0
		for end < len(order) && (end == start || rows+reqs[order[end]].NumSamples <= MaxSampleRows) {
			rows += reqs[order[end]].NumSamples
			end++
		}
		loop := make([]SampleRequest, 0, end-start)
		of := make([]*Adapter, 0, end-start)
		for _, i := range order[start:end] {
			loop = append(loop, reqs[i])
			of = append(of, adapters[i])
		}
		res, err := e.decode(ctx, of, loop)
		if err != nil {
			return nil, err
		}
		for k, i := range order[start:end] {
			out[i] = res[k]
		}
		start = end
	}
	return out, nil
}

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
	reported int // tokens handed to onToken so far
}

// decode runs one batched prefill + decode loop over the rows of some requests, request i
// sampling adapters[i] (nil: the base model).
func (e *Engine) decode(ctx context.Context, adapters []*Adapter, reqs []SampleRequest) ([]*SampleResult, error) {
	rows, maxPrompt, maxLen := e.sampleRows(reqs)
	B := len(rows) // no padding rows: a new row count costs only a few matmul compiles
	S := min(bucket(maxLen, 16), bucket(e.Config.MaxPositionEmbeddings, 16))
	images, err := e.sampleImageRows(reqs, rows)
	if err != nil {
		return nil, err
	}
	rowAdapters := make([]*Adapter, B)
	for b, r := range rows {
		rowAdapters[b] = adapters[r.req]
	}
	step, done := e.newDecodeStepRows(ctx, rowAdapters, B, S, images)
	defer done()

	first := firstRows(rows)
	prompts := e.newPromptLogprobs(reqs, first)
	logits, T, err := prefill(step, reqs, rows, first, maxPrompt, prompts.take)
	if err != nil {
		return nil, err
	}
	results := prompts.finish(rows)
	stopFailed(rows)

	// next[b] holds the logits that predict row b's next token.
	next := make([][]float64, B)
	for b := range B {
		next[b] = logits[b*T+len(rows[b].prompt)-1]
	}
	if err := e.decodeSteps(ctx, step, rows, next); err != nil {
		return nil, err
	}
	return gatherSequences(results, rows), nil
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
			rows = append(rows, &sampleRow{req: ri, prompt: r.Prompt, params: r.Params,
				rng: rand.New(rand.NewPCG(seed, uint64(i))), stopTok: stop, sample: i, onToken: r.OnToken})
		}
		maxPrompt = max(maxPrompt, len(r.Prompt))
		maxLen = max(maxLen, len(r.Prompt)+r.Params.MaxTokens)
	}
	return rows, maxPrompt, maxLen
}

// firstRows maps each request to its first row.
func firstRows(rows []*sampleRow) map[int]int {
	first := map[int]int{}
	for b := len(rows) - 1; b >= 0; b-- {
		first[rows[b].req] = b
	}
	return first
}

// prefill runs each row's prompt at positions 0…P-1, padded to a common bucket T, and returns
// the logits it asked for, indexed b·T+t: where each row's prompt ends, and at every prompt
// position of the first row of a request that asked for prompt logprobs. Padding writes garbage
// into cache slots at or after the row's prompt end; decode overwrites each slot before any
// query may attend to it.
func prefill(step stepFunc, reqs []SampleRequest, rows []*sampleRow, first map[int]int, maxPrompt int, sink rowSink) ([][]float64, int, error) {
	B, T := len(rows), bucket(maxPrompt, 16)
	tok := make([][]int, B)
	pos := make([][]int, B)
	for b := range B {
		tok[b] = make([]int, T)
		pos[b] = make([]int, T)
		copy(tok[b], rows[b].prompt)
		for t := range T {
			pos[b][t] = t
		}
	}
	logits, err := step(tok, pos, func(b, t int) bool {
		r := rows[b]
		if t == len(r.prompt)-1 {
			return true
		}
		req := reqs[r.req]
		return first[r.req] == b && t < len(r.prompt)-1 && (req.PromptLogprobs || req.TopKPromptLogprobs > 0)
	}, sink)
	return logits, T, err
}

// promptLogprobs starts each request's result and fills in its prompt logprobs where it asked
// for them, from its first row's prefill logits as the head computes them (take, a rowSink): the
// row at position t predicts the prompt's token t+1. Non-finite logits fail that row (finish).
type promptLogprobs struct {
	e       *Engine
	reqs    []SampleRequest
	results []*SampleResult
	asking  map[int]int // a first row asking for prompt logprobs → its request
	bad     [][]error   // per request asking, per prompt position: its logits were not finite
}

func (e *Engine) newPromptLogprobs(reqs []SampleRequest, first map[int]int) *promptLogprobs {
	p := &promptLogprobs{e: e, reqs: reqs, results: make([]*SampleResult, len(reqs)), asking: map[int]int{}, bad: make([][]error, len(reqs))}
	for ri, r := range reqs {
		res := &SampleResult{}
		p.results[ri] = res
		if !r.PromptLogprobs && r.TopKPromptLogprobs == 0 {
			continue
		}
		P := len(r.Prompt)
		p.asking[first[ri]] = ri
		p.bad[ri] = make([]error, P)
		res.PromptLogprobs = make([]float64, P)
		res.PromptLogprobs[0] = math.NaN()
		if r.TopKPromptLogprobs > 0 {
			res.TopKPrompt = make([][]TokenLogprob, P)
		}
	}
	return p
}

// take is the prefill's rowSink: a prompt position's row of a request asking for its logprobs
// becomes that logprob and top-k; every other row (each prompt's last, which samples) is left
// to the prefill's result.
func (p *promptLogprobs) take(b, t int, row []float64) bool {
	ri, ok := p.asking[b]
	if !ok || t >= len(p.reqs[ri].Prompt)-1 {
		return false
	}
	r, res, pos := p.reqs[ri], p.results[ri], t+1
	if err := finiteLogits(row); err != nil {
		p.bad[ri][pos] = err
		return true
	}
	res.PromptLogprobs[pos] = p.e.logprobOf(row, r.Prompt[pos]) // as a training pass computes it
	if r.TopKPromptLogprobs > 0 {
		res.TopKPrompt[pos] = topK(logSoftmax(row), r.TopKPromptLogprobs)
	}
	return true
}

// finish fails the first row of each request whose prompt logits were not finite somewhere,
// naming the first such position, and clears what came after it; it returns the results.
func (p *promptLogprobs) finish(rows []*sampleRow) []*SampleResult {
	for b, ri := range p.asking {
		for pos, err := range p.bad[ri] {
			if err == nil {
				continue
			}
			rows[b].err = fmt.Errorf("prompt logprobs at position %d: %w", pos, err)
			res := p.results[ri]
			clear(res.PromptLogprobs[pos:])
			if res.TopKPrompt != nil {
				clear(res.TopKPrompt[pos:])
			}
			break
		}
	}
	return p.results
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
		logits, err := step(feed, fpos, func(b, _ int) bool { return !rows[b].done })
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

// finiteLogits reports ErrNonFinite for a row of logits holding NaN or ±Inf: no probability
// can be computed from it, and the threshold search below would never find enough candidates.
func finiteLogits(logits []float64) error {
	for i, v := range logits {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("%w: the model's logit for token %d is %v", ErrNonFinite, i, v)
		}
	}
	return nil
}

// hitsStopString reports whether the text of toks contains a stop string. It is asked after every
// new token, so only an occurrence ending in the newest token can be new; such an occurrence lies
// within the last len(stop) tokens (every token is at least one byte), so only that tail is
// decoded instead of the whole sequence on every step.
func (e *Engine) hitsStopString(toks []int, stops []string) bool {
	if len(stops) == 0 {
		return false
	}
	longest := 0
	for _, s := range stops {
		longest = max(longest, len(s))
	}
	text := e.Tokenizer.Decode(toks[max(0, len(toks)-longest-1):])
	for _, s := range stops {
		if s != "" && strings.Contains(text, s) {
			return true
		}
	}
	return false
}

// candidates returns the tokens a top-k / top-p draw can pick from, most probable first (ties in
// token order): a prefix of the whole vocabulary sorted that way, long enough to hold the first
// topK tokens or a top-p nucleus. Sorting 150k tokens per sampled token would cost more than the
// model's decode step, so only the tokens above a log-probability threshold are sorted, the
// threshold lowered until they are enough. Every token left out is less probable than every
// token kept, so the prefix is the same as the full sort's. The threshold is lowered at most
// candidateRounds times; past that the whole vocabulary is sorted, so the search ends whatever
// the input (-Inf log-probabilities below any threshold, a top-k beyond the finite tokens, a
// top-p that float sums never reach, even NaN).
func candidates(logprobs []float64, topK int, topP float64) []int {
	var idx []int
	t := math.Log(1e-3)
	for range candidateRounds {
		idx = idx[:0]
		var mass float64
		for i, lp := range logprobs {
			if lp >= t {
				idx = append(idx, i)
				mass += math.Exp(lp)
			}
		}
		enough := len(idx) == len(logprobs) ||
			(topK > 0 && len(idx) >= topK) ||
			(topP < 1 && mass >= topP)
		if enough {
			sort.SliceStable(idx, func(a, b int) bool { return logprobs[idx[a]] > logprobs[idx[b]] })
			return idx
		}
		t -= math.Log(64)
	}
	idx = idx[:0]
	for i := range logprobs {
		idx = append(idx, i)
	}
	sort.SliceStable(idx, func(a, b int) bool { return logprobs[idx[a]] > logprobs[idx[b]] })
	return idx
}

// candidateRounds bounds the threshold search: the eighth threshold is e^-36 ≈ 2e-16, below
// which a token's probability no longer changes a float64 sum of the nucleus.
const candidateRounds = 8

func logSoftmax(x []float64) []float64 {
	m := math.Inf(-1)
	for _, v := range x {
		m = max(m, v)
	}
	var sum float64
	for _, v := range x {
		sum += math.Exp(v - m)
	}
	lse := m + math.Log(sum)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = v - lse
	}
	return out
}

// topK lists the k most probable tokens, ties in token order; the candidate search sorts only
// the head of the vocabulary, not all of it once per prompt position.
func topK(lsm []float64, k int) []TokenLogprob {
	idx := candidates(lsm, k, 1)
	k = min(k, len(idx))
	out := make([]TokenLogprob, k)
	for i := range k {
		out[i] = TokenLogprob{Token: idx[i], Logprob: lsm[idx[i]]}
	}
	return out
}

// sampleToken draws one token from logits with temperature, top-k and top-p, and returns it
// with its logprob under the untempered distribution. Non-finite logits are ErrNonFinite.
func sampleToken(logits []float64, p SampleParams, rng *rand.Rand) (int, float64, error) {
	if err := finiteLogits(logits); err != nil {
		return 0, 0, err
	}
	lsm := logSoftmax(logits)
	if p.Temperature == 0 {
		best := 0
		for i, v := range lsm {
			if v > lsm[best] {
				best = i
			}
		}
		return best, lsm[best], nil
	}
	probs := lsm
	if p.Temperature != 1 {
		// (v − max)/T rather than v/T: the largest logit becomes 0 and the others ≤ 0, so no
		// temperature, however small, overflows into Inf − Inf = NaN; a vanishing one leaves
		// every token but the most probable at -Inf, a greedy draw.
		m := math.Inf(-1)
		for _, v := range logits {
			m = max(m, v)
		}
		scaled := make([]float64, len(logits))
		for i, v := range logits {
			scaled[i] = (v - m) / p.Temperature
		}
		probs = logSoftmax(scaled)
	}
	if (p.TopK <= 0 || p.TopK >= len(probs)) && p.TopP >= 1 {
		// No truncation: draw from the full distribution without sorting the vocabulary.
		u := rng.Float64()
		last := 0
		for i, lp := range probs {
			u -= math.Exp(lp)
			if u <= 0 {
				return i, lsm[i], nil
			}
			if !math.IsInf(lp, -1) {
				last = i
			}
		}
		return last, lsm[last], nil
	}
	idx := candidates(probs, p.TopK, p.TopP)
	keep := len(idx)
	if p.TopK > 0 && p.TopK < keep {
		keep = p.TopK
	}
	if p.TopP < 1 {
		var cum float64
		for i := 0; i < keep; i++ {
			cum += math.Exp(probs[idx[i]])
			if cum >= p.TopP {
				keep = i + 1
				break
			}
		}
	}
	var total float64
	for _, i := range idx[:keep] {
		total += math.Exp(probs[i])
	}
	u := rng.Float64() * total
	for _, i := range idx[:keep] {
		u -= math.Exp(probs[i])
		if u <= 0 {
			return i, lsm[i], nil
		}
	}
	last := idx[keep-1]
	return last, lsm[last], nil
}
