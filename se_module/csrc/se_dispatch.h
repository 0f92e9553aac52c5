// se_dispatch.h: torch.ops.se_module.se_block called through the C++ dispatcher,
// shared by the autograd kernel (binding.cpp, under a guard that skips the
// Autograd key) and the extension's host fast path (binding.cpp, from the top:
// the same autograd, autocast fallthrough and device kernels as torch.ops).
#pragma once

#include "kc/dispatch.h"

namespace se_glue {

inline at::Tensor call_se_block(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                                const at::Tensor& b2, int64_t act, int64_t version, int64_t gate) {
  static const auto op =
      kc::find_op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                             const at::Tensor&, int64_t, int64_t, int64_t)>("se_module::se_block");
  return op.call(x, w1, b1, w2, b2, act, version, gate);
}

inline std::tuple<at::Tensor, at::Tensor> call_se_block_train(const at::Tensor& x, const at::Tensor& w1,
                                                              const at::Tensor& b1, const at::Tensor& w2,
                                                              const at::Tensor& b2, int64_t act, int64_t version,
                                                              int64_t gate) {
  static const auto op =
      kc::find_op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                     const at::Tensor&, const at::Tensor&, int64_t, int64_t,
                                                     int64_t)>("se_module::se_block_train");
  return op.call(x, w1, b1, w2, b2, act, version, gate);
}

}  // namespace se_glue
