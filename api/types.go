// Package api holds the Tinker API's wire types (JSON) and its protobuf codec. It is a leaf:
// it knows nothing of the engine or the gateway.
package api

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Chunk is one ModelInput chunk: encoded_text carries tokens; image (ImageChunk) and
// image_asset_pointer (ImageAssetPointerChunk) carry an image, read through Parts (image.go);
// dmel is recognised and rejected.
type Chunk struct {
	Type   string `json:"type"`
	Tokens []int  `json:"tokens,omitempty"`
	// Data is an ImageChunk's bytes, base64 as in JSON (the protobuf decoder encodes them so).
	Data           string `json:"data,omitempty"`
	Format         string `json:"format,omitempty"`
	Location       string `json:"location,omitempty"`        // image_asset_pointer
	ExpectedTokens *int   `json:"expected_tokens,omitempty"` // image kinds; advisory
}

// ModelInput is {"chunks": [...]}.
type ModelInput struct {
	Chunks []Chunk `json:"chunks"`
}

// Tokens concatenates the text chunks; other chunk kinds are an error.
func (m ModelInput) Tokens() ([]int, error) {
	var out []int
	for i, c := range m.Chunks {
		switch c.Type {
		case "encoded_text", "":
			out = append(out, c.Tokens...)
		default:
			return nil, fmt.Errorf("chunk %d: %q chunks are not supported by text models", i, c.Type)
		}
	}
	return out, nil
}

// TensorData is the JSON tensor form, dense or sparse CSR.
type TensorData struct {
	Data              []float64 `json:"data"`
	DType             string    `json:"dtype"`
	Shape             []int     `json:"shape,omitempty"`
	SparseCrowIndices []int     `json:"sparse_crow_indices,omitempty"`
	SparseColIndices  []int     `json:"sparse_col_indices,omitempty"`
}

// UnmarshalJSON accepts a TensorData object or, as the SDK's Datum does, a plain list.
func (t *TensorData) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '[' {
		return json.Unmarshal(b, &t.Data)
	}
	type plain TensorData
	return json.Unmarshal(b, (*plain)(t))
}

// ErrBadTensor marks a tensor whose shape, indices or size do not fit: the sender's fault.
var ErrBadTensor = errors.New("bad tensor")

func badTensor(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadTensor, fmt.Sprintf(format, args...))
}

// Bounds on what sparse tensors may expand to, checked before anything is allocated: a few
// bytes of CSR can describe gigabytes of zeros.
const (
	// MaxTensorElements bounds one dense expansion. Loss inputs hold one value per token, and
	// no model's context comes near it.
	MaxTensorElements = 1 << 20
	// MaxRequestElements bounds the expansions of one request's sparse tensors together.
	MaxRequestElements = 1 << 23
)

func (t TensorData) sparse() bool { return t.SparseCrowIndices != nil || t.SparseColIndices != nil }

// denseSize checks a sparse tensor's shape: 2-D, dimensions ≥ 0, their product within
// MaxTensorElements, computed without overflow.
func (t TensorData) denseSize() (rows, cols int, err error) {
	if len(t.Shape) != 2 {
		return 0, 0, badTensor("sparse tensor needs a 2-D shape, got %v", t.Shape)
	}
	rows, cols = t.Shape[0], t.Shape[1]
	if rows < 0 || cols < 0 {
		return 0, 0, badTensor("sparse tensor shape %v has a negative dimension", t.Shape)
	}
	if rows > MaxTensorElements || (cols > 0 && rows > MaxTensorElements/cols) {
		return 0, 0, badTensor("sparse tensor shape %v is over %d elements", t.Shape, MaxTensorElements)
	}
	return rows, cols, nil
}

// Dense expands a sparse CSR tensor (2-D) to dense; dense tensors are returned as they are.
// Every shape, offset and index is checked before it sizes or indexes anything (ErrBadTensor).
func (t TensorData) Dense() (TensorData, error) {
	if !t.sparse() {
		return t, nil
	}
	rows, cols, err := t.denseSize()
	if err != nil {
		return t, err
	}
	if len(t.SparseCrowIndices) != rows+1 || len(t.SparseColIndices) != len(t.Data) {
		return t, badTensor("sparse tensor: crow_indices must have %d entries and col_indices %d", rows+1, len(t.Data))
	}
	out := make([]float64, rows*cols)
	for r := range rows {
		lo, hi := t.SparseCrowIndices[r], t.SparseCrowIndices[r+1]
		if lo < 0 || hi < lo || hi > len(t.Data) {
			return t, badTensor("sparse tensor: bad crow_indices at row %d", r)
		}
		for k := lo; k < hi; k++ {
			c := t.SparseColIndices[k]
			if c < 0 || c >= cols {
				return t, badTensor("sparse tensor: column %d out of range", c)
			}
			out[r*cols+c] = t.Data[k]
		}
	}
	return TensorData{Data: out, DType: t.DType, Shape: t.Shape}, nil
}

