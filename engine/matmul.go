package engine

import (
	"fmt"
	"github.com/skein-ai/skein/engine/internal/kernels"
	"reflect"
	"runtime/debug"
	"sync"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
)

// Training and sampling run op by op: the backend multiplies matrices (its tuned, multi-threaded
// kernels are the fastest we have in Go), and everything between the matmuls is skein's own
// fused Go code (kernels.go). Inside one big GoMLX graph those element-wise ops ran one op at a
// time on one core, each a full pass over memory: more than half of a training step on the small
// preset. Here each matmul is a one-node executable compiled once per shape, and every tensor is a
// backend "shared buffer", so Go code and matmuls read and write the same memory without copies.

// float is the element type of a pass: float32 in production, float64 for gradient checks.
type float = kernels.Float

// mat is a tensor in a backend shared buffer: buf goes to matmuls, v is the same memory in Go.
type mat[T float] struct {
	buf  compute.Buffer
	v    []T
	dims []int
}

// mmKey names one compiled matmul: [batch,] m×k times k×n, or times (n×k)ᵀ when transB. These
// are the two layouts the Go backend multiplies without transposing an operand first.
type mmKey struct {
	dtype   dtypes.DType
	batch   int // 0: no batch axis
	m, k, n int
	transB  bool
}

// matmuls compiles and caches one-node DotGeneral executables, shared by an engine's forks, and
// keeps the step buffers for reuse: a training step needs hundreds of megabytes, and fresh memory
// each step costs more than the step's element-wise work (the runtime clears it and the kernel
// takes page faults writing it).
type matmuls struct {
	backend  compute.Backend
	mu       sync.Mutex
	execs    map[mmKey]compute.Executable
	compiles CompileStats
	free     map[bufKey][]sharedBuf
	// freeBytes is what the free lists hold; at most maxFree, and nothing idle for maxIdle.
	freeBytes int
	maxFree   int
	// peakBytes is the most memory one step has held.
	peakBytes int
	// putBuffer hands a matmul's output back to the backend's own pool (nil if this backend has
	// no such method), where the next matmul of that size takes it.
	putBuffer func(compute.Buffer)
}

// bufKey is a buffer's dtype and dimensions: a buffer keeps the shape it was made with.
type bufKey struct {
	dtype dtypes.DType
	dims  string
}

type sharedBuf struct {
	buf      compute.Buffer
	flat     any
	key      bufKey
	bytes    int
	returned time.Time // when it was last given back
}

// maxIdle is how long a free buffer is kept unused: long enough for an RL loop's sampling
// between two training steps, short enough that memory of old shapes goes back.
const maxIdle = 2 * time.Minute

// newMatmuls keeps at most maxFree bytes of free step buffers.
func newMatmuls(b compute.Backend, maxFree int) *matmuls {
	mm := &matmuls{backend: b, execs: map[mmKey]compute.Executable{}, free: map[bufKey][]sharedBuf{}, maxFree: maxFree}
	// The Go backend's PutBuffer is an exported method of an internal type, reachable only by
	// reflection; without it outputs are finalized and their memory left to the garbage collector.
	if m := reflect.ValueOf(b).MethodByName("PutBuffer"); m.IsValid() && m.Type().NumIn() == 1 {
		in := m.Type().In(0)
		mm.putBuffer = func(buf compute.Buffer) {
			v := reflect.ValueOf(buf)
			if !v.Type().AssignableTo(in) {
				_ = buf.Finalize()
				return
			}
			m.Call([]reflect.Value{v})
		}
	}
	return mm
}

