// se_act.cuh: the SE block's two activations as device functions, shared by
// every fused kernel, and the switches that turn their runtime enums into
// template arguments.
//   act  (after fc1, the squeeze activation): ReLU, SiLU, Hardswish. A template
//        parameter: it sits in the MLP's inner loops. with_act() picks it.
//        act_rt / act_grad_rt: the same, switched at run time, for kernels that
//        apply it once per output (se_cluster.cu).
//   gate (after fc2, the scale activation): Sigmoid, Hardsigmoid. A runtime
//        value (MlpArgs / GemvArgs .gate): it runs once per (n, c).
//
// Derivatives follow torch's conventions at the kinks, checked against the CPU
// kernels of torch 2.13 (test.py, test_kinks_*):
//   ReLU'(z)        = 1 for z > 0, 0 for z <= 0
//   Hardswish'(z)   = 0 for z <= -3, z / 3 + 1/2 for -3 < z < 3, 1 for z >= 3
//   Hardsigmoid'(z) = 1/6 for -3 < z < 3, 0 otherwise
// NaN: every forward maps NaN to NaN, and every derivative of a NaN z is NaN,
// so dz = dy * f'(z) propagates it (torch's own backward kernels disagree among
// themselves there: hardswish's scalar and vectorized CPU paths differ). The
// derivatives are multiplied in (dz = dy * f'(z), never a select on dy), so a
// NaN dy also propagates where f' = 0.
#pragma once

#include <cuda_runtime.h>

#include "se_module.h"

namespace se {

// ---------------------------------------------------------------- runtime enum -> template
template <Act A>
struct ActTag {
  static constexpr Act value = A;
};

// f(ActTag<act>{}) (host code: the launchers): one instantiation of f's body per
// activation, chosen here (the only switch over Act). f's return type must not depend on the tag.
template <typename F>
decltype(auto) with_act(Act act, F&& f) {
  switch (act) {
    case Act::SiLU: return f(ActTag<Act::SiLU>{});
    case Act::Hardswish: return f(ActTag<Act::Hardswish>{});
    case Act::ReLU: break;
  }
  return f(ActTag<Act::ReLU>{});
}

namespace dev {

__device__ __forceinline__ float sigmoidf_(float z) { return 1.f / (1.f + expf(-z)); }
__device__ __forceinline__ bool isnan_(float z) { return z != z; }

template <Act ACT>
__device__ __forceinline__ float act_f(float z) {
  if constexpr (ACT == Act::SiLU) return z * sigmoidf_(z);
  // torch: x * min(max(x + 3, 0), 6) / 6 (a NaN x stays NaN through the product)
  if constexpr (ACT == Act::Hardswish) return z * fminf(fmaxf(z + 3.f, 0.f), 6.f) / 6.f;
  return (z > 0.f || isnan_(z)) ? z : 0.f;  // ReLU; NaN passes through like torch.relu
}

template <Act ACT>
__device__ __forceinline__ float act_grad(float z) {
  if constexpr (ACT == Act::SiLU) {
    const float sg = sigmoidf_(z);
    return sg * (1.f + z * (1.f - sg));
  }
  if constexpr (ACT == Act::Hardswish) return z <= -3.f ? 0.f : (z >= 3.f ? 1.f : z / 3.f + 0.5f);  // NaN: z / 3 + 0.5
  return z > 0.f ? 1.f : (isnan_(z) ? z : 0.f);
}

// act and act' with the activation chosen at run time
__device__ __forceinline__ float act_rt(Act a, float z) {
  switch (a) {
    case Act::SiLU: return act_f<Act::SiLU>(z);
    case Act::Hardswish: return act_f<Act::Hardswish>(z);
    default: return act_f<Act::ReLU>(z);
  }
}
__device__ __forceinline__ float act_grad_rt(Act a, float z) {
  switch (a) {
    case Act::SiLU: return act_grad<Act::SiLU>(z);
    case Act::Hardswish: return act_grad<Act::Hardswish>(z);
    default: return act_grad<Act::ReLU>(z);
  }
}

// s = gate(z)
__device__ __forceinline__ float gate_f(Gate g, float z) {
  if (g == Gate::Sigmoid) return sigmoidf_(z);
  return isnan_(z) ? z : fminf(fmaxf(z + 3.f, 0.f), 6.f) / 6.f;  // torch's hardsigmoid; fmaxf alone drops NaN
}

// dz = ds * gate'(z), given z and s = gate_f(g, z). Sigmoid's derivative comes
// from s; Hardsigmoid's needs z: s alone cannot tell z = 3 (derivative 0) from
// z just below it (1/6).
__device__ __forceinline__ float gate_bwd(Gate g, float z, float s, float ds) {
  if (g == Gate::Sigmoid) return ds * s * (1.f - s);
  const float d = (z > -3.f && z < 3.f) ? 1.f / 6.f : (isnan_(z) ? z : 0.f);
  return ds * d;
}

}  // namespace dev
}  // namespace se
