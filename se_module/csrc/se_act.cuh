// se_act.cuh: the SE block's two activations as device functions, shared by
// every fused kernel: the squeeze activation act (after fc1; template
// parameter, it sits in the MLP's inner loops) and the gate (after fc2, the
// scale's activation; a runtime switch, it runs once per (n, c)).
// Each *_grad takes the pre-activation z (and the gate's output), and returns
// the derivative with torch's conventions at the kinks (ReLU' = 0 at 0,
// Hardsigmoid' = 1/6 strictly inside (-3, 3), Hardswish' as torch's
// hardswish_backward).
#pragma once

#include <cuda_runtime.h>

#include "se_module.h"

namespace se {
namespace dev {

__device__ __forceinline__ float sigmoidf_(float z) { return 1.f / (1.f + expf(-z)); }

template <Act ACT>
__device__ __forceinline__ float act_f(float z) {
  if constexpr (ACT == Act::SiLU) return z * sigmoidf_(z);
  if constexpr (ACT == Act::Hardswish) return z * fminf(fmaxf(z + 3.f, 0.f), 6.f) * (1.f / 6.f);
  return (z > 0.f || z != z) ? z : 0.f;  // ReLU; NaN passes through like torch.relu
}
template <Act ACT>
__device__ __forceinline__ float act_grad(float z) {
  if constexpr (ACT == Act::SiLU) {
    const float sg = sigmoidf_(z);
    return sg * (1.f + z * (1.f - sg));
  }
  if constexpr (ACT == Act::Hardswish) return z < -3.f ? 0.f : (z <= 3.f ? z * (1.f / 3.f) + 0.5f : 1.f);
  return z > 0.f ? 1.f : 0.f;
}

__device__ __forceinline__ float gate_f(Gate g, float z) {
  return g == Gate::Sigmoid ? sigmoidf_(z) : fminf(fmaxf(z * (1.f / 6.f) + 0.5f, 0.f), 1.f);
}
// d gate / d z, given z and s = gate_f(g, z)
__device__ __forceinline__ float gate_grad(Gate g, float z, float s) {
  return g == Gate::Sigmoid ? s * (1.f - s) : ((z > -3.f && z < 3.f) ? 1.f / 6.f : 0.f);
}

}  // namespace dev
}  // namespace se
