package gateway_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/replica"
)

// tokenizerServer serves a tiny model named with a slash, as Hugging Face names are, from a
// directory that also holds a tokenizer_config.json and a file no client may read.
func tokenizerServer(t *testing.T) (*httptest.Server, string) {
	t.Helper()
	dir := t.TempDir()
	if err := engine.InitTiny(dir, engine.ArchQwen3, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"add_bos_token": false, "model_max_length": 4096}`), 0o644); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Load(dir, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep := replica.New("r0", "org/tiny-model", e, 0)
	gw, err := gateway.New(gateway.Options{DataDir: t.TempDir()}, rep)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw)
	t.Cleanup(func() { ts.Close(); gw.Close(); rep.Close() })
	return ts, dir
}

func getTokenizer(t *testing.T, url, key string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("%v in %.200s", err, a)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("%v in %.200s", err, b)
	}
	return reflect.DeepEqual(x, y)
}

// An authenticated client gets the served model's tokenizer.json and tokenizer_config.json, by the
// model's name written with a slash or with %2F.
func TestModelTokenizerServesTheFiles(t *testing.T) {
	ts, dir := tokenizerServer(t)
	wantTok, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	wantCfg, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/api/v1/models/org/tiny-model/tokenizer", "/api/v1/models/org%2Ftiny-model/tokenizer"} {
		status, body := getTokenizer(t, ts.URL+path, "tml-alice")
		if status != http.StatusOK {
			t.Fatalf("%s: %d %s", path, status, body)
		}
		var got struct {
			ModelName       string          `json:"model_name"`
			TokenizerJSON   json.RawMessage `json:"tokenizer_json"`
			TokenizerConfig json.RawMessage `json:"tokenizer_config"`
		}
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if got.ModelName != "org/tiny-model" || !jsonEqual(t, got.TokenizerJSON, wantTok) || !jsonEqual(t, got.TokenizerConfig, wantCfg) {
			t.Fatalf("%s: model %q, tokenizer or config differ from the files", path, got.ModelName)
		}
	}
}

// Without an API key nothing is served, and no path reaches any other file: an unknown model, a
// model name that climbs directories, another file name and a file parameter all fail or are
// ignored.
func TestModelTokenizerReadsNothingElse(t *testing.T) {
	ts, _ := tokenizerServer(t)
	if status, body := getTokenizer(t, ts.URL+"/api/v1/models/org/tiny-model/tokenizer", ""); status != http.StatusUnauthorized {
		t.Fatalf("without a key: %d %s", status, body)
	}
	for _, path := range []string{
		"/api/v1/models/no-such-model/tokenizer",
		"/api/v1/models/..%2F..%2F..%2Fetc%2Fpasswd/tokenizer",
		"/api/v1/models/org/tiny-model/config.json",
		"/api/v1/models/org/tiny-model/tokenizer/../model.safetensors",
		"/api/v1/models/org/tiny-model",
		"/api/v1/models/tokenizer",
	} {
		status, body := getTokenizer(t, ts.URL+path, "tml-alice")
		if status != http.StatusNotFound {
			t.Errorf("%s: %d %.200s", path, status, body)
		}
	}
	status, body := getTokenizer(t, ts.URL+"/api/v1/models/org/tiny-model/tokenizer?file=model.safetensors", "tml-alice")
	var got map[string]json.RawMessage
	if err := json.Unmarshal(body, &got); status != http.StatusOK || err != nil || len(got["tokenizer_json"]) == 0 {
		t.Fatalf("?file= is not a way to other files: %d %.200s", status, body)
	}
}
