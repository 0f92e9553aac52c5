// kc/switch.cuh: turn run-time choices into compile-time template parameters
// in one place (the launcher), not `if`s in inner loops.
//
//   KC_BOOL_SWITCH(cond, NAME, ...)   runs the body with `constexpr bool NAME`
//   KC_DTYPE_SWITCH(dtype, T, ...)    runs the body with `using T = float |
//                                     __half | __nv_bfloat16` for a kc::DType
//
// The body is a lambda body; it may `return` a value (all branches must return
// the same type). Usage:
//   KC_DTYPE_SWITCH(dt, T, [&] { KC_BOOL_SWITCH(vec, kVec, [&] {
//       kernel<T, kVec><<<g, b, 0, s>>>(...); }); });
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kc/types.h"

#define KC_BOOL_SWITCH(COND, NAME, ...)       \
  [&] {                                       \
    if (COND) {                               \
      constexpr bool NAME = true;             \
      return __VA_ARGS__();                   \
    } else {                                  \
      constexpr bool NAME = false;            \
      return __VA_ARGS__();                   \
    }                                         \
  }()

#define KC_DTYPE_SWITCH(DT, T, ...)                                   \
  [&] {                                                               \
    switch (DT) {                                                     \
      case ::kc::DType::F16: { using T = __half; return __VA_ARGS__(); } \
      case ::kc::DType::BF16: { using T = __nv_bfloat16; return __VA_ARGS__(); } \
      default: { using T = float; return __VA_ARGS__(); }             \
    }                                                                 \
  }()
