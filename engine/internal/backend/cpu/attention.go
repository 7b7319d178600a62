package cpu

import (
	"fmt"
	"math"

	"github.com/skein-ai/skein/engine/internal/backend"
	"github.com/skein-ai/skein/engine/internal/kernels"
)

// HeadsIn: for every token n = b·T + t and head, x = the head's row of Q (or K), normed
// (y = x·w/√(mean(x²)+eps), 1/rms kept) where a norm is given, rotated by row Angle[n] of the
// tables: y[i] = x[i]·c[i] − x[i+half]·s[i], y[i+half] = x[i+half]·c[i] + x[i]·s[i]. Queries
// go to QH row (b·KVH+kv)·G·T + g·T + t (and QHT transposed); keys and values to their slot.
func (s *step[E]) HeadsIn(a *backend.HeadsIn[E]) {
	T, N := a.T, a.B*a.T
	H, KVH, hd := a.H, a.KVH, a.HD
	G := H / KVH
	kernels.ParallelRows(N, func(r0, r1 int) {
		buf, kr := make([]E, hd), make([]E, hd)
		var scratch E
		for n := r0; n < r1; n++ {
			b, t := n/T, n%T
			cs, sn := a.Rot.At(n)
			for hh := range H {
				kv, g := hh/G, hh%G
				src := a.Q.V[(n*H+hh)*hd : (n*H+hh+1)*hd]
				if a.QNorm.V != nil {
					inv := &scratch
					if a.QInv.V != nil {
						inv = &a.QInv.V[n*H+hh]
					}
					normHead(src, a.QNorm.V, a.Eps, a.GGML, buf, inv)
					src = buf
				}
				row := (b*KVH+kv)*G*T + g*T + t
				dst := a.QH.V[row*hd : (row+1)*hd]
				ropeRow(src, dst, cs, sn)
				if a.QHT.V != nil {
					base := (b*KVH + kv) * hd * G * T
					for d, v := range dst {
						a.QHT.V[base+d*G*T+g*T+t] = v
					}
				}
			}
			slot := a.Slot[n]
			for kv := range KVH {
				src := a.K.V[(n*KVH+kv)*hd : (n*KVH+kv+1)*hd]
				if a.KNorm.V != nil {
					inv := &scratch
					if a.KInv.V != nil {
						inv = &a.KInv.V[n*KVH+kv]
					}
					normHead(src, a.KNorm.V, a.Eps, a.GGML, buf, inv)
					src = buf
				}
				ropeRow(src, kr, cs, sn)
				v := a.V.V[(n*KVH+kv)*hd : (n*KVH+kv+1)*hd]
				head := b*KVH + kv
				putKV(a.KeysT, a.Values, head, slot, kr, v)
				if a.Keys.V != nil {
					row := (head*T + t) * hd
					copy(a.Keys.V[row:row+hd], kr)
					base := head * hd * T
					for d, x := range v {
						a.ValuesT.V[base+d*T+t] = x
					}
				}
				if a.CacheKeysT.V != nil {
					putKV(a.CacheKeysT, a.CacheValues, head, slot, kr, v)
				}
			}
		}
	})
}

// putKV writes a head's key k into keysT [heads, hd, S] and value v into values [heads, S, hd]
// at slot.
func putKV[E backend.Float](keysT, values backend.Tensor[E], head, slot int, k, v []E) {
	hd, S := keysT.Dims[len(keysT.Dims)-2], keysT.Dims[len(keysT.Dims)-1]
	base := head * hd * S
	for d, x := range k {
		keysT.V[base+d*S+slot] = x
	}
	row := (head*S + slot) * hd
	copy(values.V[row:row+hd], v)
}

// normHead is rmsNormRow of one query or key head, rounded as ggml-cpu does when ggml (float32).
func normHead[E backend.Float](x, w []E, eps float64, ggml bool, y []E, inv *E) {
	if xf, ok := any(x).([]float32); ok && ggml {
		*inv = E(kernels.RMSNormRowGGML(xf, any(w).([]float32), eps, any(y).([]float32)))
		return
	}
	rmsNormRow(x, w, eps, y, inv)
}

// rmsNormRow normalises one row (a query or key head), storing 1/rms in inv.
func rmsNormRow[E backend.Float](x, w []E, eps float64, y []E, inv *E) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	iv := E(1 / math.Sqrt(ss/float64(len(x))+eps))
	*inv = iv
	for i, v := range x {
		y[i] = v * iv * w[i]
	}
}

// rmsNormRowBack writes rmsNormRow's input gradient into dx.
func rmsNormRowBack[E backend.Float](dy, x, w []E, inv E, dx []E) {
	var dot float64
	for i := range x {
		dot += float64(dy[i]) * float64(w[i]) * float64(x[i])
	}
	iv := float64(inv)
	c := E(iv * iv * iv * dot / float64(len(x)))
	for i := range x {
		dx[i] = inv*dy[i]*w[i] - x[i]*c
	}
}

// ropeRow rotates x into y by the angles whose cosines and sines are c and sn (HF rotate_half
// convention). Only the first 2·len(c) dims rotate (partial rotary, Qwen3.5); the rest pass
// through.
func ropeRow[E backend.Float](x, y, c, sn []E) {
	half := len(c)
	for i := range half {
		x1, x2 := x[i], x[i+half]
		y[i] = x1*c[i] - x2*sn[i]
		y[i+half] = x2*c[i] + x1*sn[i]
	}
	copy(y[2*half:], x[2*half:])
}

// ropeBack is ropeRow's transpose: rotation by −θ.
func ropeBack[E backend.Float](dy, dx, c, sn []E) {
	half := len(c) // partial rotary: the dims past 2·half passed through
	for i := range half {
		d1, d2 := dy[i], dy[i+half]
		dx[i] = d1*c[i] + d2*sn[i]
		dx[i+half] = d2*c[i] - d1*sn[i]
	}
	copy(dx[2*half:], dy[2*half:])
}

// CopySlots: for each of heads heads h and slot i < n, dst's key column dstSlot+i of head
// dstHead+h ← src's column srcSlot+i of head srcHead+h, and the value rows likewise.
func (s *step[E]) CopySlots(dst, src backend.KV[E], dstHead, dstSlot, srcHead, srcSlot, heads, n int) {
	if s.Err() != nil || n <= 0 || heads <= 0 {
		return
	}
	hd, dS := dst.KeysT.Dims[len(dst.KeysT.Dims)-2], dst.KeysT.Dims[len(dst.KeysT.Dims)-1]
	sS := src.KeysT.Dims[len(src.KeysT.Dims)-1]
	if srcSlot < 0 || dstSlot < 0 || srcSlot+n > sS || dstSlot+n > dS || src.KeysT.Dims[len(src.KeysT.Dims)-2] != hd {
		s.Fail(fmt.Errorf("cpu: CopySlots of %d slots from %d of %v to %d of %v", n, srcSlot, src.KeysT.Dims, dstSlot, dst.KeysT.Dims))
		return
	}
	for h := range heads {
		dh, sh := dstHead+h, srcHead+h
		for d := range hd {
			dk := (dh*hd+d)*dS + dstSlot
			sk := (sh*hd+d)*sS + srcSlot
			copy(dst.KeysT.V[dk:dk+n], src.KeysT.V[sk:sk+n])
		}
		dv := (dh*dS + dstSlot) * hd
		sv := (sh*sS + srcSlot) * hd
		copy(dst.Values.V[dv:dv+n*hd], src.Values.V[sv:sv+n*hd])
	}
}
