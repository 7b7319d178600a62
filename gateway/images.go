package gateway

// Images for vision-language models: the Tinker API's ImageChunk and ImageAssetPointerChunk
// expanded into the engine's inputs (engine/vlpass.go): each image's pad tokens in the token
// sequence, its pixel rows and grid in the datum's pixel_values / image_grid_thw (training) or
// in SampleRequest.Images (sampling). Text models keep refusing image chunks (api.ModelInput.Tokens).

import (
	"errors"
	"fmt"
	"net/http"

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
	local    bool // an in-process replica holds it: its directory has the preprocessor config
}

// visionOf describes base's image preprocessing (nil for a text model). The preprocessor config
// is read from the model directory of an in-process replica, once per directory (a served
// model's files do not change, as the tokenizer endpoint also assumes); a model served only by remote
// workers has none here (engine.ModelInfo carries config.json alone), so its image chunks are
// refused (twinkle's pixel_values path still works: the worker checks it).
func (s *Server) visionOf(base string, info engine.ModelInfo) (*visionModel, error) {
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
			break
		}
	}
	return vm, nil
}

// expand lays out one model input with images: its tokens (each image its pad tokens) and its
// preprocessed images, within maxLen tokens and pixelBudget pixel_values elements (what is left
// of it is returned). what names the input in errors ("datum 3: model_input", "prompt").
func (vm *visionModel) expand(in api.ModelInput, src imageproc.Source, maxLen, pixelBudget, pixelLimit int, what string) ([]int, *engine.Images, int, error) {
	if !vm.local {
		return nil, nil, 0, errf(http.StatusBadRequest, "%s: image chunks are not supported for a model served by remote workers (its image preprocessing is not known to the gateway); send the image pad tokens with loss_fn_inputs.pixel_values and image_grid_thw instead", what)
	}
	if vm.maxLen > 0 { // a config without max_position_embeddings leaves the context to the engine
		maxLen = min(maxLen, vm.maxLen)
	}
	toks, spans, err := imageproc.LoadModelInput(in, vm.imageTok, vm.cfg, imageproc.DefaultLimits(), src, maxLen)
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
	imgs := &engine.Images{}
	for _, sp := range spans {
		img, err := sp.Preprocess()
		if err != nil {
			return nil, nil, 0, errf(http.StatusBadRequest, "%s: %v", what, err)
		}
		for _, v := range img.PixelValues {
			imgs.PixelValues = append(imgs.PixelValues, float64(v))
		}
		imgs.Grids = append(imgs.Grids, img.GridTHW)
	}
	return toks, imgs, pixelBudget, nil
}

// imageSource is where image_asset_pointer chunks may point (--image-dir).
func (s *Server) imageSource() imageproc.Source { return imageproc.Source{ImageDir: s.opts.ImageDir} }

// toEngineDataFor converts a forward/forward_backward batch for base: as toEngineData, with a VL
// model's image chunks expanded into pad tokens and pixel_values/image_grid_thw inputs (several
// images of one datum: their rows and grids concatenated in order). Image tokens count in the
// request's token bound; every image's pixels in max_request_pixel_values.
func (s *Server) toEngineDataFor(base string, info engine.ModelInfo, data []api.Datum) ([]engine.Datum, error) {
	pixelBudget := s.maxRequestPixelValues()
	for i, d := range data { // twinkle's precomputed pixels count too
		if pv, ok := d.LossFnInputs[engine.PixelValuesInput]; ok {
			if pixelBudget -= len(pv.Data); pixelBudget < 0 {
				return nil, errf(http.StatusBadRequest, "datum %d: loss_fn_inputs.%s: the request's images are over %d pixel_values elements (max_request_pixel_values)", i, engine.PixelValuesInput, s.maxRequestPixelValues())
			}
		}
	}
	if !anyImages(data) { // text only: nothing to read about the model's images
		return toEngineData(data)
	}
	vm, err := s.visionOf(base, info)
	if err != nil {
		return nil, err
	}
	if vm == nil {
		return toEngineData(data) // a text model: refuses the image chunks with its 400
	}
	tokensLeft := s.opts.MaxRequestTokens - textTokens(data) // checkBatchSize has counted these
	expanded := make([]api.Datum, len(data))
	copy(expanded, data)
	for i, d := range data {
		if !d.ModelInput.HasImages() {
			continue
		}
		what := fmt.Sprintf("datum %d: model_input", i)
		for _, k := range []string{engine.PixelValuesInput, engine.ImageGridInput} {
			if _, ok := d.LossFnInputs[k]; ok {
				return nil, errf(http.StatusBadRequest, "%s: image chunks and loss_fn_inputs.%s together: send images one way", what, k)
			}
		}
		own := textTokens(data[i : i+1])
		toks, imgs, left, err := vm.expand(d.ModelInput, s.imageSource(), own+tokensLeft, pixelBudget, s.maxRequestPixelValues(), what)
		if err != nil {
			return nil, err
		}
		pixelBudget, tokensLeft = left, tokensLeft-(len(toks)-own)
		in := make(map[string]api.TensorData, len(d.LossFnInputs)+2)
		for k, v := range d.LossFnInputs {
			in[k] = v
		}
		grid := make([]float64, 0, 3*len(imgs.Grids))
		for _, g := range imgs.Grids {
			grid = append(grid, float64(g[0]), float64(g[1]), float64(g[2]))
		}
		dim := vm.cfg.PatchDim()
		in[engine.PixelValuesInput] = api.TensorData{Data: imgs.PixelValues, DType: "float32", Shape: []int{len(imgs.PixelValues) / dim, dim}}
		in[engine.ImageGridInput] = api.TensorData{Data: grid, DType: "int64", Shape: []int{len(imgs.Grids), 3}}
		expanded[i].ModelInput = api.ModelInput{Chunks: []api.Chunk{{Type: "encoded_text", Tokens: toks}}}
		expanded[i].LossFnInputs = in
	}
	return toEngineData(expanded)
}

// promptFor reads a sampling prompt for base: its tokens, and for a VL model its images
// (nil when it has none). Text models refuse image chunks as before.
func (s *Server) promptFor(base string, prompt api.ModelInput) ([]int, *engine.Images, error) {
	if !prompt.HasImages() {
		toks, err := prompt.Tokens()
		if err != nil {
			return nil, nil, errf(http.StatusBadRequest, "prompt: %v", err)
		}
		return toks, nil, nil
	}
	info, err := s.infoOf(base)
	if err != nil {
		return nil, nil, err
	}
	vm, err := s.visionOf(base, info)
	if err != nil {
		return nil, nil, err
	}
	if vm == nil {
		_, err := prompt.Tokens() // the text model's refusal, naming the chunk
		if err == nil {
			err = errors.New("image chunks are not supported by text models")
		}
		return nil, nil, errf(http.StatusBadRequest, "prompt: %v", err)
	}
	toks, imgs, _, err := vm.expand(prompt, s.imageSource(), s.opts.MaxRequestTokens, s.maxRequestPixelValues(), s.maxRequestPixelValues(), "prompt")
	if err != nil {
		return nil, nil, err
	}
	return toks, imgs, nil
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
