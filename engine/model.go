package engine

import (
	"fmt"
	"runtime"
	"strings"
	"sync"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/backend/cpu"
	"github.com/skein-ai/skein/engine/internal/num"
	"github.com/skein-ai/skein/engine/internal/quant"
	"github.com/skein-ai/skein/safetensors"
)

// baseModel is what an engine's forks share: the base weights and the backend (compiled
// products, the pool of step buffers).
type baseModel struct {
	cpu     *cpu.Backend
	weights any // *model[float32] or *model[float64], the engine's dtype
	vision  any // *visionTower[float32] or [float64]: a vision-language model's frozen tower (nil: a text model)
	bytes   int // resident size of the weights
	// prefix is the sampler's prefix cache across requests and its counters (never nil; off
	// when its cap is 0), shared by the forks: adapters' identities are process-wide.
	prefix *prefixCache
}

// modelOf is the base model's weights in the pass's element type.
func modelOf[E float](b *baseModel) *model[E] { return b.weights.(*model[E]) }

// model is a base model's weights, resolved at load into typed per-layer structs: passes index
// them, nothing looks a weight up by name while computing.
type model[E float] struct {
	embed   backend.Weight // [V, D] rows looked up (Step.Embed); a tied head multiplies by it
	layers  []decoderLayer[E]
	norm    mat[E] // final RMSNorm
	head    *linear[E]
	linears []*linear[E]          // every linear module, by id
	byPath  map[string]*linear[E] // by HF module path, the names LoRA modules use
	// Mixtures of experts (moe.go): every MoE block, and its experts' LoRA modules by path.
	moes       []*moeFFN[E]
	expertMods map[string]expertSlot
}

// decoderLayer is one transformer block's weights: a token mixer and a feed-forward block, each
// behind its norm (pass.layer).
type decoderLayer[E float] struct {
	inputNorm, postNorm mat[E]
	mix                 mixer[E] // *attentionLayer (softmax attention) or *deltaNetLayer (Gated DeltaNet)
	ffn                 ffn[E]   // denseFFN (SwiGLU) or *moeFFN (a mixture of experts)
}

// attentionLayer is a softmax attention mixer's weights (transformer.go, backward.go).
type attentionLayer[E float] struct {
	q, k, v, o   *linear[E]
	qNorm, kNorm mat[E] // per-head RMSNorm before RoPE (families with headNorm), else empty
}

func (A *attentionLayer[E]) linears() []*linear[E] { return []*linear[E]{A.q, A.k, A.v, A.o} }

// linear is one projection module: y = x·W (+ bias), with a LoRA on it if the adapter has one.
type linear[E float] struct {
	id      int            // index into model.linears and a pass's per-module slices
	path    string         // HF module path, e.g. "model.layers.3.self_attn.q_proj"
	w       backend.Weight // as the backend keeps it; a tied head's is the embedding
	bias    mat[E]         // empty when the module has none
	in, out int
}

func (L *decoderLayer[E]) linears() []*linear[E] {
	return append(L.mix.linears(), L.ffn.linears()...)
}

