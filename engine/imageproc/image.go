package imageproc

import (
	"bytes"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"io"
)

// ErrBadImage marks an image the sender got wrong: undecodable, unsupported, zero-sized, too
// large, or costing other than the tokens it claimed. Callers answer it with a 400.
var ErrBadImage = errors.New("bad image")

func badImage(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadImage, fmt.Sprintf(format, args...))
}

// Limits bound what one image may cost the server, checked before it is decoded. A zero field
// takes its DefaultLimits value.
type Limits struct {
	MaxBytes  int // encoded size
	MaxPixels int // width·height as the image's header states it
	MaxTokens int // LM tokens after smart_resize: bounds pixel_values (tokens·merge²·PatchDim floats)
}

// DefaultLimits admit anything Qwen3-VL's own processor admits (16 Mpixel, 16384 tokens).
func DefaultLimits() Limits {
	return Limits{MaxBytes: 32 << 20, MaxPixels: 16 << 20, MaxTokens: 16384}
}

// orDefault fills the fields a caller left zero (or negative) from DefaultLimits.
func (l Limits) orDefault() Limits {
	d := DefaultLimits()
	if l.MaxBytes <= 0 {
		l.MaxBytes = d.MaxBytes
	}
	if l.MaxPixels <= 0 {
		l.MaxPixels = d.MaxPixels
	}
	if l.MaxTokens <= 0 {
		l.MaxTokens = d.MaxTokens
	}
	return l
}

// Formats are the image formats of the Tinker API (ImageChunk.format).
var Formats = []string{"png", "jpeg"}

// Info is what an image will cost, known from its header alone.
type Info struct {
	Width, Height               int    // as encoded
	ResizedWidth, ResizedHeight int    // after smart_resize
	GridTHW                     [3]int // patches along time, height, width
	Tokens                      int    // LM positions the image fills
}

// Image is a preprocessed image, ready for the vision tower.
type Image struct {
	Info
	// PixelValues is row-major [Patches(), cfg.PatchDim()]: HF's pixel_values for this image.
	PixelValues []float32
}

// Patches is the number of pixel_values rows: grid_t·grid_h·grid_w.
func (i Info) Patches() int { return i.GridTHW[0] * i.GridTHW[1] * i.GridTHW[2] }

// Inspect reads only the image's header and says what it will cost, refusing (ErrBadImage)
// an empty, oversized, zero-sized, undecodable-header or over-budget image without decoding it.
func Inspect(data []byte, format string, cfg Config, lim Limits) (Info, error) {
	if err := cfg.Validate(); err != nil {
		return Info{}, err
	}
	lim = lim.orDefault()
	if len(data) == 0 {
		return Info{}, badImage("no image data")
	}
	if len(data) > lim.MaxBytes {
		return Info{}, badImage("image is %d bytes: this server's limit is %d", len(data), lim.MaxBytes)
	}
	var hdr image.Config
	var err error
	switch format {
	case "png":
		hdr, err = png.DecodeConfig(bytes.NewReader(data))
	case "jpeg":
		hdr, err = jpeg.DecodeConfig(bytes.NewReader(data))
	default:
		return Info{}, badImage("unsupported image format %q: want one of %q", format, Formats)
	}
	if err != nil {
		return Info{}, badImage("data is not a readable %s image: %v", format, err)
	}
	if hdr.Width <= 0 || hdr.Height <= 0 {
		return Info{}, badImage("image is %d×%d pixels: it has no pixels", hdr.Width, hdr.Height)
	}
	if int64(hdr.Width)*int64(hdr.Height) > int64(lim.MaxPixels) {
		return Info{}, badImage("image is %d×%d pixels: this server's limit is %d pixels", hdr.Width, hdr.Height, lim.MaxPixels)
	}
	rh, rw, err := SmartResize(hdr.Height, hdr.Width, cfg.Factor(), cfg.MinPixels, cfg.MaxPixels)
	if err != nil {
		return Info{}, err
	}
	info := Info{
		Width: hdr.Width, Height: hdr.Height, ResizedWidth: rw, ResizedHeight: rh,
		GridTHW: [3]int{1, rh / cfg.PatchSize, rw / cfg.PatchSize},
	}
	info.Tokens = info.Patches() / (cfg.MergeSize * cfg.MergeSize)
	if info.Tokens > lim.MaxTokens {
		return Info{}, badImage("image of %d×%d pixels resizes to %d×%d, %d tokens: this server's limit is %d per image", hdr.Width, hdr.Height, rw, rh, info.Tokens, lim.MaxTokens)
	}
	return info, nil
}

// Preprocess turns encoded image bytes into pixel_values exactly as HF's Qwen2VLImageProcessor
// does: decode, convert("RGB") (alpha dropped, not composited), smart_resize with PIL's bicubic,
// rescale, normalise, patchify. Everything Inspect refuses is refused before decoding.
func Preprocess(data []byte, format string, cfg Config, lim Limits) (Image, error) {
	info, err := Inspect(data, format, cfg, lim)
	if err != nil {
		return Image{}, err
	}
	img, err := decode(data, format)
	if err != nil {
		return Image{}, err
	}
	if b := img.Bounds(); b.Dx() != info.Width || b.Dy() != info.Height {
		return Image{}, badImage("decoded image is %d×%d but its header said %d×%d", b.Dx(), b.Dy(), info.Width, info.Height)
	}
	rgb := toRGB(img)
	resized := resizeBicubic(rgb, info.Width, info.Height, info.ResizedWidth, info.ResizedHeight)
	return Image{Info: info, PixelValues: patchify(resized, info, cfg)}, nil
}

