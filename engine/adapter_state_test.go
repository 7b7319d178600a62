package engine

import (
	"context"
	"math"
	"path/filepath"
	"testing"

	"github.com/skein-ai/skein/safetensors"
)

// The float32 engine keeps an adapter's numbers in float32: 16 bytes a parameter (weights,
// gradient, two moments), the float64 engine 32.
func TestAdapterStateTakesTheEnginesElementSize(t *testing.T) {
	for _, c := range []struct {
		opts Options
		per  int
	}{{Options{}, 16}, {Options{Float64: true}, 32}} {
		e := loadTiny(t, ArchQwen3, c.opts)
		a, err := e.CreateAdapter("a", LoraConfig{Rank: 4, Seed: 1, TrainAttn: true, TrainMLP: true})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, m := range a.mods {
			n += 4 * (m.In + m.Out) // rank 4: A [4, in], B [out, 4]
		}
		if got := e.AdapterBytes(); got != c.per*n {
			t.Errorf("Float64 %v: %d bytes for %d parameters, want %d a parameter (%d)", c.opts.Float64, got, n, c.per, c.per*n)
		}
	}
}

// A training checkpoint written while the state was float64 on every engine (moments and
// accumulator as F64 tensors) loads on the float32 engine: each number narrowed to float32, and
// the next step is AdamW computed from those numbers.
func TestOldFloat64CheckpointLoadsOnFloat32Engine(t *testing.T) {
	e := loadTiny(t, ArchQwen3, Options{})
	cfg := LoraConfig{Rank: 2, Seed: 3, TrainAttn: true}
	a, err := e.CreateAdapter("a", cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := e.SaveAdapter(context.Background(), "a", dir, true); err != nil {
		t.Fatal(err)
	}
	// The optimizer file as the float64 state wrote it: values float32 cannot hold exactly.
	old := func(i, j int, what float64) float64 { return 1e-3 * (what + math.Sin(float64(3*j+i))/3) }
	opt := map[string]safetensors.Tensor{}
	for i, p := range a.params {
		m, v, g := make([]float64, p.size()), make([]float64, p.size()), make([]float64, p.size())
		for j := range m {
			m[j], v[j], g[j] = old(i, j, 1), math.Abs(old(i, j, 2)), old(i, j, 0.5)
		}
		opt[p.name+".exp_avg"] = safetensors.FromFloat64(m, p.shape...)
		opt[p.name+".exp_avg_sq"] = safetensors.FromFloat64(v, p.shape...)
		opt[p.name+".grad_accum"] = safetensors.FromFloat64(g, p.shape...)
	}
	if err := safetensors.WriteFile(filepath.Join(dir, OptimizerFile), opt, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.LoadAdapter(context.Background(), "b", dir, true); err != nil {
		t.Fatal(err)
	}
	b, _ := e.adapter("b")
	p := DefaultAdamParams()
	p.LearningRate, p.WeightDecay = 1e-2, 0.1
	// The expected step, element by element, from the narrowed numbers (torch.optim.AdamW, step 1).
	type elem struct{ w, m, v, g float64 }
	want := make([][]float64, len(b.params))
	var sq float64
	for i, q := range b.params {
		s := hostState(q.s32)
		if s == nil {
			t.Fatalf("%s: not float32 state", q.name)
		}
		for j := range s.w {
			if s.m[j] != float32(old(i, j, 1)) || s.g[j] != float32(old(i, j, 0.5)) {
				t.Fatalf("%s[%d]: moment %v, accumulator %v, want the file's numbers narrowed", q.name, j, s.m[j], s.g[j])
			}
			sq += float64(s.g[j]) * float64(s.g[j])
		}
	}
	for i, q := range b.params {
		s := hostState(q.s32)
		want[i] = make([]float64, len(s.w))
		for j := range s.w {
			x := elem{float64(s.w[j]), float64(s.m[j]), float64(s.v[j]), float64(s.g[j])}
			m := p.Beta1*x.m + (1-p.Beta1)*x.g
			v := p.Beta2*x.v + (1-p.Beta2)*x.g*x.g
			want[i][j] = x.w*(1-p.LearningRate*p.WeightDecay) - p.LearningRate*(m/(1-p.Beta1))/(math.Sqrt(v/(1-p.Beta2))+p.Eps)
		}
	}
	res, err := e.OptimStep(context.Background(), "b", p)
	if err != nil {
		t.Fatal(err)
	}
	if got := res["grad_norm:mean"]; math.Abs(got-math.Sqrt(sq)) > 1e-12*math.Sqrt(sq) {
		t.Errorf("grad norm %v, want %v", got, math.Sqrt(sq))
	}
	for i, q := range b.params {
		for j, w := range hostOf(q.s32.w) {
			if w != float32(want[i][j]) {
				t.Fatalf("%s[%d]: %v after the step, want %v", q.name, j, w, float32(want[i][j]))
			}
		}
	}
	// Saved again, the state is F32 and reads back bit for bit.
	dir2 := t.TempDir()
	if err := e.SaveAdapter(context.Background(), "b", dir2, true); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.ReadFile(filepath.Join(dir2, OptimizerFile))
	if err != nil {
		t.Fatal(err)
	}
	q := b.params[0]
	mt := f.Tensors[q.name+".exp_avg"]
	if mt.DType != "F32" {
		t.Fatalf("moments saved as %s, want F32", mt.DType)
	}
	got, _ := mt.Float32()
	for j, v := range got {
		if v != hostOf(q.s32.m)[j] {
			t.Fatalf("saved moment %d: %v, want %v", j, v, hostOf(q.s32.m)[j])
		}
	}
	wf, err := safetensors.ReadFile(filepath.Join(dir2, AdapterWeightsFile))
	if err != nil {
		t.Fatal(err)
	}
	if dt := wf.Tensors[q.name].DType; dt != "F32" {
		t.Errorf("adapter weights saved as %s, want F32 as before", dt)
	}
}
