package api

import "time"

// Named wire types of the endpoints that used to answer with ad-hoc maps. Fields are declared in
// the alphabetical order of their JSON names, so that each encodes to exactly the bytes the map
// it replaced did (encoding/json sorts map keys); omitempty marks the keys a map left out when
// empty, and a key without it is always sent (null included). responses_test.go holds the proof.

// ErrorResponse is the body of every non-2xx answer; the SDK treats an empty 400 as a network
// glitch, so both keys always carry the message.
type ErrorResponse struct {
	Detail  string `json:"detail"`
	Message string `json:"message"`
}

// StatusResponse answers healthz ("ok") and telemetry ("accepted").
type StatusResponse struct {
	Status string `json:"status"`
}

// ClientConfigResponse answers POST /api/v1/client/config: the SDK's feature switches.
type ClientConfigResponse struct {
	CredentialDefaultSource    string `json:"credential_default_source"`
	FwdViaFwdbwd               bool   `json:"fwd_via_fwdbwd"`
	ParallelFwdbwdChunks       bool   `json:"parallel_fwdbwd_chunks"`
	PjwtAuthEnabled            bool   `json:"pjwt_auth_enabled"`
	ProtoCompressFwdbwd        bool   `json:"proto_compress_fwdbwd"`
	ProtoWriteFwdbwd           bool   `json:"proto_write_fwdbwd"`
	SampleEnableStuckDetection bool   `json:"sample_enable_stuck_detection"`
	UsePyqwestTransport        bool   `json:"use_pyqwest_transport"`
}

// DynamicConfigResponse answers POST /api/v1/client/dynamic_config.
type DynamicConfigResponse struct {
	RefreshIntervalSec int `json:"refresh_interval_sec"`
}

// SupportedModel is one base model of get_server_capabilities.
type SupportedModel struct {
	MaxContextLength int    `json:"max_context_length"`
	ModelName        string `json:"model_name"`
	// TakesImages is skein's: the model accepts image chunks (a vision-language model). The
	// SDK's SupportedModel has no such field and ignores it; text models omit it.
	TakesImages bool `json:"takes_images,omitempty"`
}

// ServerCapabilities answers GET /api/v1/get_server_capabilities (null models: none served).
type ServerCapabilities struct {
	SupportedModels []SupportedModel `json:"supported_models"`
}

// CreateSessionRequest is the body of create_session.
type CreateSessionRequest struct {
	Tags         []string     `json:"tags"`
	UserMetadata UserMetadata `json:"user_metadata"`
	ProjectID    *string      `json:"project_id"`
}

// CreateSessionResponse answers create_session.
type CreateSessionResponse struct {
	SessionID string `json:"session_id"`
	Type      string `json:"type"`
}

// SessionHeartbeatRequest is the body of session_heartbeat.
type SessionHeartbeatRequest struct {
	SessionID string `json:"session_id"`
}

// TypeResponse is an answer that only names its kind (session_heartbeat).
type TypeResponse struct {
	Type string `json:"type"`
}

// FutureResponse is what every asynchronous submit answers: the future to poll, and the model it
// concerns when there is one. request_id must be a string (the SDK rejects a number).
type FutureResponse struct {
	ModelID   string `json:"model_id,omitempty"`
	RequestID string `json:"request_id"`
}

// ModelIDRequest is the body of the requests that name only a model (get_info, unload_model).
type ModelIDRequest struct {
	ModelID string `json:"model_id"`
}

// CreateModelResponse is the result of create_model's future.
type CreateModelResponse struct {
	ModelID string `json:"model_id"`
	Type    string `json:"type"`
}

// UnloadModelResponse is the result of unload_model's future.
type UnloadModelResponse struct {
	ModelID string `json:"model_id"`
	Type    string `json:"type"`
}

// ModelData describes a model's architecture in get_info.
type ModelData struct {
	Arch        string `json:"arch"`
	ModelName   string `json:"model_name"`
	TokenizerID string `json:"tokenizer_id"`
}

// GetInfoResponse answers get_info.
type GetInfoResponse struct {
	IsLora    bool      `json:"is_lora"`
	LoraRank  int       `json:"lora_rank"`
	ModelData ModelData `json:"model_data"`
	ModelID   string    `json:"model_id"`
	ModelName string    `json:"model_name"`
	Type      string    `json:"type"`
}

// OptimStepResponse is the result of optim_step's future.
type OptimStepResponse struct {
	Metrics map[string]float64 `json:"metrics"`
	Type    string             `json:"type"`
}

// SaveWeightsResponse is the result of save_weights's future (and of save_weights_for_sampler's
// with a path): the tinker path written.
type SaveWeightsResponse struct {
	Path string `json:"path"`
	Type string `json:"type"`
}

// SaveWeightsForSamplerResponse is the result of save_weights_for_sampler's future: a tinker path
// when it was given a name, else the ephemeral sampler made over a snapshot.
type SaveWeightsForSamplerResponse struct {
	Path              string `json:"path,omitempty"`
	SamplingSessionID string `json:"sampling_session_id,omitempty"`
	Type              string `json:"type"`
}

// LoadWeightsResponse is the result of load_weights's future.
type LoadWeightsResponse struct {
	Path string `json:"path"`
	Type string `json:"type"`
}

// WeightsInfoRequest is the body of weights_info.
type WeightsInfoRequest struct {
	TinkerPath string `json:"tinker_path"`
}

// WeightsInfoResponse answers weights_info.
type WeightsInfoResponse struct {
	BaseModel    string `json:"base_model"`
	IsLora       bool   `json:"is_lora"`
	LoraRank     int    `json:"lora_rank"`
	TrainAttn    bool   `json:"train_attn"`
	TrainMLP     bool   `json:"train_mlp"`
	TrainUnembed bool   `json:"train_unembed"`
}

