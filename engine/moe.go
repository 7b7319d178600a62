package engine

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/safetensors"
)

// A sparse mixture of experts (Qwen3-MoE, Qwen3.5-MoE): the feed-forward block of the layers
// the config marks (Config.isMoE). For each token x (a row of the post-attention norm's output):
//
//	p = softmax(x·Wgᵀ)                 the router, frozen (Tinker trains no router)
//	(w, S) = top-k(p)                  renormalised to sum 1 where the family says
//	y = Σ_{j∈S} w_j · down_j(silu(gate_j x) ⊙ up_j x)
//	  + σ(x·wsᵀ) · shared(x)           Qwen3.5-MoE's shared expert behind its sigmoid gate
//
// Routing is dropless: every token reaches its k experts, whatever the others do. The experts
// run as one product per expert over the rows routed to it (tokens grouped by expert, the
// grouped GEMM of transformers' grouped_mm and llama.cpp's mul_mat_id), not per token.
//
// LoRA on the experts is Tinker's "shared-outer" layout (reference §2.2): gate (w1) and up (w3)
// share A [r, D] across experts, each expert its own B_e [I, r]; down (w2) has an A_e [r, I] per
// expert and one B [D, r]. So for gate and up x·Aᵀ is one [N, r] product a layer, and for down
// each expert's rank-r rows are mixed with the routing weights before one shared B: the LoRA
// never materialises a per-expert weight. The adapter's parameter count is Tinker's
// (get_lora_param_count: 3·(D + E·I) a rank a layer), and its file is Tinker's too: w1/w3
// lora_A [1, r, D], lora_B [E, I, r]; w2 lora_A [E, r, I], lora_B [1, D, r].
//
// The router's auxiliary load-balancing loss is not part of any Tinker loss: Tinker's losses are
// the caller's (cross_entropy, importance_sampling, …) and its router is frozen, so a balancing
// term would have nothing to train. skein neither adds it nor reports it.
type moeFFN[E float] struct {
	router  *linear[E] // mlp.gate [D → E]
	experts []expertFFN[E]
	k       int
	renorm  bool
	width   int       // each expert's I
	lora    [3]int    // LoRA ids of the experts' gate (w1), up (w3) and down (w2) in a pass
	paths   [3]string // their LoRA module paths (Tinker's names)
	// Qwen3.5-MoE's shared expert and its gate [D → 1] (nil: none).
	shared     *denseFFN[E]
	sharedGate *linear[E]
}

// expertFFN is one routed expert's SwiGLU.
type expertFFN[E float] struct{ gate, up, down *linear[E] }

// expertLoRANames are Tinker's names of the experts' three projections: gate, up, down.
var expertLoRANames = [3]string{"w1", "w3", "w2"}

// expertSlot is the LoRA of one MoE block's experts' projection in a pass: its id, and the
// module's sizes as loraModules lists them.
type expertSlot struct{ id, in, out int }

var (
	_ ffn[float32] = (*moeFFN[float32])(nil)
	_ ffn[float64] = (*moeFFN[float64])(nil)
)

// moeBlock resolves a layer's mixture of experts (HF prefix p = "…layers.L.mlp.") from its
// weights, each made a linear by lin.
func (m *model[E]) moeBlock(c *Config, p string, lin func(string) *linear[E]) *moeFFN[E] {
	f := &moeFFN[E]{router: lin(p + "gate"), k: c.NumExpertsPerTok, renorm: c.moeRenorm, width: c.MoeIntermediateSize}
	for e := range c.NumExperts {
		x := p + "experts." + strconv.Itoa(e) + "."
		f.experts = append(f.experts, expertFFN[E]{gate: lin(x + "gate_proj"), up: lin(x + "up_proj"), down: lin(x + "down_proj")})
	}
	for j, n := range expertLoRANames {
		f.paths[j] = p + "experts." + n
	}
	if c.SharedExpertIntermediateSize > 0 {
		s := p + "shared_expert."
		f.shared = &denseFFN[E]{gate: lin(s + "gate_proj"), up: lin(s + "up_proj"), down: lin(s + "down_proj")}
		f.sharedGate = lin(p + "shared_expert_gate")
	}
	m.moes = append(m.moes, f)
	return f
}

