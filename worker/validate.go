package worker

import (
	"errors"
	"fmt"
	"math"
	"net/url"

	"github.com/skein-ai/skein/engine"
)

// A worker is a network peer like any other: everything it answers is checked against the call
// before the gateway uses it, so a broken or hostile worker fails its own requests and nothing else.

// ErrBadAnswer: the worker's answer is malformed or does not match the call.
var ErrBadAnswer = errors.New("bad answer from worker")

// Bounds on what a worker may report; far above any real model or fleet.
const (
	maxIDLen       = 1024
	maxAdapterIDs  = 1 << 16
	maxMetrics     = 1024
	maxWorkerLoras = 4096
	maxVocab       = 1 << 24
	maxContext     = 1 << 24
	maxRank        = 1 << 16
	maxStep        = 1 << 40
)

func badAnswer(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadAnswer, fmt.Sprintf(format, args...))
}

// Validate checks a registration before the gateway routes anything to the worker.
func (reg Registration) Validate() error {
	if reg.ID == "" || len(reg.ID) > maxIDLen || reg.BaseModel == "" || len(reg.BaseModel) > maxIDLen {
		return errors.New("registration needs an id and a base_model of at most 1024 bytes")
	}
	if reg.Instance != "" && !validPeerID(reg.Instance) {
		return errors.New("registration instance must be 1 to 128 printable bytes")
	}
	u, err := url.Parse(reg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || len(reg.URL) > maxIDLen {
		return fmt.Errorf("registration url %q is not an http(s) URL", reg.URL)
	}
	if reg.MaxLoras < 0 || reg.MaxLoras > maxWorkerLoras {
		return fmt.Errorf("max_loras %d out of range [0, %d]", reg.MaxLoras, maxWorkerLoras)
	}
	return validateInfo(reg.Info)
}

func validateInfo(info engine.ModelInfo) error {
	c := info.Config
	if c == nil {
		return errors.New("registration needs info.config")
	}
	if c.VocabSize < 1 || c.VocabSize > maxVocab || c.MaxPositionEmbeddings < 1 || c.MaxPositionEmbeddings > maxContext {
		return fmt.Errorf("info.config: vocab_size %d or max_position_embeddings %d out of range", c.VocabSize, c.MaxPositionEmbeddings)
	}
	if info.MaxRank < 0 || info.MaxRank > maxRank {
		return fmt.Errorf("info.max_rank %d out of range [0, %d]", info.MaxRank, maxRank)
	}
	return nil
}

// Validate checks a heartbeat's report (it is shown by the admin API).
func (hb Heartbeat) Validate() error {
	if len(hb.Adapters) > maxAdapterIDs || hb.FreeSlots < -maxWorkerLoras || hb.FreeSlots > maxWorkerLoras || hb.QueueDepth < 0 {
		return errors.New("heartbeat: adapters, free_slots or queue_depth out of range")
	}
	if hb.Sampler != nil && !hb.Sampler.Valid() {
		return errors.New("heartbeat: a sampler counter out of range [0, 2^62]")
	}
	return nil
}

func finite(vs []float64, what string) error {
	for i, v := range vs {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return badAnswer("%s[%d] is %v", what, i, v)
		}
	}
	return nil
}

func checkMetrics(m map[string]float64) error {
	if len(m) > maxMetrics {
		return badAnswer("%d metrics", len(m))
	}
	for k, v := range m {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return badAnswer("metric %q is %v", k, v)
		}
	}
	return nil
}

// checkForward: one row of target logprobs and of losses per datum, one value per token.
func checkForward(res *engine.ForwardResult, data []engine.Datum) error {
	if res == nil {
		return badAnswer("no forward result")
	}
	if len(res.Logprobs) != len(data) || len(res.Losses) != len(data) {
		return badAnswer("%d logprob rows and %d loss rows for %d data", len(res.Logprobs), len(res.Losses), len(data))
	}
	for i, d := range data {
		if len(res.Logprobs[i]) != len(d.Tokens) || len(res.Losses[i]) != len(d.Tokens) {
			return badAnswer("datum %d: %d logprobs and %d losses for %d tokens", i, len(res.Logprobs[i]), len(res.Losses[i]), len(d.Tokens))
		}
		if err := finite(res.Logprobs[i], fmt.Sprintf("logprobs[%d]", i)); err != nil {
			return err
		}
		if err := finite(res.Losses[i], fmt.Sprintf("losses[%d]", i)); err != nil {
			return err
		}
	}
	if math.IsNaN(res.Loss) || math.IsInf(res.Loss, 0) {
		return badAnswer("loss is %v", res.Loss)
	}
	return checkMetrics(res.Metrics)
}

