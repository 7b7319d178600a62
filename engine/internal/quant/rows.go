package quant

import (
	"fmt"
	"runtime"
	"sync"
)

// quantChunkRows is how many rows one worker converts and quantizes at a time: a chunk's
// float32 rows are all a worker holds (16 × 14336 weights: 0.9 MB), never the whole tensor.
const quantChunkRows = 16

// QuantizeRows quantizes rows rows of n weights into f's blocks on GOMAXPROCS goroutines, each
// taking chunks of rows: fill writes rows [r0, r1) as float32 into dst (len (r1−r0)·n), and the
// chunk is quantized by f.Quantize into its place. Every row's blocks depend on that row alone,
// so the result is f.Quantize's over the whole tensor, byte for byte (TestQuantizeRowsMatches),
// and the whole tensor is never widened to float32 at once: an 8B shape's head would be 2.1 GB.
func (f *Format) QuantizeRows(rows, n int, fill func(dst []float32, r0, r1 int) error) ([]byte, error) {
	if n <= 0 || n%f.Block != 0 || rows < 0 {
		return nil, fmt.Errorf("%w: %d rows of %d weights (blocks of %d)", ErrRowLength, rows, n, f.Block)
	}
	rowBytes := n / f.Block * f.BlockBytes
	// 16 spare bytes past the end, as Quantize leaves them: the Q8_0 vector kernel loads a
	// block's last quarter as 16 bytes.
	out := make([]byte, rows*rowBytes, rows*rowBytes+16)
	chunks := (rows + quantChunkRows - 1) / quantChunkRows
	var (
		next  = make(chan int, chunks)
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
	)
	for c := range chunks {
		next <- c
	}
	close(next)
	for range min(runtime.GOMAXPROCS(0), max(chunks, 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]float32, quantChunkRows*n)
			for c := range next {
				r0, r1 := c*quantChunkRows, min(rows, (c+1)*quantChunkRows)
				if err := f.quantizeChunk(out[r0*rowBytes:r1*rowBytes], buf[:(r1-r0)*n], n, r0, r1, fill); err != nil {
					errMu.Lock()
					first = cmpOr(first, err)
					errMu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return nil, first
	}
	return out, nil
}

// quantizeChunk fills rows [r0, r1) into buf and writes their blocks into dst.
func (f *Format) quantizeChunk(dst []byte, buf []float32, n, r0, r1 int, fill func([]float32, int, int) error) error {
	if err := fill(buf, r0, r1); err != nil {
		return err
	}
	b, err := f.Quantize(buf, n)
	if err != nil {
		return err
	}
	copy(dst, b)
	return nil
}

// cmpOr is the first non-nil error.
func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
