package engine

// baseProduct returns x·W for module lin's base weight, or x·Wᵀ when transposed (an input
// gradient); bias and LoRA are the caller's. How depends on the weight's form and the machine:
// the backend's (Step.Product).
func (s *pass[E]) baseProduct(x mat[E], lin *linear[E], transposed bool) mat[E] {
	return s.op.Product(x, lin.w, transposed)
}
