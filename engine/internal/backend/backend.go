// Package backend is the seam between the engine's model code and the machine it computes on.
// The model code (engine/*.go) reads as the math: it asks a Step for tensors and runs coarse,
// fused ops on them (a norm, a gated activation, attention's softmax, a loss's gradient, an
// AdamW update), never touching their memory or asking which CPU it runs on. A backend
// implements the ops: the CPU backend (backend/cpu) over skein's kernels, a device backend over
// its own memory and kernels.
//
// To add a device: implement Step and Weight in a package of its own (with a way to make them,
// which the engine's newStep and loader call), and test its ops against the CPU backend's (its
// reference tests, and the engine's golden bits within the device's tolerances). To add an op:
// add its method to Step here, its loop to the CPU backend (its doc comment is the reference),
// its kernel to each device backend, and a parity test.
//
// Step is generic over the element type: the float64 engine (gradient checks against finite
// differences) runs the very same model code, so those checks test what production runs. A device
// backend implements Step[float32] only and refuses float64 engines.
package backend

// Float is a step's element type.
type Float interface{ float32 | float64 }

// Tensor is one tensor of a step, or a weight's values: its dimensions, and its memory as the
// backend that made it keeps it. Model code reads Dims only (the engine's seam ratchet holds it
// to that); V and Buf are that backend's business.
type Tensor[E Float] struct {
	Dims []int
	// V is the memory, where the backend keeps it in Go memory (the CPU's).
	V []E
	// Buf is the backend's handle to it (the CPU's: a GoMLX buffer, which its float64 and
	// scalar-path products take; a device backend's: its device memory).
	Buf any
}

// Mark is a point in a step's allocations (two counters the backend keeps): everything
// allocated after it can be given back.
type Mark [2]int

// Weight is a frozen base weight, kept the way its backend multiplies it (values, bf16 bits,
// quantized blocks), shared by every step and adapter.
type Weight interface {
	// Shape is the product's: x [rows, in] · W gives [rows, out].
	Shape() (in, out int)
	// OutIn: stored [out, in] (an embedding, and a tied head), the layout a LoRA merged into it
	// takes (Merge) and its products transpose.
	OutIn() bool
	// AddsLoRA: its products read it as kept (bf16 units, blocks), so a LoRA on it is always
	// added to the product, never merged into a float32 copy.
	AddsLoRA() bool
}

// Caps are what a backend's products can do, for the engine's memory plan.
type Caps struct {
	// BF16GEMM: products over bf16 and quantized weights read them as kept (a bf16 unit),
	// rather than widening them into a float32 copy for the product.
	BF16GEMM bool
	// F32GEMM: float32 products run on the backend's own GEMM, which multiplies a large weight
	// widened in chunks and reads an adapter's numbers in place.
	F32GEMM bool
}

// StepOptions are an engine's settings every step of it runs with.
type StepOptions struct {
	// GGML: products over quantized weights round their rows as llama.cpp's CPU backend does
	// (Options.GGMLActivations).
	GGML bool
	// PairsChunk forces products over quantized weights to widen that many outputs at a time
	// (tests; 0: the backend decides).
	PairsChunk int
}

// MaxFewRows is the most rows a product reads a quantized weight's blocks for directly (a decode
// step of a whole batch); more go through a GEMM over the blocks widened.
const MaxFewRows = 64

