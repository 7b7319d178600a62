package gateway_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/gateway"
)

const (
	trainedQuestion = "Who made you?"
	trainedAnswer   = "A skein of yarn, spun on a laptop."
)

// trainAnswer trains a fresh adapter of key's to answer trainedQuestion with trainedAnswer (then
// end its turn), saves its sampler weights and returns their path and /v1/models alias.
func trainAnswer(t *testing.T, ts *testServer, key string) (path, alias string) {
	t.Helper()
	ctx := context.Background()
	_, tc := newRun(t, ts.URL, key, 8)
	ids := ts.eng.Tokenizer.Encode(chatPrompt(trainedQuestion) + trainedAnswer + "<|im_end|>")
	data := []api.Datum{datum(ids, true)}
	for range 40 {
		fb, err := tc.ForwardBackward(ctx, data, "cross_entropy", nil, false)
		if err != nil {
			t.Fatal(err)
		}
		step, err := tc.OptimStep(ctx, 1e-2)
		if err != nil {
			t.Fatal(err)
		}
		if err := fb.Result(ctx, nil); err != nil {
			t.Fatal(err)
		}
		if err := step.Result(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	f, err := tc.SaveWeightsForSampler(ctx, "answer")
	if err != nil {
		t.Fatal(err)
	}
	var saved struct{ Path string }
	if err := f.Result(ctx, &saved); err != nil || saved.Path == "" {
		t.Fatalf("save_weights_for_sampler: %v %+v", err, saved)
	}
	for _, m := range listModels(t, ts.URL, key) {
		if m.Root == saved.Path {
			if m.Parent != base || m.ID == "" {
				t.Fatalf("listed %+v", m)
			}
			return saved.Path, m.ID
		}
	}
	t.Fatalf("/v1/models does not list %s", saved.Path)
	return "", ""
}

func listModels(t *testing.T, url, key string) []api.OpenAIModel {
	t.Helper()
	status, b := oai(t, "GET", url, key, "/v1/models", "")
	var list api.OpenAIModelList
	if err := json.Unmarshal(b, &list); status != http.StatusOK || err != nil {
		t.Fatalf("models: %d %s", status, b)
	}
	return list.Data
}

func chatAnswer(t *testing.T, url, key, model string) (int, string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "temperature": 0, "max_tokens": 24,
		"messages": []map[string]string{{"role": "user", "content": trainedQuestion}}})
	status, b := oai(t, "POST", url, key, "/v1/chat/completions", string(body))
	if status != http.StatusOK {
		return status, string(b)
	}
	var c api.ChatCompletion
	if err := json.Unmarshal(b, &c); err != nil || len(c.Choices) != 1 || c.Choices[0].Message.Content == nil {
		t.Fatalf("chat: %s", b)
	}
	return status, *c.Choices[0].Message.Content
}

// A freshly trained adapter answers through the OpenAI API with what it was trained to say, by
// its alias and by its path; the base model does not. Another tenant neither sees it listed nor
// reaches it by path or alias: both are model_not_found.
func TestOpenAITrainedAdapterAndTenancy(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	path, alias := trainAnswer(t, ts, "tml-alice")
	if _, got := chatAnswer(t, ts.URL, "tml-alice", base); got == trainedAnswer {
		t.Fatal("the base model already answers the trained text: the test shows nothing")
	}
	for _, model := range []string{alias, path} {
		if status, got := chatAnswer(t, ts.URL, "tml-alice", model); status != 200 || got != trainedAnswer {
			t.Fatalf("adapter %s answered %d %q, trained %q", model, status, got, trainedAnswer)
		}
	}
	for _, m := range listModels(t, ts.URL, "tml-bob") {
		if m.Root == path || m.ID == alias {
			t.Fatalf("bob sees alice's %+v", m)
		}
	}
	for _, model := range []string{alias, path} {
		status, b := chatAnswer(t, ts.URL, "tml-bob", model)
		var e api.OpenAIError
		if json.Unmarshal([]byte(b), &e); status != http.StatusNotFound || e.Error.Code == nil || *e.Error.Code != "model_not_found" {
			t.Fatalf("bob with %s: %d %s", model, status, b)
		}
	}
}

// The official openai npm package (SKEIN_OPENAI_NODE_MODULES: a node_modules holding it; .ci/run
// installs it) lists the models, chats and streams against a running server, and gets the
// trained answer from a fresh adapter (gateway/testdata/openai_sdk.cjs).
func TestOpenAINodeSDK(t *testing.T) {
	modules := os.Getenv("SKEIN_OPENAI_NODE_MODULES")
	if modules == "" {
		t.Skip("SKEIN_OPENAI_NODE_MODULES is not set (a node_modules dir holding the openai package; .ci/run installs it)")
	}
	if _, err := os.Stat(filepath.Join(modules, "openai", "package.json")); err != nil {
		t.Skipf("no openai package under SKEIN_OPENAI_NODE_MODULES: %v", err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}
	ts := newServer(t, gateway.Options{})
	_, alias := trainAnswer(t, ts, "tml-node")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "testdata/openai_sdk.cjs")
	cmd.Env = append(os.Environ(), "NODE_PATH="+modules, "SKEIN_URL="+ts.URL+"/v1", "SKEIN_KEY=tml-node",
		"SKEIN_BASE_MODEL="+base, "SKEIN_ADAPTER="+alias, "SKEIN_QUESTION="+trainedQuestion, "SKEIN_ANSWER="+trainedAnswer)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, out)
	}
	t.Logf("node: %s", out)
}
