// kc/convert.cuh: storage type <-> fp32 compute type, for float, __half and
// __nv_bfloat16. All arithmetic in this repo is done in fp32; these are the only
// conversions a kernel needs. (torch builds with __CUDA_NO_HALF_CONVERSIONS__,
// so implicit conversions are off; use these.)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

}  // namespace kc
