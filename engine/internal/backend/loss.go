package backend

import "math"

// Every Tinker loss, one token at a time: its value and its derivative in the token's logprob.
// This is the reference each backend's HeadLoss follows (the CPU backend calls it), and what the
// engine sums a batch's losses with.

// Loss functions.
const (
	LossCrossEntropy = "cross_entropy"
	LossImportance   = "importance_sampling"
	LossPPO          = "ppo"
	LossCISPO        = "cispo"
	LossDRO          = "dro"
)

// LossParams are a batch's loss and its configuration: the clip range of ppo and cispo, dro's β.
type LossParams struct {
	Kind   string
	Lo, Hi float64
	Beta   float64
}

// TokenLoss is one token's loss and its derivative in the token's logprob lp (w: the
// cross-entropy weight, or dro's mask; q: the sampling logprob; adv: the advantage).
func (p LossParams) TokenLoss(lp, w, q, adv float64) (loss, grad float64) {
	lo, hi, beta := p.Lo, p.Hi, p.Beta
	switch p.Kind {
	case LossCrossEntropy:
		return -lp * w, -w
	case LossImportance:
		r := math.Exp(lp - q)
		return -r * adv, -r * adv
	case LossPPO:
		r := math.Exp(lp - q)
		clipped := min(max(r, lo), hi)
		if r*adv <= clipped*adv {
			return -r * adv, -r * adv
		}
		// The clipped branch is the minimum: its ratio is constant outside [lo, hi].
		if r > lo && r < hi {
			return -clipped * adv, -r * adv
		}
		return -clipped * adv, 0
	case LossCISPO:
		r := min(max(math.Exp(lp-q), lo), hi) // not differentiated
		return -r * lp * adv, -r * adv
	case LossDRO: // w is 1 where dro trains, 0 elsewhere
		d := lp - q
		return -w * (lp*adv - 0.5*beta*d*d), -w * (adv - beta*d)
	}
	return 0, 0
}

// LossInputs are a pass's per-token loss inputs, made once a pass (a device backend uploads
// them once): for row r of the pass's head (token r%T of row r/T), its target token, weight,
// sampling logprob and advantage; Live[r] false for padding past a sequence's end, whose
// gradient is zero.
type LossInputs struct {
	LossParams
	Target             []int
	Weight, OldLP, Adv []float64
	Live               []bool
}