// DensifyAll expands, in place, every sparse loss input of data, within MaxRequestElements
// for all of them together (ErrBadTensor past it).
func DensifyAll(data []Datum) error {
	left := MaxRequestElements
	for i, d := range data {
		for _, k := range sortedKeys(d.LossFnInputs) {
			t := d.LossFnInputs[k]
			if !t.sparse() {
				continue
			}
			rows, cols, err := t.denseSize()
			if err != nil {
				return fmt.Errorf("datum %d: loss_fn_inputs.%s: %w", i, k, err)
			}
			if rows*cols > left {
				return badTensor("datum %d: loss_fn_inputs.%s: the request's sparse tensors expand to over %d elements", i, k, MaxRequestElements)
			}
			left -= rows * cols
			if d.LossFnInputs[k], err = t.Dense(); err != nil {
				return fmt.Errorf("datum %d: loss_fn_inputs.%s: %w", i, k, err)
			}
		}
	}
	return nil
}

// Datum is one training example.
type Datum struct {
	ModelInput   ModelInput            `json:"model_input"`
	LossFnInputs map[string]TensorData `json:"loss_fn_inputs"`
}

// ForwardBackwardInput is the body of a (JSON) forward/forward_backward request.
type ForwardBackwardInput struct {
	Data         []Datum            `json:"data"`
	LossFn       string             `json:"loss_fn"`
	LossFnConfig map[string]float64 `json:"loss_fn_config,omitempty"`
}

// ForwardBackwardRequest is the decoded request, from JSON or protobuf.
type ForwardBackwardRequest struct {
	ModelID     string
	SeqID       *int
	Input       ForwardBackwardInput
	ForwardOnly bool
}

// ForwardBackwardJSON is the ≤0.24 JSON body of forward_backward and forward.
type ForwardBackwardJSON struct {
	ForwardBackwardInput *ForwardBackwardInput `json:"forward_backward_input,omitempty"`
	ForwardInput         *ForwardBackwardInput `json:"forward_input,omitempty"`
	ModelID              string                `json:"model_id"`
	SeqID                *int                  `json:"seq_id,omitempty"`
}

// LossOutput is one datum's outputs, by name (logprobs, elementwise_loss).
type LossOutput map[string]TensorData

// ForwardBackwardOutput is the result of forward and forward_backward.
type ForwardBackwardOutput struct {
	LossFnOutputType string             `json:"loss_fn_output_type"`
	LossFnOutputs    []LossOutput       `json:"loss_fn_outputs"`
	Metrics          map[string]float64 `json:"metrics"`
}

// LoraConfig is the create_model LoRA config.
type LoraConfig struct {
	Rank         int    `json:"rank"`
	Seed         *int64 `json:"seed,omitempty"`
	TrainUnembed *bool  `json:"train_unembed,omitempty"`
	TrainMLP     *bool  `json:"train_mlp,omitempty"`
	TrainAttn    *bool  `json:"train_attn,omitempty"`
}

// UserMetadata is create_session's and create_model's user_metadata: by the protocol a free-form
// JSON object (the SDK's dict[str, Any]), kept and returned as the client sent it (the gateway
// bounds its keys and size).
type UserMetadata map[string]any

// CreateModelRequest is the body of create_model.
type CreateModelRequest struct {
	SessionID    string       `json:"session_id"`
	ModelSeqID   int          `json:"model_seq_id"`
	BaseModel    string       `json:"base_model"`
	UserMetadata UserMetadata `json:"user_metadata,omitempty"`
	LoraConfig   *LoraConfig  `json:"lora_config,omitempty"`
}

// AdamParams as sent by optim_step.
type AdamParams struct {
	LearningRate *float64 `json:"learning_rate"`
	Beta1        *float64 `json:"beta1"`
	Beta2        *float64 `json:"beta2"`
	Eps          *float64 `json:"eps"`
	WeightDecay  *float64 `json:"weight_decay"`
	GradClipNorm *float64 `json:"grad_clip_norm"`
}

// OptimStepRequest is the body of optim_step.
type OptimStepRequest struct {
	AdamParams AdamParams `json:"adam_params"`
	ModelID    string     `json:"model_id"`
	SeqID      *int       `json:"seq_id,omitempty"`
}

// SaveWeightsRequest is the body of save_weights and save_weights_for_sampler.
type SaveWeightsRequest struct {
	ModelID              string `json:"model_id"`
	Path                 string `json:"path,omitempty"`
	SeqID                *int   `json:"seq_id,omitempty"`
	TTLSeconds           *int64 `json:"ttl_seconds,omitempty"`
	Overwrite            bool   `json:"overwrite,omitempty"`
	SamplingSessionSeqID *int   `json:"sampling_session_seq_id,omitempty"`
}

