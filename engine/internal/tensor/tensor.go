// Package tensor holds a step's tensors: matrices in backend shared buffers, the arena that hands
// them out and takes them back, and the matmuls that multiply them (the kernels' GEMM where the
// path has one, GoMLX's Go backend otherwise). It is the only importer of GoMLX.
package tensor

import (
	"fmt"
	"os"
	"reflect"
	"runtime/debug"
	"sync"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/gobackend"
	"github.com/gomlx/compute/shapes"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/kernels"
)

// Training and sampling run op by op: the backend multiplies matrices (its tuned, multi-threaded
// kernels are the fastest we have in Go), and everything between the matmuls is skein's own
// fused Go code (internal/kernels). Inside one big GoMLX graph those element-wise ops ran one op at a
// time on one core, each a full pass over memory: more than half of a training step on the small
// preset. Here each matmul is a one-node executable compiled once per shape, and every tensor is a
// backend "shared buffer", so Go code and matmuls read and write the same memory without copies.

// Mat is a tensor in a backend shared buffer: Buf (a compute.Buffer) goes to matmuls, V is the
// same memory in Go.
type Mat[T kernels.Float] = backend.Tensor[T]

// mmKey names one compiled matmul: [batch,] m×k times k×n, or times (n×k)ᵀ when transB. These
// are the two layouts the Go backend multiplies without transposing an operand first.
type mmKey struct {
	dtype   dtypes.DType
	batch   int // 0: no batch axis
	m, k, n int
	transB  bool
}

