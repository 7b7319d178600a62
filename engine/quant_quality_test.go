package engine

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// A LoRA trained over a Q4_K base learns as one over the float32 base: the same data (generated
// stories), the same steps, and the loss curves stay close, the final losses within 5%. Both
// curves must also fall (a LoRA that learned nothing would match trivially).
func TestQuantizedBaseTrainsLikeFloat32(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "m")
	if err := InitTiny(dir, ArchQwen3, "tiny-quant", 1); err != nil {
		t.Fatal(err)
	}
	curves := map[string][]float64{}
	for _, prec := range []string{PrecisionF32, "q4_k"} {
		e, err := Load(dir, Options{Precision: prec})
		if err != nil {
			t.Fatal(err)
		}
		ids := e.Tokenizer.Encode(SyntheticStories(60, 1))
		adam := DefaultAdamParams()
		adam.LearningRate = 3e-3
		c, err := e.LossCurve(ids, LoraConfig{Rank: 8, Seed: 1, TrainAttn: true, TrainMLP: true}, adam, 4, 64, 30)
		if err != nil {
			t.Fatal(err)
		}
		curves[prec] = c
	}
	f, q := curves[PrecisionF32], curves["q4_k"]
	var line strings.Builder
	for i := range f {
		fmt.Fprintf(&line, " %.3f/%.3f", f[i], q[i])
	}
	t.Logf("loss per token, f32/q4_k:%s", line.String())
	last := len(f) - 1
	for name, c := range curves {
		if c[last] > 0.8*c[0] {
			t.Fatalf("%s: loss %v at the start, %v at the end: it did not learn", name, c[0], c[last])
		}
	}
	if d := math.Abs(q[last]-f[last]) / f[last]; d > 0.05 {
		t.Fatalf("final loss %v over q4_k, %v over f32: %.1f%% apart, more than 5%%", q[last], f[last], 100*d)
	}
	for i := range f {
		if d := math.Abs(q[i]-f[i]) / f[i]; d > 0.10 {
			t.Fatalf("step %d: loss %v over q4_k, %v over f32: %.1f%% apart, more than 10%%", i, q[i], f[i], 100*d)
		}
	}
}

// BenchmarkQuantizedBaseLossCurve prints the loss curves of a LoRA (rank 16, attention and MLP)
// trained over the small preset in float32, Q8_0 and Q4_K, the same generated stories and steps
// (SKEIN_CURVE_STEPS, default 40), and the final losses' distance from float32's. Run:
//
//	go test ./engine -run X -bench QuantizedBaseLossCurve -benchtime 1x
func BenchmarkQuantizedBaseLossCurve(b *testing.B) {
	steps := 40
	if v, err := strconv.Atoi(os.Getenv("SKEIN_CURVE_STEPS")); err == nil && v > 0 && v <= maxCurveSteps {
		steps = v
	}
	dir := filepath.Join(b.TempDir(), "small")
	if err := InitTiny(dir, ArchQwen2, "small", 1); err != nil {
		b.Fatal(err)
	}
	for range b.N {
		curves := map[string][]float64{}
		precs := []string{PrecisionF32, "q8_0", "q4_k"}
		for _, prec := range precs {
			e, err := Load(dir, Options{Precision: prec})
			if err != nil {
				b.Fatal(err)
			}
			ids := e.Tokenizer.Encode(SyntheticStories(400, 1))
			adam := DefaultAdamParams()
			adam.LearningRate = 2e-3
			c, err := e.LossCurve(ids, LoraConfig{Rank: 16, Seed: 1, TrainAttn: true, TrainMLP: true}, adam, 4, 128, steps)
			if err != nil {
				b.Fatal(err)
			}
			curves[prec] = c
		}
		f := curves[PrecisionF32]
		last := len(f) - 1
		for _, prec := range precs {
			var line strings.Builder
			for _, v := range curves[prec] {
				fmt.Fprintf(&line, " %.3f", v)
			}
			q := curves[prec]
			b.Logf("%-5s final %.4f (%+.2f%% of f32's):%s", prec, q[last], 100*(q[last]-f[last])/f[last], line.String())
			b.ReportMetric(q[last], "final_loss_"+prec)
		}
	}
}
