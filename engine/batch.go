package engine

import "context"

// Batch is a forward or forward_backward batch validated against a model: made once, at the
// gateway, by ModelInfo.PrepareBatch, and run by Compute.ForwardBatch without being checked again
// in the same process. A remote worker receives only its data and validates it again: a network
// peer is unproven.
type Batch struct {
	Data       []Datum
	Loss       string
	LossConfig map[string]float64

	p      *prepared
	config *Config // the model p was validated against
}

// PrepareBatch validates a batch for the model: every error a forward pass could find in its
// input is found here, before the batch waits in any queue.
func (m ModelInfo) PrepareBatch(data []Datum, loss string, cfg map[string]float64) (*Batch, error) {
	p, err := prepareFor(m.Config, data, loss, cfg)
	if err != nil {
		return nil, err
	}
	return &Batch{Data: data, Loss: loss, LossConfig: cfg, p: p, config: m.Config}, nil
}

// preparedFor is the batch validated against c: as prepared when that was against c itself,
// validated now otherwise (a Batch built by hand, or for another model).
func (b *Batch) preparedFor(c *Config) (*prepared, error) {
	if b.p != nil && b.config == c {
		return b.p, nil
	}
	return prepareFor(c, b.Data, b.Loss, b.LossConfig)
}

// ForwardBatch runs a batch through adapter id: with backward, accumulating its gradients (a
// training adapter only); without, changing nothing (id "" is the bare base model). On any
// error nothing about the adapter changes.
//
// A cancelled ctx stops the pass between layers or between chunks. Gradients are summed into a
// buffer of the call's own and added to the accumulator only after every chunk has run, so a
// cancelled call, like a failed one, has changed nothing: no partial gradients to roll back.
func (e *Engine) ForwardBatch(ctx context.Context, id string, b *Batch, backward bool) (*ForwardResult, error) {
	var a *Adapter
	var err error
	switch {
	case backward:
		a, err = e.trainable(id)
	case id != "":
		a, err = e.adapter(id)
	}
	if err != nil {
		return nil, err
	}
	if err := stopped(ctx); err != nil {
		return nil, err
	}
	p, err := b.preparedFor(e.Config)
	if err != nil {
		return nil, err
	}
	return e.run(ctx, a, p, backward)
}

// ForwardBackward validates and runs a batch, accumulating gradients into the adapter.
func (e *Engine) ForwardBackward(ctx context.Context, id string, data []Datum, loss string, cfg map[string]float64) (*ForwardResult, error) {
	return e.ForwardBatch(ctx, id, &Batch{Data: data, Loss: loss, LossConfig: cfg}, true)
}

// Forward validates and runs a batch without gradients; id "" is the bare base model.
func (e *Engine) Forward(ctx context.Context, id string, data []Datum, loss string, cfg map[string]float64) (*ForwardResult, error) {
	return e.ForwardBatch(ctx, id, &Batch{Data: data, Loss: loss, LossConfig: cfg}, false)
}
