// Package client is a Go client for skein's Tinker API, with the same operations as the Python
// SDK: sessions, training clients (forward_backward, optim_step, save/load), sampling, futures.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/skein-ai/skein/api"
)

// Client talks to one server with one API key.
type Client struct {
	BaseURL string
	APIKey  string
	HTTP    *http.Client
	// JSONForwardBackward sends forward_backward as JSON (SDK ≤0.24) instead of protobuf.
	JSONForwardBackward bool
}

// New makes a client.
func New(baseURL, apiKey string) *Client {
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), APIKey: apiKey, HTTP: &http.Client{Timeout: 120 * time.Second}}
}

// StatusError is a non-2xx answer.
type StatusError struct {
	Status int
	Body   string
}

func (e *StatusError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Status, e.Body) }

// RequestFailed is a future that ended in an error.
type RequestFailed struct {
	Message, Category string
}

func (e *RequestFailed) Error() string {
	return fmt.Sprintf("request failed (%s): %s", e.Category, e.Message)
}

// Do sends a request and decodes a JSON answer into out (if not nil).
func (c *Client) Do(ctx context.Context, method, path string, body any, out any) error {
	var rd io.Reader
	ctype := "application/json"
	switch b := body.(type) {
	case nil:
	case []byte:
		rd, ctype = bytes.NewReader(b), "application/x-protobuf"
	default:
		j, err := json.Marshal(b)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+"/api/v1/"+path, rd)
	if err != nil {
		return err
	}
	if rd != nil {
		req.Header.Set("Content-Type", ctype)
	}
	req.Header.Set("X-API-Key", c.APIKey)
	req.Header.Set("Accept", "application/json")
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return &StatusError{Status: resp.StatusCode, Body: string(rb)}
	}
	if out != nil {
		return json.Unmarshal(rb, out)
	}
	return nil
}

// Future is a submitted request.
type Future struct {
	c         *Client
	RequestID string `json:"request_id"`
	ModelID   string `json:"model_id,omitempty"`
}

// Result long-polls until the future completes and decodes its result. For forward_backward
// and sample results it asks for protobuf, as SDK v0.25 does.
func (f *Future) Result(ctx context.Context, out any) error {
	for {
		body, _ := json.Marshal(api.RetrieveFutureRequest{RequestID: f.RequestID})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.c.BaseURL+"/api/v1/retrieve_future", bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-API-Key", f.c.APIKey)
		switch out.(type) {
		case *api.ForwardBackwardOutput, *api.SampleResponse:
			req.Header.Set("Accept", "application/x-protobuf")
		}
		resp, err := f.c.HTTP.Do(req)
		if err != nil {
			return err
		}
		rb, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		if resp.StatusCode == http.StatusRequestTimeout {
			continue // long-poll ran out: ask again
		}
		if resp.StatusCode != http.StatusOK {
			return &StatusError{Status: resp.StatusCode, Body: string(rb)}
		}
		if strings.Contains(resp.Header.Get("Content-Type"), "protobuf") {
			switch o := out.(type) {
			case *api.ForwardBackwardOutput:
				r, err := api.DecodeForwardBackwardOutput(rb)
				if err != nil {
					return err
				}
				*o = *r
				return nil
			case *api.SampleResponse:
				r, err := api.DecodeSampleResponse(rb)
				if err != nil {
					return err
				}
				*o = *r
				return nil
			}
			return fmt.Errorf("unexpected protobuf result")
		}
		var probe map[string]json.RawMessage
		if err := json.Unmarshal(rb, &probe); err != nil {
			return err
		}
		if _, ok := probe["error"]; ok {
			var e api.ErrorResult
			_ = json.Unmarshal(rb, &e)
			return &RequestFailed{Message: e.Error, Category: e.Category}
		}
		if t, ok := probe["type"]; ok && string(t) == `"try_again"` {
			continue
		}
		if out == nil {
			return nil
		}
		return json.Unmarshal(rb, out)
	}
}

// Future returns a handle on an existing request id.
func (c *Client) Future(requestID string) *Future { return &Future{c: c, RequestID: requestID} }

func (c *Client) submit(ctx context.Context, path string, body any) (*Future, error) {
	f := &Future{c: c}
	if err := c.Do(ctx, http.MethodPost, path, body, f); err != nil {
		return nil, err
	}
	return f, nil
}

// CreateSession starts a session.
func (c *Client) CreateSession(ctx context.Context) (string, error) {
	var out struct {
		SessionID string `json:"session_id"`
	}
	err := c.Do(ctx, http.MethodPost, "create_session", map[string]any{"tags": []string{}, "user_metadata": map[string]any{}, "type": "create_session"}, &out)
	return out.SessionID, err
}

// TrainingClient drives one LoRA model, numbering its ops as the SDK does (seq_id from 1).
type TrainingClient struct {
	c       *Client
	ModelID string
	seq     int
}

// CreateLoraTrainingClient creates a LoRA model and waits for it.
func (c *Client) CreateLoraTrainingClient(ctx context.Context, sessionID string, modelSeq int, base string, rank int) (*TrainingClient, error) {
	return c.CreateLoraTrainingClientConfig(ctx, sessionID, modelSeq, base, api.LoraConfig{Rank: rank})
}

