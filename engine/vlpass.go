package engine

import (
	"fmt"
	"math"
	"slices"
)

// Images in a pass (twinkle's path): a datum's model_input already holds each image's pad
// tokens (image_token_id, one per merged 2×2 block of patches) and its loss_fn_inputs carry
// the pixels, already cut into patches, and the grids:
//
//	pixel_values    float32 [patches, C·T·P·P]  (the image processor's output, all images)
//	image_grid_thw  int64   [images, 3]         (t, h, w in patches, per image, in order)
//
// The tower runs once per image per request (frozen: no gradient); its merged features replace
// the pad tokens' embeddings and DeepStack's are added to the first LM layers' outputs there.

// Input names of twinkle's image path.
const (
	PixelValuesInput = "pixel_values"
	ImageGridInput   = "image_grid_thw"
)

// Images are one sequence's images: pixel rows [patches, C·T·P·P] of every image in order, and
// each image's grid (t, h, w) in patches.
type Images struct {
	PixelValues []float64
	Grids       [][3]int
}

// imageInput reports the loss_fn_inputs that carry images, allowed beside any loss's inputs.
func imageInput(name string) bool { return name == PixelValuesInput || name == ImageGridInput }

// datumImages reads and checks datum i's images from its loss_fn_inputs (nil: it has none).
func datumImages(c *Config, i int, tokens []int, inputs map[string]TensorInput) (*Images, error) {
	const field = "loss_fn_inputs."
	pv, hasPV := inputs[PixelValuesInput]
	gr, hasGrid := inputs[ImageGridInput]
	if !hasPV && !hasGrid {
		return nil, checkImages(c, i, tokens, nil, field)
	}
	if c.VisionConfig == nil {
		return nil, inputErr(i, field+PixelValuesInput, "images sent to a text model (%s)", c.Arch)
	}
	if !hasPV || !hasGrid {
		return nil, inputErr(i, field+PixelValuesInput, "%s and %s come together", PixelValuesInput, ImageGridInput)
	}
	if gr.DType != "int64" && gr.DType != "int32" {
		return nil, inputErr(i, field+ImageGridInput, "dtype %q, want int64", gr.DType)
	}
	if len(gr.Shape) != 2 || gr.Shape[1] != 3 || gr.Shape[0] < 1 || gr.Shape[0] > len(tokens) || gr.Shape[0]*3 != len(gr.Data) {
		return nil, inputErr(i, field+ImageGridInput, "shape %v with %d values, want [images, 3], at most one image per token", gr.Shape, len(gr.Data))
	}
	if pv.DType != "float32" && pv.DType != "float64" && pv.DType != "bfloat16" {
		return nil, inputErr(i, field+PixelValuesInput, "dtype %q, want float32", pv.DType)
	}
	dim := c.VisionConfig.patchDim()
	if len(pv.Shape) != 2 || pv.Shape[1] != dim || pv.Shape[0] < 0 || pv.Shape[0] > len(pv.Data) || pv.Shape[0]*dim != len(pv.Data) {
		return nil, inputErr(i, field+PixelValuesInput, "shape %v with %d values, want [patches, %d] (C·T·P·P)", pv.Shape, len(pv.Data), dim)
	}
	img := &Images{PixelValues: pv.Data}
	for k := range gr.Shape[0] {
		var g [3]int
		for a := range 3 {
			x := gr.Data[3*k+a]
			if x != math.Trunc(x) || x < 0 || x > math.MaxInt32 {
				return nil, inputErr(i, field+ImageGridInput, "image %d: grid value %v is not a 32-bit integer ≥ 0", k, x)
			}
			g[a] = int(x)
		}
		img.Grids = append(img.Grids, g)
	}
	return img, checkImages(c, i, tokens, img, field)
}