func checkLora(cfg *engine.LoraConfig, step int, info engine.ModelInfo) error {
	if cfg == nil {
		return badAnswer("no lora config")
	}
	limit := maxRank
	if info.MaxRank > 0 {
		limit = info.MaxRank
	}
	if cfg.Rank < 1 || cfg.Rank > limit {
		return badAnswer("rank %d out of range [1, %d]", cfg.Rank, limit)
	}
	if step < 0 || step > maxStep {
		return badAnswer("step %d out of range", step)
	}
	if math.IsNaN(cfg.Alpha) || math.IsInf(cfg.Alpha, 0) {
		return badAnswer("alpha is %v", cfg.Alpha)
	}
	return nil
}

func checkIDs(ids []string) error {
	if len(ids) > maxAdapterIDs {
		return badAnswer("%d adapter ids", len(ids))
	}
	for _, id := range ids {
		if id == "" || len(id) > maxIDLen {
			return badAnswer("adapter id of %d bytes", len(id))
		}
	}
	return nil
}

// checkSamples: one result per request, NumSamples sequences each, no more tokens than asked,
// every token in the vocabulary, one logprob per token, prompt logprobs only when asked.
func checkSamples(res []*wireSample, reqs []engine.SampleRequest, info engine.ModelInfo) error {
	if len(res) != len(reqs) {
		return badAnswer("%d results for %d requests", len(res), len(reqs))
	}
	vocab := maxVocab
	if info.Config != nil && info.Config.VocabSize > 0 {
		vocab = info.Config.VocabSize
	}
	inVocab := func(t int) bool { return t >= 0 && t < vocab }
	for i, w := range res {
		q := reqs[i]
		if w == nil {
			return badAnswer("result %d is null", i)
		}
		n := max(q.NumSamples, 1)
		if len(w.Sequences) != n {
			return badAnswer("result %d: %d sequences for %d samples", i, len(w.Sequences), n)
		}
		maxTokens := q.Params.MaxTokens
		if maxTokens <= 0 {
			maxTokens = engine.DefaultMaxTokens
		}
		for j, s := range w.Sequences {
			if len(s.Tokens) > maxTokens || len(s.Logprobs) != len(s.Tokens) {
				return badAnswer("result %d sequence %d: %d tokens, %d logprobs (max_tokens %d)", i, j, len(s.Tokens), len(s.Logprobs), maxTokens)
			}
			if s.StopReason != "stop" && s.StopReason != "length" {
				return badAnswer("result %d sequence %d: stop reason %q", i, j, s.StopReason)
			}
			for _, t := range s.Tokens {
				if !inVocab(t) {
					return badAnswer("result %d sequence %d: token %d outside the vocabulary", i, j, t)
				}
			}
			if err := finite(s.Logprobs, "logprobs"); err != nil {
				return err
			}
		}
		wantPrompt := q.PromptLogprobs || q.TopKPromptLogprobs > 0
		if (w.PromptLogprobs != nil) != wantPrompt || (wantPrompt && len(w.PromptLogprobs) != len(q.Prompt)) {
			return badAnswer("result %d: %d prompt logprobs for a prompt of %d (asked: %v)", i, len(w.PromptLogprobs), len(q.Prompt), wantPrompt)
		}
		for _, v := range w.PromptLogprobs {
			if v != nil && (math.IsNaN(*v) || math.IsInf(*v, 0)) {
				return badAnswer("result %d: prompt logprob %v", i, *v)
			}
		}
		if q.TopKPromptLogprobs <= 0 {
			if w.TopKPrompt != nil {
				return badAnswer("result %d: top-k prompt logprobs nobody asked for", i)
			}
			continue
		}
		if len(w.TopKPrompt) != len(q.Prompt) {
			return badAnswer("result %d: %d top-k rows for a prompt of %d", i, len(w.TopKPrompt), len(q.Prompt))
		}
		for _, row := range w.TopKPrompt {
			if len(row) > q.TopKPromptLogprobs {
				return badAnswer("result %d: top-k row of %d, asked %d", i, len(row), q.TopKPromptLogprobs)
			}
			for _, t := range row {
				if !inVocab(t.Token) || math.IsNaN(t.Logprob) || math.IsInf(t.Logprob, 0) {
					return badAnswer("result %d: top-k entry %+v", i, t)
				}
			}
		}
	}
	return nil
}
