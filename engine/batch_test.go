package engine

import (
	"context"
	"testing"
)

// A batch is validated once: PrepareBatch's work is reused by the engine of the model it was
// prepared for (the same prepared value runs), and an engine of another model validates it
// again, refusing what does not fit that model.
func TestBatchIsValidatedOnce(t *testing.T) {
	e := loadTiny(t, ArchLlama, Options{})
	b, err := e.Info().PrepareBatch([]Datum{textDatum([]int{1, 2, 3, 4})}, "cross_entropy", nil)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := b.preparedFor(e.Config); err != nil || p != b.p {
		t.Fatalf("the engine of the prepared model validated the batch again (%v)", err)
	}
	fork := e.Fork() // replicas of one model share its config
	if p, _ := b.preparedFor(fork.Config); p != b.p {
		t.Fatal("a replica of the same model validated the batch again")
	}
	if _, err := fork.ForwardBatch(context.Background(), "", b, false); err != nil {
		t.Fatal(err)
	}
	small := *e.Config
	small.VocabSize = 3 // token 3 is outside this model's vocabulary
	if _, err := b.preparedFor(&small); err == nil {
		t.Fatal("a batch prepared for one model passed for another without being checked")
	}
	if _, err := (&Batch{Data: b.Data, Loss: "no_such_loss"}).preparedFor(e.Config); err == nil {
		t.Fatal("a batch built by hand was run unchecked")
	}
}

// A sampling request passed by ValidateSample is not checked again by that model's engine, but
// is by another model's.
func TestSampleRequestIsValidatedOnce(t *testing.T) {
	e := loadTiny(t, ArchLlama, Options{})
	r := SampleRequest{Prompt: []int{1, 5}, NumSamples: 1, Params: SampleParams{MaxTokens: 2, TopK: -1, TopP: 1}}
	if err := e.Info().ValidateSample(&r); err != nil {
		t.Fatal(err)
	}
	if r.validFor != e.Config {
		t.Fatal("ValidateSample did not mark the request as checked for its model")
	}
	other := &Engine{Config: &Config{VocabSize: 4, MaxPositionEmbeddings: 64}}
	if err := other.validateSample(&r); err == nil {
		t.Fatal("a request checked for one model passed another's engine unchecked")
	}
	if _, err := e.SampleBatch(context.Background(), "", []SampleRequest{r}); err != nil {
		t.Fatal(err)
	}
}
