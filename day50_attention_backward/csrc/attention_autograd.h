// The C++ entry of torch.ops.day50.attention_forward (attention_autograd.cpp):
// the op called through the dispatcher from the top (autograd, autocast, device
// kernel), what the pybind11 module exposes as the host fast path.
#pragma once

#include <optional>
#include <tuple>

#include <ATen/ATen.h>

namespace day50 {

std::tuple<at::Tensor, at::Tensor> call_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                          const at::Tensor& v, bool causal,
                                                          std::optional<double> scale, c10::string_view backend,
                                                          bool deterministic, at::IntArrayRef window,
                                                          double softcap);

}  // namespace day50
