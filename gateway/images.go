package gateway

// Images for vision-language models: the Tinker API's ImageChunk and ImageAssetPointerChunk
// expanded into the engine's inputs (engine/vlpass.go): each image's pad tokens in the token
// sequence, its pixel rows and grid in the datum's pixel_values / image_grid_thw (training) or
// in SampleRequest.Images (sampling). Text models keep refusing image chunks (api.ModelInput.Tokens).

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/engine/imageproc"
)

// DefaultMaxRequestPixelValues bounds the pixel_values elements of one request, all its images
// together, whether the gateway preprocesses them (image chunks: counted from the image headers,
// before anything is decoded) or twinkle sends them in loss_fn_inputs. One row is C·T·P·P
// floats (1536 for Qwen3-VL), so this is ~21k patches, ~5k LM tokens of images: a handful of
// megapixel images. The engine holds them as float64: 256 MiB.
const DefaultMaxRequestPixelValues = 1 << 25

// DefaultMaxRequestImageBytes bounds the encoded bytes of one request's images together (files
// by their size, before they are read; a file named twice counts once): twice one image's
// limit, so a repeated pointer cannot multiply what the server holds.
const DefaultMaxRequestImageBytes = 64 << 20

// DefaultMaxRequestImagePixels bounds the decoded pixels (width·height from each header, before
// any decode) of one request's images together: four 4096² images. Decoding costs about 1 CPU-s
// per 16 Mpixel and 4 bytes a pixel while it runs.
const DefaultMaxRequestImagePixels = 64 << 20

// imageBudget is a fresh per-request budget of image bytes and decoded pixels.
func (s *Server) imageBudget() *imageproc.Budget {
	b, p := s.opts.MaxRequestImageBytes, s.opts.MaxRequestImagePixels
	if b <= 0 {
		b = DefaultMaxRequestImageBytes
	}
	if p <= 0 {
		p = DefaultMaxRequestImagePixels
	}
	return imageproc.NewBudget(b, p)
}

// maxRequestPixelValues is Options.MaxRequestPixelValues, or its default.
func (s *Server) maxRequestPixelValues() int {
	if s.opts.MaxRequestPixelValues > 0 {
		return s.opts.MaxRequestPixelValues
	}
	return DefaultMaxRequestPixelValues
}

// visionModel is what expanding image chunks needs of a VL base model.
type visionModel struct {
	cfg      imageproc.Config
	imageTok int
	maxLen   int  // the model's context
	local    bool // its preprocessor config is known here (a local model directory, or published)
}

// visionOf describes base's image preprocessing (nil for a text model). The preprocessor config
// is read once per source (a served model's files do not change, as the tokenizer endpoint also
// assumes): an in-process replica's model directory, else the config its workers published in
// object storage (basefiles.go). Without either (remote workers and no object storage), image
// chunks are refused (twinkle's pixel_values path still works: the worker checks it).
func (s *Server) visionOf(ctx context.Context, base string, info engine.ModelInfo) (*visionModel, error) {
	if !info.TakesImages() || info.Config.ImageTokenID == nil {
		return nil, nil
	}
	vm := &visionModel{imageTok: *info.Config.ImageTokenID, maxLen: info.Config.MaxPositionEmbeddings}
	reps, err := s.replicasOf(base)
	if err != nil {
		return nil, err
	}
	for _, r := range reps {
		if e, ok := r.Local(); ok {
			if cached, ok := s.visionCfgs.Load(e.Dir); ok {
				vm.cfg = cached.(imageproc.Config)
			} else if vm.cfg, err = imageproc.LoadConfig(e.Dir); err != nil {
				return nil, errf(http.StatusInternalServerError, "model %s: %v", base, err)
			} else {
				s.visionCfgs.Store(e.Dir, vm.cfg)
			}
			vm.local = true
			return vm, nil
		}
	}
	if !s.objectStorage() {
		return vm, nil
	}
	files, _, err := s.filesOf(base)
	if err != nil {
		return nil, err
	}
	if vm.cfg, err = s.preprocessorConfig(ctx, files); err != nil {
		return nil, errf(http.StatusServiceUnavailable, "model %s: the image preprocessing its workers published: %v", base, err)
	}
	vm.local = true
	return vm, nil
}