// takeShared returns a shared buffer of the given shape, reused if one is free.
func (mm *matmuls) takeShared(dtype dtypes.DType, dims []int) (sharedBuf, error) {
	key := bufKey{dtype, fmt.Sprint(dims)}
	mm.mu.Lock()
	if l := mm.free[key]; len(l) > 0 {
		b := l[len(l)-1]
		mm.free[key] = l[:len(l)-1]
		mm.freeBytes -= b.bytes
		mm.mu.Unlock()
		return b, nil
	}
	mm.mu.Unlock()
	buf, flat, err := mm.backend.NewSharedBuffer(0, shapes.Make(dtype, dims...))
	return sharedBuf{buf: buf, flat: flat, key: key, bytes: int(shapes.Make(dtype, dims...).Memory())}, err
}

// giveBack returns buffers: shared ones to our free lists, matmul outputs to the backend. At the
// end of a pass, free buffers idle for maxIdle are dropped, and then the least recently returned
// ones while the lists hold more than maxFree bytes.
func (mm *matmuls) giveBack(shared []sharedBuf, outputs []compute.Buffer, endOfStep bool) {
	now := time.Now()
	mm.mu.Lock()
	for _, b := range shared {
		if b.buf == nil {
			continue
		}
		b.returned = now
		mm.free[b.key] = append(mm.free[b.key], b)
		mm.freeBytes += b.bytes
	}
	if endOfStep {
		mm.trimFree(now)
	}
	mm.mu.Unlock()
	for _, b := range outputs {
		switch {
		case b == nil:
		case mm.putBuffer != nil:
			mm.putBuffer(b)
		default:
			_ = b.Finalize()
		}
	}
}

// trimFree drops idle free buffers, then the oldest while over maxFree. Each list is in return
// order, oldest first. Called with mm.mu held.
func (mm *matmuls) trimFree(now time.Time) {
	for k, l := range mm.free {
		i := 0
		for i < len(l) && now.Sub(l[i].returned) > maxIdle {
			mm.dropFree(l[i])
			i++
		}
		mm.free[k] = l[i:]
	}
	for mm.freeBytes > mm.maxFree {
		var oldest bufKey
		found := false
		for k, l := range mm.free {
			if len(l) > 0 && (!found || l[0].returned.Before(mm.free[oldest][0].returned)) {
				oldest, found = k, true
			}
		}
		if !found {
			break
		}
		mm.dropFree(mm.free[oldest][0])
		mm.free[oldest] = mm.free[oldest][1:]
	}
	for k, l := range mm.free {
		if len(l) == 0 {
			delete(mm.free, k)
		}
	}
}

func (mm *matmuls) dropFree(b sharedBuf) {
	mm.freeBytes -= b.bytes
	_ = b.buf.Finalize()
}

func (mm *matmuls) exec(key mmKey) (x compute.Executable, err error) {
	mm.mu.Lock()
	defer mm.mu.Unlock()
	if x, ok := mm.execs[key]; ok {
		return x, nil
	}
	if len(mm.execs) >= maxMatmuls {
		// Many shapes over a long run: start over rather than grow without bound. The dropped
		// executables are not finalized: a step on another replica may be running one; the
		// garbage collector frees them after.
		clear(mm.execs)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("engine: compiling matmul %+v: %v\n%s", key, r, debug.Stack())
		}
	}()
	start := time.Now()
	b := mm.backend.Builder(fmt.Sprintf("matmul_%d_%dx%dx%d_%v", key.batch, key.m, key.k, key.n, key.transB))
	f := b.Main()
	lhsDims, lhsContract := []int{key.m, key.k}, 1
	rhsDims, rhsContract := []int{key.k, key.n}, 0
	if key.transB {
		rhsDims, rhsContract = []int{key.n, key.k}, 1
	}
	var batchAxes []int
	if key.batch > 0 {
		lhsDims = append([]int{key.batch}, lhsDims...)
		rhsDims = append([]int{key.batch}, rhsDims...)
		lhsContract++
		rhsContract++
		batchAxes = []int{0}
	}
	lhs, err := f.Parameter("lhs", shapes.Make(key.dtype, lhsDims...), nil)
	if err != nil {
		return nil, err
	}
	rhs, err := f.Parameter("rhs", shapes.Make(key.dtype, rhsDims...), nil)
	if err != nil {
		return nil, err
	}
	out, err := f.DotGeneral(lhs, []int{lhsContract}, batchAxes, rhs, []int{rhsContract}, batchAxes, compute.DotGeneralConfig{})
	if err != nil {
		return nil, err
	}
	if err := f.Return([]compute.Value{out}, nil); err != nil {
		return nil, err
	}
	if x, err = b.Compile(); err != nil {
		return nil, err
	}
	mm.execs[key] = x
	mm.compiles.Count++
	mm.compiles.Total += time.Since(start)
	return x, nil
}

