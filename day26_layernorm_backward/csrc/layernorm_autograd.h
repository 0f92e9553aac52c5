// The C++ entry of torch.ops.day26.layer_norm_fwd (binding.cpp): the op
// called through the dispatcher from the top (autograd, autocast, device kernel),
// what the pybind11 module exposes as the host fast path.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

namespace day26 {

std::tuple<at::Tensor, at::Tensor, at::Tensor> call_layer_norm_fwd(const at::Tensor& x, at::IntArrayRef nshape,
                                                                   const std::optional<at::Tensor>& weight,
                                                                   const std::optional<at::Tensor>& bias, double eps,
                                                                   int64_t version);

// The same for torch.ops.day26.rms_norm_fwd: (y, rstd).
std::tuple<at::Tensor, at::Tensor> call_rms_norm_fwd(const at::Tensor& x, at::IntArrayRef nshape,
                                                     const std::optional<at::Tensor>& weight, double eps,
                                                     int64_t version);

// The same for torch.ops.day26.add_norm_fwd: (y, sum, mean, rstd).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> call_add_norm_fwd(
    const at::Tensor& x, const at::Tensor& residual, at::IntArrayRef nshape, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, double eps, bool rms, int64_t version);

// The backward's plan for a call (private: tests and tools/, through the
// module's _backward_plan), as (name, value) pairs. Set by layernorm_cuda.cpp
// in CUDA builds; null in CPU-only builds. Defined in binding.cpp.
// dsum (add_norm's backward) may be absent; rms: RMSNorm (mean ignored).
using LnBwdPlanQuery = std::vector<std::pair<std::string, int64_t>> (*)(
    const at::Tensor& dy, const at::Tensor& x, at::IntArrayRef nshape, const at::Tensor& mean, const at::Tensor& rstd,
    const std::optional<at::Tensor>& weight, std::array<bool, 3> mask, int64_t version,
    const std::optional<at::Tensor>& dsum, bool rms);
LnBwdPlanQuery& ln_backward_plan_query();

// The forward's plan for a call, likewise (_forward_plan): residual (add_norm)
// may be absent; rms: RMSNorm (or add_norm's "rms" kind).
using LnFwdPlanQuery = std::vector<std::pair<std::string, int64_t>> (*)(
    const at::Tensor& x, at::IntArrayRef nshape, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, int64_t version, const std::optional<at::Tensor>& residual, bool rms);
LnFwdPlanQuery& ln_forward_plan_query();

}  // namespace day26
