package quant

import (
	"bytes"
	"errors"
	"math"
	"runtime"
	"testing"
)

// QuantizeRows on several goroutines gives Quantize's blocks over the whole tensor byte for
// byte, for a row count that is not a whole number of chunks (and one of a single row), with
// its spare bytes; a failing fill is the error returned; a row of a part block is refused.
func TestQuantizeRowsMatches(t *testing.T) {
	old := runtime.GOMAXPROCS(4)
	defer runtime.GOMAXPROCS(old)
	for _, f := range []*Format{Q8_0, Q4_K} {
		for _, rows := range []int{1, 3*quantChunkRows + 5} {
			n := 2 * f.Block
			x := make([]float32, rows*n)
			for i := range x {
				x[i] = float32(math.Sin(float64(i)*0.37)*0.05 + math.Cos(float64(i)*0.011)*0.01)
			}
			want, err := f.Quantize(x, n)
			if err != nil {
				t.Fatal(err)
			}
			got, err := f.QuantizeRows(rows, n, func(dst []float32, r0, r1 int) error {
				copy(dst, x[r0*n:r1*n])
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) || cap(got)-len(got) < 16 {
				t.Fatalf("%s, %d rows: blocks differ from Quantize's (or no spare bytes: cap %d, len %d)", f.Name, rows, cap(got), len(got))
			}
		}
		bad := errors.New("unreadable rows")
		if _, err := f.QuantizeRows(40, f.Block, func([]float32, int, int) error { return bad }); !errors.Is(err, bad) {
			t.Fatalf("%s: a failing fill gave %v", f.Name, err)
		}
		if _, err := f.QuantizeRows(2, f.Block+1, func([]float32, int, int) error { return nil }); !errors.Is(err, ErrRowLength) {
			t.Fatalf("%s: rows of a part block gave %v", f.Name, err)
		}
	}
}
