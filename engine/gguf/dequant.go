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
		dequantizeQ6_K(out, b)
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

// dequantizeQ6_K is ggml's dequantize_row_q6_K: super-blocks of 256 as ql[128] (low 4 bits),
// qh[64] (high 2 bits), 16 int8 scales (one per 16 weights) and f16 d; x = d·sc·(q − 32).
func dequantizeQ6_K(dst []float32, b []byte) {
	for blk := range len(dst) / 256 {
		o := b[blk*210:]
		ql, qh, sc := o[0:128], o[128:192], o[192:208]
		d := quant.F16ToF32(binary.LittleEndian.Uint16(o[208:]))
		y := dst[blk*256:]
		for half := range 2 {
			ql, qh, sc, y := ql[64*half:], qh[32*half:], sc[8*half:], y[128*half:]
			for l := range 32 {
				is := l / 16
				q1 := int(int8((ql[l]&0xf)|((qh[l]>>0)&3)<<4)) - 32
				q2 := int(int8((ql[l+32]&0xf)|((qh[l]>>2)&3)<<4)) - 32
				q3 := int(int8((ql[l]>>4)|((qh[l]>>4)&3)<<4)) - 32
				q4 := int(int8((ql[l+32]>>4)|((qh[l]>>6)&3)<<4)) - 32
				y[l] = d * float32(int8(sc[is])) * float32(q1)
				y[l+32] = d * float32(int8(sc[is+2])) * float32(q2)
				y[l+64] = d * float32(int8(sc[is+4])) * float32(q3)
				y[l+96] = d * float32(int8(sc[is+6])) * float32(q4)
			}
		}
	}
}