// LoadWeightsRequest is the body of load_weights.
type LoadWeightsRequest struct {
	ModelID   string `json:"model_id"`
	SeqID     *int   `json:"seq_id,omitempty"`
	Path      string `json:"path"`
	Optimizer bool   `json:"optimizer"`
	// create-via-load form
	SessionID  string `json:"session_id,omitempty"`
	ModelSeqID *int   `json:"model_seq_id,omitempty"`
	BaseModel  string `json:"base_model,omitempty"`
}

// SamplingParams of asample.
type SamplingParams struct {
	MaxTokens   *int            `json:"max_tokens,omitempty"`
	Seed        *int64          `json:"seed,omitempty"`
	Stop        json.RawMessage `json:"stop,omitempty"`
	Temperature *float64        `json:"temperature,omitempty"`
	TopK        *int            `json:"top_k,omitempty"`
	TopP        *float64        `json:"top_p,omitempty"`
}

// StopSpec parses stop as a string, a list of strings, or a list of token ids.
func (p SamplingParams) StopSpec() (strs []string, toks []int, err error) {
	if len(p.Stop) == 0 || string(p.Stop) == "null" {
		return nil, nil, nil
	}
	var one string
	if json.Unmarshal(p.Stop, &one) == nil {
		return []string{one}, nil, nil
	}
	if json.Unmarshal(p.Stop, &strs) == nil {
		return strs, nil, nil
	}
	if json.Unmarshal(p.Stop, &toks) == nil {
		return nil, toks, nil
	}
	return nil, nil, fmt.Errorf("stop must be a string, a list of strings or a list of token ids")
}

// SampleRequest is the body of asample.
type SampleRequest struct {
	NumSamples         *int           `json:"num_samples,omitempty"`
	Prompt             ModelInput     `json:"prompt"`
	SamplingParams     SamplingParams `json:"sampling_params"`
	BaseModel          string         `json:"base_model,omitempty"`
	ModelPath          string         `json:"model_path,omitempty"`
	SamplingSessionID  string         `json:"sampling_session_id,omitempty"`
	SeqID              *int           `json:"seq_id,omitempty"`
	PromptLogprobs     bool           `json:"prompt_logprobs,omitempty"`
	TopKPromptLogprobs int            `json:"topk_prompt_logprobs,omitempty"`
}

// SampledSequence in JSON results.
type SampledSequence struct {
	StopReason string    `json:"stop_reason"`
	Tokens     []int     `json:"tokens"`
	Logprobs   []float64 `json:"logprobs"`
}

// SampleResponse is the result of asample.
type SampleResponse struct {
	Type                 string            `json:"type"`
	Sequences            []SampledSequence `json:"sequences"`
	PromptLogprobs       []*float64        `json:"prompt_logprobs,omitempty"`
	TopKPromptLogprobs   [][][2]float64    `json:"topk_prompt_logprobs,omitempty"`
	PromptCacheHitTokens int               `json:"prompt_cache_hit_tokens"`
}

// CreateSamplingSessionRequest is the body of create_sampling_session.
type CreateSamplingSessionRequest struct {
	SessionID            string `json:"session_id"`
	SamplingSessionSeqID int    `json:"sampling_session_seq_id"`
	BaseModel            string `json:"base_model,omitempty"`
	ModelPath            string `json:"model_path,omitempty"`
}

// RetrieveFutureRequest is the body of retrieve_future.
type RetrieveFutureRequest struct {
	RequestID         string `json:"request_id"`
	AllowMetadataOnly bool   `json:"allow_metadata_only,omitempty"`
}

// ErrorResult is the body of a failed future.
type ErrorResult struct {
	Error    string `json:"error"`
	Category string `json:"category"`
}

// TryAgain is the body of a not-yet-ready future.
type TryAgain struct {
	Type             string `json:"type"`
	RequestID        string `json:"request_id"`
	QueueState       string `json:"queue_state"`
	QueueStateReason string `json:"queue_state_reason,omitempty"`
}

// Checkpoint is a row of checkpoint listings.
type Checkpoint struct {
	CheckpointID   string  `json:"checkpoint_id"`
	CheckpointType string  `json:"checkpoint_type"`
	Time           string  `json:"time"`
	TinkerPath     string  `json:"tinker_path"`
	SizeBytes      int64   `json:"size_bytes"`
	Public         bool    `json:"public"`
	ExpiresAt      *string `json:"expires_at"`
}

