// Attention's row softmax with a causal limit, in place (the probabilities of Ops.Attend).
// Scores are in the attention layout [B*KVH, G*T, S]: row r is token t = r % T of sequence
// b = r / (KVH*G*T), and sees slots 0..limit, limit = slot[b*T + t] (slot null: every slot).
// Launch: one block per row, blockDim.x a multiple of 32 (at most 1024).
#include "common.cuh"

// softmax_causal: x[r, j] = exp(scale*x[r, j] - m) / sum for j <= limit, 0 past it.
extern "C" __global__ void softmax_causal(float* __restrict__ x, const int* __restrict__ slot, int cols,
                                          int T, int rowsPerSeq, float scale) {
  __shared__ float scratch[32];
  long r = blockIdx.x;
  float* row = x + r * cols;
  int lim = cols - 1;
  if (slot) lim = min(slot[(r / rowsPerSeq) * T + r % T], cols - 1);
  float m = -__int_as_float(0x7f800000);
  for (int j = threadIdx.x; j <= lim; j += blockDim.x) m = fmaxf(m, scale * row[j]);
  m = block_max(m, scratch);
  float s = 0.f;
  for (int j = threadIdx.x; j <= lim; j += blockDim.x) {
    float e = expf(scale * row[j] - m);
    row[j] = e;
    s += e;
  }
  s = block_sum(s, scratch);
  float k = 1.f / s;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) row[j] = j <= lim ? row[j] * k : 0.f;
}
