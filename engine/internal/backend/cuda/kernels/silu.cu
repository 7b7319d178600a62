// The SwiGLU gate forward and backward, element-wise over n (the engine's Ops.SiluGate,
// SiluGateBack). Launch: any grid (grid-stride loops).
#include "common.cuh"

// silu_gate_fwd: sig = sigmoid(gate), out = gate*sig*up.
extern "C" __global__ void silu_gate_fwd(const float* __restrict__ gate, const float* __restrict__ up,
                                         float* __restrict__ sig, float* __restrict__ out, long n) {
  for (long i = gs_first(); i < n; i += gs_stride()) {
    float g = gate[i];
    float s = 1.f / (1.f + expf(-g));
    sig[i] = s;
    out[i] = g * s * up[i];
  }
}

// silu_gate_bwd: dgate = da*up*s*(1 + g*(1 - s)), dup = da*g*s, with s = sig as the forward left it.
extern "C" __global__ void silu_gate_bwd(const float* __restrict__ da, const float* __restrict__ gate,
                                         const float* __restrict__ up, const float* __restrict__ sig,
                                         float* __restrict__ dgate, float* __restrict__ dup, long n) {
  for (long i = gs_first(); i < n; i += gs_stride()) {
    float g = gate[i], s = sig[i], a = da[i];
    dgate[i] = a * up[i] * s * (1.f + g * (1.f - s));
    dup[i] = a * g * s;
  }
}