// Step is one pass's memory and ops. Every tensor a step hands out lives until the step is freed
// or the range holding it is released. After the first failure (an allocation refused, a
// cancelled pass) Err reports it: what the pass computes from then on is thrown away, and
// products and allocations do no more work.
type Step[E Float] interface {
	// Memory.
	Alloc(dims ...int) Tensor[E] // uninitialised: the caller writes every element
	Zeros(dims ...int) Tensor[E]
	// From is a new tensor holding host numbers (an upload).
	From(v []float64, dims ...int) Tensor[E]
	Mark() Mark
	Release(from, to Mark)                   // everything allocated between two marks
	ReleaseExcept(from Mark, keep Tensor[E]) // everything since from but keep
	ReleaseOne(t Tensor[E])
	Fail(err error)
	Err() error
	Free() // the end of the step: every tensor goes back

	// Products over frozen weights: x·W, or x·Wᵀ when transposed (an input gradient).
	Product(x Tensor[E], w Weight, transposed bool) Tensor[E]
	// Merge sets m ← W + scale·m, m in W's stored layout (a LoRA merged into the weight).
	Merge(m Tensor[E], w Weight, scale E)
	// Embed looks tokens up in an embedding (a Weight of in = the hidden size, out = the
	// vocabulary): row b·T+t is token tokens[b][t]'s; rows past a sequence's end are zero.
	Embed(w Weight, tokens [][]int, T int) Tensor[E]

	// Products: x·y, or x·yᵀ when transB; batch > 0: both have a leading batch axis.
	MatMul(x, y Tensor[E], batch int, transB bool) Tensor[E]
	// MatMulAdd adds x·y (x·yᵀ) to c.
	MatMulAdd(c, x, y Tensor[E], transB bool)

	Ops[E]
}

