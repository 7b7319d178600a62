// Package worker runs a replica as its own process: an HTTP server in front of a local engine
// (skein worker), the client that implements engine.Compute over it for the gateway, and the
// registration and heartbeat loop. Checkpoint and state directories are paths on storage shared
// by the gateway and its workers.
package worker

import (
	"errors"
	"fmt"
	"math"

	"github.com/skein-ai/skein/engine"
)

// TokenHeader may carry the cluster token itself from a caller that holds it to a gateway's
// worker endpoints (register, heartbeat). skein never sends it: workers and gateways prove the
// token by handshakes and sign their requests (auth.go).
const TokenHeader = "X-Skein-Worker-Token"

// Registration is what a worker tells the gateway about itself.
type Registration struct {
	ID  string `json:"id"`
	URL string `json:"url"`
	// Instance is the worker process's random id (from its handshake): two addresses of one
	// instance are one worker. Empty in a registration sent with the raw token.
	Instance  string           `json:"instance,omitempty"`
	BaseModel string           `json:"base_model"`
	MaxLoras  int              `json:"max_loras"`
	Info      engine.ModelInfo `json:"info"`
}

// RegisterReply is the gateway's answer to a registration: Secret must come with every
// heartbeat of this registration, so that no one else can keep it alive.
type RegisterReply struct {
	ID     string `json:"id"`
	Secret string `json:"secret"`
}

// Heartbeat is sent every second: the worker's own view of what it holds and how busy it is.
type Heartbeat struct {
	ID         string   `json:"id"`
	Secret     string   `json:"secret"`             // from RegisterReply`
	Adapters   []string `json:"adapters"`           // training adapters resident in its engine
	FreeSlots  int      `json:"free_slots"`         // max_loras minus those
	QueueDepth int      `json:"queue_depth"`        // calls running or waiting
	Draining   bool     `json:"draining,omitempty"` // leaving (SIGTERM): place nothing new here
	// Sampler is its engine's sampler counters (prompt positions requested, computed and served
	// from its prefix cache; the cache's bytes), for the gateway's /metrics.
	Sampler *engine.SamplerStats `json:"sampler,omitempty"`
}

// Description is a discovered worker's answer to describe: what a registration says, less the
// id and URL, which discovery gives.
type Description struct {
	BaseModel string           `json:"base_model"`
	MaxLoras  int              `json:"max_loras"`
	Info      engine.ModelInfo `json:"info"`
}

// AdapterState is one training adapter a worker holds: its step, and whether it holds no
// gradients accumulated since its last optim_step, load or create (Clean). A gateway that
// starts adopts clean adapters at the step its state records instead of reloading them.
type AdapterState struct {
	ID    string `json:"id"`
	Step  int    `json:"step"`
	Clean bool   `json:"clean"`
}

type callRequest struct {
	ID            string                 `json:"id,omitempty"`
	Dir           string                 `json:"dir,omitempty"`
	Key           string                 `json:"key,omitempty"` // the directory as a storage key (relative to the data directory); wins over Dir
	WithOptimizer bool                   `json:"with_optimizer,omitempty"`
	Lora          *engine.LoraConfig     `json:"lora,omitempty"`
	Data          []engine.Datum         `json:"data,omitempty"`
	Loss          string                 `json:"loss,omitempty"`
	LossConfig    map[string]float64     `json:"loss_config,omitempty"`
	Adam          *engine.AdamParams     `json:"adam,omitempty"`
	Samples       []engine.SampleRequest `json:"samples,omitempty"`
	// Epoch is the run lease's epoch of the gateway that sends the call (0: no leases); see
	// Server.fence.
	Epoch int64 `json:"epoch,omitempty"`
}

type wireSample struct {
	Sequences      []engine.SampledSequence `json:"sequences"`
	PromptLogprobs []*float64               `json:"prompt_logprobs,omitempty"` // NaN (no value) as null
	TopKPrompt     [][]engine.TokenLogprob  `json:"topk_prompt,omitempty"`
	Failure        *callResponse            `json:"failure,omitempty"` // this request failed alone (SampleResult.Err)
	CachedTokens   int                      `json:"cached_tokens,omitempty"`
}

