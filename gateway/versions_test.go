package gateway_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/gateway"
)

// promptLogprobs samples one token from a sampling session (or a model path) and returns the
// prompt's logprobs, which depend only on the weights.
func promptLogprobs(t *testing.T, c *client.Client, session, modelPath string) (string, error) {
	t.Helper()
	one := 1
	f, err := c.Sample(context.Background(), api.SampleRequest{SamplingSessionID: session, ModelPath: modelPath,
		Prompt:         api.ModelInput{Chunks: []api.Chunk{{Type: "encoded_text", Tokens: []int{3, 14, 15, 92}}}},
		SamplingParams: api.SamplingParams{MaxTokens: &one}, PromptLogprobs: true})
	if err != nil {
		return "", err
	}
	var out api.SampleResponse
	if err := f.Result(context.Background(), &out); err != nil {
		return "", err
	}
	var s []float64
	for _, p := range out.PromptLogprobs {
		if p != nil {
			s = append(s, *p)
		}
	}
	return fmt.Sprint(s), nil
}

func saveForSampler(t *testing.T, tc *client.TrainingClient, name string) string {
	t.Helper()
	f, err := tc.SaveWeightsForSampler(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Path string `json:"path"`
	}
	if err := f.Result(context.Background(), &out); err != nil {
		t.Fatal(err)
	}
	return out.Path
}

// Overwriting a checkpoint serves the new weights to samplers built on its path (sampler copies
// were keyed by path only, so the old weights stayed in memory).
func TestOverwrittenCheckpointServesNewWeights(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	c, tc := trainedModel(t, ts, "tml-overwrite")
	trainOne(t, tc)
	path := saveForSampler(t, tc, "s1")
	sess, _ := c.CreateSession(context.Background())
	smp, err := c.CreateSamplingSession(context.Background(), sess, "", path)
	if err != nil {
		t.Fatal(err)
	}
	first, err := promptLogprobs(t, c, smp, "")
	if err != nil {
		t.Fatal(err)
	}
	trainOne(t, tc)
	trainOne(t, tc)
	if saveForSampler(t, tc, "s1") != path {
		t.Fatal("the path changed")
	}
	for _, via := range []struct{ session, path string }{{smp, ""}, {"", path}} {
		got, err := promptLogprobs(t, c, via.session, via.path)
		if err != nil {
			t.Fatal(err)
		}
		if got == first {
			t.Fatalf("sampling %+v after the overwrite still serves the old weights", via)
		}
	}
}

// An archive URL is for the checkpoint it was made for: once that checkpoint is deleted, a new
// one of the same name does not make the URL work again.
func TestArchiveURLIsForOneVersion(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	c, tc := trainedModel(t, ts, "tml-archver")
	save := func() {
		f, _ := tc.SaveState(ctx, "a1")
		if err := f.Result(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	save()
	var u struct{ URL string }
	if err := c.Do(ctx, "GET", "training_runs/"+tc.ModelID+"/checkpoints/weights/a1/archive", nil, &u); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, "DELETE", "training_runs/"+tc.ModelID+"/checkpoints/weights/a1", nil, nil); err != nil {
		t.Fatal(err)
	}
	trainOne(t, tc)
	save()
	resp, err := http.Get(u.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		t.Fatal("an archive URL of a deleted checkpoint downloads the new one of the same name")
	}
}

// Unpublishing or deleting a checkpoint stops other tenants' samplers built on it.
func TestUnpublishAndDeleteStopOtherTenantsSamplers(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	ctx := context.Background()
	owner, tc := trainedModel(t, ts, "tml-pub-owner")
	trainOne(t, tc)
	path := saveForSampler(t, tc, "shared")
	ckpt := "training_runs/" + tc.ModelID + "/checkpoints/sampler_weights/shared"
	if err := owner.Do(ctx, "POST", ckpt+"/publish", nil, nil); err != nil {
		t.Fatal(err)
	}
	other := client.New(ts.URL, "tml-pub-other")
	sess, _ := other.CreateSession(ctx)
	smp, err := other.CreateSamplingSession(ctx, sess, "", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := promptLogprobs(t, other, smp, ""); err != nil {
		t.Fatalf("sampling a published checkpoint: %v", err)
	}
	if err := owner.Do(ctx, "DELETE", ckpt+"/publish", nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := promptLogprobs(t, other, smp, ""); !isStatus(err, http.StatusNotFound) {
		t.Fatalf("sampling after unpublish: %v", err)
	}
	if _, err := promptLogprobs(t, owner, "", path); err != nil {
		t.Fatalf("the owner samples its own unpublished checkpoint: %v", err)
	}
	ownSess, _ := owner.CreateSession(ctx)
	ownSmp, err := owner.CreateSamplingSession(ctx, ownSess, "", path)
	if err != nil {
		t.Fatal(err)
	}
	if err := owner.Do(ctx, "DELETE", ckpt, nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := promptLogprobs(t, owner, ownSmp, ""); !isStatus(err, http.StatusNotFound) {
		t.Fatalf("sampling after delete: %v", err)
	}
}

// A crash in the middle of overwriting a checkpoint (the acknowledged one moved aside, the new
// one not yet renamed in, a partial directory left) loses nothing: at start the aside copy is put
// back, the checkpoint serves the weights it was acknowledged with, and no temporary remains.
func TestInterruptedOverwriteIsRecoveredAtStart(t *testing.T) {
	data := t.TempDir()
	ts := newServer(t, gateway.Options{DataDir: data})
	c, tc := trainedModel(t, ts, "tml-swap")
	trainOne(t, tc)
	path := saveForSampler(t, tc, "s1")
	want, err := promptLogprobs(t, c, "", path)
	if err != nil {
		t.Fatal(err)
	}
	ts.Close()
	ts.gw.Close()
	dir := filepath.Join(data, "checkpoints", strings.ReplaceAll(tc.ModelID, ":", "_"), "sampler_weights", "s1")
	if err := os.Rename(dir, dir+".old-1a2b3c4d"); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir+".partial-5e6f7a8b", 0o755); err != nil {
		t.Fatal(err)
	}
	crashed := time.Now().Add(-3 * time.Hour) // older than any save in progress could be
	if err := os.Chtimes(dir+".partial-5e6f7a8b", crashed, crashed); err != nil {
		t.Fatal(err)
	}
	next := newServer(t, gateway.Options{DataDir: data})
	c.BaseURL = next.URL
	got, err := promptLogprobs(t, c, "", path)
	if err != nil {
		t.Fatalf("the acknowledged checkpoint after an interrupted overwrite: %v", err)
	}
	if got != want {
		t.Fatal("the recovered checkpoint serves other weights than the acknowledged one")
	}
	entries, _ := os.ReadDir(filepath.Dir(dir))
	for deadline := time.Now().Add(20 * time.Second); len(entries) != 1 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond) // the start's sweep of stale partials runs beside it
		entries, _ = os.ReadDir(filepath.Dir(dir))
	}
	if len(entries) != 1 || entries[0].Name() != "s1" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("left behind: %v", names)
	}
}