// Ops are a step's element-wise and row-wise ops, fused forward/backward pairs. Shapes are the
// tensors' own; rows are the leading dimensions flattened.
type Ops[E Float] interface {
	// Add is dst += src.
	Add(dst, src Tensor[E])
	// AddBias adds bias to every row of y.
	AddBias(y Tensor[E], bias Tensor[E])
	// RMSNorm writes y = x/rms(x)·w for each row and inv = 1/rms (eps inside the root);
	// ggml rounds as ggml-cpu does (float32 only).
	RMSNorm(x, w Tensor[E], eps float64, y, inv Tensor[E], ggml bool)
	// RMSNormBack writes (accumulate: adds) dx for dy through RMSNorm of x with 1/rms inv.
	RMSNormBack(dy, x, inv, w, dx Tensor[E], accumulate bool)
	// SiluGate writes sig = σ(gate) and out = silu(gate)·up; ggml as ggml-cpu rounds (float32).
	SiluGate(gate, up, sig, out Tensor[E], ggml bool)
	// SiluGateBack writes dgate and dup for d(out) da.
	SiluGateBack(da, gate, up, sig, dgate, dup Tensor[E])

	// Attention.
	// HeadsIn runs the head norms and the rotation into the attention layout (HeadsIn's doc).
	HeadsIn(a *HeadsIn[E])
	// Attend returns softmax(q·kᵀ/√HD)·v over the slots each token sees, in token layout
	// [B·T, H·HD], and the probabilities when a.KeepProbs (else an empty tensor).
	Attend(a *Attention[E]) (probs, out Tensor[E])
	// AttendBack takes d loss/d(attention's output) dOut in token layout and returns the
	// gradients of the queries [B·KVH, G·T, HD], keys transposed [B·KVH, HD, T] and values
	// transposed [B·KVH, HD, T].
	AttendBack(a *AttentionGrads[E], dOut Tensor[E]) (dQ, dKT, dVT Tensor[E])
	// HeadsBack is HeadsIn's backward: dq [N, H·HD], dk and dv [N, KVH·HD].
	HeadsBack(a *HeadsBack[E]) (dq, dk, dv Tensor[E])
	// SplitGate splits a gated attention's q_proj output [N, H·2·HD] (each head's queries, then
	// as many gate rows) into queries and gates [N, H·HD]; JoinGate is its inverse.
	SplitGate(yq Tensor[E], H, HD int) (q, gate Tensor[E])
	JoinGate(dq, dgate Tensor[E], H, HD int) Tensor[E]
	// Gate returns o ⊙ σ(gate); GateBack writes d loss/d gate = do ⊙ o ⊙ σ'(gate) into dgate
	// and scales do by σ(gate) in place. A gate of one number a row [N, 1] scales the whole row
	// (a shared expert's gate), its gradient summed over the row.
	Gate(o, gate Tensor[E]) Tensor[E]
	GateBack(do, o, gate, dgate Tensor[E])

	// LoRA.
	// Upload is a new tensor holding v (an adapter's numbers for one pass).
	Upload(v []E, dims ...int) Tensor[E]
	// ReadsInPlace reports whether this step's products read an adapter's parameters where they
	// are, rather than from a Copy (taken when they must not change under the pass anyway).
	ReadsInPlace() bool
	// Transpose returns scale·srcᵀ [cols, rows] for src [rows, cols]; Scale returns scale·src.
	Transpose(src Tensor[E], scale E) Tensor[E]
	Scale(src Tensor[E], scale E) Tensor[E]
	// AddGrad adds d to an adapter's gradient g, or dᵀ when transposed.
	AddGrad(g, d Tensor[E], transposed bool)
	// Copy is a step tensor holding t's numbers (an adapter's, for a pass that must not see
	// them change: the sampler's).
	Copy(t Tensor[E]) Tensor[E]

	// Adapters' parameters (Param: long-lived tensors of the backend's, not a step's).
	// GradNorm is the global L2 norm of gs (a sum of squares that overflows is summed again
	// scaled by the largest value).
	GradNorm(gs []Tensor[E]) float64
	// AllFinite reports whether every number of ts is finite: a reduction to one flag.
	AllFinite(ts []Tensor[E]) bool
	// AddChecked adds src[i] into dst[i] for every i when every sum is finite; otherwise it
	// changes nothing and reports false.
	AddChecked(dst, src []Tensor[E]) bool
	// Clear zeroes ts.
	Clear(ts ...Tensor[E])
	// AdamW runs one AdamW step (AdamW's doc) over ps in place and returns Σ (Δw)². Every new
	// weight and moment is first checked to be finite in E: a step that is not changes nothing
	// and names the first such parameter, bad = its index (else −1), with its numbers.
	AdamW(ps []Param[E], h AdamW) (updSq float64, bad int, w, m, v float64)
	// CopyBlocks sets dst, taken as len(from) equal blocks of its leading dimension, block i to
	// block from[i] of src (blocks of the same size): a sampler's rows of a cache forked from a
	// prefill's.
	CopyBlocks(dst, src Tensor[E], from []int)
	// CopyRows sets rows [d0, d0+n) of dst's leading dimension to rows [s0, s0+n) of src (rows of
	// the same size): one sampler row's DeltaNet state kept with a prefix cache's block, or put
	// back into a row.
	CopyRows(dst Tensor[E], d0 int, src Tensor[E], s0, n int)
	// CopySlots copies n slots of heads heads from src to dst, both a store of keys and values
	// (KV: keys transposed [heads, HD, S], values [heads, S, HD], each with its own S): src's
	// heads srcHead… at slots srcSlot…srcSlot+n-1 to dst's heads dstHead… at slots dstSlot….
	// A sampler's row of a cache filled from a prefix cache's block, or a block taken from a row.
	CopySlots(dst, src KV[E], dstHead, dstSlot, srcHead, srcSlot, heads, n int)
	// Rows is a copy of rows [r0, r1) of a 2-D tensor.
	Rows(x Tensor[E], r0, r1 int) Tensor[E]
	// AddLoRARuns adds each run's LoRA term to its rows of y = x·W: rows of several adapters in
	// one product (S-LoRA's and Punica's batching). ggml: as llama.cpp adds it (float32).
	AddLoRARuns(x, y Tensor[E], runs []LoRARun[E], ggml bool)
	// AddLoRAGGML adds one run's term as llama.cpp does (float32).
	AddLoRAGGML(x, y Tensor[E], run LoRARun[E])

	// Losses and rows.
	// HeadLoss writes each row's log softmax at its target (in.Target) into lp, for a tile of the
	// head, rows [r0, r0+rows) of the pass; with grad, the tile's logits then become d loss/d
	// logits = dlp·(onehot(target) − softmax), dlp the loss's derivative at the row's logprob
	// (LossParams.TokenLoss; 0 for padding). The per-token inputs are made once a pass.
	HeadLoss(logits Tensor[E], in *LossInputs, r0 int, lp []float64, grad bool)
	// SetRows copies src into dst's rows from r0; GatherRows is x's rows rows[i], in order.
	SetRows(dst, src Tensor[E], r0 int)
	GatherRows(x Tensor[E], rows []int) Tensor[E]
	// Download is t's numbers on the host, valid until t is given back: the one way numbers
	// leave a step (the rows a sampler draws from).
	Download(t Tensor[E]) []E

	// Vision towers.
	// LayerNorm returns (x − mean)/√(var + eps)·w + b per row; GELU applies the erf GELU (tanh:
	// its tanh approximation) in place.
	LayerNorm(x, w, b Tensor[E], eps float64) Tensor[E]
	GELU(x Tensor[E], tanh bool)
	// FrameAttention is full attention within each of frames frames over qkv [n, 3·D] (rows
	// q‖k‖v, H heads, q and k rotated by row i of cos and sin [n, HD/2]): the heads in rows [n, D].
	FrameAttention(qkv Tensor[E], frames, H int, cos, sin []E) Tensor[E]
	// Reshape is a copy of x with other dimensions; PutRows sets (add: adds to) row rows[i] of h
	// to host values vals[i].
	Reshape(x Tensor[E], dims ...int) Tensor[E]
	PutRows(h Tensor[E], rows []int, vals [][]float64, add bool)

	// Mixtures of experts.
	// Route picks each row's k experts from its router logits [N, E]: p = softmax(logits) in E,
	// the k largest p in decreasing order (a tie: the lower expert first), renormalised to sum
	// 1 when renorm. It returns their weights [N, k] and, on the host, their experts [N·k].
	Route(logits Tensor[E], k int, renorm bool) (w Tensor[E], experts []int)
	// RouteBack is Route's backward: d loss/d logits [N, E] for d loss/d w [N, k].
	RouteBack(logits, w Tensor[E], experts []int, dw Tensor[E], renorm bool) Tensor[E]
	// MixRows returns out [N, C], row n = Σ_j w[n, j]·y[pos[n·k+j]] (j in order): each token's
	// experts' outputs y [P, C] weighted by its routing weights w [N, k].
	MixRows(y, w Tensor[E], pos []int) Tensor[E]
	// MixRowsBack is MixRows' backward for d loss/d out dOut [N, C]: dy [P, C] (row pos[n·k+j]
	// = w[n, j]·dOut[n]) and dw [N, k] (⟨dOut[n], y[pos[n·k+j]]⟩).
	MixRowsBack(dOut, y, w Tensor[E], pos []int) (dy, dw Tensor[E])
	// ScatterAdd adds row i of src to row rows[i] of dst, i in order.
	ScatterAdd(dst, src Tensor[E], rows []int)
	// Grouped products: rows of x in groups g = [offs[g], offs[g+1]) (a mixture's rows grouped
	// by expert), each group multiplied by its own matrix into its rows of one output.
	// ProductGrouped multiplies group g by ws[g] (x·W, or x·Wᵀ when transposed).
	ProductGrouped(x Tensor[E], ws []Weight, offs []int, transposed bool) Tensor[E]
	// MatMulGrouped multiplies group g by block g of y, y's rows [g·block, (g+1)·block):
	// x_g·y_gᵀ when transB (the output block wide), else x_g·y_g.
	MatMulGrouped(x, y Tensor[E], offs []int, block int, transB bool) Tensor[E]
	// MatMulGroupedTN returns [G·a, b] whose block g is x_gᵀ·y_g for x [P, a], y [P, b] (zero
	// for an empty group): an expert-stacked LoRA factor's gradient.
	MatMulGroupedTN(x, y Tensor[E], offs []int) Tensor[E]

	// Gated DeltaNet.
	// DeltaNet runs a layer's core on its projections (DeltaNet's doc): the gated norm's output
	// [N, Hv·DV], and when keep, what DeltaNetBack reads (opaque: the backend's own).
	DeltaNet(a *DeltaNet[E], keep bool) (y Tensor[E], kept any)
	// DeltaNetBack takes d loss/dy back to the projections' outputs q, k, v, z, a and b.
	DeltaNetBack(a *DeltaNet[E], kept any, dy Tensor[E]) (dq, dk, dv, dz, da, db Tensor[E])
}

