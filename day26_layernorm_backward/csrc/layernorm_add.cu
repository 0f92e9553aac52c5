// add_norm's elementwise add where no fused kernel runs: out = a + b over n
// elements (the forward's sum = x + residual before a norm that cannot take the
// residual; the backward's dx += dsum after a norm backward that cannot add it).
// Computed in fp32 and rounded once to the dtype, as torch's add does, so the
// unfused sum is bitwise torch's x + residual and the fused kernels' sum.
#include <algorithm>

#include "layernorm.h"
#include "layernorm_common.cuh"

#include "kc/check.cuh"

namespace day26 {
namespace {

// VEC > 1: a, b and out aligned to a VEC-vector and n % VEC == 0. Grid-stride
// over vectors, so any grid covers any n; out may alias a (each element is read
// before it is written, by the same thread).
template <typename T, int VEC>
__global__ void ln_add_kernel(const T* a, const T* b, T* out, int64_t nvec) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < nvec; i += int64_t(gridDim.x) * blockDim.x) {
    float fa[VEC], fb[VEC];
    kc::vec_to_float(kc::load_vec<VEC>(a + i * VEC), fa);
    kc::vec_to_float(kc::load_vec<VEC>(b + i * VEC), fb);
#pragma unroll
    for (int j = 0; j < VEC; ++j) fa[j] += fb[j];
    store_from_f32<T, VEC>(out + i * VEC, fa);
  }
}

}  // namespace

cudaError_t ln_add(const void* a, const void* b, void* out, int64_t n, kc::DType dt, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  return ln_input_typed(dt, [&](auto t) {
    using T = decltype(t);
    constexpr int V = kc::max_vec_elems<T>();
    const bool vec = n % V == 0 && kc::is_aligned(a, 16) && kc::is_aligned(b, 16) && kc::is_aligned(out, 16);
    const int64_t nvec = vec ? n / V : n;
    const int threads = 256;
    const int64_t cap = int64_t(num_sms()) * 8;  // enough blocks to fill the GPU; each walks the rest
    const int64_t blocks = std::min<int64_t>((nvec + threads - 1) / threads, cap);
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* po = static_cast<T*>(out);
    if (vec)
      ln_add_kernel<T, V><<<unsigned(blocks), threads, 0, stream>>>(pa, pb, po, nvec);
    else
      ln_add_kernel<T, 1><<<unsigned(blocks), threads, 0, stream>>>(pa, pb, po, nvec);
    return cudaGetLastError();
  });
}

}  // namespace day26
