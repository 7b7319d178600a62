// AdamW (decoupled weight decay, as torch.optim.AdamW and the engine's OptimStep), element-wise
// over an adapter's float32 weights w, gradients g and moments m, v; the arithmetic in double as
// on the CPU. bc1 = 1 - beta1^t and bc2 = 1 - beta2^t come from the host; clip scales the
// gradient (global-norm clipping: grad_sumsq gives the norm). Launch: any grid (grid-stride).
#include "common.cuh"

__device__ __forceinline__ bool finite_f(float x) { return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u; }

// adamw_step: with apply == 0 it only counts into *bad the elements whose new weight or moments
// would not be finite in float32 (a refused step changes nothing); with apply != 0 it stores them.
extern "C" __global__ void adamw_step(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ m,
                                      float* __restrict__ v, long n, double lr, double beta1, double beta2,
                                      double eps, double wd, double bc1, double bc2, double clip, int apply,
                                      unsigned int* __restrict__ bad) {
  for (long i = gs_first(); i < n; i += gs_stride()) {
    double gi = (double)g[i] * clip;
    double mf = beta1 * (double)m[i] + (1.0 - beta1) * gi;
    double vf = beta2 * (double)v[i] + (1.0 - beta2) * gi * gi;
    double wf = (double)w[i] * (1.0 - lr * wd);
    double upd = lr * (mf / bc1) / (sqrt(vf / bc2) + eps);
    float nw = (float)(wf - upd), nm = (float)mf, nv = (float)vf;
    if (!apply) {
      if (!finite_f(nw) || !finite_f(nm) || !finite_f(nv)) atomicAdd(bad, 1u);
      continue;
    }
    w[i] = nw;
    m[i] = nm;
    v[i] = nv;
  }
}

// grad_sumsq: *out += sum of g^2 in double (the global gradient norm's square, over calls).
// Launch: blockDim.x a multiple of 32 (at most 1024), any grid.
extern "C" __global__ void grad_sumsq(const float* __restrict__ g, long n, double* __restrict__ out) {
  __shared__ double scratch[32];
  double s = 0.0;
  for (long i = gs_first(); i < n; i += gs_stride()) s += (double)g[i] * (double)g[i];
  s = block_sum_d(s, scratch);
  if (threadIdx.x == 0) atomicAdd(out, s);
}
