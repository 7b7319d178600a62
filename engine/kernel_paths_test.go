package engine

import (
	"math"
	"testing"
)

// exp32 is accurate up to its overflow threshold: e^x for x in [88.38, 88.72] is below
// MaxFloat32 but its k = 128, whose 2^k alone is not a float32. The lower end (k = −126,
// the smallest normal 2^k) stays accurate too.
func TestExp32NearOverflow(t *testing.T) {
	var xs []float32
	for x := float32(88.3); x <= 88.72; x += 0.01 {
		xs = append(xs, x)
	}
	for x := float32(-87.33); x <= -87; x += 0.01 {
		xs = append(xs, x)
	}
	for _, x := range xs {
		want := math.Exp(float64(x))
		if got := float64(exp32(x)); math.Abs(got-want) > 4e-7*want {
			t.Fatalf("exp32(%v) = %v, want %v", x, got, want)
		}
	}
}
