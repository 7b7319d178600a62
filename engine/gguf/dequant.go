package gguf

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/skein-ai/skein/engine/internal/quant"
)

// Float32s is a tensor's values as float32, in its storage order (innermost dimension
// fastest): float types widened exactly, block types dequantized as ggml's dequantize_row_*.
func Float32s(t *TensorInfo) ([]float32, error) {
	n := t.Elements()
	rowBytes, err := t.Type.RowBytes(t.Dims[0])
	if err != nil {
		return nil, err
	}
	if len(t.Data) != rowBytes*(n/t.Dims[0]) {
		return nil, fmt.Errorf("gguf: tensor %s has %d bytes, its shape needs %d", t.Name, len(t.Data), rowBytes*(n/t.Dims[0]))
	}
	out := make([]float32, n)
	b := t.Data
	switch t.Type {
	case F32:
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
	case F16:
		for i := range out {
			out[i] = quant.F16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
		}
	case BF16:
		for i := range out {
			out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16)
		}
	case Q8_0:
		quant.DequantizeQ8_0(out, b)
	case Q4_K:
		quant.DequantizeQ4_K(out, b)
	case Q6_K:
		quant.DequantizeQ6_K(out, b)
	case Q4_0:
		dequantizeQ4_0(out, b)
	default:
		return nil, fmt.Errorf("gguf: tensor %s: cannot read type %s", t.Name, t.Type)
	}
	return out, nil
}

// dequantizeQ4_0 is ggml's dequantize_row_q4_0: blocks of 32 as f16 d and 16 bytes; element j
// is the low nibble of byte j, element j+16 its high nibble; x = d·(q − 8).
func dequantizeQ4_0(dst []float32, b []byte) {
	for blk := range len(dst) / 32 {
		o := b[blk*18:]
		d := quant.F16ToF32(binary.LittleEndian.Uint16(o))
		y := dst[blk*32:]
		for j := range 16 {
			q := o[2+j]
			y[j] = float32(int(q&0xf)-8) * d
			y[j+16] = float32(int(q>>4)-8) * d
		}
	}
}