// TrainingRun is a row of training_runs.
type TrainingRun struct {
	TrainingRunID         string            `json:"training_run_id"`
	BaseModel             string            `json:"base_model"`
	ModelOwner            string            `json:"model_owner"`
	IsLora                bool              `json:"is_lora"`
	Corrupted             bool              `json:"corrupted"`
	LoraRank              int               `json:"lora_rank"`
	LastRequestTime       string            `json:"last_request_time"`
	LastCheckpoint        *Checkpoint       `json:"last_checkpoint"`
	LastSamplerCheckpoint *Checkpoint       `json:"last_sampler_checkpoint"`
	UserMetadata          map[string]string `json:"user_metadata"`
	ProjectID             string            `json:"project_id,omitempty"` // skein: the run's session's project
}

// Cursor pages a listing.
type Cursor struct {
	Offset     int `json:"offset"`
	Limit      int `json:"limit"`
	TotalCount int `json:"total_count"`
}

// AssignProjectRequest is the body of PUT /api/v1/sessions/{id}/project.
type AssignProjectRequest struct {
	ProjectID string `json:"project_id"`
}

// AssignProjectResponse answers it (the SDK reads no body).
type AssignProjectResponse struct {
	SessionID string `json:"session_id"`
	ProjectID string `json:"project_id"`
}

// AuditLogEntry is one event of GET /api/v1/audit: who (Actor, the tenant) did what (Event) to
// which run, checkpoint or key.
type AuditLogEntry struct {
	Timestamp  string `json:"timestamp"`
	Event      string `json:"event"`
	ModelID    string `json:"model_id,omitempty"`
	TinkerPath string `json:"tinker_path,omitempty"`
	Purpose    string `json:"purpose,omitempty"`
	Actor      string `json:"actor"` // skein: the tenant that did it
}

// AuditLogResponse answers GET /api/v1/audit, oldest first.
type AuditLogResponse struct {
	Entries []AuditLogEntry `json:"entries"`
	// NextCursor, when set, is the cursor= of the next page (skein; absent on the last page).
	NextCursor string `json:"next_cursor,omitempty"`
}

// BillingEventInfo is the kind-specific part of a billing usage bucket, tagged by Type:
// "training", "sampling_prefill", "sampling_sample" (TokenCount), "checkpoint" (Count),
// "storage" (GigabyteHours).
type BillingEventInfo struct {
	Type          string   `json:"type"`
	TokenCount    *int64   `json:"token_count,omitempty"`
	Cached        *bool    `json:"cached,omitempty"`
	Count         *int64   `json:"count,omitempty"`
	GigabyteHours *float64 `json:"gigabyte_hours,omitempty"`
}

// BillingUsageEvent is one hourly bucket of one tenant's usage of one kind, session and base model.
type BillingUsageEvent struct {
	BucketStart    string           `json:"bucket_start"`
	BucketEnd      string           `json:"bucket_end"`
	BaseModel      *string          `json:"base_model"`
	UserID         *string          `json:"user_id"`
	SessionID      *string          `json:"session_id"`
	ProjectID      *string          `json:"project_id"`
	EventInfo      BillingEventInfo `json:"event_info"`
	ComputeSeconds *float64         `json:"compute_seconds,omitempty"` // skein: engine time of training and sampling
}

// BillingUsageSession is a session's attributes in a usage answer.
type BillingUsageSession struct {
	UserMetadata map[string]string `json:"user_metadata"`
}

// BillingUsageResponse answers GET /api/v1/billing/usage/events.
type BillingUsageResponse struct {
	Data     []BillingUsageEvent            `json:"data"`
	Sessions map[string]BillingUsageSession `json:"sessions"`
}

// TraceExportResponse answers GET /api/v1/sessions/{id}/trace_export.
type TraceExportResponse struct {
	Status string `json:"status"` // "pending", "ready" or "failed"
	URL    string `json:"url,omitempty"`
	Error  string `json:"error,omitempty"`
}

// UnmarshalJSON reads loss_fn_config's values as numbers or booleans (1 and 0): twinkle's
// clients send {"disable_lora": true}, the tinker SDK sends numbers.
func (in *ForwardBackwardInput) UnmarshalJSON(b []byte) error {
	type plain ForwardBackwardInput
	var aux struct {
		plain
		LossFnConfig map[string]configValue `json:"loss_fn_config"`
	}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	*in = ForwardBackwardInput(aux.plain)
	in.LossFnConfig = nil
	if aux.LossFnConfig != nil {
		in.LossFnConfig = make(map[string]float64, len(aux.LossFnConfig))
		for k, v := range aux.LossFnConfig {
			in.LossFnConfig[k] = float64(v)
		}
	}
	return nil
}

// configValue is one loss_fn_config value: a number, or a boolean as 1 or 0.
type configValue float64

func (v *configValue) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case "true":
		*v = 1
		return nil
	case "false":
		*v = 0
		return nil
	}
	var f float64
	if string(b) == "null" || json.Unmarshal(b, &f) != nil {
		return fmt.Errorf("loss_fn_config: value %s is not a number or a boolean", b)
	}
	*v = configValue(f)
	return nil
}
