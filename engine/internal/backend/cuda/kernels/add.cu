// The residual add, element-wise (the engine's Ops.Add). Launch: any grid (grid-stride loops).
#include "common.cuh"

// add_f32: dst += src.
extern "C" __global__ void add_f32(float* __restrict__ dst, const float* __restrict__ src, long n) {
  for (long i = gs_first(); i < n; i += gs_stride()) dst[i] += src[i];
}

// add_bf16_f32: dst += src widened from bf16 (a bf16 product's output onto the float32 stream).
extern "C" __global__ void add_bf16_f32(float* __restrict__ dst, const bf16* __restrict__ src, long n) {
  for (long i = gs_first(); i < n; i += gs_stride()) dst[i] += bf16_to_f32(src[i]);
}
