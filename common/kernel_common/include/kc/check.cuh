// kc/check.cuh: CUDA error checks that do not depend on torch.
//
// Kernel files (csrc/*.cu) know nothing of torch, so they cannot throw a
// c10::Error. Their launchers return a cudaError_t instead, and the torch glue
// turns it into an exception (KC_TORCH_CHECK_CUDA in kc/torch_utils.h).
//
//   KC_CUDA_TRY(expr)    evaluate expr; if it is not cudaSuccess, return it from
//                        the enclosing function (which must return cudaError_t).
//   KC_CUDA_LAUNCH_TRY() after a <<<>>> launch: return cudaGetLastError() if set.
//   KC_CUDA_CHECK(expr)  for standalone programs and tests: print and abort.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define KC_CUDA_TRY(expr)                          \
  do {                                             \
    cudaError_t kc_err_ = (expr);                  \
    if (kc_err_ != cudaSuccess) return kc_err_;    \
  } while (0)

#define KC_CUDA_LAUNCH_TRY() KC_CUDA_TRY(cudaGetLastError())

#define KC_CUDA_CHECK(expr)                                                   \
  do {                                                                        \
    cudaError_t kc_err_ = (expr);                                             \
    if (kc_err_ != cudaSuccess) {                                             \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n",                    \
                   cudaGetErrorName(kc_err_), __FILE__, __LINE__,             \
                   cudaGetErrorString(kc_err_));                              \
      std::abort();                                                           \
    }                                                                         \
  } while (0)