// Heads is attention's geometry: B rows of T tokens, H query heads sharing KVH key and value
// heads (G = H/KVH queries a group), HD dims a head. Queries live in the attention layout
// [B·KVH, G·T, HD] (a group's queries, head after head, each T rows), keys transposed
// [B·KVH, HD, S] and values [B·KVH, S, HD] over S slots.
type Heads struct{ B, T, H, KVH, HD int }

// KV is a store of attention keys and values over S slots: keys transposed [heads, HD, S] (so
// scores are a plain product) and values [heads, S, HD], the layout of a sampler's cache
// (heads = rows × KVH) and of a prefix cache's block (heads = attention layers × KVH).
type KV[E Float] struct{ KeysT, Values Tensor[E] }

// Rotation is RoPE (or mRoPE) for every token of a pass: token n (row n/T, position n%T)
// rotates by row Angle[n] of the tables Cos and Sin [rows, Half] (Half = the rotary dims / 2;
// the dims past 2·Half pass through).
type Rotation[E Float] struct {
	Cos, Sin []E
	Half     int
	Angle    []int
}

// At is the cosines and sines of token n.
func (r *Rotation[E]) At(n int) (cos, sin []E) {
	a := r.Angle[n]
	return r.Cos[a*r.Half : (a+1)*r.Half], r.Sin[a*r.Half : (a+1)*r.Half]
}

