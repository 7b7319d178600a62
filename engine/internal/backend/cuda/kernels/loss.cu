// The head's loss rows (the engine's Ops.TargetLogprobs and LogitsGrad) over logits [N, V].
// Launch: one block per row, blockDim.x a multiple of 32 (at most 1024).
#include "common.cuh"

// target_logprobs: m = max of the row; the row becomes exp(logit - m); sumExp[r] = its sum (in
// double); lp[r] = (logit[target] - m) - log(sumExp[r]): log softmax at the target.
extern "C" __global__ void target_logprobs(float* __restrict__ logits, const int* __restrict__ target, int V,
                                           double* __restrict__ lp, double* __restrict__ sumExp) {
  __shared__ float scratch[32];
  __shared__ double scratch_d[32];
  long r = blockIdx.x;
  float* row = logits + r * V;
  float picked = row[target[r]];
  float m = -__int_as_float(0x7f800000);
  for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, row[j]);
  m = block_max(m, scratch);
  double s = 0.0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    float e = expf(row[j] - m);
    row[j] = e;
    s += e;
  }
  s = block_sum_d(s, scratch_d);
  if (threadIdx.x == 0) {
    sumExp[r] = s;
    lp[r] = (double)(picked - m) - log(s);
  }
}

// logits_grad: each row, exp(logit - m) as target_logprobs left it, becomes
// dlp*(onehot(target) - softmax) in place: row*(-dlp/sumExp), plus dlp at the target.
extern "C" __global__ void logits_grad(float* __restrict__ logits, const double* __restrict__ dlp,
                                       const double* __restrict__ sumExp, const int* __restrict__ target, int V) {
  long r = blockIdx.x;
  float* row = logits + r * V;
  double g = dlp[r];
  int t = target[r];
  if (g == 0.0) {
    for (int j = threadIdx.x; j < V; j += blockDim.x) row[j] = 0.f;
    return;
  }
  float k = (float)(-g / sumExp[r]);
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    float v = row[j] * k;
    if (j == t) v += (float)g;
    row[j] = v;
  }
}
