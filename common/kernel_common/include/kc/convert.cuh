// kc/convert.cuh: storage type <-> fp32 compute type, for float, __half and
// __nv_bfloat16. All arithmetic in this repo is done in fp32; these are the only
// conversions a kernel needs. (torch builds with __CUDA_NO_HALF_CONVERSIONS__,
// so implicit conversions are off; use these.)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kc/types.h"

namespace kc {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Element i of a buffer whose dtype is known only at run time (small side
// tensors, e.g. weights handled by a kernel templated on another type).
__device__ __forceinline__ float load_float(const void* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::F16: return to_float(static_cast<const __half*>(p)[i]);
    case DType::BF16: return to_float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}
__device__ __forceinline__ void store_float(void* p, DType dt, int64_t i, float v) {
  switch (dt) {
    case DType::F16: static_cast<__half*>(p)[i] = from_float<__half>(v); break;
    case DType::BF16: static_cast<__nv_bfloat16*>(p)[i] = from_float<__nv_bfloat16>(v); break;
    default: static_cast<float*>(p)[i] = v;
  }
}

}  // namespace kc
