// attention_autocast.cpp: the ops' autocast rule, the one torch gives
// F.scaled_dot_product_attention (a lower_precision_fp op): under
// torch.autocast(device, dtype) the floating inputs on that device are cast to
// the autocast dtype (bfloat16 or float16), so out comes back in that dtype.
//
// Why it matters: in a transformers Llama under bf16 autocast, q and k leave
// RoPE as float32 (cos and sin are float32) while v is bfloat16. Without this
// rule the op sees mixed dtypes; SDPA casts all three and runs a fused kernel.
//
// What is cast: the tensors a kernel computes with (q, k, v; in the backward
// also grad_out and out). lse and grad_lse are float32 statistics and stay as
// they are (lse_dtype in attention_checks.h); integer tensors (cu_seqlens) are
// never cast; float64 is never cast (torch's rule: is_autocast_eligible). A
// tensor on another device is left alone, so the device check still names it.
//
// How, for the forwards (dense and packed): the autocast kernel excludes its own
// key and enters the op's autograd node (attention_autograd.cpp) with the
// autocast dtype; the node casts q, k, v by the same rule and saves the cast
// tensors. Its backward asks attention_backward for the gradients in the
// inputs' dtypes, which the fused kernels store from their fp32 sums: SDPA's
// path instead runs a cast kernel per float32 input in each direction (in a
// Llama layer under bf16 autocast, q's and k's gradients back to float32).
// Entering the node directly skips only the JIT tracer's key, which sits
// between Autocast and Autograd. For the backwards, called directly: one boxed
// kernel casts the tensor arguments by name (following the schemas in
// binding.cpp) and calls the op again through the dispatcher. Outside autocast
// neither runs and mixed dtypes remain an error (check_qkv).
#include <string_view>

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "attention_autograd.h"

namespace day50 {
namespace {

// Arguments that keep their dtype: the float32 (float64) row statistics.
bool keeps_dtype(std::string_view name) { return name == "lse" || name == "grad_lse"; }

template <c10::DeviceType D>
void autocast_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(at::autocast::get_autocast_dispatch_key_from_device_type(D));
  const auto dtype = at::autocast::get_autocast_dtype(D);
  const auto& args = op.schema().arguments();
  const size_t first = stack->size() - args.size();
  for (size_t i = 0; i < args.size(); ++i) {
    c10::IValue& a = (*stack)[first + i];
    if (a.isTensor() && !keeps_dtype(args[i].name())) a = at::autocast::cached_cast(dtype, a.toTensor(), D);
  }
  op.callBoxed(stack);
}

template <c10::DeviceType D>
AutocastTo autocast_to() {
  return {at::autocast::get_autocast_dtype(D), D};
}

template <c10::DeviceType D>
std::tuple<at::Tensor, at::Tensor> autocast_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                    bool causal, std::optional<double> scale,
                                                    c10::string_view backend, bool deterministic,
                                                    at::IntArrayRef window, double softcap) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(at::autocast::get_autocast_dispatch_key_from_device_type(D));
  return attention_forward_autocast(q, k, v, causal, scale, backend, deterministic, window, softcap, autocast_to<D>());
}

template <c10::DeviceType D>
std::tuple<at::Tensor, at::Tensor> autocast_varlen_forward(const at::Tensor& q, const at::Tensor& k,
                                                           const at::Tensor& v, const at::Tensor& cu_q,
                                                           const at::Tensor& cu_k, int64_t max_q, int64_t max_k,
                                                           bool causal, std::optional<double> scale,
                                                           at::IntArrayRef window, double softcap,
                                                           bool deterministic) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(at::autocast::get_autocast_dispatch_key_from_device_type(D));
  return attention_varlen_forward_autocast(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window, softcap,
                                           deterministic, autocast_to<D>());
}

template <c10::DeviceType D>
void register_autocast(torch::Library& m) {
  m.impl("attention_forward", &autocast_forward<D>);
  m.impl("attention_varlen_forward", &autocast_varlen_forward<D>);
  for (const char* name : {"attention_backward", "attention_varlen_backward"})
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&autocast_kernel<D>>());
}

}  // namespace
}  // namespace day50

TORCH_LIBRARY_IMPL(day50, AutocastCUDA, m) { day50::register_autocast<c10::DeviceType::CUDA>(m); }
TORCH_LIBRARY_IMPL(day50, AutocastCPU, m) { day50::register_autocast<c10::DeviceType::CPU>(m); }
