package worker

import (
	"context"
	"errors"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/skein-ai/skein/engine"
)

// A call carrying a lower run-lease epoch than one the adapter has seen comes from a gateway
// that lost the run: the worker refuses it before it runs (typed across the wire), so a dead
// gateway's forward_backward still in flight cannot add its gradients to the adapter the new
// gateway drives. Calls without an epoch (no leases) are never refused; reads are not fenced.
func TestCallsOfAStaleEpochAreRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tiny")
	if err := engine.InitTiny(dir, engine.ArchQwen2, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Load(dir, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(NewServer(e, "tok", t.TempDir()))
	defer ts.Close()
	c := NewClient(ts.URL, "tok", e.Info())
	at := func(epoch int64) context.Context { return WithEpoch(context.Background(), "a", epoch) }
	if err := c.CreateLora(at(2), "a", engine.LoraConfig{Rank: 2, Seed: 1, TrainMLP: true}); err != nil {
		t.Fatal(err)
	}
	datum := []engine.Datum{{Tokens: []int{1, 2, 3}, Inputs: map[string]engine.TensorInput{
		"target_tokens": {DType: "int64", Data: []float64{2, 3, 4}}, "weights": {DType: "float32", Data: []float64{1, 1, 1}}}}}
	if _, err := c.ForwardBackward(at(1), "a", datum, "cross_entropy", nil); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("a forward_backward of epoch 1 after epoch 2: %v, want ErrStaleEpoch", err)
	}
	sts, err := c.AdapterStates(context.Background())
	if err != nil || len(sts) != 1 || !sts[0].Clean {
		t.Fatalf("the refused call touched the adapter: %+v %v", sts, err)
	}
	if _, err := c.OptimStep(at(1), "a", engine.AdamParams{LearningRate: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("an optim_step of epoch 1: %v", err)
	}
	if _, err := c.ForwardBackward(at(3), "a", datum, "cross_entropy", nil); err != nil {
		t.Fatalf("epoch 3: %v", err)
	}
	if _, err := c.ForwardBackward(at(2), "a", datum, "cross_entropy", nil); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("epoch 2 after 3: %v", err)
	}
	if _, err := c.ForwardBackward(context.Background(), "a", datum, "cross_entropy", nil); err != nil {
		t.Fatalf("a call without an epoch: %v", err)
	}
	if _, err := c.Forward(at(1), "a", datum, "cross_entropy", nil); err != nil {
		t.Fatalf("a read (forward) of an old epoch: %v", err)
	}
	// Another adapter's epochs are its own, and a call for it under a's epoch carries none.
	if err := c.CreateLora(WithEpoch(context.Background(), "b", 1), "b", engine.LoraConfig{Rank: 2, Seed: 1, TrainMLP: true}); err != nil {
		t.Fatalf("another adapter at epoch 1: %v", err)
	}
	if !c.DeleteAdapter(at(1), "b") {
		t.Fatal("deleting b under a's epoch (an eviction inside a's op) was refused")
	}
}
