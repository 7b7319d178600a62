// common.cuh: the helpers every kernel shares. Header-free on purpose: NVRTC 11.8 ships no CUDA
// headers (no cuda_bf16.h), so bf16 is plain bits here, and this file is handed to NVRTC from
// memory (the Go side passes it as the header "common.cuh").
#pragma once

typedef unsigned short bf16; // bfloat16 bits: a float32's top 16

// bf16_to_f32 widens exactly.
__device__ __forceinline__ float bf16_to_f32(bf16 h) { return __int_as_float(((unsigned)h) << 16); }

// f32_to_bf16 rounds to nearest, ties to even; NaN stays a (quiet) NaN.
__device__ __forceinline__ bf16 f32_to_bf16(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x0040u);
  return (bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// warp_sum and warp_max reduce over the 32 lanes of a full warp; every lane gets the result.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// block_sum and block_max reduce over a block of whole warps (blockDim.x a multiple of 32, at
// most 1024); every thread gets the result. scratch holds 32 floats of shared memory; the call
// ends with a barrier, so the same scratch can serve the next reduction.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.f;
  v = warp_sum(v);
  __syncthreads();
  return v;
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -__int_as_float(0x7f800000);
  v = warp_max(v);
  __syncthreads();
  return v;
}

// block_sum_d is block_sum in double (a row's float64 totals, as the CPU keeps them).
__device__ __forceinline__ double block_sum_d(double v, double* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  return v;
}

// grid_stride: for (long i = first(); i < n; i += stride()) walks n elements with any grid.
__device__ __forceinline__ long gs_first() { return (long)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ long gs_stride() { return (long)gridDim.x * blockDim.x; }
