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
	// firstSample is the index in its request of this part's first sample, when SampleBatch
	// splits a request of more than MaxSampleRows samples into parts (0: a whole request).
	firstSample int
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
	// CachedTokens are the prompt positions served from the sampler's prefix cache (keys and
	// values of an earlier request's prompt on the same weights) instead of computed: Tinker's
	// prompt_cache_hit_tokens.
	CachedTokens int `json:",omitempty"`
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
	// A request of more samples than a loop takes runs in parts of at most MaxSampleRows, each
	// sample with its own random stream as in one loop (its index in the request); the first
	// part alone computes the prompt's logprobs. So at most MaxSampleRows rows decode together
	// whatever the request: their state (KV cache, DeltaNet states) is bounded by it.
	var parts []SampleRequest
	var partOf []int // the request each part belongs to
	var partAdapters []*Adapter
	for _, i := range order {
		for k := 0; k == 0 || k < reqs[i].NumSamples; k += MaxSampleRows {
			p := reqs[i]
			p.firstSample, p.NumSamples = k, min(MaxSampleRows, reqs[i].NumSamples-k)
			if k > 0 {
				p.PromptLogprobs, p.TopKPromptLogprobs = false, 0
			}
			parts = append(parts, p)
			partOf = append(partOf, i)
			partAdapters = append(partAdapters, adapters[i])
		}
	}
	res, err := e.sampleParts(ctx, parts, partAdapters)
	if err != nil {
		return nil, err
	}
	out := make([]*SampleResult, len(reqs))
	for k, r := range res {
		i := partOf[k]
		switch {
		case out[i] == nil:
			out[i] = r
		case out[i].Err != nil:
		case r.Err != nil:
			out[i] = &SampleResult{Err: r.Err}
		default:
			out[i].Sequences = append(out[i].Sequences, r.Sequences...)
		}
	}
	return out, nil
}

// sampleParts decodes requests (none of more than MaxSampleRows samples) in loops of at most
// MaxSampleRows rows, in order, a request never split between loops.
func (e *Engine) sampleParts(ctx context.Context, reqs []SampleRequest, adapters []*Adapter) ([]*SampleResult, error) {
	order := make([]int, len(reqs))
	for i := range order {
		order[i] = i
	}
	out := make([]*SampleResult, len(reqs))
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