func (mm *matmuls) notePeak(bytes int) {
	mm.mu.Lock()
	mm.peakBytes = max(mm.peakBytes, bytes)
	mm.mu.Unlock()
}

func (mm *matmuls) peak() int {
	mm.mu.Lock()
	defer mm.mu.Unlock()
	return mm.peakBytes
}

// maxMatmuls bounds the compiled matmuls kept; a training shape needs about twenty.
const maxMatmuls = 4096

func (mm *matmuls) stats() CompileStats {
	mm.mu.Lock()
	defer mm.mu.Unlock()
	return mm.compiles
}

// arena hands out shared buffers for one step and frees them all at its end.
type arena[T float] struct {
	mm     *matmuls
	dtype  dtypes.DType
	owned  []compute.Buffer // matmul outputs
	shared []sharedBuf      // from alloc
	err    error            // first failure; later calls are no-ops and the step returns it
	// live and peak count the bytes the step holds (weights excluded).
	live, peak int
}

func newArena[T float](mm *matmuls) *arena[T] {
	var zero T
	dt := dtypes.Float32
	if any(zero) == any(float64(0)) {
		dt = dtypes.Float64
	}
	return &arena[T]{mm: mm, dtype: dt}
}

func (a *arena[T]) fail(err error) {
	if a.err == nil {
		a.err = err
	}
}

// alloc returns an uninitialised tensor (the backend reuses memory): callers write every element.
func (a *arena[T]) alloc(dims ...int) mat[T] {
	if a.err != nil {
		return mat[T]{v: make([]T, prod(dims)), dims: dims}
	}
	sb, err := a.mm.takeShared(a.dtype, dims)
	if err != nil {
		a.fail(fmt.Errorf("engine: allocating %v: %w", dims, err))
		return mat[T]{v: make([]T, prod(dims)), dims: dims}
	}
	a.shared = append(a.shared, sb)
	a.count(prod(dims))
	return mat[T]{buf: sb.buf, v: sb.flat.([]T), dims: dims}
}

func (a *arena[T]) zeros(dims ...int) mat[T] {
	m := a.alloc(dims...)
	clear(m.v)
	return m
}

// from copies float64 values into a new tensor.
func (a *arena[T]) from(v []float64, dims ...int) mat[T] {
	m := a.alloc(dims...)
	for i, x := range v {
		m.v[i] = T(x)
	}
	return m
}

// free returns every buffer of the step; no tensor of the arena may be used afterwards.
func (a *arena[T]) free() {
	a.mm.notePeak(a.peak)
	a.mm.giveBack(a.shared, a.owned, true)
	a.owned, a.shared = nil, nil
}

func (a *arena[T]) count(elems int) {
	a.live += elems * a.dtype.Size()
	a.peak = max(a.peak, a.live)
}

func bufBytes(b compute.Buffer) int {
	sh, err := b.Shape()
	if err != nil {
		return 0
	}
	return int(sh.Memory())
}

// arenaMark is a point in an arena's allocations.
type arenaMark struct{ owned, shared int }

func (a *arena[T]) mark() arenaMark { return arenaMark{len(a.owned), len(a.shared)} }

// release gives back, in the middle of a step, everything allocated between two marks: later
// allocations of the step reuse it. Nothing allocated there may be used afterwards.
func (a *arena[T]) release(from, to arenaMark) { a.releaseRange(from, to, nil) }