// decode decodes an image whose header Inspect has checked.
func decode(data []byte, format string) (image.Image, error) {
	var img image.Image
	var err error
	switch format {
	case "png":
		img, err = png.Decode(bytes.NewReader(data))
	case "jpeg":
		img, err = jpeg.Decode(bytes.NewReader(data))
	default:
		return nil, badImage("unsupported image format %q: want one of %q", format, Formats)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, badImage("%s image is truncated", format)
	}
	if err != nil {
		return nil, badImage("data is not a decodable %s image: %v", format, err)
	}
	return img, nil
}

// toRGB is PIL's convert("RGB") on what Go's decoders return: interleaved 8-bit RGB, alpha
// dropped from the straight (non-premultiplied) colour, grey replicated, palettes looked up.
// 16-bit samples keep their high byte, as PIL reads 16-bit RGB(A) PNGs.
func toRGB(img image.Image) []uint8 {
	b := img.Bounds()
	w, h := b.Dx(), b.Dy()
	out := make([]uint8, w*h*3)
	put := func(i int, r, g, bl uint8) { out[i*3], out[i*3+1], out[i*3+2] = r, g, bl }
	switch m := img.(type) {
	case *image.NRGBA:
		for y := range h {
			row := m.Pix[y*m.Stride:]
			for x := range w {
				put(y*w+x, row[x*4], row[x*4+1], row[x*4+2])
			}
		}
	case *image.RGBA: // opaque PNGs decode to RGBA with alpha 255
		for y := range h {
			row := m.Pix[y*m.Stride:]
			for x := range w {
				put(y*w+x, row[x*4], row[x*4+1], row[x*4+2])
			}
		}
	case *image.Gray:
		for y := range h {
			row := m.Pix[y*m.Stride:]
			for x := range w {
				put(y*w+x, row[x], row[x], row[x])
			}
		}
	case *image.YCbCr:
		for y := range h {
			for x := range w {
				yi, ci := m.YOffset(b.Min.X+x, b.Min.Y+y), m.COffset(b.Min.X+x, b.Min.Y+y)
				r, g, bl := color.YCbCrToRGB(m.Y[yi], m.Cb[ci], m.Cr[ci])
				put(y*w+x, r, g, bl)
			}
		}
	case *image.Paletted:
		pal := make([][3]uint8, len(m.Palette))
		for i, c := range m.Palette {
			n := straight(c)
			pal[i] = [3]uint8{n.R, n.G, n.B}
		}
		for y := range h {
			row := m.Pix[y*m.Stride:]
			for x := range w {
				p := [3]uint8{} // an index past the palette reads black, as PIL's padded palette does
				if int(row[x]) < len(pal) {
					p = pal[row[x]]
				}
				put(y*w+x, p[0], p[1], p[2])
			}
		}
	default:
		for y := range h {
			for x := range w {
				n := straight(img.At(b.Min.X+x, b.Min.Y+y))
				put(y*w+x, n.R, n.G, n.B)
			}
		}
	}
	return out
}

// straight is a colour's non-premultiplied 8-bit form; for NRGBA/NRGBA64 (PNG with alpha) that
// is the stored colour itself, whatever its alpha, as PIL keeps it.
func straight(c color.Color) color.NRGBA {
	switch v := c.(type) {
	case color.NRGBA:
		return v
	case color.NRGBA64:
		return color.NRGBA{uint8(v.R >> 8), uint8(v.G >> 8), uint8(v.B >> 8), uint8(v.A >> 8)}
	}
	return color.NRGBAModel.Convert(c).(color.NRGBA)
}

// patchify rescales, normalises and cuts resized RGB pixels into HF's pixel_values layout:
// rows in (t, h/merge, w/merge, merge_h, merge_w) order, columns in (channel, temporal,
// patch_h, patch_w) order, the single frame repeated temporal_patch_size times. It is the
// reshape/transpose(0, 3, 6, 4, 7, 2, 1, 5, 8) of Qwen2VLImageProcessor._preprocess.
func patchify(rgb []uint8, info Info, cfg Config) []float32 {
	// numpy: (u8.astype(float64) * rescale).astype(float32), then (x - mean) / std in float32.
	var lut [3][256]float32
	for c := range 3 {
		for u := range 256 {
			lut[c][u] = (float32(float64(u)*cfg.RescaleFactor) - cfg.ImageMean[c]) / cfg.ImageStd[c]
		}
	}
	P, M, T := cfg.PatchSize, cfg.MergeSize, cfg.TemporalPatchSize
	gh, gw := info.GridTHW[1], info.GridTHW[2]
	W := info.ResizedWidth
	dim := cfg.PatchDim()
	out := make([]float32, info.Patches()*dim)
	row := 0
	for bh := range gh / M {
		for bw := range gw / M {
			for mh := range M {
				for mw := range M {
					dst := out[row*dim : (row+1)*dim]
					y0, x0 := (bh*M+mh)*P, (bw*M+mw)*P
					for c := range 3 {
						for t := range T {
							for ph := range P {
								for pw := range P {
									u := rgb[((y0+ph)*W+x0+pw)*3+c]
									dst[((c*T+t)*P+ph)*P+pw] = lut[c][u]
								}
							}
						}
					}
					row++
				}
			}
		}
	}
	return out
}
