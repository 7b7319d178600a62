package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/replica"
)

const (
	// DefaultChatMaxTokens is the length of a chat answer whose request sets no limit (OpenAI's
	// is the model's context; the server's request limits apply either way).
	DefaultChatMaxTokens = 1024
	// DefaultCompletionMaxTokens is OpenAI's default for legacy completions.
	DefaultCompletionMaxTokens = 16
	// MaxTopLogprobs is OpenAI's bound on top_logprobs; legacy completions' logprobs go to 5.
	MaxTopLogprobs        = 20
	MaxCompletionLogprobs = 5

	// MaxPromptBytesPerToken bounds a text prompt's length in bytes by the model's context: text
	// longer than context × 32 bytes is refused before it is tokenized or rendered. Tokenizing is
	// the costly step (a 32 MB prompt took a gigabyte and half a minute only to be refused for its
	// token count), and real text averages 3–5 bytes a token, so a prompt refused here could fit
	// only if its tokens averaged over 32 bytes (long runs of one character).
	MaxPromptBytesPerToken = 32
	// MaxOpenAIBodyBytes is the body limit of /v1/completions and /v1/chat/completions (the
	// server's --max-body-bytes is for training data): a 128k-token context's prompt bytes, with
	// room for JSON escapes.
	MaxOpenAIBodyBytes = 16 << 20
)

// checkPromptBytes refuses text of n bytes for a model of the given context before any work on it.
func checkPromptBytes(param string, n int, e replica.LocalModel) error {
	ctxLen := e.Config.MaxPositionEmbeddings
	if limit := ctxLen * MaxPromptBytesPerToken; n > limit {
		return badParam(param, fmt.Sprintf("%d bytes of text, over the %d bytes a prompt for this model's context of %d tokens may have (%d bytes a token)",
			n, limit, ctxLen, MaxPromptBytesPerToken))
	}
	return nil
}

// decodeOpenAI reads an OpenAI request within MaxOpenAIBodyBytes.
func (o *openAI) decodeOpenAI(r *http.Request, v any) error {
	b, err := o.srv.readBodyWithin(r, MaxOpenAIBodyBytes)
	if err != nil {
		return err
	}
	return decodeJSONBytes(b, v)
}

// oaiJob is one OpenAI request as an engine sampling request, with what its answer needs.
type oaiJob struct {
	chat         bool
	model        string // as the client named it, echoed in every answer
	tenant       string
	smp          *sampler
	eng          replica.LocalModel // its tokenizer decodes the answer
	files        baseFiles          // where its chat template is read from
	sr           engine.SampleRequest
	endTokens    map[int]bool // tokens that end an answer and have no text in it
	logprobs     bool
	topLogprobs  int
	stream       bool
	includeUsage bool
	id           string
	created      int64
}