// releaseExcept gives back everything allocated since from except keep.
func (a *arena[T]) releaseExcept(from arenaMark, keep mat[T]) {
	a.releaseRange(from, a.mark(), keep.buf)
}

func (a *arena[T]) releaseRange(from, to arenaMark, keep compute.Buffer) {
	var shared []sharedBuf
	for i := from.shared; i < to.shared; i++ {
		if a.shared[i].buf != nil && (keep == nil || a.shared[i].buf != keep) {
			a.live -= bufBytes(a.shared[i].buf)
			shared = append(shared, a.shared[i])
			a.shared[i] = sharedBuf{}
		}
	}
	var outputs []compute.Buffer
	for i := from.owned; i < to.owned; i++ {
		if a.owned[i] != nil && (keep == nil || a.owned[i] != keep) {
			a.live -= bufBytes(a.owned[i])
			outputs = append(outputs, a.owned[i])
			a.owned[i] = nil
		}
	}
	a.mm.giveBack(shared, outputs, false)
}

// releaseOne gives back one tensor (a matmul output or an allocation) in the middle of a step.
func (a *arena[T]) releaseOne(m mat[T]) {
	if m.buf == nil {
		return
	}
	for i := len(a.shared) - 1; i >= 0; i-- {
		if a.shared[i].buf == m.buf {
			a.live -= a.shared[i].bytes
			a.mm.giveBack([]sharedBuf{a.shared[i]}, nil, false)
			a.shared[i] = sharedBuf{}
			return
		}
	}
	for i := len(a.owned) - 1; i >= 0; i-- {
		if a.owned[i] != nil && a.owned[i] == m.buf {
			a.live -= bufBytes(m.buf)
			a.owned[i] = nil
			a.mm.giveBack(nil, []compute.Buffer{m.buf}, false)
			return
		}
	}
}

// matmul returns x·y (y given as [k,n]) or x·yᵀ (transB: y given as [n,k]); with batch > 0 both
// operands have a leading batch axis.
func (a *arena[T]) matmul(x, y mat[T], batch int, transB bool) mat[T] {
	xd, yd := x.dims[len(x.dims)-2:], y.dims[len(y.dims)-2:]
	m, k := xd[0], xd[1]
	n := yd[1]
	if transB {
		n = yd[0]
	}
	outDims := []int{m, n}
	if batch > 0 {
		outDims = []int{batch, m, n}
	}
	if a.err != nil {
		return mat[T]{v: make([]T, prod(outDims)), dims: outDims}
	}
	if xf, ok := any(x.v).([]float32); ok && kernels.HaveGEMM() {
		out := a.alloc(outDims...)
		if a.err == nil {
			kernels.MatMul(any(out.v).([]float32), xf, any(y.v).([]float32), max(batch, 1), m, k, n, transB)
		}
		return out
	}
	x2, err := a.mm.exec(mmKey{dtype: a.dtype, batch: batch, m: m, k: k, n: n, transB: transB})
	if err != nil {
		a.fail(err)
		return mat[T]{v: make([]T, prod(outDims)), dims: outDims}
	}
	outs, err := x2.Execute([]compute.Buffer{x.buf, y.buf}, nil, 0)
	if err != nil {
		a.fail(fmt.Errorf("engine: matmul %v·%v: %w", x.dims, y.dims, err))
		return mat[T]{v: make([]T, prod(outDims)), dims: outDims}
	}
	flat, err := outs[0].Data()
	if err != nil {
		a.fail(err)
		return mat[T]{v: make([]T, prod(outDims)), dims: outDims}
	}
	a.owned = append(a.owned, outs[0])
	a.count(prod(outDims))
	return mat[T]{buf: outs[0], v: flat.([]T), dims: outDims}
}

func prod(dims []int) int {
	n := 1
	for _, d := range dims {
		n *= d
	}
	return n
}
