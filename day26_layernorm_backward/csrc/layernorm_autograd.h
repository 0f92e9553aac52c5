// The C++ entry of torch.ops.day26.layer_norm_fwd (layernorm_autograd.cpp): the op
// called through the dispatcher from the top (autograd, autocast, device kernel),
// what the pybind11 module exposes as the host fast path.
#pragma once

#include <optional>
#include <tuple>

#include <ATen/ATen.h>

namespace day26 {

std::tuple<at::Tensor, at::Tensor, at::Tensor> call_layer_norm_fwd(const at::Tensor& x, at::IntArrayRef nshape,
                                                                   const std::optional<at::Tensor>& weight,
                                                                   const std::optional<at::Tensor>& bias, double eps,
                                                                   int64_t version);

}  // namespace day26