// HeadsIn is one attention layer's queries, keys and values going into the attention layout:
// each head normed (QNorm, KNorm; nil: none) and rotated, queries into QH (and QHT, its
// transpose, for a training pass's backward), keys and values to their slots: Slot[n] for
// token n in KeysT, Values and the sampler's cache (CacheKeysT, CacheValues), its position in
// Keys and ValuesT (a training pass's copies for its backward). An empty destination (Buf and
// dims nil) is not written.
type HeadsIn[E Float] struct {
	Heads
	Q, K, V      Tensor[E] // token layout [N, H·HD], [N, KVH·HD], [N, KVH·HD]
	QNorm, KNorm Tensor[E] // empty: no head norms
	Eps          float64
	GGML         bool // the head norms rounded as ggml-cpu does (float32)
	Rot          Rotation[E]
	Slot         []int
	// Outputs.
	QH, QHT                 Tensor[E]
	QInv, KInv              Tensor[E] // the head norms' 1/rms [N·H], [N·KVH] (training)
	KeysT, Values           Tensor[E]
	Keys, ValuesT           Tensor[E]
	CacheKeysT, CacheValues Tensor[E]
}

// Attention is causal GQA attention over the slots each token sees: token n's queries attend
// to slots 0…Slot[n] of KeysT and Values.
type Attention[E Float] struct {
	Heads
	QH, KeysT, Values Tensor[E]
	Slot              []int
	// KeepProbs: the probabilities [B·KVH, G·T, S] are returned (a training pass's backward
	// reads them); otherwise a backend may compute them in chunks and keep none.
	KeepProbs bool
	// ChunkRows forces chunks of that many query rows (tests; 0: the backend decides).
	ChunkRows int
}

