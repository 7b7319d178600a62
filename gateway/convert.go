package gateway

// The one conversion layer between the wire (package api) and compute (package engine): every
// request field becomes an engine value here, with the wire's defaults, and every engine result
// becomes a wire response here. Validation against the model happens once, after conversion
// (engine.ModelInfo.PrepareBatch and ValidateSample), at the gateway, before anything queues.

import (
	"fmt"
	"math"
	"net/http"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/engine"
)

// loraConfigOf is create_model's lora_config with Tinker's defaults (rank 32, every part trained).
func loraConfigOf(lc *api.LoraConfig) engine.LoraConfig {
	c := api.LoraConfig{Rank: 32}
	if lc != nil {
		c = *lc
	}
	cfg := engine.LoraConfig{Rank: c.Rank, TrainAttn: boolOr(c.TrainAttn, true), TrainMLP: boolOr(c.TrainMLP, true),
		TrainUnembed: boolOr(c.TrainUnembed, true)}
	if c.Seed != nil {
		cfg.Seed = *c.Seed
	}
	return cfg
}

func boolOr(p *bool, d bool) bool {
	if p == nil {
		return d
	}
	return *p
}

// adamParamsOf is optim_step's adam_params over the engine's defaults.
func adamParamsOf(a api.AdamParams) engine.AdamParams {
	p := engine.DefaultAdamParams()
	for dst, src := range map[*float64]*float64{&p.LearningRate: a.LearningRate, &p.Beta1: a.Beta1,
		&p.Beta2: a.Beta2, &p.Eps: a.Eps, &p.WeightDecay: a.WeightDecay, &p.GradClipNorm: a.GradClipNorm} {
		if src != nil {
			*dst = *src
		}
	}
	return p
}

func toEngineData(data []api.Datum) ([]engine.Datum, error) {
	if err := api.DensifyAll(data); err != nil { // sparse inputs, within the request's budget
		return nil, err
	}
	out := make([]engine.Datum, len(data))
	for i, d := range data {
		toks, err := d.ModelInput.Tokens()
		if err != nil {
			return nil, fmt.Errorf("datum %d: model_input: %v", i, err)
		}
		in := map[string]engine.TensorInput{}
		for k, t := range d.LossFnInputs {
			dt, err := t.Dense()
			if err != nil {
				return nil, fmt.Errorf("datum %d: loss_fn_inputs.%s: %v", i, k, err)
			}
			dtype := dt.DType
			if dtype == "" { // plain lists: the SDK coerces by key
				dtype = "float32"
				if k == "target_tokens" {
					dtype = "int64"
				}
			}
			var shape []int
			if len(dt.Shape) > 0 {
				shape = dt.Shape
			}
			in[k] = engine.TensorInput{DType: dtype, Shape: shape, Data: dt.Data}
		}
		out[i] = engine.Datum{Tokens: toks, Inputs: in}
	}
	return out, nil
}

// forwardOutput is a forward or forward_backward result on the wire.
func forwardOutput(res *engine.ForwardResult) *api.ForwardBackwardOutput {
	out := &api.ForwardBackwardOutput{LossFnOutputType: "ArrayRecord", Metrics: res.Metrics}
	for i := range res.Logprobs {
		out.LossFnOutputs = append(out.LossFnOutputs, api.LossOutput{
			"logprobs":         {Data: res.Logprobs[i], DType: "float32", Shape: []int{len(res.Logprobs[i])}},
			"elementwise_loss": {Data: res.Losses[i], DType: "float32", Shape: []int{len(res.Losses[i])}},
		})
	}
	return out
}

// disableLoraKey is twinkle's loss_fn_config switch for a forward pass of the base model on a
// run (reference logprobs without a second client or a copy of the weights).
const disableLoraKey = "disable_lora"

// takeDisableLora removes disable_lora from a request's loss_fn_config and reports whether it
// was set. Only forward takes it: a backward pass through the base model would train nothing.
func takeDisableLora(in *api.ForwardBackwardInput, forwardOnly bool) (bool, error) {
	v, ok := in.LossFnConfig[disableLoraKey]
	if !ok {
		return false, nil
	}
	delete(in.LossFnConfig, disableLoraKey)
	if v != 0 && v != 1 {
		return false, errf(http.StatusBadRequest, "loss_fn_config.%s must be true or false (1 or 0), got %v", disableLoraKey, v)
	}
	if v == 1 && !forwardOnly {
		return false, errf(http.StatusBadRequest, "loss_fn_config.%s is for forward only: forward_backward through the base model would train nothing (compute reference logprobs with forward, then train with forward_backward)", disableLoraKey)
	}
	return v == 1, nil
}

// tinkerSampleRequest is asample's request as the engine's, with Tinker's defaults
// (temperature 1, no top-k, no nucleus, one sample).
func tinkerSampleRequest(req api.SampleRequest, prompt []int, images *engine.Images) (engine.SampleRequest, error) {
	var err error
	sr := engine.SampleRequest{Prompt: prompt, Images: images, NumSamples: 1, PromptLogprobs: req.PromptLogprobs, TopKPromptLogprobs: req.TopKPromptLogprobs}
	if req.NumSamples != nil {
		sr.NumSamples = *req.NumSamples
		if sr.NumSamples < 1 {
			return sr, errf(http.StatusBadRequest, "num_samples must be at least 1, got %d", sr.NumSamples)
		}
	}
	sp := req.SamplingParams
	sr.Params = engine.SampleParams{Temperature: 1, TopK: -1, TopP: 1, Seed: sp.Seed}
	if sp.MaxTokens != nil {
		if *sp.MaxTokens < 1 {
			return sr, errf(http.StatusBadRequest, "sampling_params.max_tokens must be at least 1, got %d", *sp.MaxTokens)
		}
		sr.Params.MaxTokens = *sp.MaxTokens
	}
	if sp.Temperature != nil {
		sr.Params.Temperature = *sp.Temperature
	}
	if sp.TopK != nil {
		sr.Params.TopK = *sp.TopK
	}
	if sp.TopP != nil {
		sr.Params.TopP = *sp.TopP
		greedyTopP(&sr.Params)
	}
	if sr.Params.StopStrings, sr.Params.StopTokens, err = sp.StopSpec(); err != nil {
		return sr, errf(http.StatusBadRequest, "sampling_params.stop: %v", err)
	}
	return sr, nil
}

// greedyTopP makes an explicit top_p of 0 greedy, as top_k=1 and temperature 0 are: the
// nucleus shrinks to the single most probable token (the engine reads its own zero as "off").
func greedyTopP(p *engine.SampleParams) {
	if p.TopP == 0 {
		p.TopK, p.TopP = 1, 1
	}
}

func sampleResponse(res *engine.SampleResult) *api.SampleResponse {
	out := &api.SampleResponse{Type: "sample", PromptCacheHitTokens: res.CachedTokens}
	for _, q := range res.Sequences {
		out.Sequences = append(out.Sequences, api.SampledSequence{StopReason: q.StopReason, Tokens: q.Tokens, Logprobs: q.Logprobs})
	}
	for _, v := range res.PromptLogprobs {
		if math.IsNaN(v) {
			out.PromptLogprobs = append(out.PromptLogprobs, nil)
		} else {
			v := v
			out.PromptLogprobs = append(out.PromptLogprobs, &v)
		}
	}
	for _, row := range res.TopKPrompt {
		var r [][2]float64
		for _, t := range row {
			r = append(r, [2]float64{float64(t.Token), t.Logprob})
		}
		out.TopKPromptLogprobs = append(out.TopKPromptLogprobs, r)
	}
	return out
}