func (o *openAI) chatCompletions(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.ChatCompletionRequest
	if err := o.decodeOpenAI(r, &req); err != nil {
		return nil, err
	}
	if t := strings.TrimSpace(string(req.Tools)); t != "" && t != "null" && t != "[]" {
		return nil, badParam("tools", "tool calling is not served")
	}
	if f := strings.TrimSpace(string(req.ResponseFormat)); f != "" && f != "null" {
		var rf struct{ Type string }
		if json.Unmarshal(req.ResponseFormat, &rf) != nil || rf.Type != "text" {
			return nil, badParam("response_format", "only response_format {\"type\": \"text\"} is served")
		}
	}
	job, err := o.newOAIJob(r, tenant, req.OpenAISampling)
	if err != nil {
		return nil, err
	}
	job.chat, job.logprobs = true, req.Logprobs
	if req.TopLogprobs != nil {
		if *req.TopLogprobs < 0 || *req.TopLogprobs > MaxTopLogprobs {
			return nil, badParam("top_logprobs", fmt.Sprintf("must be in [0, %d], got %d", MaxTopLogprobs, *req.TopLogprobs))
		}
		if *req.TopLogprobs > 0 && !req.Logprobs {
			return nil, badParam("top_logprobs", "top_logprobs needs logprobs: true")
		}
		job.topLogprobs = *req.TopLogprobs
	}
	tmpl, err := chatTemplates.get(r.Context(), job.files)
	if errors.Is(err, errNoChatTemplate) {
		return nil, badParam("model", fmt.Sprintf("base model %s has no chat template in its %s: use /v1/completions", job.smp.baseModel, tokenizerConfigFile))
	}
	if err != nil {
		return nil, err
	}
	// The messages are measured before the template renders them, the rendered text before it
	// is tokenized (the template adds its own text around each message).
	n := 0
	for _, m := range req.Messages {
		text, _ := m.Text() // an error is render's to report
		n += len(text)
	}
	if err := checkPromptBytes("messages", n, job.eng); err != nil {
		return nil, err
	}
	text, err := tmpl.render(r.Context(), o.templateTimeout, req.Messages)
	if err != nil {
		return nil, err
	}
	if err := checkPromptBytes("messages", len(text), job.eng); err != nil {
		return nil, err
	}
	maxTokens, param := req.MaxCompletionTokens, "max_completion_tokens"
	if maxTokens == nil {
		maxTokens, param = req.MaxTokens, "max_tokens"
	}
	if err := job.setParams(req.OpenAISampling, maxTokens, param, DefaultChatMaxTokens); err != nil {
		return nil, err
	}
	// The chat template's end of turn ends the answer even where config.json names another EOS.
	if id, ok := job.eng.Tokenizer.TokenID(tmpl.eos); ok && !job.endTokens[id] {
		job.sr.Params.StopTokens = append(job.sr.Params.StopTokens, id)
		job.endTokens[id] = true
	}
	job.sr.Prompt = job.eng.Tokenizer.Encode(text)
	return o.runOAIJob(w, r, job)
}

func (o *openAI) completions(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	var req api.CompletionRequest
	if err := o.decodeOpenAI(r, &req); err != nil {
		return nil, err
	}
	switch {
	case req.Echo:
		return nil, badParam("echo", "echo is not served")
	case req.Suffix != nil && *req.Suffix != "":
		return nil, badParam("suffix", "suffix is not served")
	case req.BestOf != nil && (req.N == nil && *req.BestOf != 1 || req.N != nil && *req.BestOf != *req.N):
		return nil, badParam("best_of", "best_of other than n is not served")
	}
	job, err := o.newOAIJob(r, tenant, req.OpenAISampling)
	if err != nil {
		return nil, err
	}
	if req.Logprobs != nil {
		if *req.Logprobs < 0 || *req.Logprobs > MaxCompletionLogprobs {
			return nil, badParam("logprobs", fmt.Sprintf("must be in [0, %d], got %d", MaxCompletionLogprobs, *req.Logprobs))
		}
		job.logprobs, job.topLogprobs = true, *req.Logprobs
	}
	if err := job.setParams(req.OpenAISampling, req.MaxTokens, "max_tokens", DefaultCompletionMaxTokens); err != nil {
		return nil, err
	}
	if job.sr.Prompt, err = completionPrompt(req.Prompt, job.eng); err != nil {
		return nil, err
	}
	return o.runOAIJob(w, r, job)
}

// completionPrompt reads a completions prompt: a string (tokenized with the model's special
// tokens, as Hugging Face does by default), a list of token ids, or a list of one of either.
func completionPrompt(raw json.RawMessage, e replica.LocalModel) ([]int, error) {
	var text string
	if json.Unmarshal(raw, &text) == nil {
		if err := checkPromptBytes("prompt", len(text), e); err != nil {
			return nil, err
		}
		return e.Tokenizer.EncodeWithSpecialTokens(text), nil
	}
	var ids []int
	if json.Unmarshal(raw, &ids) == nil {
		return ids, nil // the engine checks them against the vocabulary
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) == nil && len(list) == 1 {
		return completionPrompt(list[0], e)
	}
	return nil, badParam("prompt", "prompt must be a string, a list of token ids, or a list of one of these (one prompt per request)")
}

