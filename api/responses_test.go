package api

import (
	"encoding/json"
	"testing"
	"time"
)

// The named response types replaced maps: each must encode to the very bytes its map did, key
// order, null and absent keys included (the recorded-SDK replay compares decoded JSON only).
func TestResponsesEncodeAsTheirMaps(t *testing.T) {
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		name      string
		typed, as any
	}{
		{"error", ErrorResponse{Detail: "d", Message: "d"}, map[string]string{"detail": "d", "message": "d"}},
		{"status", StatusResponse{Status: "ok"}, map[string]string{"status": "ok"}},
		{"client config", ClientConfigResponse{CredentialDefaultSource: "api_key", ParallelFwdbwdChunks: true,
			ProtoWriteFwdbwd: true, FwdViaFwdbwd: true, SampleEnableStuckDetection: true}, map[string]any{
			"use_pyqwest_transport": false, "pjwt_auth_enabled": false, "credential_default_source": "api_key",
			"proto_compress_fwdbwd": false, "parallel_fwdbwd_chunks": true, "proto_write_fwdbwd": true,
			"fwd_via_fwdbwd": true, "sample_enable_stuck_detection": true}},
		{"dynamic config", DynamicConfigResponse{RefreshIntervalSec: 300}, map[string]any{"refresh_interval_sec": 300}},
		{"capabilities", ServerCapabilities{SupportedModels: []SupportedModel{{ModelName: "m", MaxContextLength: 7}}},
			map[string]any{"supported_models": []map[string]any{{"model_name": "m", "max_context_length": 7}}}},
		{"capabilities, none", ServerCapabilities{}, map[string]any{"supported_models": []map[string]any(nil)}},
		{"create session", CreateSessionResponse{SessionID: "s", Type: "create_session"}, map[string]any{"session_id": "s", "type": "create_session"}},
		{"heartbeat", TypeResponse{Type: "session_heartbeat"}, map[string]any{"type": "session_heartbeat"}},
		{"future", FutureResponse{RequestID: "r", ModelID: "m"}, map[string]any{"request_id": "r", "model_id": "m"}},
		{"future, no model", FutureResponse{RequestID: "r"}, map[string]any{"request_id": "r"}},
		{"create model", CreateModelResponse{ModelID: "m", Type: "create_model"}, map[string]any{"model_id": "m", "type": "create_model"}},
		{"unload", UnloadModelResponse{ModelID: "m", Type: "unload_model"}, map[string]any{"model_id": "m", "type": "unload_model"}},
		{"get info", GetInfoResponse{ModelID: "m", Type: "get_info", IsLora: true, LoraRank: 8, ModelName: "b",
			ModelData: ModelData{Arch: "llama", ModelName: "b", TokenizerID: "b"}}, map[string]any{"model_id": "m", "type": "get_info",
			"is_lora": true, "lora_rank": 8, "model_name": "b",
			"model_data": map[string]any{"arch": "llama", "model_name": "b", "tokenizer_id": "b"}}},
		{"optim step", OptimStepResponse{Metrics: map[string]float64{"x": 1.5}, Type: "optim_step"},
			map[string]any{"metrics": map[string]float64{"x": 1.5}, "type": "optim_step"}},
		{"optim step, no metrics", OptimStepResponse{Type: "optim_step"}, map[string]any{"metrics": map[string]float64(nil), "type": "optim_step"}},
		{"save weights", SaveWeightsResponse{Path: "p", Type: "save_weights"}, map[string]any{"path": "p", "type": "save_weights"}},
		{"save for sampler, path", SaveWeightsForSamplerResponse{Path: "p", Type: "save_weights_for_sampler"},
			map[string]any{"path": "p", "type": "save_weights_for_sampler"}},
		{"save for sampler, ephemeral", SaveWeightsForSamplerResponse{SamplingSessionID: "s", Type: "save_weights_for_sampler"},
			map[string]any{"sampling_session_id": "s", "type": "save_weights_for_sampler"}},
		{"load weights", LoadWeightsResponse{Path: "p", Type: "load_weights"}, map[string]any{"path": "p", "type": "load_weights"}},
		{"weights info", WeightsInfoResponse{BaseModel: "b", IsLora: true, LoraRank: 4, TrainMLP: true},
			map[string]any{"base_model": "b", "is_lora": true, "lora_rank": 4, "train_unembed": false, "train_mlp": true, "train_attn": false}},
		{"create sampling session", CreateSamplingSessionResponse{SamplingSessionID: "s", Type: "create_sampling_session"},
			map[string]any{"sampling_session_id": "s", "type": "create_sampling_session"}},
		{"sampler", SamplerInfo{SamplerID: "s", BaseModel: "b", ModelPath: "p"}, map[string]any{"sampler_id": "s", "base_model": "b", "model_path": "p"}},
		{"sampler, base", SamplerInfo{SamplerID: "s", BaseModel: "b"}, map[string]any{"sampler_id": "s", "base_model": "b"}},
		{"training runs", TrainingRunsResponse{TrainingRuns: []TrainingRun{}, Cursor: Cursor{Limit: 20, TotalCount: 3}},
			map[string]any{"training_runs": []TrainingRun{}, "cursor": Cursor{Limit: 20, TotalCount: 3}}},
		{"run checkpoints", CheckpointsResponse{Checkpoints: []Checkpoint{}}, map[string]any{"checkpoints": []Checkpoint{}}},
		{"all checkpoints", CheckpointsResponse{Checkpoints: []Checkpoint{{CheckpointID: "c"}}, Cursor: &Cursor{Offset: 1}},
			map[string]any{"checkpoints": []Checkpoint{{CheckpointID: "c"}}, "cursor": Cursor{Offset: 1}}},
		{"delete checkpoint", DeleteCheckpointResponse{Deleted: "p"}, map[string]any{"deleted": "p"}},
		{"publish", PublishResponse{TinkerPath: "p", Public: true}, map[string]any{"tinker_path": "p", "public": true}},
		{"ttl", SetTTLResponse{TinkerPath: "p"}, map[string]any{"tinker_path": "p"}},
		{"archive", ArchiveURLResponse{URL: "u", Expires: "e"}, map[string]any{"url": "u", "expires": "e"}},
		{"sessions", SessionsResponse{Sessions: []string{}}, map[string]any{"sessions": []string{}}},
		{"session", SessionResponse{TrainingRunIDs: []string{"r"}, SamplerIDs: []string{}},
			map[string]any{"training_run_ids": []string{"r"}, "sampler_ids": []string{}}},
		{"fleet capacity", map[string]FleetCapacity{"m": {MaxLoras: 4, UsedLoras: 1, FreeLoras: 3}},
			map[string]any{"m": map[string]any{"max_loras": 4, "used_loras": 1, "free_loras": 3}}},
		{"capacity", CapacityResponse{Tenant: "t", LiveLoras: 1, MaxLoras: 30}, map[string]any{"tenant": "t", "live_loras": 1, "max_loras": 30}},
		{"keys", KeysResponse{Keys: []KeyInfo{}}, map[string]any{"keys": []KeyInfo{}}},
		{"created key", CreatedKey{KeyInfo: KeyInfo{ID: "i", Created: created}, Key: "k"}, struct {
			KeyInfo
			Key string `json:"key"`
		}{KeyInfo{ID: "i", Created: created}, "k"}},
		{"revoke key", RevokeKeyResponse{ID: "i", Revoked: true}, map[string]any{"id": "i", "revoked": true}},
		{"ok", OKResponse{OK: true}, map[string]any{"ok": true}},
	} {
		got, err := json.Marshal(c.typed)
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(c.as)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, want)
		}
	}
}