// finishExperts gives every MoE block's expert LoRA its ids, after the linears': a pass's LoRA
// table holds both (loraSlots).
func (m *model[E]) finishExperts(c *Config) {
	m.expertMods = map[string]expertSlot{}
	D := c.HiddenSize
	for i, f := range m.moes {
		E, I := len(f.experts), f.width
		for j := range 3 {
			f.lora[j] = len(m.linears) + 3*i + j
			in, out := D, E*I
			if j == 2 {
				in, out = I, D
			}
			m.expertMods[f.paths[j]] = expertSlot{id: f.lora[j], in: in, out: out}
		}
	}
}

// loraSlots is the size of a pass's LoRA table: the linears', then the experts'.
func (m *model[E]) loraSlots() int { return len(m.linears) + 3*len(m.moes) }

func (f *moeFFN[E]) linears() []*linear[E] {
	out := []*linear[E]{f.router}
	for _, x := range f.experts {
		out = append(out, x.gate, x.up, x.down)
	}
	if f.shared != nil {
		out = append(out, f.shared.linears()...)
		out = append(out, f.sharedGate)
	}
	return out
}

// routing is where each token's experts' rows are: the (token, slot) pairs grouped by expert, in
// expert order and within an expert by token, so that each expert's rows are one block of the
// grouped tensors [P, ·] (P = N·k), the same size every pass.
type routing struct {
	k       int
	experts []int   // [N·k]: token n's j-th expert
	tokens  [][]int // by expert: its tokens, ascending
	offs    []int   // [E+1]: expert e's rows are [offs[e], offs[e+1])
	order   []int   // [P]: the token of each grouped row
	pos     []int   // [N·k]: the grouped row of (n, j)
}

func groupByExpert(experts []int, N, k, numExperts int) *routing {
	r := &routing{k: k, experts: experts, tokens: make([][]int, numExperts), offs: make([]int, numExperts+1), pos: make([]int, N*k)}
	for n := range N {
		for j := range k {
			e := experts[n*k+j]
			r.tokens[e] = append(r.tokens[e], n)
		}
	}
	for e, toks := range r.tokens {
		r.offs[e+1] = r.offs[e] + len(toks)
		r.order = append(r.order, toks...)
	}
	seen := make([]int, numExperts)
	for n := range N {
		for j := range k {
			e := experts[n*k+j]
			r.pos[n*k+j] = r.offs[e] + seen[e]
			seen[e]++
		}
	}
	return r
}

// expertRun is the experts' LoRA of token rows [r0, r1) (one adapter's; nil entries: none).
type expertRun[E float] struct {
	r0, r1 int
	lm     [3]*loraMats[E]
	scale  E
	// The run's grouped rows: which of the grouped tensors' rows are its tokens' (rows), and
	// each expert's part of them (offs).
	rows, offs []int
	xag        [2]mat[E] // scale·x·Aᵀ of gate and up at the run's grouped rows [len(rows), r]
	ha         mat[E]    // down's act·A_eᵀ over every grouped row (zero outside the run) [P, r]
}