// Pool is the CPU's pool of step buffers, shared by an engine's forks, kept for reuse (it also
// compiles and caches GoMLX's one-node DotGeneral executables, the products of paths without the
// kernels' GEMM and of the float64 engine): a training step needs hundreds of megabytes, and fresh memory
// each step costs more than the step's element-wise work (the runtime clears it and the kernel
// takes page faults writing it).
type Pool struct {
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

// NewPool keeps at most maxFree bytes of free step buffers.
func NewPool(maxFree int) (*Pool, error) {
	b, err := sharedBackend()
	if err != nil {
		return nil, fmt.Errorf("engine: starting compute backend: %w", err)
	}
	mm := &Pool{backend: b, execs: map[mmKey]compute.Executable{}, free: map[bufKey][]sharedBuf{}, maxFree: maxFree}
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
	return mm, nil
}

// takeShared returns a shared buffer of the given shape, reused if one is free.
func (mm *Pool) takeShared(dtype dtypes.DType, dims []int) (sharedBuf, error) {
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
func (mm *Pool) giveBack(shared []sharedBuf, outputs []compute.Buffer, endOfStep bool) {
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
func (mm *Pool) trimFree(now time.Time) {
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

func (mm *Pool) dropFree(b sharedBuf) {
	mm.freeBytes -= b.bytes
	_ = b.buf.Finalize()
}

func (mm *Pool) exec(key mmKey) (x compute.Executable, err error) {
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

func (mm *Pool) notePeak(bytes int) {
	mm.mu.Lock()
	mm.peakBytes = max(mm.peakBytes, bytes)
	mm.mu.Unlock()
}

func (mm *Pool) Peak() int {
	mm.mu.Lock()
	defer mm.mu.Unlock()
	return mm.peakBytes
}

// maxMatmuls bounds the compiled matmuls kept; a training shape needs about twenty.
const maxMatmuls = 4096

func (mm *Pool) Stats() CompileStats {
	mm.mu.Lock()
	defer mm.mu.Unlock()
	return mm.compiles
}

// Arena hands out shared buffers for one step and frees them all at its end.
type Arena[T kernels.Float] struct {
	Pool   *Pool
	dtype  dtypes.DType
	owned  []compute.Buffer // matmul outputs
	shared []sharedBuf      // from alloc
	err    error            // first failure; later calls are no-ops and the step returns it
	// live and peak count the bytes the step holds (weights excluded).
	live, peak int
	// into, while set (AllocInto), is the memory the next allocation of exactly its size takes.
	into []T
}

// AllocInto makes the next allocation of len(v) elements v itself (nil: none): a product's
// output written straight into part of a bigger tensor (a group of rows of a mixture of experts'
// grouped products). The caller checks whether the product's output is v, and unsets it.
func (a *Arena[T]) AllocInto(v []T) { a.into = v }

func NewArena[T kernels.Float](mm *Pool) *Arena[T] {
	return &Arena[T]{Pool: mm, dtype: dtypeOf[T]()}
}

// Fail records the step's first failure: later calls are no-ops and the step returns it.
func (a *Arena[T]) Fail(err error) {
	if a.err == nil {
		a.err = err
	}
}

// Err is the step's first failure (nil: none).
func (a *Arena[T]) Err() error { return a.err }

// Alloc returns an uninitialised tensor (the backend reuses memory): callers write every element.
func (a *Arena[T]) Alloc(dims ...int) Mat[T] {
	if a.err != nil {
		return Mat[T]{V: make([]T, Prod(dims)), Dims: dims}
	}
	if a.into != nil && Prod(dims) == len(a.into) {
		v := a.into
		a.into = nil
		return Mat[T]{V: v, Dims: dims} // memory of a tensor the step already holds
	}
	sb, err := a.Pool.takeShared(a.dtype, dims)
	if err != nil {
		a.Fail(fmt.Errorf("engine: allocating %v: %w", dims, err))
		return Mat[T]{V: make([]T, Prod(dims)), Dims: dims}
	}
	a.shared = append(a.shared, sb)
	a.count(Prod(dims))
	return Mat[T]{Buf: sb.buf, V: sb.flat.([]T), Dims: dims}
}

func (a *Arena[T]) Zeros(dims ...int) Mat[T] {
	m := a.Alloc(dims...)
	clear(m.V)
	return m
}

// From copies float64 values into a new tensor.
func (a *Arena[T]) From(v []float64, dims ...int) Mat[T] {
	m := a.Alloc(dims...)
	for i, x := range v {
		m.V[i] = T(x)
	}
	return m
}

// Free returns every buffer of the step; no tensor of the arena may be used afterwards.
func (a *Arena[T]) Free() {
	a.Pool.notePeak(a.peak)
	a.Pool.giveBack(a.shared, a.owned, true)
	a.owned, a.shared = nil, nil
}

func (a *Arena[T]) count(elems int) {
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

// Point is a point in an arena's allocations: how many matmul outputs, and how many buffers.
type Point = backend.Mark

func (a *Arena[T]) Mark() Point { return Point{len(a.owned), len(a.shared)} }

// Release gives back, in the middle of a step, everything allocated between two marks: later
// allocations of the step reuse it. Nothing allocated there may be used afterwards.
func (a *Arena[T]) Release(from, to Point) { a.releaseRange(from, to, nil) }

// ReleaseExcept gives back everything allocated since from except keep.
func (a *Arena[T]) ReleaseExcept(from Point, keep Mat[T]) {
	kb, _ := keep.Buf.(compute.Buffer)
	a.releaseRange(from, a.Mark(), kb)
}

func (a *Arena[T]) releaseRange(from, to Point, keep compute.Buffer) {
	var shared []sharedBuf
	for i := from[1]; i < to[1]; i++ {
		if a.shared[i].buf != nil && (keep == nil || a.shared[i].buf != keep) {
			a.live -= bufBytes(a.shared[i].buf)
			shared = append(shared, a.shared[i])
			a.shared[i] = sharedBuf{}
		}
	}
	var outputs []compute.Buffer
	for i := from[0]; i < to[0]; i++ {
		if a.owned[i] != nil && (keep == nil || a.owned[i] != keep) {
			a.live -= bufBytes(a.owned[i])
			outputs = append(outputs, a.owned[i])
			a.owned[i] = nil
		}
	}
	a.Pool.giveBack(shared, outputs, false)
}

// ReleaseOne gives back one tensor (a matmul output or an allocation) in the middle of a step.
func (a *Arena[T]) ReleaseOne(m Mat[T]) {
	if m.Buf == nil {
		return
	}
	for i := len(a.shared) - 1; i >= 0; i-- {
		if a.shared[i].buf == m.Buf {
			a.live -= a.shared[i].bytes
			a.Pool.giveBack([]sharedBuf{a.shared[i]}, nil, false)
			a.shared[i] = sharedBuf{}
			return
		}
	}
	for i := len(a.owned) - 1; i >= 0; i-- {
		if a.owned[i] != nil && a.owned[i] == m.Buf {
			a.live -= bufBytes(a.owned[i])
			a.Pool.giveBack(nil, []compute.Buffer{a.owned[i]}, false)
			a.owned[i] = nil
			return
		}
	}
}

// MatMulAdd adds x·y (or x·yᵀ when transB) to c, in one pass over c where the kernels' GEMM runs.
func (a *Arena[T]) MatMulAdd(c, x, y Mat[T], transB bool) {
	if a.err != nil {
		return
	}
	if cf, ok := any(c.V).([]float32); ok && kernels.HaveGEMM() {
		m, k := x.Dims[len(x.Dims)-2], x.Dims[len(x.Dims)-1]
		n := y.Dims[len(y.Dims)-1]
		if transB {
			n = y.Dims[len(y.Dims)-2]
		}
		kernels.MatMulAdd(cf, any(x.V).([]float32), any(y.V).([]float32), m, k, n, transB)
		return
	}
	p := a.MatMul(x, y, 0, transB)
	kernels.AddScaled(c.V, p.V, 1)
	a.ReleaseOne(p)
}

// MatMul returns x·y (y given as [k,n]) or x·yᵀ (transB: y given as [n,k]); with batch > 0 both
// operands have a leading batch axis.
func (a *Arena[T]) MatMul(x, y Mat[T], batch int, transB bool) Mat[T] {
	xd, yd := x.Dims[len(x.Dims)-2:], y.Dims[len(y.Dims)-2:]
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
		return Mat[T]{V: make([]T, Prod(outDims)), Dims: outDims}
	}
	if xf, ok := any(x.V).([]float32); ok && kernels.HaveGEMM() {
		out := a.Alloc(outDims...)
		if a.err == nil {
			kernels.MatMul(any(out.V).([]float32), xf, any(y.V).([]float32), max(batch, 1), m, k, n, transB)
		}
		return out
	}
	x2, err := a.Pool.exec(mmKey{dtype: a.dtype, batch: batch, m: m, k: k, n: n, transB: transB})
	if err != nil {
		a.Fail(err)
		return Mat[T]{V: make([]T, Prod(outDims)), Dims: outDims}
	}
	xb, _ := x.Buf.(compute.Buffer)
	yb, _ := y.Buf.(compute.Buffer)
	outs, err := x2.Execute([]compute.Buffer{xb, yb}, nil, 0)
	if err != nil {
		a.Fail(fmt.Errorf("engine: matmul %v·%v: %w", x.Dims, y.Dims, err))
		return Mat[T]{V: make([]T, Prod(outDims)), Dims: outDims}
	}
	flat, err := outs[0].Data()
	if err != nil {
		a.Fail(err)
		return Mat[T]{V: make([]T, Prod(outDims)), Dims: outDims}
	}
	a.owned = append(a.owned, outs[0])
	a.count(Prod(outDims))
	return Mat[T]{Buf: outs[0], V: flat.([]T), Dims: outDims}
}

// Prod is the number of elements of a tensor of the given dimensions.
func Prod(dims []int) int {
	n := 1
	for _, d := range dims {
		n *= d
	}
	return n
}

// CompileStats counts compilations: one one-node matmul per distinct shape.
type CompileStats struct {
	Count int
	Total time.Duration
}

// sharedBackend is GoMLX's Go backend with unlimited worker parallelism. With the default (a pool of
// 2×GOMAXPROCS workers) several large matmuls running at once deadlock when each waits in Saturate
// for workers the others hold (seen with GoMLX graphs at batch 8 × 256 on the small preset; replicas
// training side by side also run matmuls at once). Unlimited parallelism has no pool to exhaust:
// each matmul still splits into GOMAXPROCS workers. SKEIN_GOBACKEND_CONFIG overrides the setting.
var sharedBackend = sync.OnceValues(func() (compute.Backend, error) {
	cfg := os.Getenv("SKEIN_GOBACKEND_CONFIG")
	if cfg == "" {
		cfg = "parallelism=-1"
	}
	// The backend prints its parallelism setting to stdout; keep stdout for our own output.
	stdout := os.Stdout
	if devnull, err := os.Open(os.DevNull); err == nil {
		os.Stdout = devnull
		defer func() { os.Stdout = stdout; devnull.Close() }()
	}
	return gobackend.New(cfg)
})

// dtypeOf is the backend's element type for T.
func dtypeOf[T kernels.Float]() dtypes.DType {
	var zero T
	if any(zero) == any(float64(0)) {
		return dtypes.Float64
	}
	return dtypes.Float32
}

// NewWeight returns a tensor of the given dimensions in a backend shared buffer that lives as long
// as it is referenced (a model's weights), and its size in bytes.
func NewWeight[T kernels.Float](dims ...int) (Mat[T], int, error) {
	b, err := sharedBackend()
	if err != nil {
		return Mat[T]{}, 0, err
	}
	sh := shapes.Make(dtypeOf[T](), dims...)
	buf, flat, err := b.NewSharedBuffer(0, sh)
	if err != nil {
		return Mat[T]{}, 0, err
	}
	v, ok := flat.([]T)
	if !ok {
		return Mat[T]{}, 0, fmt.Errorf("backend gave %T for %v", flat, sh)
	}
	return Mat[T]{Buf: buf, V: v, Dims: dims}, int(sh.Memory()), nil
}