// plan lays out one model input with images: its tokens (each image its pad tokens) and its
// images, read from their headers and not yet decoded, within maxLen tokens, pixelBudget
// pixel_values elements (what is left of it is returned) and the request's image Budget. what
// names the input in errors ("datum 3: model_input", "prompt").
func (vm *visionModel) plan(in api.ModelInput, src imageproc.Source, b *imageproc.Budget, maxLen, pixelBudget, pixelLimit int, what string) ([]int, []imageproc.ImageSpan, int, error) {
	if !vm.local {
		return nil, nil, 0, errf(http.StatusBadRequest, "%s: image chunks are not supported for a model served by remote workers when the gateway has no object storage (where workers publish its image preprocessing); send the image pad tokens with loss_fn_inputs.pixel_values and image_grid_thw instead", what)
	}
	if vm.maxLen > 0 { // a config without max_position_embeddings leaves the context to the engine
		maxLen = min(maxLen, vm.maxLen)
	}
	toks, spans, err := imageproc.LoadModelInput(in, vm.imageTok, vm.cfg, imageproc.DefaultLimits(), src, maxLen, b)
	if err != nil {
		if imageproc.IsUserError(err) {
			return nil, nil, 0, errf(http.StatusBadRequest, "%s: %v", what, err)
		}
		return nil, nil, 0, errf(http.StatusInternalServerError, "%s: %v", what, err)
	}
	dim := vm.cfg.PatchDim()
	for _, sp := range spans { // from the headers: refuse before decoding anything
		if pixelBudget -= sp.Patches() * dim; pixelBudget < 0 {
			return nil, nil, 0, errf(http.StatusBadRequest, "%s: the request's images are over %d pixel_values elements (max_request_pixel_values); send fewer or smaller images", what, pixelLimit)
		}
	}
	return toks, spans, pixelBudget, nil
}

// patches is the pixel_values rows of spans' images, and their grids.
func patches(spans []imageproc.ImageSpan) (int, [][3]int) {
	n, grids := 0, make([][3]int, 0, len(spans))
	for _, sp := range spans {
		n += sp.Patches()
		grids = append(grids, sp.GridTHW)
	}
	return n, grids
}