// expertRuns are the runs of rows whose experts carry a LoRA: the whole pass's adapter, or each
// adapter of a pass over rows of several (segments.go).
func (s *pass[E]) expertRuns(f *moeFFN[E], N int, r *routing) []*expertRun[E] {
	pick := func(lora []*loraMats[E]) (lm [3]*loraMats[E], any bool) {
		for j, id := range f.lora {
			if id < len(lora) && lora[id] != nil {
				lm[j], any = lora[id], true
			}
		}
		return lm, any
	}
	var runs []*expertRun[E]
	if s.segs == nil {
		if lm, ok := pick(s.lora); ok {
			runs = append(runs, &expertRun[E]{r0: 0, r1: N, lm: lm, scale: s.scale})
		}
	} else {
		for _, g := range s.rowRuns(N) {
			if g.seg < 0 {
				continue
			}
			if lm, ok := pick(s.segs[g.seg].lora); ok {
				runs = append(runs, &expertRun[E]{r0: g.r0, r1: g.r1, lm: lm, scale: s.segs[g.seg].scale})
			}
		}
	}
	for _, run := range runs {
		run.offs = make([]int, len(r.tokens)+1)
		for e, toks := range r.tokens {
			lo, hi := sort.SearchInts(toks, run.r0), sort.SearchInts(toks, run.r1)
			for i := lo; i < hi; i++ {
				run.rows = append(run.rows, r.offs[e]+i)
			}
			run.offs[e+1] = run.offs[e] + hi - lo
		}
	}
	return runs
}

// moeActs are what the block's backward reads.
type moeActs[E float] struct {
	x, logits, w, y mat[E]
	r               *routing
	g, u, sig, act  mat[E] // grouped [P, I]
	run             *expertRun[E]
	hac             mat[E] // down's LoRA rows mixed [N, r]
	sh, sg          mat[E] // the shared expert's output before its gate, and the gate's logit [N, 1]
}

// weights are the experts' projections of one kind (0 gate, 1 up, 2 down), by expert.
func (f *moeFFN[E]) weights(kind int) []backend.Weight {
	ws := make([]backend.Weight, len(f.experts))
	for e, x := range f.experts {
		ws[e] = [3]*linear[E]{x.gate, x.up, x.down}[kind].w
	}
	return ws
}

func (f *moeFFN[E]) forward(s *pass[E], x mat[E], la *layerActs[E]) mat[E] {
	N, D, I := x.Dims[0], s.c.HiddenSize, f.width
	logits := s.linear(x, f.router)
	w, experts := s.op.Route(logits, f.k, f.renorm)
	if s.op.Err() != nil {
		return s.op.Zeros(N, D)
	}
	r := groupByExpert(experts, N, f.k, len(f.experts))
	P := N * f.k
	runs := s.expertRuns(f, N, r)
	var a *moeActs[E]
	if la != nil {
		a = &moeActs[E]{x: x, logits: logits, w: w, r: r}
		if len(runs) > 0 {
			a.run = runs[0] // a training pass has one adapter
		}
		la.moe = a
	}
	xg := s.op.GatherRows(x, r.order)
	g := s.op.ProductGrouped(xg, f.weights(0), r.offs, false)
	u := s.op.ProductGrouped(xg, f.weights(1), r.offs, false)
	s.op.ReleaseOne(xg)
	for _, run := range runs {
		if len(run.rows) == 0 {
			continue
		}
		// gate and up += scale·(x·Aᵀ)·B_eᵀ: x·Aᵀ once for the run's tokens, then each expert's B.
		toks := make([]int, len(run.rows))
		for i, p := range run.rows {
			toks[i] = r.order[p]
		}
		for j, proj := range []mat[E]{g, u} {
			lm := run.lm[j]
			if lm == nil {
				continue
			}
			xt := s.op.GatherRows(x, toks)
			xa := s.op.MatMul(xt, lm.a, 0, true)
			run.xag[j] = s.op.Scale(xa, run.scale)
			s.op.ReleaseOne(xt)
			s.op.ReleaseOne(xa)
			t := s.op.MatMulGrouped(run.xag[j], lm.b, run.offs, I, true)
			s.op.ScatterAdd(proj, t, run.rows)
			s.op.ReleaseOne(t)
		}
	}
	act, sig := s.op.Alloc(P, I), s.op.Alloc(P, I)
	s.op.SiluGate(g, u, sig, act, s.e.ggmlNorms())
	y := s.op.ProductGrouped(act, f.weights(2), r.offs, false)
	out := s.op.MixRows(y, w, r.pos)
	for _, run := range runs {
		lm := run.lm[2]
		if lm == nil || len(run.rows) == 0 {
			continue
		}
		// down += scale·B·Σ_j w_j·A_e·act: each expert's rank-r rows, mixed per token, then B.
		rank := lm.a.Dims[0] / len(f.experts)
		at := s.op.GatherRows(act, run.rows)
		ha := s.op.MatMulGrouped(at, lm.a, run.offs, rank, true)
		run.ha = s.op.Zeros(P, rank)
		s.op.ScatterAdd(run.ha, ha, run.rows)
		s.op.ReleaseOne(at)
		s.op.ReleaseOne(ha)
		wr := w
		if run.r0 != 0 || run.r1 != N {
			wr = s.op.Rows(w, run.r0, run.r1)
		}
		hac := s.op.MixRows(run.ha, wr, r.pos[run.r0*f.k:run.r1*f.k])
		t := s.op.MatMul(s.op.Scale(hac, run.scale), lm.b, 0, true)
		s.op.ScatterAdd(out, t, span(run.r0, run.r1))
		if a != nil {
			a.hac = hac
		}
	}
	if f.shared != nil {
		sh := f.shared.forward(s, x, la)
		sg := s.linear(x, f.sharedGate)
		s.op.Add(out, s.op.Gate(sh, sg))
		if a != nil {
			a.sh, a.sg = sh, sg
		}
	}
	if a != nil {
		a.y, a.g, a.u, a.sig, a.act = y, g, u, sig, act
	}
	return out
}