// CreateSamplingSessionResponse answers create_sampling_session.
type CreateSamplingSessionResponse struct {
	SamplingSessionID string `json:"sampling_session_id"`
	Type              string `json:"type"`
}

// SamplerInfo answers GET /api/v1/samplers/{id}.
type SamplerInfo struct {
	BaseModel string `json:"base_model"`
	ModelPath string `json:"model_path,omitempty"`
	SamplerID string `json:"sampler_id"`
}

// TrainingRunsResponse answers GET /api/v1/training_runs.
type TrainingRunsResponse struct {
	Cursor       Cursor        `json:"cursor"`
	TrainingRuns []TrainingRun `json:"training_runs"`
}

// CheckpointsResponse answers the checkpoint listings: a run's (no cursor: not paged) and the
// tenant's (paged).
type CheckpointsResponse struct {
	Checkpoints []Checkpoint `json:"checkpoints"`
	Cursor      *Cursor      `json:"cursor,omitempty"`
}

// DeleteCheckpointResponse answers DELETE of a checkpoint.
type DeleteCheckpointResponse struct {
	Deleted string `json:"deleted"`
}

// PublishResponse answers POST and DELETE of a checkpoint's publish.
type PublishResponse struct {
	Public     bool   `json:"public"`
	TinkerPath string `json:"tinker_path"`
}

// SetTTLRequest is the body of PUT of a checkpoint's ttl (null: never expires).
type SetTTLRequest struct {
	TTLSeconds *int64 `json:"ttl_seconds"`
}

// SetTTLResponse answers it.
type SetTTLResponse struct {
	TinkerPath string `json:"tinker_path"`
}

// ArchiveURLResponse answers GET of a checkpoint's archive: a signed download link.
type ArchiveURLResponse struct {
	Expires string `json:"expires"`
	URL     string `json:"url"`
}

// SessionsResponse answers GET /api/v1/sessions: session ids, oldest first.
type SessionsResponse struct {
	Sessions []string `json:"sessions"`
}

// SessionResponse answers GET /api/v1/sessions/{id}.
type SessionResponse struct {
	SamplerIDs     []string `json:"sampler_ids"`
	TrainingRunIDs []string `json:"training_run_ids"`
}

// CapacityResponse answers GET /api/v1/skein/capacity for a tenant's (non-admin) key.
type CapacityResponse struct {
	LiveLoras int    `json:"live_loras"`
	MaxLoras  int    `json:"max_loras"`
	Tenant    string `json:"tenant"`
}

// FleetCapacity is one base model's LoRA slots over its healthy replicas, in the admin's answer to
// GET /api/v1/skein/capacity (a map from base model name to it).
type FleetCapacity struct { // fields in the order the map it replaced encoded them
	FreeLoras int `json:"free_loras"`
	MaxLoras  int `json:"max_loras"`
	UsedLoras int `json:"used_loras"`
}

// CreateKeyRequest is the body of POST /api/v1/skein/keys.
type CreateKeyRequest struct {
	Name  string `json:"name"`
	Admin bool   `json:"admin"`
}

// KeyInfo is a key as listed: never its secret or hash.
type KeyInfo struct {
	ID      string     `json:"id"`
	Name    string     `json:"name"`
	Admin   bool       `json:"admin"`
	Tenant  string     `json:"tenant"`
	Created time.Time  `json:"created"`
	Revoked *time.Time `json:"revoked,omitempty"`
}

// CreatedKey answers POST /api/v1/skein/keys: the only time the key itself is shown.
type CreatedKey struct {
	KeyInfo
	Key string `json:"key"`
}

// KeysResponse answers GET /api/v1/skein/keys.
type KeysResponse struct {
	Keys []KeyInfo `json:"keys"`
}

// RevokeKeyResponse answers DELETE /api/v1/skein/keys/{id}.
type RevokeKeyResponse struct {
	ID      string `json:"id"`
	Revoked bool   `json:"revoked"`
}

// OKResponse answers a worker's heartbeat.
type OKResponse struct {
	OK bool `json:"ok"`
}

// ReplicasResponse answers GET /api/v1/skein/replicas (admin): every replica, what it holds and
// everything waiting for it.
type ReplicasResponse struct {
	Replicas []ReplicaStatus `json:"replicas"`
}

// ReplicaStatus is one replica in ReplicasResponse.
type ReplicaStatus struct {
	Adapters       []string        `json:"adapters"`
	AdaptersHeld   int             `json:"adapters_held"`
	BaseModel      string          `json:"base_model"`
	Healthy        bool            `json:"healthy"`
	ID             string          `json:"id"`
	IdleAdapters   int             `json:"idle_adapters"`
	MaxLoras       int             `json:"max_loras"`
	Queue          ReplicaQueue    `json:"queue"`
	QueueDepth     int             `json:"queue_depth"`
	WorkerReported *WorkerReported `json:"worker_reported,omitempty"`
}

// ReplicaQueue says where a replica's queue depth waits: on the replica, routed to it, behind
// the ops of run queues whose adapters it holds, or batched for sampling at the gateway.
type ReplicaQueue struct {
	OnReplica       int `json:"on_replica"`
	Routed          int `json:"routed"`
	RunQueues       int `json:"run_queues"`
	SamplingBatched int `json:"sampling_batched"`
}

// WorkerReported is what a worker's own last heartbeat said.
type WorkerReported struct {
	Adapters   int `json:"adapters"`
	FreeSlots  int `json:"free_slots"`
	QueueDepth int `json:"queue_depth"`
	// Draining: the worker is leaving (SIGTERM); nothing new is placed on it.
	Draining bool `json:"draining,omitempty"`
}
