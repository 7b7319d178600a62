package imageproc

import (
	"errors"
	"fmt"
	"math"

	"github.com/skein-ai/skein/api"
)

// IsUserError says whether err is the sender's fault (a 400): a bad image, or a malformed
// model_input chunk.
func IsUserError(err error) bool {
	return errors.Is(err, ErrBadImage) || errors.Is(err, api.ErrBadChunk)
}

// ImageSpan is one image of a model input: LM positions [Start, Start+Tokens) hold its
// image_token_id pads. Preprocess decodes it when the vision tower is about to run.
type ImageSpan struct {
	Start int
	*Pending
}

// LoadModelInput checks a model input and lays it out for a VL model: its token sequence with
// each image chunk expanded to Tokens copies of imageTokenID (what an ImageChunk stands for in
// the Tinker API), and its images in order. Images are read from their headers alone, so the
// whole length is known, and refused past maxLen, before anything is decoded or expanded.
// Errors satisfy IsUserError, except a server-side failure to open the image directory. b
// (nil: none) is the request's Budget, shared by all its model inputs.
func LoadModelInput(m api.ModelInput, imageTokenID int, cfg Config, lim Limits, src Source, maxLen int, b *Budget) ([]int, []ImageSpan, error) {
	parts, err := m.Parts()
	if err != nil {
		return nil, nil, err
	}
	total := 0
	var spans []ImageSpan
	for _, p := range parts {
		if p.Image == nil {
			total += len(p.Tokens)
			continue
		}
		pending, err := Load(*p.Image, cfg, lim, src, b)
		if err != nil {
			return nil, nil, err
		}
		spans = append(spans, ImageSpan{Start: total, Pending: pending})
		total += pending.Tokens
	}
	if total > maxLen {
		return nil, nil, badImage("model_input is %d tokens with its %d images: the limit is %d", total, len(spans), maxLen)
	}
	tokens := make([]int, 0, total)
	next := 0
	for _, p := range parts {
		if p.Image == nil {
			tokens = append(tokens, p.Tokens...)
			continue
		}
		for range spans[next].Tokens {
			tokens = append(tokens, imageTokenID)
		}
		next++
	}
	return tokens, spans, nil
}

// FromTensors checks twinkle's precomputed images, loss_fn_inputs pixel_values (float32,
// [patches, channels·temporal·patch·patch]) and image_grid_thw (int64, [images, 3]), against
// the model's config and lim, and splits them into one Image per grid row. Every number is
// checked before it sizes anything. Errors wrap ErrBadImage and name the field.
func FromTensors(pixelValues, gridTHW api.TensorData, cfg Config, lim Limits) ([]Image, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	lim = lim.orDefault()
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: loss_fn_inputs.%s: %s", ErrBadImage, field, fmt.Sprintf(format, args...))
	}
	g := gridTHW.Data
	if len(gridTHW.Shape) != 2 || gridTHW.Shape[1] != 3 || gridTHW.Shape[0] < 1 || gridTHW.Shape[0]*3 != len(g) {
		return nil, bad("image_grid_thw", "shape %v with %d values: want [images, 3]", gridTHW.Shape, len(g))
	}
	dim := cfg.PatchDim()
	images := make([]Image, 0, gridTHW.Shape[0])
	rows := 0
	for i := range gridTHW.Shape[0] {
		var thw [3]int
		for j := range 3 {
			v := g[i*3+j]
			if v != math.Trunc(v) || v < 1 || v > 1<<20 {
				return nil, bad("image_grid_thw", "image %d: %v is not a positive whole number of patches", i, v)
			}
			thw[j] = int(v)
		}
		if thw[0] != 1 {
			return nil, bad("image_grid_thw", "image %d: grid_t %d: an image has one temporal patch", i, thw[0])
		}
		if thw[1]%cfg.MergeSize != 0 || thw[2]%cfg.MergeSize != 0 {
			return nil, bad("image_grid_thw", "image %d: grid %v is not a multiple of merge_size %d", i, thw, cfg.MergeSize)
		}
		info := Info{
			GridTHW: thw, ResizedHeight: thw[1] * cfg.PatchSize, ResizedWidth: thw[2] * cfg.PatchSize,
		}
		info.Width, info.Height = info.ResizedWidth, info.ResizedHeight
		info.Tokens = info.Patches() / (cfg.MergeSize * cfg.MergeSize)
		if info.Tokens > lim.MaxTokens {
			return nil, bad("image_grid_thw", "image %d: grid %v is %d tokens: this server's limit is %d per image", i, thw, info.Tokens, lim.MaxTokens)
		}
		rows += info.Patches()
		images = append(images, Image{Info: info})
	}
	if len(pixelValues.Shape) != 2 || pixelValues.Shape[0] != rows || pixelValues.Shape[1] != dim || len(pixelValues.Data) != rows*dim {
		return nil, bad("pixel_values", "shape %v with %d values: image_grid_thw needs [%d, %d]", pixelValues.Shape, len(pixelValues.Data), rows, dim)
	}
	off := 0
	for i := range images {
		n := images[i].Patches() * dim
		px := make([]float32, n)
		for k, v := range pixelValues.Data[off : off+n] {
			if math.IsNaN(v) || math.IsInf(v, 0) || math.Abs(v) > math.MaxFloat32 {
				return nil, bad("pixel_values", "value %v at row %d is not a finite float32", v, (off+k)/dim)
			}
			px[k] = float32(v)
		}
		images[i].PixelValues = px
		off += n
	}
	return images, nil
}

// CheckPadTokens checks that a model input holds as many imageTokenID pads as its images
// stand for, as HF's Qwen3-VL requires before it scatters the image features.
func CheckPadTokens(tokens []int, imageTokenID int, images []Image) error {
	want := 0
	for _, im := range images {
		want += im.Tokens
	}
	got := 0
	for _, t := range tokens {
		if t == imageTokenID {
			got++
		}
	}
	if got != want {
		return fmt.Errorf("%w: model_input has %d image tokens (id %d) but image_grid_thw describes %d", ErrBadImage, got, imageTokenID, want)
	}
	return nil
}
