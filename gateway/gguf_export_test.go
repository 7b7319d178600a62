package gateway_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/engine/gguf"
	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/replica"
)

func download(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("download: %d %s", resp.StatusCode, b)
	}
	return b
}

// ?format=gguf on the archive route gives a signed link to the checkpoint as a llama.cpp LoRA
// adapter: the file skein model export-gguf makes of the same checkpoint's PEFT files.
func TestCheckpointArchiveAsGGUF(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	// The tiny base ties its head to the embedding: a head LoRA has no place in llama.cpp.
	c, tied := trainedModel(t, ts, "tml-gguf")
	f, _ := tied.SaveState(ctx, "h1")
	if err := f.Result(ctx, nil); err != nil {
		t.Fatal(err)
	}
	var u struct{ URL string }
	if err := c.Do(ctx, "GET", "training_runs/"+tied.ModelID+"/checkpoints/weights/h1/archive?format=gguf", nil, &u); err == nil || !strings.Contains(err.Error(), "train_unembed") {
		t.Fatalf("a head LoRA on a tied model as GGUF: %v", err)
	}
	sess, err := c.CreateSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	no := false
	tc, err := c.CreateLoraTrainingClientConfig(ctx, sess, 0, base, api.LoraConfig{Rank: 4, TrainUnembed: &no})
	if err != nil {
		t.Fatal(err)
	}
	f, _ = tc.SaveState(ctx, "g1")
	if err := f.Result(ctx, nil); err != nil {
		t.Fatal(err)
	}
	route := "training_runs/" + tc.ModelID + "/checkpoints/weights/g1/archive"
	if err := c.Do(ctx, "GET", route+"?format=gguf", nil, &u); err != nil || u.URL == "" {
		t.Fatalf("gguf url: %v %+v", err, u)
	}
	got := download(t, u.URL)
	file, err := gguf.Parse(got)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := file.Value("general.type"); v != "adapter" {
		t.Fatalf("general.type %v", v)
	}
	// The same checkpoint's files, from the tar.gz, converted here.
	var tgz struct{ URL string }
	if err := c.Do(ctx, "GET", route, nil, &tgz); err != nil {
		t.Fatal(err)
	}
	gz, err := gzip.NewReader(bytes.NewReader(download(t, tgz.URL)))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(h.Name)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(t.TempDir(), "a.gguf")
	if err := engine.ExportAdapterGGUF(dir, ts.eng.Config, out); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(out)
	if !bytes.Equal(got, want) {
		t.Fatalf("the route's GGUF (%d bytes) is not export-gguf's (%d bytes)", len(got), len(want))
	}
	var e struct{ URL string }
	if err := c.Do(ctx, "GET", route+"?format=zip", nil, &e); err == nil || !strings.Contains(err.Error(), "format") {
		t.Fatalf("an unknown format: %v", err)
	}
}

// A base model served from a GGUF file has the tokenizer.json and chat template rebuilt from its
// metadata: the tokenizer endpoint serves them and a chat completion renders the template, as
// for the directory the GGUF was written from.
func TestServedGGUFModelHasTokenizerAndTemplate(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := engine.WriteGGUF(modelDir(), file, gguf.Q8_0, "tiny"); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Load(file, engine.Options{Precision: engine.PrecisionQ8_0})
	if err != nil {
		t.Fatal(err)
	}
	rep := replica.New("r0", "tiny-gguf", e, 2)
	gw, err := gateway.New(gateway.Options{DataDir: t.TempDir()}, rep)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(func() { srv.Close(); gw.Close(); rep.Close() })
	status, b := oai(t, "GET", srv.URL, "tml-a", "/api/v1/models/tiny-gguf/tokenizer", "")
	var tok struct {
		TokenizerJSON struct {
			Model struct{ Type string }
		} `json:"tokenizer_json"`
		TokenizerConfig struct {
			ChatTemplate string `json:"chat_template"`
		} `json:"tokenizer_config"`
	}
	if err := json.Unmarshal(b, &tok); status != 200 || err != nil || tok.TokenizerJSON.Model.Type != "BPE" || tok.TokenizerConfig.ChatTemplate != engine.TinyChatTemplate {
		t.Fatalf("tokenizer: %d %v %.300s", status, err, b)
	}
	c := oaiOK[api.ChatCompletion](t, srv.URL, "tml-a", "/v1/chat/completions",
		`{"model":"tiny-gguf","messages":[{"role":"user","content":"hello there"}],"temperature":0,"max_tokens":4}`)
	if want := len(e.Tokenizer.Encode(chatPrompt("hello there"))); c.Usage.PromptTokens != want {
		t.Fatalf("prompt of %d tokens, the template renders %d", c.Usage.PromptTokens, want)
	}
}