// loadModel places every weight once in memory, one weight at a time (the host tensors alias
// the file), and resolves them. Weights go into backend shared buffers of the engine's dtype:
// matmuls read them in place and Go code reads the same memory. With bf16 precision the
// projections and the embedding are kept as bf16 bits in Go memory instead, widened per
// product (precision.go, backend/cpu). Linear weights are stored transposed, [in, out]: with few rows (decoding)
// the backend multiplies x·W twice as fast as x·Wᵀ, and for training the two are even. The
// embedding stays [V, D] for the lookup, so a tied head multiplies by it transposed.
func loadModel[E float](opts Options, c *Config, host map[string]safetensors.Tensor) (*model[E], int, error) {
	precision := opts.Precision
	w := map[string]mat[E]{}
	w16 := map[string][]uint16{}
	qw := map[string][]byte{}
	qfs := map[string]*quant.Format{} // each quantized weight's format (a mix has several)
	bytes := 0
	for _, name := range c.modelWeightNames() {
		shape := host[name].Shape
		qf := weightFormat(opts, c, name)
		qfs[name] = qf
		if ef := embeddingFormat(opts, c); ef != nil && name == c.lm()+"embed_tokens.weight" {
			blocks, kept, err := embeddingBlocks(ef, host, name, precision == PrecisionQ4_K_M)
			if err != nil {
				return nil, 0, err
			}
			w[name], qw[name], qfs[name] = mat[E]{Dims: shape}, blocks, kept
			bytes += len(blocks)
			dropHost(host, name)
			continue
		}
		// A GGUF's block tensor: its blocks kept as they are, or dequantized in place (gguf_load.go).
		if blocks, kept, err := ggufHostTensor(host, name, qf, precision == PrecisionQ4_K_M); err != nil {
			return nil, 0, err
		} else if blocks != nil {
			w[name], qw[name], qfs[name] = mat[E]{Dims: []int{shape[1], shape[0]}}, blocks, kept
			bytes += len(blocks)
			delete(host, name)
			continue
		}
		if qf != nil && isLinearWeight(name) {
			// Quantized from float32, rows of the file's [out, in] layout along in, as GGUF does.
			blocks, err := quantizeHost(qf, host[name])
			if err != nil {
				return nil, 0, fmt.Errorf("engine: weight %s %v for %s (rows must be whole blocks of %d): %w", name, shape, qf.Name, qf.Block, err)
			}
			w[name], qw[name] = mat[E]{Dims: []int{shape[1], shape[0]}}, blocks
			bytes += len(blocks)
			dropHost(host, name)
			continue
		}
		// A VL model's embedding is the LM's, under its own prefix.
		embedding := name == c.lm()+"embed_tokens.weight"
		if precision == PrecisionBF16 && (keepsBF16(name) || embedding) {
			v, err := bf16Weight(host[name])
			if err != nil {
				return nil, 0, fmt.Errorf("engine: weight %s: %w", name, err)
			}
			if isLinearWeight(name) {
				v, shape = num.TransposeBF16(v, shape[0], shape[1]), []int{shape[1], shape[0]}
			}
			w[name], w16[name] = mat[E]{Dims: shape}, v
			bytes += 2 * len(v)
			dropHost(host, name)
			continue
		}
		v, err := host[name].Float64()
		if err != nil {
			return nil, 0, fmt.Errorf("engine: weight %s: %w", name, err)
		}
		if isLinearWeight(name) {
			t := transpose2D(hostTensor{shape: shape, data: v})
			v, shape = t.data, t.shape
		}
		if c.plusOneNorm(name) { // (1 + w), in float64 before the engine's dtype rounds it
			for i := range v {
				v[i]++
			}
		}
		t, size, err := cpu.NewValues[E](v, shape...)
		if err != nil {
			return nil, 0, fmt.Errorf("engine: placing weight %s: %w", name, err)
		}
		w[name] = t
		bytes += size
		dropHost(host, name)
	}
	return resolveModel(c, w, w16, qw, qfs), bytes, nil
}

// quantizeHost quantizes a 2-D host tensor's rows into qf's blocks on every core, a few rows
// widened to float32 at a time (quant.QuantizeRows): an 8B shape's weights took 861 s on one
// goroutine, and its head widened whole was 2.1 GB of float32 beside the model.
func quantizeHost(qf *quant.Format, t safetensors.Tensor) ([]byte, error) {
	if len(t.Shape) != 2 || t.Shape[0] <= 0 || t.Shape[1] <= 0 {
		return nil, fmt.Errorf("shape %v is not a matrix", t.Shape)
	}
	rows, n := t.Shape[0], t.Shape[1]
	es := len(t.Data) / (rows * n) // bytes per element; the file's reader checked data against shape
	if es == 0 || es*rows*n != len(t.Data) {
		return nil, fmt.Errorf("%d bytes for shape %v", len(t.Data), t.Shape)
	}
	return qf.QuantizeRows(rows, n, func(dst []float32, r0, r1 int) error {
		part := safetensors.Tensor{DType: t.DType, Shape: []int{r1 - r0, n}, Data: t.Data[r0*n*es : r1*n*es]}
		err := part.Float32Into(dst)
		// The rows' pages of a mapped file go back as soon as they are converted, not with the
		// whole tensor: an 8B shape's head is 1.05 GB of bf16 file, resident beside the model
		// until its last row was quantized. A page shared with a neighbouring chunk that another
		// worker still reads is read from the file again (a clean, read-only mapping).
		releaseHost(part.Data)
		return err
	})
}

// dropHost forgets a host tensor loadModel has converted, giving back its pages of a mapped file
// (releaseHost). Every 256 MB of converted tensors the garbage of their conversion (float32 or
// untransposed copies, as big as the tensors or twice) is collected at once: left to the
// collector's pace, a load's garbage grows with what it has converted, up to the size of the
// model again (the 1b preset in bf16 reached 4.6 GB of resident memory for 2.1 GB of weights).
func dropHost(host map[string]safetensors.Tensor, name string) {
	n := len(host[name].Data)
	releaseHost(host[name].Data)
	delete(host, name)
	noteGarbage(n)
}

// noteGarbage counts n bytes a load has let go of and collects every 256 MB of them.
func noteGarbage(n int) {
	hostGarbage.Lock()
	hostGarbage.n += n
	collect := hostGarbage.n >= 256<<20
	if collect {
		hostGarbage.n = 0
	}
	hostGarbage.Unlock()
	if collect {
		runtime.GC()
	}
}