// CreateLoraTrainingClientConfig is CreateLoraTrainingClient with the whole LoRA config (which
// modules are trained, the seed).
func (c *Client) CreateLoraTrainingClientConfig(ctx context.Context, sessionID string, modelSeq int, base string, cfg api.LoraConfig) (*TrainingClient, error) {
	f, err := c.submit(ctx, "create_model", api.CreateModelRequest{SessionID: sessionID, ModelSeqID: modelSeq, BaseModel: base,
		LoraConfig: &cfg})
	if err != nil {
		return nil, err
	}
	var out struct {
		ModelID string `json:"model_id"`
	}
	if err := f.Result(ctx, &out); err != nil {
		return nil, err
	}
	return &TrainingClient{c: c, ModelID: out.ModelID}, nil
}

// Via sends the run's next requests through another client (another gateway of the same
// service, as after a load balancer moved the connection), keeping the seq_ids going on.
func (t *TrainingClient) Via(c *Client) { t.c = c }

// NextSeq reserves the next seq_id (exposed so tests can submit out of order).
func (t *TrainingClient) NextSeq() int { t.seq++; return t.seq }

// ForwardBackward submits a forward_backward (or, with forwardOnly, a forward).
func (t *TrainingClient) ForwardBackward(ctx context.Context, data []api.Datum, loss string, cfg map[string]float64, forwardOnly bool) (*Future, error) {
	return t.ForwardBackwardSeq(ctx, t.NextSeq(), data, loss, cfg, forwardOnly)
}

// ForwardBackwardSeq submits with an explicit seq_id.
func (t *TrainingClient) ForwardBackwardSeq(ctx context.Context, seq int, data []api.Datum, loss string, cfg map[string]float64, forwardOnly bool) (*Future, error) {
	in := api.ForwardBackwardInput{Data: data, LossFn: loss, LossFnConfig: cfg}
	// The protobuf form has no image_asset_pointer chunk (the SDK's has none either): those go as JSON.
	if t.c.JSONForwardBackward || hasAssetPointer(data) {
		body := api.ForwardBackwardJSON{ModelID: t.ModelID, SeqID: &seq}
		path := "forward_backward"
		if forwardOnly {
			body.ForwardInput, path = &in, "forward"
		} else {
			body.ForwardBackwardInput = &in
		}
		return t.c.submit(ctx, path, body)
	}
	return t.c.submit(ctx, "forward_backward", api.EncodeForwardBackwardRequest(&api.ForwardBackwardRequest{
		ModelID: t.ModelID, SeqID: &seq, Input: in, ForwardOnly: forwardOnly}))
}

// OptimStep submits an AdamW step.
func (t *TrainingClient) OptimStep(ctx context.Context, lr float64) (*Future, error) {
	b1, b2, eps, zero := 0.9, 0.95, 1e-8, 0.0
	seq := t.NextSeq()
	return t.c.submit(ctx, "optim_step", api.OptimStepRequest{ModelID: t.ModelID, SeqID: &seq,
		AdamParams: api.AdamParams{LearningRate: &lr, Beta1: &b1, Beta2: &b2, Eps: &eps, WeightDecay: &zero, GradClipNorm: &zero}})
}

// SaveState saves weights and optimizer under a name; the result's path is a tinker:// path.
func (t *TrainingClient) SaveState(ctx context.Context, name string) (*Future, error) {
	seq := t.NextSeq()
	return t.c.submit(ctx, "save_weights", api.SaveWeightsRequest{ModelID: t.ModelID, Path: name, SeqID: &seq})
}

// SaveWeightsForSampler saves sampler weights; an empty name makes an ephemeral sampler.
func (t *TrainingClient) SaveWeightsForSampler(ctx context.Context, name string) (*Future, error) {
	seq := t.NextSeq()
	req := api.SaveWeightsRequest{ModelID: t.ModelID, Path: name, SeqID: &seq}
	if name == "" {
		zero := 0
		req.SamplingSessionSeqID = &zero
	}
	return t.c.submit(ctx, "save_weights_for_sampler", req)
}

// LoadState loads a training checkpoint, with or without its optimizer state.
func (t *TrainingClient) LoadState(ctx context.Context, path string, optimizer bool) (*Future, error) {
	seq := t.NextSeq()
	return t.c.submit(ctx, "load_weights", api.LoadWeightsRequest{ModelID: t.ModelID, Path: path, SeqID: &seq, Optimizer: optimizer})
}

// CreateSamplingSession makes a sampler for a base model or a checkpoint path.
func (c *Client) CreateSamplingSession(ctx context.Context, sessionID, base, modelPath string) (string, error) {
	var out struct {
		ID string `json:"sampling_session_id"`
	}
	err := c.Do(ctx, http.MethodPost, "create_sampling_session", api.CreateSamplingSessionRequest{SessionID: sessionID, BaseModel: base, ModelPath: modelPath}, &out)
	return out.ID, err
}

// Sample submits an asample request.
func (c *Client) Sample(ctx context.Context, req api.SampleRequest) (*Future, error) {
	return c.submit(ctx, "asample", req)
}

func hasAssetPointer(data []api.Datum) bool {
	for _, d := range data {
		for _, c := range d.ModelInput.Chunks {
			if c.Type == "image_asset_pointer" {
				return true
			}
		}
	}
	return false
}
