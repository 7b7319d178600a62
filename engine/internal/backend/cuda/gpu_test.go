package cuda

import (
	"math"
	"math/rand"
	"testing"
)

// TestLocateHere logs where each library would be loaded from on this machine.
func TestLocateHere(t *testing.T) {
	for what, p := range Locate() {
		t.Logf("%s: %s", what, p)
	}
}

// gpu is a test's GPU: the kernels compiled for it and loaded.
type gpu struct {
	t   *testing.T
	c   *Context
	fns map[string]Function
}

// gpuOrSkip opens GPU 0 and loads every kernel file compiled for it; skipped without a GPU.
func gpuOrSkip(t *testing.T) *gpu {
	t.Helper()
	dev, err := Open(0)
	if err != nil {
		t.Skipf("skipped: no GPU: %v", err)
	}
	n := nvrtcOrSkip(t)
	t.Logf("%v; NVRTC %s at %s", dev.Info, n.Version(), n.Path)
	c, err := dev.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	g := &gpu{t: t, c: c, fns: map[string]Function{}}
	for _, s := range Sources() {
		comp, err := n.Compile(s.Name, s.Text, Headers(), CompileOptions{Arch: dev.Arch(), Verbose: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range ParsePtxasLog(comp.Log) {
			t.Logf("%v", r)
		}
		m, err := c.Load(comp)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range s.Entries() {
			f, err := m.Function(e)
			if err != nil {
				t.Fatal(err)
			}
			g.fns[e] = f
		}
	}
	return g
}

func up[T any](g *gpu, v []T) DevPtr {
	g.t.Helper()
	var z T
	p, err := g.c.Alloc(len(v) * int(sizeOf(z)))
	if err != nil {
		g.t.Fatal(err)
	}
	if err := CopyIn(g.c, p, v); err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { g.c.Free(p) })
	return p
}

func down[T any](g *gpu, p DevPtr, n int) []T {
	g.t.Helper()
	out := make([]T, n)
	if err := CopyOut(g.c, out, p); err != nil {
		g.t.Fatal(err)
	}
	return out
}

func sizeOf(v any) uintptr {
	switch v.(type) {
	case float32, int32, uint32:
		return 4
	case float64, int64:
		return 8
	case uint16:
		return 2
	}
	panic("sizeOf")
}

func (g *gpu) launch(name string, grid, block int, args ...any) {
	g.t.Helper()
	f, ok := g.fns[name]
	if !ok {
		g.t.Fatalf("no kernel %s", name)
	}
	if err := f.Launch(grid, block, args...); err != nil {
		g.t.Fatal(err)
	}
}

// near reports the worst |got − want| / (1 + |want|) and fails past tol.
func near[T float32 | float64](t *testing.T, what string, got []T, want []float64, tol float64) {
	t.Helper()
	worst, at := 0.0, -1
	for i := range want {
		e := math.Abs(float64(got[i])-want[i]) / (1 + math.Abs(want[i]))
		if e > worst || math.IsNaN(e) {
			worst, at = e, i
		}
	}
	if worst > tol || math.IsNaN(worst) {
		t.Errorf("%s: error %.3g at %d (got %v, want %v), tolerance %.3g", what, worst, at, got[at], want[at], tol)
	} else {
		t.Logf("%s: max error %.3g", what, worst)
	}
}

func randF32(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return v
}

func bf16of(f float32) uint16 {
	b := math.Float32bits(f)
	return uint16((b + 0x7fff + ((b >> 16) & 1)) >> 16)
}
func f32ofBF16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// TestKernelsOnGPU runs every kernel on GPU 0 against float64 references written from the CPU
// backend's doc comments. Skipped without a GPU.
func TestKernelsOnGPU(t *testing.T) {
	g := gpuOrSkip(t)
	r := rand.New(rand.NewSource(35))
	const tol = 2e-5

	t.Run("rmsnorm", func(t *testing.T) {
		g.t = t
		rows, d, eps := 7, 1000, 1e-6
		x, w, dy := randF32(r, rows*d, 1), randF32(r, d, 0.3), randF32(r, rows*d, 1)
		for i := range w {
			w[i] += 1
		}
		px, pw, pdy := up(g, x), up(g, w), up(g, dy)
		py, pinv := up(g, make([]float32, rows*d)), up(g, make([]float32, rows))
		pyb := up(g, make([]uint16, rows*d))
		g.launch("rmsnorm_fwd", rows, 256, px, pw, py, pinv, int32(d), float32(eps))
		g.launch("rmsnorm_fwd_bf16", rows, 128, px, pw, pyb, pinv, int32(d), float32(eps))
		wantY, wantInv := make([]float64, rows*d), make([]float64, rows)
		wantDx := make([]float64, rows*d)
		for rr := 0; rr < rows; rr++ {
			ss, dot := 0.0, 0.0
			for i := 0; i < d; i++ {
				v := float64(x[rr*d+i])
				ss += v * v
				dot += float64(dy[rr*d+i]) * float64(w[i]) * v
			}
			inv := 1 / math.Sqrt(ss/float64(d)+eps)
			wantInv[rr] = inv
			c := inv * inv * inv * dot / float64(d)
			for i := 0; i < d; i++ {
				wantY[rr*d+i] = float64(x[rr*d+i]) * inv * float64(w[i])
				wantDx[rr*d+i] = inv*float64(dy[rr*d+i])*float64(w[i]) - float64(x[rr*d+i])*c
			}
		}
		near(t, "rmsnorm_fwd y", down[float32](g, py, rows*d), wantY, tol)
		near(t, "rmsnorm_fwd inv", down[float32](g, pinv, rows), wantInv, tol)
		yb := down[uint16](g, pyb, rows*d)
		yf := make([]float32, len(yb))
		for i, h := range yb {
			yf[i] = f32ofBF16(h)
		}
		near(t, "rmsnorm_fwd_bf16 y", yf, wantY, 1.0/256)
		pdx := up(g, make([]float32, rows*d))
		g.launch("rmsnorm_bwd", rows, 256, pdy, px, pinv, pw, pdx, int32(d), int32(0))
		near(t, "rmsnorm_bwd dx", down[float32](g, pdx, rows*d), wantDx, tol)
		g.launch("rmsnorm_bwd", rows, 64, pdy, px, pinv, pw, pdx, int32(d), int32(1))
		for i := range wantDx {
			wantDx[i] *= 2
		}
		near(t, "rmsnorm_bwd dx accumulated", down[float32](g, pdx, rows*d), wantDx, tol)
	})

	t.Run("silu_gate", func(t *testing.T) {
		g.t = t
		n := 10007
		gate, upv, da := randF32(r, n, 3), randF32(r, n, 1), randF32(r, n, 1)
		pg, pu, pda := up(g, gate), up(g, upv), up(g, da)
		psig, pout := up(g, make([]float32, n)), up(g, make([]float32, n))
		pdg, pdu := up(g, make([]float32, n)), up(g, make([]float32, n))
		g.launch("silu_gate_fwd", 8, 128, pg, pu, psig, pout, int64(n))
		g.launch("silu_gate_bwd", 8, 128, pda, pg, pu, psig, pdg, pdu, int64(n))
		ws, wo, wdg, wdu := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
		for i := range n {
			gg := float64(gate[i])
			s := 1 / (1 + math.Exp(-gg))
			ws[i], wo[i] = s, gg*s*float64(upv[i])
			wdg[i] = float64(da[i]) * float64(upv[i]) * s * (1 + gg*(1-s))
			wdu[i] = float64(da[i]) * gg * s
		}
		near(t, "silu_gate_fwd sig", down[float32](g, psig, n), ws, tol)
		near(t, "silu_gate_fwd out", down[float32](g, pout, n), wo, tol)
		near(t, "silu_gate_bwd dgate", down[float32](g, pdg, n), wdg, tol)
		near(t, "silu_gate_bwd dup", down[float32](g, pdu, n), wdu, tol)
	})

	t.Run("add", func(t *testing.T) {
		g.t = t
		n := 5000
		dst, src := randF32(r, n, 1), randF32(r, n, 1)
		srcb := make([]uint16, n)
		for i := range srcb {
			srcb[i] = bf16of(float32(r.NormFloat64()))
		}
		pd, ps, psb := up(g, dst), up(g, src), up(g, srcb)
		g.launch("add_f32", 3, 256, pd, ps, int64(n))
		g.launch("add_bf16_f32", 3, 256, pd, psb, int64(n))
		want := make([]float64, n)
		for i := range want {
			want[i] = float64(dst[i]+src[i]) + float64(f32ofBF16(srcb[i]))
		}
		near(t, "add_f32 + add_bf16_f32", down[float32](g, pd, n), want, 1e-6)
	})

	t.Run("softmax_causal", func(t *testing.T) {
		g.t = t
		B, KVH, G, T, S := 2, 2, 2, 5, 9
		rowsPerSeq := KVH * G * T
		rows := B * rowsPerSeq
		slot := make([]int32, B*T)
		for b := range B {
			for tt := range T {
				slot[b*T+tt] = int32(tt + 3*(1-b)) // row 0 sees 3 slots more (a cache), row 1 is plain causal
			}
		}
		x := randF32(r, rows*S, 2)
		scale := 1 / math.Sqrt(64)
		px, ps := up(g, x), up(g, slot)
		g.launch("softmax_causal", rows, 32, px, ps, int32(S), int32(T), int32(rowsPerSeq), float32(scale))
		want := make([]float64, rows*S)
		for rr := range rows {
			lim := int(slot[(rr/rowsPerSeq)*T+rr%T])
			m := math.Inf(-1)
			for j := 0; j <= lim; j++ {
				m = math.Max(m, scale*float64(x[rr*S+j]))
			}
			s := 0.0
			for j := 0; j <= lim; j++ {
				s += math.Exp(scale*float64(x[rr*S+j]) - m)
			}
			for j := 0; j <= lim; j++ {
				want[rr*S+j] = math.Exp(scale*float64(x[rr*S+j])-m) / s
			}
		}
		near(t, "softmax_causal", down[float32](g, px, rows*S), want, tol)
	})

	t.Run("loss", func(t *testing.T) {
		g.t = t
		N, V := 5, 3001
		logits := randF32(r, N*V, 4)
		target := []int32{0, 17, 3000, 1234, 5}
		dlp := []float64{1, -0.5, 0, 2, 1}
		pl, pt := up(g, logits), up(g, target)
		plp, pse := up(g, make([]float64, N)), up(g, make([]float64, N))
		g.launch("target_logprobs", N, 256, pl, pt, int32(V), plp, pse)
		wantLp, wantSe, wantRow, wantGrad := make([]float64, N), make([]float64, N), make([]float64, N*V), make([]float64, N*V)
		for rr := range N {
			m := math.Inf(-1)
			for j := range V {
				m = math.Max(m, float64(logits[rr*V+j]))
			}
			s := 0.0
			for j := range V {
				e := math.Exp(float64(logits[rr*V+j]) - m)
				wantRow[rr*V+j] = e
				s += e
			}
			wantSe[rr] = s
			wantLp[rr] = float64(logits[rr*V+int(target[rr])]) - m - math.Log(s)
			for j := range V {
				oh := 0.0
				if j == int(target[rr]) {
					oh = 1
				}
				wantGrad[rr*V+j] = dlp[rr] * (oh - wantRow[rr*V+j]/s)
			}
		}
		near(t, "target_logprobs lp", down[float64](g, plp, N), wantLp, tol)
		near(t, "target_logprobs sumExp", down[float64](g, pse, N), wantSe, tol)
		near(t, "target_logprobs rows", down[float32](g, pl, N*V), wantRow, tol)
		g.launch("logits_grad", N, 256, pl, up(g, dlp), pse, pt, int32(V))
		near(t, "logits_grad", down[float32](g, pl, N*V), wantGrad, tol)
	})

	t.Run("adamw", func(t *testing.T) {
		g.t = t
		n := 4099
		w, gr, m, v := randF32(r, n, 0.1), randF32(r, n, 0.01), randF32(r, n, 0.001), make([]float32, n)
		for i := range v {
			v[i] = float32(math.Abs(r.NormFloat64()) * 1e-5)
		}
		lr, b1, b2, eps, wd, clip := 1e-3, 0.9, 0.999, 1e-8, 0.01, 0.5
		step := 3.0
		bc1, bc2 := 1-math.Pow(b1, step), 1-math.Pow(b2, step)
		pw, pg, pm, pv := up(g, w), up(g, gr), up(g, m), up(g, v)
		pbad := up(g, []uint32{0})
		g.launch("adamw_step", 4, 256, pw, pg, pm, pv, int64(n), lr, b1, b2, eps, wd, bc1, bc2, clip, int32(0), pbad)
		if bad := down[uint32](g, pbad, 1)[0]; bad != 0 {
			t.Errorf("check pass counted %d non-finite", bad)
		}
		if got := down[float32](g, pw, n); got[0] != w[0] || got[n-1] != w[n-1] {
			t.Error("the check pass changed weights")
		}
		g.launch("adamw_step", 4, 256, pw, pg, pm, pv, int64(n), lr, b1, b2, eps, wd, bc1, bc2, clip, int32(1), pbad)
		ww, wm, wv := make([]float64, n), make([]float64, n), make([]float64, n)
		for i := range n {
			gi := float64(gr[i]) * clip
			mf := b1*float64(m[i]) + (1-b1)*gi
			vf := b2*float64(v[i]) + (1-b2)*gi*gi
			wf := float64(w[i]) * (1 - lr*wd)
			ww[i] = float64(float32(wf - lr*(mf/bc1)/(math.Sqrt(vf/bc2)+eps)))
			wm[i], wv[i] = float64(float32(mf)), float64(float32(vf))
		}
		near(t, "adamw_step w", down[float32](g, pw, n), ww, 1e-7)
		near(t, "adamw_step m", down[float32](g, pm, n), wm, 1e-7)
		near(t, "adamw_step v", down[float32](g, pv, n), wv, 1e-7)
		// A huge learning rate overflows float32: the check pass counts it.
		g.launch("adamw_step", 4, 256, pw, pg, pm, pv, int64(n), 1e40, b1, b2, eps, 0.0, bc1, bc2, clip, int32(0), pbad)
		if bad := down[uint32](g, pbad, 1)[0]; bad == 0 {
			t.Error("check pass missed an overflow")
		}
		psum := up(g, []float64{0})
		g.launch("grad_sumsq", 3, 128, pg, int64(n), psum)
		ss := 0.0
		for _, x := range gr {
			ss += float64(x) * float64(x)
		}
		near(t, "grad_sumsq", down[float64](g, psum, 1), []float64{ss}, 1e-12)
	})
}