// hostGarbage counts the bytes converted since the last collection (dropHost).
var hostGarbage struct {
	sync.Mutex
	n int
}

// resolveModel sorts named weights (all of c.weightNames(), checked by loadWeights; those kept
// in bf16 also in w16, quantized ones in qw with their formats in qfs) into the model's structs,
// each weight handed to the backend to keep as it multiplies it.
func resolveModel[E float](c *Config, w map[string]mat[E], w16 map[string][]uint16, qw map[string][]byte, qfs map[string]*quant.Format) *model[E] {
	embedding := c.lm() + "embed_tokens.weight"
	weight := func(name string) backend.Weight {
		h := cpu.Host[E]{F: w[name], BF16: w16[name], OutIn: name == embedding}
		if b, ok := qw[name]; ok {
			// Blocks are rows of in, [out, in] (an embedding's [V, D] too: a tied head
			// multiplies by the same blocks).
			h.Blocks, h.Format, h.OutIn = b, qfs[name], false
			if name == embedding {
				h.F.Dims = []int{h.F.Dims[1], h.F.Dims[0]}
			}
		}
		wt := cpu.NewWeight(h)
		if h.BF16 != nil && cpu.Inspect(wt).Pairs != nil {
			// Packed once for the bf16 unit, replacing the rows: the same bytes. The rows are
			// let go of at once (the map held them all until the load ended: the weights twice,
			// 4.2 GB for the 1b preset's 2.1).
			delete(w16, name)
			noteGarbage(2 * len(h.BF16))
		}
		return wt
	}
	m := &model[E]{embed: weight(embedding), norm: w[c.lm()+"norm.weight"], byPath: map[string]*linear[E]{}}
	lin := func(path string) *linear[E] {
		l := &linear[E]{id: len(m.linears), path: path}
		if path == "lm_head" && c.TieWordEmbeddings {
			l.w = m.embed
		} else {
			l.w = weight(path + ".weight")
		}
		l.in, l.out = l.w.Shape()
		if b, ok := w[path+".bias"]; ok {
			l.bias = b
		}
		m.linears = append(m.linears, l)
		m.byPath[path] = l
		return l
	}
	for l := range c.NumHiddenLayers {
		p := c.layerPrefix(l)
		L := decoderLayer[E]{inputNorm: w[p+"input_layernorm.weight"], postNorm: w[p+"post_attention_layernorm.weight"]}
		if c.isDeltaNet(l) {
			a := p + "linear_attn."
			L.mix = &deltaNetLayer[E]{q: lin(a + "in_proj_q"), k: lin(a + "in_proj_k"), v: lin(a + "in_proj_v"),
				z: lin(a + "in_proj_z"), a: lin(a + "in_proj_a"), b: lin(a + "in_proj_b"), out: lin(a + "out_proj"),
				conv: w[a+"conv1d.weight"], dtBias: w[a+"dt_bias"], aLog: w[a+"A_log"], norm: w[a+"norm.weight"]}
		} else {
			A := &attentionLayer[E]{q: lin(p + "self_attn.q_proj"), k: lin(p + "self_attn.k_proj"),
				v: lin(p + "self_attn.v_proj"), o: lin(p + "self_attn.o_proj")}
			if n, ok := w[p+"self_attn.q_norm.weight"]; ok {
				A.qNorm, A.kNorm = n, w[p+"self_attn.k_norm.weight"]
			}
			L.mix = A
		}
		if c.isMoE(l) {
			L.ffn = m.moeBlock(c, p+"mlp.", lin)
		} else {
			L.ffn = denseFFN[E]{gate: lin(p + "mlp.gate_proj"), up: lin(p + "mlp.up_proj"), down: lin(p + "mlp.down_proj")}
		}
		m.layers = append(m.layers, L)
	}
	m.head = lin("lm_head")
	m.finishExperts(c)
	return m
}

// layerPrefix is the HF name prefix of layer l's weights.
func (c *Config) layerPrefix(l int) string { return fmt.Sprintf("%slayers.%d.", c.lm(), l) }

// isLinearWeight reports the weights stored transposed to [in, out] (all projections and an untied lm_head).
func isLinearWeight(name string) bool {
	return strings.HasSuffix(name, "_proj.weight") || name == "lm_head.weight" || strings.Contains(name, ".linear_attn.in_proj_") ||
		isRouterWeight(name)
}

func transpose2D(t hostTensor) hostTensor {
	r, c := t.shape[0], t.shape[1]
	out := make([]float64, len(t.data))
	for i := range r {
		for j := range c {
			out[j*r+i] = t.data[i*c+j]
		}
	}
	return hostTensor{shape: []int{c, r}, data: out}
}
