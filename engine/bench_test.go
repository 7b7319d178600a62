package engine

import "testing"

// The bench's image is one image of whole merge blocks whose pixels the vision tower encodes;
// an image whose pixels do not match its grid is refused with an error, not a panic.
func TestVisionImagesPerSecondChecksItsImage(t *testing.T) {
	e := loadTiny(t, ArchQwen3VL, Options{})
	v := e.Config.VisionConfig
	img, err := BenchImage(v, 224)
	if err != nil {
		t.Fatal(err)
	}
	if g := img.Grids[0]; g[0] != 1 || g[1] != g[2] || g[1]%v.SpatialMergeSize != 0 || g[1]*v.PatchSize > 224 || len(img.PixelValues) != g[1]*g[2]*v.patchDim() {
		t.Fatalf("grid %v with %d pixel values", g, len(img.PixelValues))
	}
	if r, err := e.VisionImagesPerSecond(img, 2); err != nil || !(r > 0) {
		t.Fatalf("%v images/s, %v", r, err)
	}
	short := Images{PixelValues: img.PixelValues[:len(img.PixelValues)/2], Grids: img.Grids}
	huge := Images{PixelValues: img.PixelValues, Grids: [][3]int{{1, 1 << 20, 1 << 20}}}
	for name, bad := range map[string]Images{"short": short, "huge": huge, "no grid": {PixelValues: img.PixelValues}} {
		if _, err := e.VisionImagesPerSecond(bad, 1); err == nil {
			t.Errorf("%s image accepted", name)
		}
	}
	if _, err := e.VisionImagesPerSecond(img, 0); err == nil {
		t.Error("0 images accepted")
	}
	for _, side := range []int{0, v.PatchSize*v.SpatialMergeSize - 1, 1 << 20} {
		if _, err := BenchImage(v, side); err == nil {
			t.Errorf("side %d accepted", side)
		}
	}
	if _, err := BenchImage(nil, 224); err == nil {
		t.Error("a bench image for a text model")
	}
	text := loadTiny(t, ArchQwen3, Options{})
	if _, err := text.VisionImagesPerSecond(img, 1); err == nil {
		t.Error("a text model timed a vision tower")
	}
}