type callResponse struct {
	Error string `json:"error,omitempty"`
	Kind  string `json:"kind,omitempty"` // input, unknown_adapter, no_optimizer, non_finite, stale_epoch
	Datum int    `json:"datum,omitempty"`
	Field string `json:"field,omitempty"`
	Msg   string `json:"msg,omitempty"`

	Bool    bool                  `json:"bool,omitempty"`
	IDs     []string              `json:"ids,omitempty"`
	Lora    *engine.LoraConfig    `json:"lora,omitempty"`
	Step    int                   `json:"step,omitempty"`
	Forward *engine.ForwardResult `json:"forward,omitempty"`
	Metrics map[string]float64    `json:"metrics,omitempty"`
	Samples []*wireSample         `json:"samples,omitempty"`
	Info    *engine.ModelInfo     `json:"info,omitempty"`

	Describe *Description   `json:"describe,omitempty"`
	Status   *Heartbeat     `json:"status,omitempty"`
	States   []AdapterState `json:"states,omitempty"`
}

func encodeErr(err error) callResponse {
	r := callResponse{Error: err.Error()}
	var ie *engine.InputError
	switch {
	case errors.As(err, &ie):
		r.Kind, r.Datum, r.Field, r.Msg = "input", ie.Datum, ie.Field, ie.Msg
	case errors.Is(err, engine.ErrUnknownAdapter):
		r.Kind = "unknown_adapter"
	case errors.Is(err, engine.ErrNoOptimizerState):
		r.Kind = "no_optimizer"
	case errors.Is(err, engine.ErrNonFinite):
		r.Kind = "non_finite"
	case errors.Is(err, ErrStaleEpoch):
		r.Kind = "stale_epoch"
	}
	return r
}

// decodeErr rebuilds a typed error, so the gateway classifies user faults as it does locally.
func decodeErr(r callResponse) error {
	switch r.Kind {
	case "input":
		return &engine.InputError{Datum: r.Datum, Field: r.Field, Msg: r.Msg}
	case "unknown_adapter":
		return fmt.Errorf("%w (worker: %s)", engine.ErrUnknownAdapter, r.Error)
	case "no_optimizer":
		return fmt.Errorf("%w (worker: %s)", engine.ErrNoOptimizerState, r.Error)
	case "non_finite":
		return fmt.Errorf("%w (worker: %s)", engine.ErrNonFinite, r.Error)
	case "stale_epoch":
		return fmt.Errorf("%w (worker: %s)", ErrStaleEpoch, r.Error)
	}
	return fmt.Errorf("worker: %s", r.Error)
}

func toWireSample(s *engine.SampleResult) *wireSample {
	if s.Err != nil {
		f := encodeErr(s.Err)
		return &wireSample{Failure: &f}
	}
	w := &wireSample{Sequences: s.Sequences, TopKPrompt: s.TopKPrompt, CachedTokens: s.CachedTokens}
	if s.PromptLogprobs != nil {
		w.PromptLogprobs = make([]*float64, len(s.PromptLogprobs))
		for i, v := range s.PromptLogprobs {
			if !math.IsNaN(v) {
				v := v
				w.PromptLogprobs[i] = &v
			}
		}
	}
	return w
}

func fromWireSample(w *wireSample) *engine.SampleResult {
	if w.Failure != nil {
		return &engine.SampleResult{Err: decodeErr(*w.Failure)}
	}
	s := &engine.SampleResult{Sequences: w.Sequences, TopKPrompt: w.TopKPrompt, CachedTokens: w.CachedTokens}
	if w.PromptLogprobs != nil {
		s.PromptLogprobs = make([]float64, len(w.PromptLogprobs))
		for i, v := range w.PromptLogprobs {
			if v == nil {
				s.PromptLogprobs[i] = math.NaN()
			} else {
				s.PromptLogprobs[i] = *v
			}
		}
	}
	return s
}