// newOAIJob resolves the model and its tokenizer.
func (o *openAI) newOAIJob(r *http.Request, tenant string, p api.OpenAISampling) (*oaiJob, error) {
	smp, err := o.openAISampler(r, tenant, p.Model)
	if err != nil {
		return nil, err
	}
	e, files, err := o.localModel(r.Context(), smp.baseModel)
	if err != nil {
		return nil, err
	}
	job := &oaiJob{model: p.Model, tenant: tenant, smp: smp, eng: e, files: files, stream: p.Stream,
		includeUsage: p.StreamOptions != nil && p.StreamOptions.IncludeUsage,
		id:           randomHex(12), created: time.Now().Unix(), endTokens: map[int]bool{}}
	for _, t := range e.Config.EOSTokens() {
		job.endTokens[t] = true
	}
	return job, nil
}

// setParams checks the sampling fields and writes them into the engine request.
func (j *oaiJob) setParams(p api.OpenAISampling, maxTokens *int, maxParam string, defaultMax int) error {
	n := 1
	if p.N != nil {
		n = *p.N
		if n < 1 || n > 128 {
			return badParam("n", fmt.Sprintf("must be in [1, 128], got %d", n))
		}
	}
	for name, v := range map[string]*float64{"presence_penalty": p.PresencePenalty, "frequency_penalty": p.FrequencyPenalty} {
		if v != nil && *v != 0 {
			return badParam(name, name+" is not served")
		}
	}
	if len(p.LogitBias) > 0 {
		return badParam("logit_bias", "logit_bias is not served")
	}
	sp := engine.SampleParams{MaxTokens: defaultMax, Temperature: 1, TopK: -1, TopP: 1, Seed: p.Seed}
	if p.Temperature != nil {
		if t := *p.Temperature; math.IsNaN(t) || t < 0 || t > 2 {
			return badParam("temperature", fmt.Sprintf("must be in [0, 2], got %v", t))
		}
		sp.Temperature = *p.Temperature
	}
	if p.TopP != nil {
		if t := *p.TopP; math.IsNaN(t) || t < 0 || t > 1 {
			return badParam("top_p", fmt.Sprintf("must be in [0, 1], got %v", t))
		}
		sp.TopP = *p.TopP
		greedyTopP(&sp)
	}
	if maxTokens != nil {
		if *maxTokens < 1 {
			return badParam(maxParam, fmt.Sprintf("must be at least 1, got %d", *maxTokens))
		}
		sp.MaxTokens = *maxTokens
	}
	stops, err := p.StopStrings()
	if err != nil {
		return badParam("stop", err.Error())
	}
	if len(stops) > engine.MaxStopSequences {
		return badParam("stop", fmt.Sprintf("%d stop sequences, at most %d", len(stops), engine.MaxStopSequences))
	}
	for _, s := range stops {
		if s == "" || len(s) > engine.MaxStopStringBytes {
			return badParam("stop", fmt.Sprintf("a stop sequence must have 1 to %d bytes", engine.MaxStopStringBytes))
		}
	}
	sp.StopStrings = stops
	if j.stream && j.topLogprobs > 0 {
		return badParam("stream", "top logprobs are not served on a stream; ask for logprobs without top_logprobs, or do not stream")
	}
	j.sr = engine.SampleRequest{NumSamples: n, Params: sp}
	return nil
}

// awaitSample waits for a sampling future, or for the client to go.
func awaitSample(ctx context.Context, f *future) (*api.SampleResponse, error) {
	select {
	case <-f.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("the client went away: %w", ctx.Err())
	}
	res, ok := f.result.(*api.SampleResponse)
	if !ok {
		status := http.StatusInternalServerError
		if f.category == "user" {
			status = http.StatusBadRequest
		}
		return nil, &oaiError{status: status, msg: "sampling failed: " + f.errMsg}
	}
	return res, nil
}

