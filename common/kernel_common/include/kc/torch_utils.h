// kc/torch_utils.h: helpers for the torch side of a day (op validation and
// launch glue). Included only from C++ files compiled against torch, never
// from kernel (.cu) files.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdio>
#include <string>
#include <type_traits>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "kc/types.h"

// Turn a cudaError_t returned by a torch-free launcher into a c10::Error.
// (Use it only in files that include <cuda_runtime.h>.)
#define KC_TORCH_CHECK_CUDA(expr)                                              \
  do {                                                                         \
    auto kc_err_ = (expr);                                                     \
    TORCH_CHECK(kc_err_ == cudaSuccess, "CUDA error: ",                        \
                cudaGetErrorString(kc_err_), " (", #expr, ")");                \
  } while (0)

namespace kc {

// The kc::DType of a floating tensor; a clear error for anything else.
inline DType to_kc_dtype(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::F32;
    case at::kHalf: return DType::F16;
    case at::kBFloat16: return DType::BF16;
    default:
      TORCH_CHECK(false, name, " must be float32, float16 or bfloat16, got ", t.scalar_type());
  }
  return DType::F32;
}

// Numbers and shapes for error messages, formatted without std::ostream.
// Seen on the GPU image (torch 2.11): streaming an integer
// (`c10::str(..., int64_t)`, so also an IntArrayRef) from an extension crashed
// the process inside ostream's number formatting, while strings streamed fine.
// TORCH_CHECK messages in this repo therefore pass numbers through kc::fmt.
template <typename I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
inline std::string fmt(I v) {
  return std::to_string(v);
}
inline std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}
inline std::string fmt(at::IntArrayRef a) {
  std::string s = "[";
  for (size_t i = 0; i < a.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(a[i]);
  }
  return s + "]";
}

inline void check_float_dtype(const at::Tensor& t, const char* name) { (void)to_kc_dtype(t, name); }

inline void check_same_device(const at::Tensor& a, const char* an, const at::Tensor& b, const char* bn) {
  TORCH_CHECK(a.device() == b.device(), an, " and ", bn, " must be on the same device, got ",
              a.device(), " and ", b.device());
}

// Outputs are allocated through this. The tests switch poisoning on (through
// the private `_set_poison_outputs` each extension binds, see bind_test_hooks):
// every output then starts as NaN, so an element a kernel forgets to write shows
// up in the comparison instead of passing as whatever the allocator left there.
// One flag per extension module; off unless a test sets it, and never read from
// the environment, so a user's process cannot switch it on by accident.
inline std::atomic<bool> poison_outputs_flag{false};

inline bool poison_outputs() { return poison_outputs_flag.load(std::memory_order_relaxed); }

inline void set_poison_outputs(bool on) { poison_outputs_flag.store(on, std::memory_order_relaxed); }

// The private test hooks of an extension, bound on its pybind11 module `m`
// (one line in each day's PYBIND11_MODULE). kernel_common.testing calls them on
// every loaded day extension; users never need them.
template <typename Module>
inline void bind_test_hooks(Module& m) {
  m.def("_set_poison_outputs", &set_poison_outputs,
        "private (tests): fill every output with NaN before a kernel writes it");
  m.def("_poison_outputs", &poison_outputs, "private (tests): whether outputs start as NaN");
}

inline at::Tensor new_output(at::IntArrayRef sizes, const at::TensorOptions& opts) {
  at::Tensor t = at::empty(sizes, opts);
  if (poison_outputs() && t.numel() > 0 && at::isFloatingType(t.scalar_type())) t.fill_(NAN);
  return t;
}

inline at::Tensor new_output_like(const at::Tensor& like) {
  return new_output(like.sizes(), like.options().memory_format(at::MemoryFormat::Contiguous));
}

}  // namespace kc
