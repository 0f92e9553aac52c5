// The C++ entry of torch.ops.day50.attention_forward (attention_autograd.cpp):
// the op called through the dispatcher from the top (autograd, autocast, device
// kernel), what the pybind11 module exposes as the host fast path; and the
// autograd nodes' entry for the autocast rule.
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

// The autocast rule's entry (attention_autocast.cpp): the forwards' autograd nodes with the
// dtype to compute in. q, k, v floating on `device` (float64 excepted) are cast to `dtype` inside
// the node, and its backward returns their gradients in their own dtypes (float32 q, k: float32
// gradients from the fused backward's fp32 sums, no cast kernel).
struct AutocastTo {
  at::ScalarType dtype;
  c10::DeviceType device;
};

std::tuple<at::Tensor, at::Tensor> attention_forward_autocast(const at::Tensor& q, const at::Tensor& k,
                                                              const at::Tensor& v, bool causal,
                                                              std::optional<double> scale, c10::string_view backend,
                                                              bool deterministic, at::IntArrayRef window,
                                                              double softcap, AutocastTo to);

std::tuple<at::Tensor, at::Tensor> attention_varlen_forward_autocast(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_q, const at::Tensor& cu_k,
    int64_t max_q, int64_t max_k, bool causal, std::optional<double> scale, at::IntArrayRef window, double softcap,
    bool deterministic, AutocastTo to);

}  // namespace day50