// checkImages checks a sequence's images against its tokens: every grid a whole number of
// merge blocks of one frame, the pad tokens one run of the right length per image in order,
// pixel rows for exactly the grids' patches, all finite. img nil: the tokens hold no pad
// token. field prefixes the error's field names.
func checkImages(c *Config, i int, tokens []int, img *Images, field string) error {
	v := c.VisionConfig
	if img == nil {
		if v != nil {
			for j, t := range tokens {
				if t == *c.ImageTokenID {
					return inputErr(i, "model_input", "image pad token %d at position %d but no %s%s", t, j, field, PixelValuesInput)
				}
			}
		}
		return nil
	}
	if v == nil {
		return inputErr(i, field+PixelValuesInput, "images sent to a text model (%s)", c.Arch)
	}
	if len(img.Grids) == 0 || len(img.Grids) > len(tokens) {
		return inputErr(i, field+ImageGridInput, "%d images for %d tokens", len(img.Grids), len(tokens))
	}
	m, n := v.SpatialMergeSize, len(tokens)
	patches, want := 0, 0
	for k, g := range img.Grids {
		// Every image has at least one pad token in the sequence, so no side can exceed the
		// sequence's length (in merged tokens): bounds the products below.
		for _, x := range g {
			if x < 1 || x > n*m {
				return inputErr(i, field+ImageGridInput, "image %d: grid %v: values must be in 1…%d", k, g, n*m)
			}
		}
		if g[0] != 1 {
			return inputErr(i, field+ImageGridInput, "image %d: grid %v: an image has one temporal patch (t = 1)", k, g)
		}
		if g[1]%m != 0 || g[2]%m != 0 {
			return inputErr(i, field+ImageGridInput, "image %d: grid %v: h and w must be multiples of the merge size %d", k, g, m)
		}
		tokensOf := g[1] / m * (g[2] / m)
		if tokensOf > n-want {
			return inputErr(i, field+ImageGridInput, "the grids stand for more image tokens than the %d tokens of model_input", n)
		}
		want += tokensOf
		patches += g[1] * g[2]
	}
	if err := imageRuns(c, i, tokens, img.Grids); err != nil {
		return err
	}
	dim := v.patchDim()
	if len(img.PixelValues) != patches*dim {
		return inputErr(i, field+PixelValuesInput, "%d values, want %d patches × %d (the grids' patches × C·T·P·P)", len(img.PixelValues), patches, dim)
	}
	for j, x := range img.PixelValues {
		if math.IsNaN(x) || math.IsInf(x, 0) || math.Abs(x) > math.MaxFloat32 {
			return inputErr(i, field+PixelValuesInput, "value %v at %d is not a finite float32", x, j)
		}
	}
	return nil
}

// imageRuns checks that the image pad tokens are, in order, one contiguous run per image of
// exactly its merged grid's size.
func imageRuns(c *Config, i int, tokens []int, grids [][3]int) error {
	pad, m := *c.ImageTokenID, c.VisionConfig.SpatialMergeSize
	img := 0
	for j := 0; j < len(tokens); {
		if tokens[j] != pad {
			j++
			continue
		}
		if img >= len(grids) {
			return inputErr(i, "model_input", "image pad tokens at position %d beyond the %d images of %s", j, len(grids), ImageGridInput)
		}
		g := grids[img]
		size := g[0] * (g[1] / m) * (g[2] / m)
		for k := range size {
			if j+k >= len(tokens) || tokens[j+k] != pad {
				return inputErr(i, "model_input", "image %d (grid %v) needs %d pad tokens from position %d, found %d", img, g, size, j, k)
			}
		}
		j += size
		img++
	}
	if img != len(grids) {
		return inputErr(i, "model_input", "%d images in %s but pad tokens for %d", len(grids), ImageGridInput, img)
	}
	return nil
}

// encodeImages runs the tower over every image of seqs (nil entries: none), once each.
func (e *Engine) encodeImages(seqs []*Images) ([][]imageFeatures, error) {
	out := make([][]imageFeatures, len(seqs))
	for i, im := range seqs {
		if im == nil {
			continue
		}
		off := 0
		for _, g := range im.Grids {
			np := g[0] * g[1] * g[2]
			var f imageFeatures
			var err error
			switch vt := e.base.vision.(type) {
			case *visionTower[float32]:
				dim := vt.cfg.patchDim()
				f, err = vt.forward(e, im.PixelValues[off*dim:(off+np)*dim], g)
			case *visionTower[float64]:
				dim := vt.cfg.patchDim()
				f, err = vt.forward(e, im.PixelValues[off*dim:(off+np)*dim], g)
			default:
				return nil, fmt.Errorf("engine: images given to a model without a vision tower")
			}
			if err != nil {
				return nil, err
			}
			out[i] = append(out[i], f)
			off += np
		}
	}
	return out, nil
}

// visualInputs are the image tokens of a pass: each row (b·T+t) with its merged features and
// DeepStack's, one per LM layer that takes them.
type visualInputs struct {
	at        []int
	embeds    [][]float64
	deepstack [][][]float64 // [layer][i]
}

// imageRow is one sequence of a pass with images: its tokens, images and their features.
type imageRow struct {
	tokens []int
	images *Images
	feats  []imageFeatures
}

