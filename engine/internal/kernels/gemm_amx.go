package kernels

// The AMX path multiplies bf16 pairs in tiles: TDPBF16PS adds a 16-row tile of A's pairs (16
// pairs a row) times a 16-pair tile of B (16 columns a row, the pairs-of-rows layout the bf16 path
// already packs) into a 16×16 float32 tile. Its micro-kernel (gemm_amx_amd64.s) keeps a 32×32 block
// of c in four tiles and takes k 16 pairs at a time (kunit); the driver, the packing and the
// rounding are the bf16 GEMM's. Its tests passed on a real Xeon with AMX (issue 36), where it
// trained the small preset 1.9× faster than AVX512_BF16 at 8 × 256 tokens: it is the default
// where Linux grants the tile state (Best), for products of at least amxMinRows rows; the
// start-up check compares it with a float64 reference before it is used, and a path that
// disagrees falls back. This project's own machines have run only its Go model (amxModelMicro).

// amxModelMicro is the AMX micro-kernel in Go: each output a chain over the pairs in order, each
// pair adding its even product and then its odd one (TDPBF16PS as Intel describes it; the
// opposite order from VDPBF16PS), products exact, denormal inputs and sums flushed as measured
// for VDPBF16PS. Only the model has run: where AMX is present the assembly is compared with it to
// float32 tolerance, not bit for bit.
func amxModelMicro(kp int, a *uint32, lda int, b *uint32, c *float32, ldc int, first bool) {
	const mr, nr = 32, 32
	as, bs, cs := unsafeSlice(a, (mr-1)*lda+kp), unsafeSlice(b, kp*nr), unsafeSlice(c, (mr-1)*ldc+nr)
	for i := range mr {
		for j := range nr {
			var acc float32
			if !first {
				acc = cs[i*ldc+j]
			}
			for p := range kp {
				x, w := as[i*lda+p], bs[p*nr+j]
				acc = dotPairBF16(acc, x&0xffff, w&0xffff)   // even: the low halves
				acc = dotPairBF16(acc, x&^0xffff, w&^0xffff) // odd: the high halves
			}
			cs[i*ldc+j] = acc
		}
	}
}
