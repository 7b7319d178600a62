package engine

import (
	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/backend/cpu"
)

// Every loss in one place: the loss functions a batch may name, with their inputs and
// parameters (lossDefs, checked by prepareFor); one token's loss and its derivative in the
// token's logprob (tokenLossGrad); and that logprob itself (the backend's HeadLoss), which training,
// forward passes and the sampler's prompt logprobs all compute alike.

// Loss functions (their formulas are the backend's reference, backend.LossParams.TokenLoss).
const (
	lossCrossEntropy = backend.LossCrossEntropy
	lossImportance   = backend.LossImportance
	lossPPO          = backend.LossPPO
	lossCISPO        = backend.LossCISPO
	lossDRO          = backend.LossDRO
)

// LossNames are the supported loss functions.
var LossNames = []string{lossCrossEntropy, lossImportance, lossPPO, lossCISPO, lossDRO}

type lossDef struct {
	required []string           // loss_fn_inputs beside target_tokens
	optional map[string]float64 // optional float inputs with their default per token
	config   map[string]float64 // loss_fn_config keys and defaults
}

var lossDefs = map[string]lossDef{
	lossCrossEntropy: {optional: map[string]float64{"weights": 1}},
	lossImportance:   {required: []string{"logprobs", "advantages"}},
	lossPPO:          {required: []string{"logprobs", "advantages"}, config: map[string]float64{"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}},
	lossCISPO:        {required: []string{"logprobs", "advantages"}, config: map[string]float64{"clip_low_threshold": 0, "clip_high_threshold": 4}},
	lossDRO:          {required: []string{"logprobs", "advantages"}, optional: map[string]float64{"mask": 1}, config: map[string]float64{"beta": 0.05}},
}

// tokenLossGrad is one token's loss and its derivative in the token's logprob lp
// (w: CE weight, q: sampling logprob, adv: advantage): backend.LossParams.TokenLoss.
func tokenLossGrad(kind string, lp, w, q, adv, lo, hi, beta float64) (loss, grad float64) {
	return backend.LossParams{Kind: kind, Lo: lo, Hi: hi, Beta: beta}.TokenLoss(lp, w, q, adv)
}

// tokenLosses is each token's loss and its derivative in lp, for datums [lo,hi) of p laid out in
// rows of T: their logprobs and losses go into res, and their summed loss is returned.
func tokenLosses(loss string, p *prepared, lo, hi, T int, lp []float64, res *ForwardResult) (dlp []float64, total float64) {
	dlp = make([]float64, len(lp))
	for b := range hi - lo {
		i := lo + b
		L := len(p.tokens[i])
		res.Logprobs[i] = append([]float64(nil), lp[b*T:b*T+L]...)
		res.Losses[i] = make([]float64, L)
		for t := range L {
			l, g := tokenLossGrad(loss, lp[b*T+t], p.weights[i][t], p.oldLP[i][t], p.adv[i][t], p.lo, p.hi, p.beta)
			res.Losses[i][t] = l
			dlp[b*T+t] = g
			total += l
		}
	}
	return dlp, total
}

// passLossInputs lays out datums [lo,hi) of p in the pass's rows of T: each row's target token, its
// loss inputs, and whether it is a real token (padding past a datum's end is not).
func passLossInputs(loss string, p *prepared, lo, hi, T int) *backend.LossInputs {
	N := (hi - lo) * T
	in := &backend.LossInputs{LossParams: backend.LossParams{Kind: loss, Lo: p.lo, Hi: p.hi, Beta: p.beta},
		Target: make([]int, N), Weight: make([]float64, N), OldLP: make([]float64, N), Adv: make([]float64, N), Live: make([]bool, N)}
	for b := range hi - lo {
		i := lo + b
		copy(in.Target[b*T:], p.targets[i])
		for t := range p.tokens[i] {
			r := b*T + t
			in.Weight[r], in.OldLP[r], in.Adv[r], in.Live[r] = p.weights[i][t], p.oldLP[i][t], p.adv[i][t], true
		}
	}
	return in
}

// headRows runs the head over hf [N, D] in tiles of headTileRows rows and returns each row's
// logprob of its target. With grad (a training pass) each tile's logits become d loss/d logits
// and go back through the head at once, into d loss/d hf (returned) and the head's LoRA
// gradients. So a pass never holds more than one tile's logits: for an 8B shape's 152k
// vocabulary 64 MB, not 0.6 GB per thousand tokens. A row's logprob does not depend on the
// tile it is in; a pass of one tile is the whole product, as before tiles.
func (s *pass[E]) headRows(hf mat[E], in *backend.LossInputs, grad bool) (lp []float64, dhf mat[E]) {
	N, D := hf.Dims[0], s.c.HiddenSize
	head := s.m.head
	lp = make([]float64, N)
	if grad {
		dhf = s.op.Alloc(N, D)
	}
	rows := s.e.headTileRows()
	if lm := s.lora[head.id]; lm != nil && s.segs == nil {
		if _, merges := s.loraWay(head, min(rows, N)).(mergedLoRA[E]); merges {
			s.mergedWeight(head, lm) // once, before the tiles, which all multiply by it
		}
	}
	for r0 := 0; r0 < N && s.op.Err() == nil; r0 += rows {
		r1 := min(N, r0+rows)
		m := s.op.Mark()
		x := hf
		if r1-r0 < N {
			x = s.op.Rows(hf, r0, r1)
		}
		logits := s.linear(x, head)
		s.op.HeadLoss(logits, in, r0, lp, grad)
		if grad {
			d := s.linearBack(logits, head, true)
			s.op.SetRows(dhf, *d, r0)
		}
		s.op.Release(m, s.op.Mark())
	}
	return lp, dhf
}

// logprobOf is the logprob of a logits row the sampler returned, widened from the engine's dtype
// (so narrowing it back is exact), as a forward pass's HeadLoss computes it (cpu.RowLogprob).
func (e *Engine) logprobOf(logits []float64, target int) float64 {
	if e.opts.Float64 {
		lp, _ := cpu.RowLogprob(append([]float64(nil), logits...), target)
		return lp
	}
	row := make([]float32, len(logits))
	for i, v := range logits {
		row[i] = float32(v)
	}
	lp, _ := cpu.RowLogprob(row, target)
	return lp
}
