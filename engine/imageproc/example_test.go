package imageproc_test

import (
	"errors"
	"fmt"
	"log"
	"net/http"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/engine/imageproc"
)

// How a VL engine or the gateway uses this package for one datum of a forward_backward or a
// sampling prompt: check and lay out the input before any compute (all lengths known from the
// image headers), answer 400 for user errors, then decode each image when the tower runs.
func Example() {
	cfg, err := imageproc.LoadConfig("/path/to/Qwen3-VL-model") // preprocessor_config.json, or defaults
	if err != nil {
		log.Fatal(err)
	}
	const imageTokenID = 151655           // config.json's image_token_id (<|image_pad|>)
	src := imageproc.Source{ImageDir: ""} // --image-dir; empty refuses file pointers
	var input api.ModelInput              // a datum's model_input, decoded from JSON or protobuf

	tokens, images, err := imageproc.LoadModelInput(input, imageTokenID, cfg, imageproc.DefaultLimits(), src, 32768, imageproc.NewBudget(64<<20, 64<<20))
	if imageproc.IsUserError(err) {
		// A 400 (prefix "datum i: model_input: "); nothing has been decoded or changed.
		var mismatch *imageproc.TokenMismatchError
		if errors.As(err, &mismatch) {
			fmt.Println(http.StatusBadRequest, mismatch.Chunk, mismatch.Expected, mismatch.Actual)
		}
		return
	} else if err != nil {
		log.Fatal(err) // the image directory could not be opened: the server's fault
	}
	_ = tokens // len(tokens) is the datum's length: target_tokens/weights must match it
	for _, span := range images {
		img, err := span.Preprocess() // decode + resize + normalise + patchify, once per image
		if err != nil {
			return // a 400 as above: the body did not decode
		}
		// img.PixelValues: [img.Patches(), cfg.PatchDim()] float32; img.GridTHW: [1, h/16, w/16];
		// LM positions span.Start … span.Start+img.Tokens-1 hold the image's pads.
		_ = img
	}
}