// useImages sets a pass over rows (nil entries: text) to place their image features and to
// rotate by multimodal positions; nothing when no row has images.
func useImages[E float](s *pass[E], e *Engine, rows []*imageRow) {
	any := false
	for _, r := range rows {
		any = any || (r != nil && r.images != nil)
	}
	if !any {
		return
	}
	c := s.c
	D := c.HiddenSize
	pos := make([][3]int, s.B*s.T)
	vis := &visualInputs{deepstack: make([][][]float64, len(c.VisionConfig.DeepstackVisualIndexes))}
	for b := range s.B {
		var r *imageRow
		if b < len(rows) {
			r = rows[b]
		}
		delta := 0
		if r != nil && r.images != nil {
			var p [][3]int
			p, delta = mropePositions(r.tokens, *c.ImageTokenID, c.VisionConfig.SpatialMergeSize, r.images.Grids)
			copy(pos[b*s.T:], p)
			j := 0
			for _, f := range r.feats {
				for k := range f.tokens {
					for j < len(r.tokens) && r.tokens[j] != *c.ImageTokenID {
						j++
					}
					vis.at = append(vis.at, b*s.T+j)
					vis.embeds = append(vis.embeds, f.embeds[k*D:(k+1)*D])
					for l, d := range f.deepstack {
						vis.deepstack[l] = append(vis.deepstack[l], d[k*D:(k+1)*D])
					}
					j++
				}
			}
		}
		n0 := 0
		if r != nil {
			n0 = len(r.tokens)
		}
		for t := n0; t < s.T; t++ { // text and padding: plain positions, after the row's images
			pos[b*s.T+t] = [3]int{t + delta, t + delta, t + delta}
		}
		if r == nil || r.images == nil {
			for t := range n0 {
				pos[b*s.T+t] = [3]int{t, t, t}
			}
		}
	}
	cs, sn := mropeTables[E](c, e.invFreq, pos)
	s.rope = &ropeOverride[E]{cos: cs, sin: sn}
	s.vis = vis
}

// placeImages writes the image features over the pad tokens' embeddings.
func (s *pass[E]) placeImages(h mat[E]) {
	if s.vis == nil {
		return
	}
	s.op.PutRows(h, s.vis.at, s.vis.embeds, false)
}

// addDeepstack adds DeepStack's features to layer l's output at the image tokens.
func (s *pass[E]) addDeepstack(l int, h mat[E]) {
	if s.vis == nil || l >= len(s.vis.deepstack) {
		return
	}
	s.op.PutRows(h, s.vis.at, s.vis.deepstack[l], true)
}

// imageRows are datums [lo,hi) as a pass's rows (nil: no datum has images).
func (p *prepared) imageRows(lo, hi int) []*imageRow {
	var rows []*imageRow
	for i := lo; i < hi; i++ {
		if p.images[i] != nil {
			rows = make([]*imageRow, hi-lo)
			break
		}
	}
	for i := range rows {
		rows[i] = &imageRow{tokens: p.tokens[lo+i], images: p.images[lo+i], feats: p.feats[lo+i]}
	}
	return rows
}

// sampleImageRows are the decode loop's rows with their request's images, each image run
// through the tower once per request (nil: no request has images).
func (e *Engine) sampleImageRows(reqs []SampleRequest, rows []*sampleRow) ([]*imageRow, error) {
	var seqs []*Images
	for _, r := range reqs {
		seqs = append(seqs, r.Images)
	}
	if !slices.ContainsFunc(seqs, func(im *Images) bool { return im != nil }) {
		return nil, nil
	}
	feats, err := e.encodeImages(seqs)
	if err != nil {
		return nil, err
	}
	out := make([]*imageRow, len(rows))
	for b, r := range rows {
		out[b] = &imageRow{tokens: r.prompt, images: reqs[r.req].Images, feats: feats[r.req]}
	}
	return out, nil
}

// useImages sets up a step of the sampler: a prefill places its rows' images and rotates by
// their multimodal positions; a decode step's tokens, text after the prompt, turn at their slot
// plus their row's delta.
func (d *kvDecoder[E]) useImages(s *pass[E], prefill bool) {
	if d.images == nil {
		return
	}
	if prefill {
		useImages(s, d.e, d.images)
		return
	}
	if d.shift == nil {
		d.shift = make([]int, s.B)
		for b, r := range d.images {
			if r != nil && r.images != nil {
				_, d.shift[b] = mropePositions(r.tokens, *s.c.ImageTokenID, s.c.VisionConfig.SpatialMergeSize, r.images.Grids)
			}
		}
	}
	s.rope = &ropeOverride[E]{shift: d.shift}
}

// TakesImages reports a vision-language model: its requests may carry images.
func (m ModelInfo) TakesImages() bool { return m.Config != nil && m.Config.VisionConfig != nil }