// decodeInto decodes spans' images into dst, their pixel_values rows in order (dst is sized
// by patches). Each decode holds one of the server's decode slots, so however many handlers
// decode at once, at most that many CPUs do; a request whose client has gone stops between
// images.
func (s *Server) decodeInto(ctx context.Context, spans []imageproc.ImageSpan, dst []float64, what string) error {
	off := 0
	for _, sp := range spans {
		select {
		case s.decodeSlots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		img, err := sp.Preprocess()
		<-s.decodeSlots
		if err != nil {
			return errf(http.StatusBadRequest, "%s: %v", what, err)
		}
		if off+len(img.PixelValues) > len(dst) { // the header's grid fixed the size: cannot happen
			return errf(http.StatusInternalServerError, "%s: image decoded to more pixel_values than its header said", what)
		}
		for _, v := range img.PixelValues {
			dst[off] = float64(v)
			off++
		}
	}
	return nil
}

// imageSource is where image_asset_pointer chunks may point (--image-dir).
func (s *Server) imageSource() imageproc.Source { return imageproc.Source{ImageDir: s.opts.ImageDir} }

// toEngineDataFor converts a forward/forward_backward batch for base: as toEngineData, with a VL
// model's image chunks expanded into pad tokens and pixel_values/image_grid_thw inputs (several
// images of one datum: their rows and grids concatenated in order). Image tokens count in the
// request's token bound; every image's pixels in max_request_pixel_values, its bytes and
// decoded pixels in the request's image budget. Images are not decoded here: the returned
// decode (nil when there are none) fills the pixel_values in place, once check (the batch's
// validation) has passed, so a request that is refused for any reason decodes nothing.
func (s *Server) toEngineDataFor(ctx context.Context, base string, info engine.ModelInfo, data []api.Datum) ([]engine.Datum, func(context.Context) error, error) {
	pixelBudget := s.maxRequestPixelValues()
	for i, d := range data { // twinkle's precomputed pixels count too
		if pv, ok := d.LossFnInputs[engine.PixelValuesInput]; ok {
			if pixelBudget -= len(pv.Data); pixelBudget < 0 {
				return nil, nil, errf(http.StatusBadRequest, "datum %d: loss_fn_inputs.%s: the request's images are over %d pixel_values elements (max_request_pixel_values)", i, engine.PixelValuesInput, s.maxRequestPixelValues())
			}
		}
	}
	if !anyImages(data) { // text only: nothing to read about the model's images
		out, err := toEngineData(data)
		return out, nil, err
	}
	vm, err := s.visionOf(ctx, base, info)
	if err != nil {
		return nil, nil, err
	}
	if vm == nil {
		out, err := toEngineData(data) // a text model: refuses the image chunks with its 400
		return out, nil, err
	}
	budget := s.imageBudget()
	tokensLeft := s.opts.MaxRequestTokens - textTokens(data) // checkBatchSize has counted these
	expanded := make([]api.Datum, len(data))
	copy(expanded, data)
	planned := make([][]imageproc.ImageSpan, len(data))
	for i, d := range data {
		if !d.ModelInput.HasImages() {
			continue
		}
		what := fmt.Sprintf("datum %d: model_input", i)
		for _, k := range []string{engine.PixelValuesInput, engine.ImageGridInput} {
			if _, ok := d.LossFnInputs[k]; ok {
				return nil, nil, errf(http.StatusBadRequest, "%s: image chunks and loss_fn_inputs.%s together: send images one way", what, k)
			}
		}
		own := textTokens(data[i : i+1])
		toks, spans, left, err := vm.plan(d.ModelInput, s.imageSource(), budget, own+tokensLeft, pixelBudget, s.maxRequestPixelValues(), what)
		if err != nil {
			return nil, nil, err
		}
		pixelBudget, tokensLeft = left, tokensLeft-(len(toks)-own)
		planned[i] = spans
		in := make(map[string]api.TensorData, len(d.LossFnInputs)+2)
		for k, v := range d.LossFnInputs {
			in[k] = v
		}
		rows, grids := patches(spans)
		grid := make([]float64, 0, 3*len(grids))
		for _, g := range grids {
			grid = append(grid, float64(g[0]), float64(g[1]), float64(g[2]))
		}
		dim := vm.cfg.PatchDim()
		// Zeros stand in for the pixels until decode: the batch is checked with them (shapes,
		// pad tokens, every loss input's length), and decode writes the image into this slice.
		in[engine.PixelValuesInput] = api.TensorData{Data: make([]float64, rows*dim), DType: "float32", Shape: []int{rows, dim}}
		in[engine.ImageGridInput] = api.TensorData{Data: grid, DType: "int64", Shape: []int{len(grids), 3}}
		expanded[i].ModelInput = api.ModelInput{Chunks: []api.Chunk{{Type: "encoded_text", Tokens: toks}}}
		expanded[i].LossFnInputs = in
	}
	out, err := toEngineData(expanded)
	if err != nil {
		return nil, nil, err
	}
	decode := func(ctx context.Context) error {
		for i, spans := range planned {
			if len(spans) == 0 {
				continue
			}
			if err := s.decodeInto(ctx, spans, out[i].Inputs[engine.PixelValuesInput].Data, fmt.Sprintf("datum %d: model_input", i)); err != nil {
				return err
			}
		}
		return nil
	}
	return out, decode, nil
}

// promptFor reads a sampling prompt for base: its tokens, and for a VL model its images (nil
// when it has none), their pixel_values zeros until the returned decode (nil when there are no
// images) fills them in place: the caller checks the whole request first, so a refused one
// decodes nothing. Text models refuse image chunks as before.
func (s *Server) promptFor(ctx context.Context, base string, prompt api.ModelInput) ([]int, *engine.Images, func(context.Context) error, error) {
	if !prompt.HasImages() {
		toks, err := prompt.Tokens()
		if err != nil {
			return nil, nil, nil, errf(http.StatusBadRequest, "prompt: %v", err)
		}
		return toks, nil, nil, nil
	}
	info, err := s.infoOf(base)
	if err != nil {
		return nil, nil, nil, err
	}
	vm, err := s.visionOf(ctx, base, info)
	if err != nil {
		return nil, nil, nil, err
	}
	if vm == nil {
		_, err := prompt.Tokens() // the text model's refusal, naming the chunk
		if err == nil {
			err = errors.New("image chunks are not supported by text models")
		}
		return nil, nil, nil, errf(http.StatusBadRequest, "prompt: %v", err)
	}
	toks, spans, _, err := vm.plan(prompt, s.imageSource(), s.imageBudget(), s.opts.MaxRequestTokens, s.maxRequestPixelValues(), s.maxRequestPixelValues(), "prompt")
	if err != nil {
		return nil, nil, nil, err
	}
	rows, grids := patches(spans)
	imgs := &engine.Images{PixelValues: make([]float64, rows*vm.cfg.PatchDim()), Grids: grids}
	decode := func(ctx context.Context) error { return s.decodeInto(ctx, spans, imgs.PixelValues, "prompt") }
	return toks, imgs, decode, nil
}

func anyImages(data []api.Datum) bool {
	for _, d := range data {
		if d.ModelInput.HasImages() {
			return true
		}
	}
	return false
}

// textTokens counts the token chunks' tokens of data, as checkBatchSize does.
func textTokens(data []api.Datum) int {
	n := 0
	for _, d := range data {
		for _, c := range d.ModelInput.Chunks {
			n += len(c.Tokens)
		}
	}
	return n
}

// DefaultImageDecoders is Options.ImageDecoders' default: half the CPUs (at least one), so
// image decoding, which runs in the request handlers, leaves the replicas' compute cores.
func DefaultImageDecoders() int { return max(1, runtime.GOMAXPROCS(0)/2) }