func (o *openAI) runOAIJob(w http.ResponseWriter, r *http.Request, j *oaiJob) (any, error) {
	if j.stream {
		return nil, o.streamOAIJob(w, r, j)
	}
	ctx := r.Context()
	// A client that hangs up stops its decode at the next token.
	j.sr.OnToken = func(int, int, float64) bool { return ctx.Err() == nil }
	f, err := o.srv.startSample(r.Context(), w, r, j.tenant, j.smp, j.sr)
	if err != nil {
		return nil, err
	}
	res, err := awaitSample(ctx, f)
	if err != nil {
		return nil, err
	}
	if len(res.Sequences) != j.sr.NumSamples {
		return nil, fmt.Errorf("sampling answered %d sequences for %d", len(res.Sequences), j.sr.NumSamples)
	}
	var top [][][][2]float64
	if j.topLogprobs > 0 {
		if top, err = o.topLogprobsOf(w, r, j, res.Sequences); err != nil {
			return nil, err
		}
	}
	usage := &api.Usage{PromptTokens: len(j.sr.Prompt)}
	streams := make([]*choiceStream, len(res.Sequences))
	for i, q := range res.Sequences {
		usage.CompletionTokens += len(q.Tokens)
		c := j.newChoiceStream()
		for k, t := range q.Tokens {
			c.push(t, logprobAt(q.Logprobs, k))
		}
		if top != nil {
			c.top = top[i]
		}
		streams[i] = c
	}
	usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
	if j.chat {
		out := api.ChatCompletion{ID: "chatcmpl-" + j.id, Object: "chat.completion", Created: j.created, Model: j.model, Usage: usage}
		for i, c := range streams {
			text := c.take() + c.flush()
			finish := c.finishReason(res.Sequences[i].StopReason)
			out.Choices = append(out.Choices, api.ChatChoice{Index: i, Message: &api.ChatChoiceMessage{Role: "assistant", Content: &text},
				Logprobs: c.chatLogprobs(j.logprobs), FinishReason: &finish})
		}
		return out, nil
	}
	out := api.Completion{ID: "cmpl-" + j.id, Object: "text_completion", Created: j.created, Model: j.model, Usage: usage}
	for i, c := range streams {
		text := c.take() + c.flush()
		finish := c.finishReason(res.Sequences[i].StopReason)
		out.Choices = append(out.Choices, api.CompletionChoice{Index: i, Text: text, Logprobs: c.completionLogprobs(j.logprobs), FinishReason: &finish})
	}
	return out, nil
}

func logprobAt(lps []float64, k int) float64 {
	if k < len(lps) {
		return lps[k]
	}
	return math.NaN()
}

// topLogprobsOf scores each answer once more, as a prompt, for the most likely tokens at each of
// its positions: the engine's prompt top-k of prompt+answer at the answer's positions is the
// distribution each answer token was drawn from. The requests queue as any other sampling.
func (o *openAI) topLogprobsOf(w http.ResponseWriter, r *http.Request, j *oaiJob, seqs []api.SampledSequence) ([][][][2]float64, error) {
	ctxLen := j.eng.Config.MaxPositionEmbeddings
	P := len(j.sr.Prompt)
	futures := make([]*future, len(seqs))
	for i, q := range seqs {
		full := append(slices.Clip(j.sr.Prompt), q.Tokens...)
		full = full[:min(len(full), ctxLen-1)] // a prompt must leave room for one token
		if len(full) <= P {
			continue
		}
		sr := engine.SampleRequest{Prompt: full, NumSamples: 1, TopKPromptLogprobs: j.topLogprobs,
			Params: engine.SampleParams{MaxTokens: 1, TopK: -1, TopP: 1}}
		f, err := o.srv.startSample(r.Context(), w, r, j.tenant, j.smp, sr)
		if err != nil {
			return nil, err
		}
		futures[i] = f
	}
	out := make([][][][2]float64, len(seqs))
	for i, f := range futures {
		if f == nil {
			continue
		}
		res, err := awaitSample(r.Context(), f)
		if err != nil {
			return nil, err
		}
		if len(res.TopKPromptLogprobs) > P {
			out[i] = res.TopKPromptLogprobs[P:]
		}
	}
	return out, nil
}