// span is the rows lo, lo+1, …, hi−1.
func span(lo, hi int) []int {
	out := make([]int, hi-lo)
	for i := range out {
		out[i] = lo + i
	}
	return out
}

func (f *moeFFN[E]) backward(s *pass[E], dy mat[E], la *layerActs[E]) mat[E] {
	a := la.moe
	N, D, I := dy.Dims[0], s.c.HiddenSize, f.width
	r := a.r
	var lm [3]*loraMats[E]
	if a.run != nil {
		lm = a.run.lm
	}
	grads := s.train.grads
	var dxShared mat[E]
	if f.shared != nil {
		// out += σ(sg)·sh: d sh = σ(sg)·dy, d sg = Σ dy·sh·σ'(sg).
		dsh := s.op.Scale(dy, 1)
		dsg := s.op.Alloc(N, 1)
		s.op.GateBack(dsh, a.sh, a.sg, dsg)
		dxShared = f.shared.backward(s, dsh, la)
		s.op.Add(dxShared, *s.linearBack(dsg, f.sharedGate, true))
	}
	dY, dw := s.op.MixRowsBack(dy, a.y, a.w, r.pos)
	dact := s.op.ProductGrouped(dY, f.weights(2), r.offs, true)
	s.op.ReleaseOne(dY)
	if lm[2] != nil {
		// out += scale·hac·Bᵀ: dB = scale·dyᵀ·hac, d hac = scale·dy·B, then through the mix to
		// each expert's rank-r rows: dA_e = dHA_eᵀ·act_e, d act += dHA·A_e.
		dB := s.op.MatMul(s.op.Transpose(a.hac, s.scale), dy, 0, false) // [r, D]
		s.op.AddGrad(grads[lm[2].bi], dB, true)
		dhac := s.op.Scale(s.op.MatMul(dy, lm[2].b, 0, false), s.scale)
		dHA, dw2 := s.op.MixRowsBack(dhac, a.run.ha, a.w, r.pos)
		s.op.Add(dw, dw2)
		s.op.AddGrad(grads[lm[2].ai], s.op.MatMulGroupedTN(dHA, a.act, r.offs), false)
		rank := lm[2].a.Dims[0] / len(f.experts)
		s.op.Add(dact, s.op.MatMulGrouped(dHA, lm[2].a, r.offs, rank, false))
	}
	dg, du := s.op.Alloc(N*f.k, I), s.op.Alloc(N*f.k, I)
	s.op.SiluGateBack(dact, a.g, a.u, a.sig, dg, du)
	dxg := s.op.ProductGrouped(dg, f.weights(0), r.offs, true)
	s.op.Add(dxg, s.op.ProductGrouped(du, f.weights(1), r.offs, true))
	dx := s.op.Zeros(N, D)
	s.op.ScatterAdd(dx, dxg, r.order)
	for j, dproj := range []mat[E]{dg, du} {
		if lm[j] == nil {
			continue
		}
		// gate/up += scale·(x·Aᵀ)·B_eᵀ: dB_e = dproj_eᵀ·(scale·x·Aᵀ)_e; with dGB the rows
		// Σ_e dproj·B_e per token, dA = scale·dGBᵀ·x and dx += scale·dGB·A.
		s.op.AddGrad(grads[lm[j].bi], s.op.MatMulGroupedTN(dproj, a.run.xag[j], r.offs), false)
		dGB := s.op.Zeros(N, lm[j].a.Dims[0])
		s.op.ScatterAdd(dGB, s.op.MatMulGrouped(dproj, lm[j].b, r.offs, I, false), r.order)
		s.op.AddGrad(grads[lm[j].ai], s.op.MatMul(s.op.Transpose(dGB, s.scale), a.x, 0, false), false)
		s.op.MatMulAdd(dx, s.op.Scale(dGB, s.scale), lm[j].a, false)
	}
	// The router is frozen, but its path carries gradient to x all the same.
	dlogits := s.op.RouteBack(a.logits, a.w, r.experts, dw, f.renorm)
	s.op.Add(dx, *s.linearBack(dlogits, f.router, true))
	if f.shared != nil {
		s.op.Add(dx, dxShared)
	}
	la.moe = nil
	return dx
}

