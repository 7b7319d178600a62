package engine

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/skein-ai/skein/engine/internal/backend/cpu"
	"github.com/skein-ai/skein/engine/internal/kernels"
)

// vlDatum is the fixture's prompt as a cross-entropy datum with its images in loss_fn_inputs
// (twinkle's path): position i predicts token i+1 (the last one token 0).
func vlDatum(c *Config, tokens []int, im *Images) Datum {
	n := len(tokens)
	tg, w := make([]float64, n), make([]float64, n)
	for i := range n - 1 {
		tg[i], w[i] = float64(tokens[i+1]), 1
	}
	in := imageInputs(c, im)
	in["target_tokens"] = TensorInput{DType: "int64", Data: tg}
	in["weights"] = TensorInput{DType: "float32", Data: w}
	return Datum{Tokens: tokens, Inputs: in}
}

// Forward with pixel_values and image_grid_thw in loss_fn_inputs gives the reference's
// logprobs, alone and batched beside a text-only datum.
func TestQwen3VLForwardWithImagesMatchesReference(t *testing.T) {
	ref := loadVLReference(t, "testdata/reference_vl.json")
	e := loadTiny(t, ArchQwen3VL, Options{})
	c := e.Config
	d := vlDatum(c, ref.Tokens, referenceImages(c, ref.Grids))
	text := textDatum(e.Tokenizer.Encode("A plain sentence with no image in it at all."))
	// A small token budget runs each datum of a batch in its own pass (chunks).
	chunked, err := Load(tinyModel(t, ArchQwen3VL), Options{MaxBatchTokens: 32})
	if err != nil {
		t.Fatal(err)
	}
	for k, batch := range [][]Datum{{d}, {text, d}, {d, text, d}} {
		r, err := e.Forward(context.Background(), "", batch, "cross_entropy", nil)
		if k == 2 {
			r, err = chunked.Forward(context.Background(), "", batch, "cross_entropy", nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		if k == 2 && !slices.Equal(r.Logprobs[0], r.Logprobs[2]) {
			t.Fatal("the same datum gave different logprobs in two chunks")
		}
		got := r.Logprobs[len(batch)-1]
		V := ref.Vocab
		for i := range len(ref.Tokens) - 1 {
			row := ref.Logits[i*V : (i+1)*V]
			want := refLogSoftmax(row, ref.Tokens[i+1])
			if math.Abs(got[i]-want) > 1e-4 {
				t.Fatalf("batch of %d: position %d: logprob %.6f, reference %.6f", len(batch), i, got[i], want)
			}
		}
	}
}

func refLogSoftmax(row []float64, target int) float64 {
	m := math.Inf(-1)
	for _, v := range row {
		m = max(m, v)
	}
	var s float64
	for _, v := range row {
		s += math.Exp(v - m)
	}
	return row[target] - m - math.Log(s)
}

// LoRA gradients through a pass with images (placed features, DeepStack, mRoPE angles in the
// backward RoPE) match central finite differences in float64.
func TestQwen3VLGradientsWithImages(t *testing.T) {
	ref := loadVLReference(t, "testdata/reference_vl.json")
	e := loadTiny(t, ArchQwen3VL, Options{Float64: true})
	c := e.Config
	data := []Datum{vlDatum(c, ref.Tokens, referenceImages(c, ref.Grids))}
	a := adapterWithB(t, e, "g", LoraConfig{Rank: 2, Seed: 4, TrainAttn: true, TrainMLP: true}, func(i, j int) float64 { return 0.05 * math.Sin(float64(5*j+i)) })
	if _, err := e.ForwardBackward(context.Background(), "g", data, "cross_entropy", nil); err != nil {
		t.Fatal(err)
	}
	for pi, p := range a.params {
		for _, j := range []int{0, len(hostOf(p.s64.w)) / 2, len(hostOf(p.s64.w)) - 1} {
			orig := hostOf(p.s64.w)[j]
			const h = 1e-6
			var l [2]float64
			for k, x := range []float64{orig + h, orig - h} {
				hostOf(p.s64.w)[j] = x
				r, err := e.Forward(context.Background(), "g", data, "cross_entropy", nil)
				if err != nil {
					t.Fatal(err)
				}
				l[k] = r.Loss
			}
			hostOf(p.s64.w)[j] = orig
			fd := (l[0] - l[1]) / (2 * h)
			if math.Abs(fd-hostOf(p.s64.g)[j]) > 1e-5*(1+math.Abs(fd)) {
				t.Fatalf("param %d (%s) elem %d: autodiff %.10g, finite difference %.10g", pi, p.name, j, hostOf(p.s64.g)[j], fd)
			}
		}
	}
}

// Sampling from a prompt with images: the KV-cache decode steps continue from the
// image-adjusted positions, so each sampled token's logprob is what a full forward pass over
// prompt and continuation gives it; the prompt's logprobs are the reference's.
// Qwen3.5 with images too (its DeltaNet states carried from the prefill with images).
func TestQwen3VLSampleDecodesFromMultimodalPositions(t *testing.T) {
	q35, err := Load(tinyPresetModel(t, ArchQwen3_5, "tiny-vl"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		e   *Engine
		ref string
	}{"qwen3_vl": {loadTiny(t, ArchQwen3VL, Options{}), "testdata/reference_vl.json"}, "qwen3_5": {q35, "testdata/reference_qwen35_vl.json"}} {
		t.Run(name, func(t *testing.T) { checkSampleWithImages(t, c.e, loadVLReference(t, c.ref)) })
	}
}

func checkSampleWithImages(t *testing.T, e *Engine, ref vlReference) {
	c := e.Config
	im := referenceImages(c, ref.Grids)
	seed := int64(3)
	res, err := e.Sample("", SampleRequest{Prompt: ref.Tokens, NumSamples: 2, PromptLogprobs: true, Images: im,
		Params: SampleParams{MaxTokens: 6, Temperature: 1, Seed: &seed}})
	if err != nil {
		t.Fatal(err)
	}
	V := ref.Vocab
	for i := 1; i < len(ref.Tokens); i++ {
		if want := refLogSoftmax(ref.Logits[(i-1)*V:i*V], ref.Tokens[i]); math.Abs(res.PromptLogprobs[i]-want) > 1e-4 {
			t.Fatalf("prompt logprob %d: %.6f, reference %.6f", i, res.PromptLogprobs[i], want)
		}
	}
	for _, seq := range res.Sequences {
		full := append(append([]int(nil), ref.Tokens...), seq.Tokens...)
		r, err := e.Forward(context.Background(), "", []Datum{vlDatum(c, full[:len(full)-1], im)}, "cross_entropy", nil)
		if err != nil {
			t.Fatal(err)
		}
		// vlDatum's targets are the next tokens, so position P-1+k predicts seq.Tokens[k].
		for k, lp := range seq.Logprobs {
			got := r.Logprobs[0][len(ref.Tokens)-1+k]
			if k == len(seq.Logprobs)-1 {
				break // the last target is vlDatum's padding token 0
			}
			if math.Abs(got-lp) > 1e-4 {
				t.Fatalf("sampled token %d: decode logprob %.6f, full pass %.6f", k, lp, got)
			}
		}
	}
}

// Images that do not fit their tokens or their model are a typed input error naming datum and
// field, before any compute; nothing changes.
func TestQwen3VLRejectsBadImages(t *testing.T) {
	ref := loadVLReference(t, "testdata/reference_vl.json")
	e := loadTiny(t, ArchQwen3VL, Options{})
	c := e.Config
	good := func() Datum { return vlDatum(c, ref.Tokens, referenceImages(c, ref.Grids)) }
	pad := *c.ImageTokenID
	cases := map[string]struct {
		edit  func(d *Datum)
		field string
	}{
		"grid bigger than its pad tokens": {func(d *Datum) {
			g := d.Inputs[ImageGridInput]
			g.Data = append([]float64(nil), g.Data...)
			g.Data[5] = 8
			d.Inputs[ImageGridInput] = g
		}, "model_input"},
		"one pad token too few": {func(d *Datum) {
			d.Tokens = append([]int(nil), d.Tokens...)
			for i, t := range d.Tokens {
				if t == pad {
					d.Tokens[i] = 5
					break
				}
			}
		}, "model_input"},
		"pad tokens without images": {func(d *Datum) { delete(d.Inputs, PixelValuesInput); delete(d.Inputs, ImageGridInput) }, "model_input"},
		"pixels without grid":       {func(d *Datum) { delete(d.Inputs, ImageGridInput) }, "loss_fn_inputs.pixel_values"},
		"odd grid": {func(d *Datum) {
			g := d.Inputs[ImageGridInput]
			g.Data = append([]float64(nil), g.Data...)
			g.Data[1] = 3
			d.Inputs[ImageGridInput] = g
		}, "loss_fn_inputs.image_grid_thw"},
		"two frames": {func(d *Datum) {
			g := d.Inputs[ImageGridInput]
			g.Data = append([]float64(nil), g.Data...)
			g.Data[0] = 2
			d.Inputs[ImageGridInput] = g
		}, "loss_fn_inputs.image_grid_thw"},
		"enormous grid": {func(d *Datum) {
			g := d.Inputs[ImageGridInput]
			g.Data = append([]float64(nil), g.Data...)
			g.Data[1] = 1 << 40
			d.Inputs[ImageGridInput] = g
		}, "loss_fn_inputs.image_grid_thw"},
		"grid shape": {func(d *Datum) { g := d.Inputs[ImageGridInput]; g.Shape = []int{3, 2}; d.Inputs[ImageGridInput] = g }, "loss_fn_inputs.image_grid_thw"},
		"pixel rows short": {func(d *Datum) {
			p := d.Inputs[PixelValuesInput]
			p.Shape = []int{p.Shape[0] - 1, p.Shape[1]}
			p.Data = p.Data[:p.Shape[0]*p.Shape[1]]
			d.Inputs[PixelValuesInput] = p
		}, "loss_fn_inputs.pixel_values"},
		"pixel row width": {func(d *Datum) {
			p := d.Inputs[PixelValuesInput]
			p.Shape = []int{p.Shape[0] * 2, p.Shape[1] / 2}
			d.Inputs[PixelValuesInput] = p
		}, "loss_fn_inputs.pixel_values"},
		"non-finite pixel": {func(d *Datum) {
			p := d.Inputs[PixelValuesInput]
			p.Data = append([]float64(nil), p.Data...)
			p.Data[7] = math.NaN()
			d.Inputs[PixelValuesInput] = p
		}, "loss_fn_inputs.pixel_values"},
		// 40 patches × 1536 wraps around 2⁶⁴ to the true count: the shape must not be trusted.
		"pixel rows overflowing": {func(d *Datum) {
			p := d.Inputs[PixelValuesInput]
			p.Shape = []int{40 + 1<<55, p.Shape[1]}
			d.Inputs[PixelValuesInput] = p
		}, "loss_fn_inputs.pixel_values"},
		"integer pixels": {func(d *Datum) { p := d.Inputs[PixelValuesInput]; p.DType = "int64"; d.Inputs[PixelValuesInput] = p }, "loss_fn_inputs.pixel_values"},
	}
	if _, err := e.CreateAdapter("a", LoraConfig{Rank: 2, Seed: 1, TrainAttn: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ForwardBackward(context.Background(), "a", []Datum{good()}, "cross_entropy", nil); err != nil {
		t.Fatalf("the good datum: %v", err)
	}
	a, _ := e.adapter("a")
	before := append([]float64(nil), a.params[0].float64s('g')...)
	for what, tc := range cases {
		d := good()
		tc.edit(&d)
		_, err := e.ForwardBackward(context.Background(), "a", []Datum{textDatum([]int{1, 2, 3}), d}, "cross_entropy", nil)
		var ie *InputError
		if !errors.As(err, &ie) || !errors.Is(err, ErrInvalidInput) {
			t.Errorf("%s: error %v, want an InputError", what, err)
			continue
		}
		if ie.Datum != 1 || ie.Field != tc.field {
			t.Errorf("%s: datum %d field %q (%v), want datum 1 field %q", what, ie.Datum, ie.Field, err, tc.field)
		}
	}
	for j, g := range a.params[0].float64s('g') {
		if g != before[j] {
			t.Fatal("a refused batch changed the gradient accumulator")
		}
	}
	// A sampling request's images are checked the same way.
	bad := referenceImages(c, ref.Grids)
	bad.Grids = [][3]int{bad.Grids[0]}
	if _, err := e.Sample("", SampleRequest{Prompt: ref.Tokens, Images: bad}); !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), "image") {
		t.Errorf("sample with one grid for two images: %v", err)
	}
}

// Images sent to a text model are refused, naming the field.
func TestImagesToTextModelAreRefused(t *testing.T) {
	vl := loadTiny(t, ArchQwen3VL, Options{})
	ref := loadVLReference(t, "testdata/reference_vl.json")
	d := vlDatum(vl.Config, []int{5, 6, 7, 8}, referenceImages(vl.Config, ref.Grids))
	e := loadTiny(t, ArchQwen3, Options{})
	_, err := e.Forward(context.Background(), "", []Datum{d}, "cross_entropy", nil)
	var ie *InputError
	if !errors.As(err, &ie) || ie.Field != "loss_fn_inputs.pixel_values" || !strings.Contains(err.Error(), "text model") {
		t.Fatalf("error %v", err)
	}
	if _, err := e.Sample("", SampleRequest{Prompt: []int{5, 6}, Images: referenceImages(vl.Config, ref.Grids)}); !errors.Is(err, ErrInvalidInput) {
		t.Fatalf("sample: %v", err)
	}
}

// A bf16 VL checkpoint loads with --precision bf16 (the LM's projections and embedding kept as
// bf16 bits, the tower in f32) and gives with images what the f32 engine gives on the same file
// (to 1e-4 where bf16 weights are widened, to the bf16 paths' 2e-2 where products run in bf16).
func TestQwen3VLBF16(t *testing.T) {
	p := Presets["tiny"]
	p.BF16 = true
	Presets["tiny-vl-bf16-test"] = p
	defer delete(Presets, "tiny-vl-bf16-test")
	dir := t.TempDir()
	if err := InitTiny(dir, ArchQwen3VL, "tiny-vl-bf16-test", 1); err != nil {
		t.Fatal(err)
	}
	ref := loadVLReference(t, "testdata/reference_vl.json")
	var lps [][]float64
	for _, prec := range []string{PrecisionF32, PrecisionBF16} {
		e, err := Load(dir, Options{Precision: prec})
		if err != nil {
			t.Fatal(err)
		}
		if emb := cpu.Inspect(modelOf[float32](e.base).embed); (emb.BF16Rows != nil) != (prec == PrecisionBF16) {
			t.Fatalf("%s: embedding kept in bf16: %v", prec, emb.BF16Rows != nil)
		}
		r, err := e.Forward(context.Background(), "", []Datum{vlDatum(e.Config, ref.Tokens, referenceImages(e.Config, ref.Grids))}, "cross_entropy", nil)
		if err != nil {
			t.Fatal(err)
		}
		lps = append(lps, r.Logprobs[0])
	}
	tol := 1e-4
	if kernels.HaveBF16GEMM() { // the LM's products round their rows to bf16 (TestBF16GEMMTrainsNearFloat32)
		tol = 2e-2
	}
	for i := range lps[0] {
		if math.Abs(lps[0][i]-lps[1][i]) > tol {
			t.Fatalf("position %d: f32 %.6f, bf16 %.6f", i, lps[0][i], lps[1][i])
		}
	}
}

// A prompt with images that finishes first in a batch keeps being stepped (fed at slot 0) while
// the other rows decode; its negative mRoPE delta must not take that dummy slot out of the
// rotary table.
func TestQwen3VLRowFinishingFirstInABatch(t *testing.T) {
	ref := loadVLReference(t, "testdata/reference_vl.json")
	e := loadTiny(t, ArchQwen3VL, Options{})
	im := referenceImages(e.Config, ref.Grids)
	seed := int64(5)
	reqs := []SampleRequest{
		{Prompt: ref.Tokens, Images: im, Params: SampleParams{MaxTokens: 1, Temperature: 1, Seed: &seed}},
		{Prompt: []int{5, 6, 7}, Params: SampleParams{MaxTokens: 6, Temperature: 1, Seed: &seed}},
	}
	res, err := e.SampleBatch(context.Background(), "", reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("request %d: %v", i, r.Err)
		}
	}
	if n := len(res[0].Sequences[0].Tokens); n != 1 {
		t.Fatalf("image request drew %d tokens, want 1", n)
	}
	if n := len(res[1].Sequences[0].Tokens); n != 6 {
		t.Fatalf("text request drew %d tokens, want 6", n)
	}
}