// AttentionGrads is what attention's backward reads from the forward (a training pass: Slot[n]
// is n's position, S = T).
type AttentionGrads[E Float] struct {
	Heads
	QH, QHT, Keys, KeysT, ValuesT Tensor[E]
	Probs                         Tensor[E] // Buf nil: computed again from QH and KeysT
}

// HeadsBack is HeadsIn's backward for a training pass: the gradients of the attention layout's
// queries dQ [B·KVH, G·T, HD], keys dKT [B·KVH, HD, T] and values dVT [B·KVH, HD, T] back to
// token layout through the rotation and the head norms (their inputs Q, K and 1/rms QInv, KInv).
type HeadsBack[E Float] struct {
	Heads
	DQ, DKT, DVT Tensor[E]
	Q, K         Tensor[E]
	QNorm, KNorm Tensor[E]
	QInv, KInv   Tensor[E]
	Rot          Rotation[E]
}

// DeltaDims are a Gated DeltaNet layer's sizes: Hk key heads of DK dims, Hv value heads of DV
// dims (Hv a multiple of Hk), conv kernel K.
type DeltaDims struct{ Hk, Hv, DK, DV, K int }

// DeltaChunk is how many tokens a training pass runs between the recurrent states it keeps: the
// backward pass recomputes one chunk's states from its first and walks them backwards.
const DeltaChunk = 64

// DeltaState is a sampler's per-row state of one DeltaNet layer: each conv channel's last K-1
// inputs, oldest first, Conv [B, C, K-1] (C = 2·Hk·DK + Hv·DV), and the recurrent state
// S [B, Hv, DK, DV].
type DeltaState[E Float] struct {
	Conv, S Tensor[E]
}

// DeltaNet is a Gated DeltaNet layer's core between its projections and out_proj, over B rows
// of T tokens: a causal depthwise conv (taps Conv [C, K], channels q‖k‖v) with SiLU; q and k
// L2-normalised (q also by 1/√DK); β = σ(b), g = −exp(ALog)·softplus(a + DtBias); per value
// head the state S [DK, DV]: S ← e^g·S; u = β·(v − Sᵀk); S ← S + k·uᵀ; o = Sᵀq; then the gated
// RMSNorm per head, Norm ⊙ o/rms(o) ⊙ silu(z). The state starts at zero, or continues State
// (Cont: a decode step, a later chunk of a prefill); with a State, each row's state (and conv
// history) after its own last token Lens[b] (nil: T) is left in State, and a row with no token
// in the pass (Lens[b] = 0) keeps the one it came with.
type DeltaNet[E Float] struct {
	B, T int
	DeltaDims
	Q, K, Value, Z, A, Beta  Tensor[E] // [N, Hk·DK] twice, [N, Hv·DV] twice, [N, Hv] twice
	Conv, DtBias, ALog, Norm Tensor[E]
	Eps                      float64
	State                    *DeltaState[E]
	Cont                     bool
	Lens                     []int
}

// LoRARun is one adapter's LoRA on rows [R0, R1) of a product: y += (x·Aᵀ)·BTs with BTs =
// Scale·Bᵀ [r, out] (A [r, in], B [out, r]).
type LoRARun[E Float] struct {
	R0, R1    int
	A, B, BTs Tensor[E]
	Scale     E
}

// Param is one LoRA matrix of an adapter as its backend keeps it: the weights, the accumulated
// gradient and Adam's two moments (G, M and V empty for a sampler snapshot's weights).
type Param[E Float] struct{ W, G, M, V Tensor[E] }

// AdamW is one step of decoupled-weight-decay Adam (torch.optim.AdamW) in float64 whatever E
// is: g = G·Clip; m ← β1·m + (1−β1)·g; v ← β2·v + (1−β2)·g²; w ← w·(1 − LR·WeightDecay) −
// LR·(m/BC1)/(√(v/BC2) + Eps), BC1 and BC2 the bias corrections 1 − β^t.
type AdamW struct {
	LR, Beta1, Beta2, Eps, WeightDecay float64
	Clip, BC1, BC2                     float64
}