// Weights.

// ffnWeights are layer l's feed-forward tensors: the dense MLP's three, or a mixture of experts'
// router, experts (one tensor each: the transformers 4 layout, which splitFusedExperts makes of
// a fused file) and shared expert.
func (c *Config) ffnWeights(l int) []string {
	p := c.layerPrefix(l) + "mlp."
	if !c.isMoE(l) {
		return []string{p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"}
	}
	names := []string{p + "gate.weight"}
	for e := range c.NumExperts {
		x := p + "experts." + strconv.Itoa(e) + "."
		names = append(names, x+"gate_proj.weight", x+"up_proj.weight", x+"down_proj.weight")
	}
	if c.SharedExpertIntermediateSize > 0 {
		names = append(names, p+"shared_expert.gate_proj.weight", p+"shared_expert.up_proj.weight",
			p+"shared_expert.down_proj.weight", p+"shared_expert_gate.weight")
	}
	return names
}

// isRouterWeight reports a mixture of experts' router or shared-expert gate: products like any
// projection's, never quantized.
func isRouterWeight(name string) bool {
	return strings.HasSuffix(name, ".mlp.gate.weight") || strings.HasSuffix(name, ".mlp.shared_expert_gate.weight")
}

// moeShape is the HF shape of a mixture of experts' tensor (nil: not one).
func (c *Config) moeShape(name string) []int {
	if c.NumExperts == 0 || !strings.Contains(name, ".mlp.") {
		return nil
	}
	D, I, S := c.HiddenSize, c.MoeIntermediateSize, c.SharedExpertIntermediateSize
	switch {
	case strings.HasSuffix(name, ".mlp.gate.weight"):
		return []int{c.NumExperts, D}
	case strings.HasSuffix(name, ".mlp.shared_expert_gate.weight"):
		return []int{1, D}
	case strings.HasSuffix(name, ".mlp.experts.gate_up_proj"):
		return []int{c.NumExperts, 2 * I, D}
	case strings.HasSuffix(name, ".mlp.experts.down_proj"):
		return []int{c.NumExperts, D, I}
	}
	width := 0
	if strings.Contains(name, ".mlp.experts.") {
		width = I
	} else if strings.Contains(name, ".mlp.shared_expert.") {
		width = S
	} else {
		return nil
	}
	switch {
	case strings.HasSuffix(name, "gate_proj.weight"), strings.HasSuffix(name, "up_proj.weight"):
		return []int{width, D}
	case strings.HasSuffix(name, "down_proj.weight"):
		return []int{D, width}
	}
	return nil
}

// splitFusedExperts replaces each fused expert tensor of a file (transformers 5 and Qwen3.5-MoE
// checkpoints: mlp.experts.gate_up_proj [E, 2I, D], each expert's gate rows then its up rows,
// and mlp.experts.down_proj [E, D, I]) by one tensor per expert and projection, views of the same
// bytes, named as the transformers 4 checkpoints name them. Other tensors pass through.
func (c *Config) splitFusedExperts(in map[string]safetensors.Tensor) (map[string]safetensors.Tensor, error) {
	var fused []string
	for name := range in {
		if strings.HasSuffix(name, ".mlp.experts.gate_up_proj") || strings.HasSuffix(name, ".mlp.experts.down_proj") {
			fused = append(fused, name)
		}
	}
	if len(fused) == 0 {
		return in, nil
	}
	out := make(map[string]safetensors.Tensor, len(in)+len(fused)*c.NumExperts*2)
	for n, t := range in {
		out[n] = t
	}
	for _, name := range fused {
		t := in[name]
		delete(out, name)
		want := c.moeShape(name)
		if want == nil || len(t.Shape) != 3 || t.Shape[0] != want[0] || t.Shape[1] != want[1] || t.Shape[2] != want[2] {
			return nil, fmt.Errorf("engine: weight %s has shape %v, config implies %v", name, t.Shape, want)
		}
		elems := t.Shape[0] * t.Shape[1] * t.Shape[2]
		if elems == 0 || len(t.Data)%elems != 0 {
			return nil, fmt.Errorf("engine: weight %s: %d bytes for shape %v", name, len(t.Data), t.Shape)
		}
		es := len(t.Data) / elems
		per := t.Shape[1] * t.Shape[2] * es // one expert's bytes
		prefix := strings.TrimSuffix(strings.TrimSuffix(name, "gate_up_proj"), "down_proj")
		for e := range t.Shape[0] {
			x := prefix + strconv.Itoa(e) + "."
			b := t.Data[e*per : (e+1)*per]
			if strings.HasSuffix(name, "down_proj") {
				out[x+"down_proj.weight"] = safetensors.Tensor{DType: t.DType, Shape: []int{t.Shape[1], t.Shape[2]}, Data: b}
				continue
			}
			half, rows := per/2, t.Shape[1]/2
			out[x+"gate_proj.weight"] = safetensors.Tensor{DType: t.DType, Shape: []int{rows, t.Shape[2]}, Data: b[:half]}
			out[x+"up_proj.weight"] = safetensors.Tensor{DType: t.DType, Shape: []int{rows, t.Shape[2]}, Data: b[half:]}
		}
	}
	return out, nil
}

// expertLoRAModules are a MoE layer's LoRA modules under train_mlp: the experts' three in
// Tinker's shared-outer layout, and the shared expert's ordinary three (its gate, like the
// router, takes none: Tinker's counts have no term for either).
func (c *Config) expertLoRAModules(l int) []loraModule {
	p := c.layerPrefix(l) + "mlp."
	D, I, E := c.HiddenSize, c.MoeIntermediateSize, c.NumExperts
	mods := []loraModule{
		{Path: p + "experts.w1", In: D, Out: E * I, Experts: E},
		{Path: p + "experts.w3", In: D, Out: E * I, Experts: E},
		{Path: p + "experts.w2", In: I, Out: D, Experts: E, ExpertA: true},
	}
	if S := c.SharedExpertIntermediateSize; S > 0 {
		mods = append(mods,
			loraModule{Path: p + "shared_expert.gate_proj", In: D, Out: S},
			loraModule{Path: p + "shared_expert.up_proj", In: D, Out: S},
			loraModule{Path: p + "shared_expert.down_proj", In: S, Out: D})
	}
	return mods
}
