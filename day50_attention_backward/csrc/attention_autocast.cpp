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
// How: one boxed kernel serves every op (the dense and the packed-sequence
// forward and backward), so the rule is written once and follows the schemas in
// binding.cpp: it casts the tensor arguments by name, excludes its own autocast
// key and calls the op again through the dispatcher, so the cast tensors reach
// the Autograd kernel (attention_autograd.cpp) and gradients flow back through
// the casts to the float32 inputs, as with SDPA. Outside autocast this kernel
// never runs and mixed dtypes remain an error (check_qkv).
#include <string_view>

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

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
void register_autocast(torch::Library& m) {
  for (const char* name :
       {"attention_forward", "attention_backward", "attention_varlen_forward", "attention_varlen_backward"})
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&autocast_kernel<D>>());
}

}  // namespace
}  // namespace day50

TORCH_LIBRARY_IMPL(day50, AutocastCUDA, m) { day50::register_autocast<c10::DeviceType::CUDA>(m); }
TORCH_LIBRARY_IMPL(day50, AutocastCPU, m) { day50::register_autocast<c10::DeviceType::CPU>(m); }
