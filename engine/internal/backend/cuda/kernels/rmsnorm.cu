// RMSNorm forward and backward over rows of width d (the engine's Ops.RMSNorm, RMSNormBack).
// Launch: one block per row, blockDim.x a multiple of 32 (at most 1024), no dynamic shared memory.
#include "common.cuh"

// rmsnorm_fwd: inv[r] = 1/sqrt(mean(x[r]^2) + eps), y[r] = x[r]*inv[r]*w.
extern "C" __global__ void rmsnorm_fwd(const float* __restrict__ x, const float* __restrict__ w,
                                       float* __restrict__ y, float* __restrict__ inv, int d, float eps) {
  __shared__ float scratch[32];
  const float* xr = x + (long)blockIdx.x * d;
  float* yr = y + (long)blockIdx.x * d;
  float ss = 0.f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, scratch);
  float r = rsqrtf(ss / d + eps);
  if (threadIdx.x == 0) inv[blockIdx.x] = r;
  for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = xr[i] * r * w[i];
}

// rmsnorm_fwd_bf16: rmsnorm_fwd with y rounded to bf16 (the input of a bf16 GEMM).
extern "C" __global__ void rmsnorm_fwd_bf16(const float* __restrict__ x, const float* __restrict__ w,
                                            bf16* __restrict__ y, float* __restrict__ inv, int d, float eps) {
  __shared__ float scratch[32];
  const float* xr = x + (long)blockIdx.x * d;
  bf16* yr = y + (long)blockIdx.x * d;
  float ss = 0.f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, scratch);
  float r = rsqrtf(ss / d + eps);
  if (threadIdx.x == 0) inv[blockIdx.x] = r;
  for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = f32_to_bf16(xr[i] * r * w[i]);
}

// rmsnorm_bwd: with u = dy*w, dx = inv*u - x*inv^3*(sum u*x)/d; added to dx when accumulate != 0.
extern "C" __global__ void rmsnorm_bwd(const float* __restrict__ dy, const float* __restrict__ x,
                                       const float* __restrict__ inv, const float* __restrict__ w,
                                       float* __restrict__ dx, int d, int accumulate) {
  __shared__ float scratch[32];
  long o = (long)blockIdx.x * d;
  float dot = 0.f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) dot += dy[o + i] * w[i] * x[o + i];
  dot = block_sum(dot, scratch);
  float r = inv[blockIdx.x];
  float c = r * r * r * dot / d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float g = r * dy[o + i] * w[i] - x[o + i] * c;
    dx[o + i] = accumulate ? dx[o + i] + g : g;
  }
}
