// kc/types.h: the dtype tag shared by torch glue (C++) and kernels (CUDA).
// Plain C++, no CUDA and no torch, so both sides can include it.
#pragma once

namespace kc {

// Storage dtype of a tensor handed to a kernel. Arithmetic is always fp32.
enum class DType : int { F32 = 0, F16 = 1, BF16 = 2 };

// bytes an element
constexpr int dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
  }
  return "?";
}

}  // namespace kc
