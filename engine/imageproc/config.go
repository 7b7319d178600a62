// Package imageproc turns images into the inputs of a Qwen2-VL/Qwen3-VL vision tower, exactly as
// the Hugging Face image processor (Qwen2VLImageProcessor) does: decode, convert to RGB,
// smart_resize, PIL's bicubic resampling, rescale, normalise, and cut into patches.
//
// Every image is untrusted: its encoded size and its header's pixel count are checked before
// anything is decoded, and the token count it will cost is known before it is resized.
package imageproc

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path/filepath"

	"github.com/skein-ai/skein/internal/filebound"
)

// Config is a model's image preprocessing, as its preprocessor_config.json states it.
type Config struct {
	PatchSize         int        // side of one patch in pixels
	MergeSize         int        // patches merged per side into one LM token
	TemporalPatchSize int        // frames per patch; a still image is repeated this often
	MinPixels         int        // smart_resize's lower bound on height·width
	MaxPixels         int        // smart_resize's upper bound on height·width
	RescaleFactor     float64    // pixel scale before normalising (1/255)
	ImageMean         [3]float32 // per RGB channel
	ImageStd          [3]float32 // per RGB channel
}

// DefaultConfig is Qwen3-VL's preprocessor configuration.
func DefaultConfig() Config {
	return Config{
		PatchSize:         16,
		MergeSize:         2,
		TemporalPatchSize: 2,
		MinPixels:         65536,    // size.shortest_edge
		MaxPixels:         16777216, // size.longest_edge
		RescaleFactor:     1.0 / 255,
		ImageMean:         [3]float32{0.5, 0.5, 0.5},
		ImageStd:          [3]float32{0.5, 0.5, 0.5},
	}
}

// Factor is the side every resized dimension is a multiple of: patch_size × merge_size.
func (c Config) Factor() int { return c.PatchSize * c.MergeSize }

// PatchDim is the width of one pixel_values row: channels · temporal · patch · patch.
func (c Config) PatchDim() int { return 3 * c.TemporalPatchSize * c.PatchSize * c.PatchSize }

// ErrBadConfig marks a preprocessor configuration that cannot be used.
var ErrBadConfig = errors.New("bad preprocessor config")

// Validate checks the configuration's numbers, so that no later product overflows or divides
// by zero. Sizes are bounded far above any real model's.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case c.PatchSize < 1 || c.PatchSize > 256:
		return bad("patch_size %d not in [1, 256]", c.PatchSize)
	case c.MergeSize < 1 || c.MergeSize > 16:
		return bad("merge_size %d not in [1, 16]", c.MergeSize)
	case c.TemporalPatchSize < 1 || c.TemporalPatchSize > 16:
		return bad("temporal_patch_size %d not in [1, 16]", c.TemporalPatchSize)
	case c.MinPixels < 1 || c.MaxPixels < c.MinPixels || c.MaxPixels > 1<<30:
		return bad("min_pixels %d and max_pixels %d must satisfy 1 ≤ min ≤ max ≤ 2^30", c.MinPixels, c.MaxPixels)
	case !(c.RescaleFactor > 0) || math.IsInf(c.RescaleFactor, 0):
		return bad("rescale_factor %v must be positive", c.RescaleFactor)
	}
	for i, s := range c.ImageStd {
		if !(s > 0) || math.IsInf(float64(s), 0) || math.IsNaN(float64(c.ImageMean[i])) || math.IsInf(float64(c.ImageMean[i]), 0) {
			return bad("image_mean/image_std[%d] = %v/%v: std must be positive and both finite", i, c.ImageMean[i], s)
		}
	}
	return nil
}

// preprocessorJSON is the part of preprocessor_config.json we read. Pointers tell absent from zero.
type preprocessorJSON struct {
	PatchSize         *int       `json:"patch_size"`
	MergeSize         *int       `json:"merge_size"`
	TemporalPatchSize *int       `json:"temporal_patch_size"`
	MinPixels         *int       `json:"min_pixels"`
	MaxPixels         *int       `json:"max_pixels"`
	RescaleFactor     *float64   `json:"rescale_factor"`
	ImageMean         *[]float32 `json:"image_mean"`
	ImageStd          *[]float32 `json:"image_std"`
	Size              *struct {
		ShortestEdge *int `json:"shortest_edge"`
		LongestEdge  *int `json:"longest_edge"`
		MinPixels    *int `json:"min_pixels"` // older Qwen2-VL checkpoints
		MaxPixels    *int `json:"max_pixels"`
	} `json:"size"`
}

// ParseConfig reads a preprocessor_config.json; fields it lacks keep Qwen3-VL's defaults.
// As in HF's processor, top-level min_pixels/max_pixels win over size.shortest_edge/longest_edge.
func ParseConfig(b []byte) (Config, error) {
	var p preprocessorJSON
	if err := json.Unmarshal(b, &p); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	c := DefaultConfig()
	set := func(dst *int, src *int) {
		if src != nil {
			*dst = *src
		}
	}
	set(&c.PatchSize, p.PatchSize)
	set(&c.MergeSize, p.MergeSize)
	set(&c.TemporalPatchSize, p.TemporalPatchSize)
	if p.Size != nil {
		set(&c.MinPixels, p.Size.MinPixels)
		set(&c.MaxPixels, p.Size.MaxPixels)
		set(&c.MinPixels, p.Size.ShortestEdge)
		set(&c.MaxPixels, p.Size.LongestEdge)
	}
	set(&c.MinPixels, p.MinPixels)
	set(&c.MaxPixels, p.MaxPixels)
	if p.RescaleFactor != nil {
		c.RescaleFactor = *p.RescaleFactor
	}
	for name, src := range map[string]*[]float32{"image_mean": p.ImageMean, "image_std": p.ImageStd} {
		if src == nil {
			continue
		}
		if len(*src) != 3 {
			return Config{}, fmt.Errorf("%w: %s has %d values, want 3", ErrBadConfig, name, len(*src))
		}
		if name == "image_mean" {
			copy(c.ImageMean[:], *src)
		} else {
			copy(c.ImageStd[:], *src)
		}
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// MaxConfigBytes bounds a preprocessor_config.json (a real one is under a kilobyte).
const MaxConfigBytes = 1 << 20

// LoadConfig reads dir/preprocessor_config.json (a regular file of at most MaxConfigBytes). A directory without one gets Qwen3-VL's defaults.
func LoadConfig(dir string) (Config, error) {
	b, err := filebound.Read(filepath.Join(dir, "preprocessor_config.json"), MaxConfigBytes)
	if errors.Is(err, fs.ErrNotExist) {
		return DefaultConfig(), nil
	}
	if err != nil {
		return Config{}, fmt.Errorf("read preprocessor config: %w", err)
	}
	c, err := ParseConfig(b)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", filepath.Join(dir, "preprocessor_config.json"), err)
	}
	return c, nil
}
