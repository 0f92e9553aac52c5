// LayerNorm forward, version 1: the seed's structure (layernorm_fwd_common.cuh
// has the math and the list of versions). One block of 256 threads per row,
// three passes over the row in global memory, scalar loads.
#include "layernorm_fwd_common.cuh"

#include "kc/check.cuh"

namespace day26 {
namespace {

// v1. Assumes blockDim.x = 256 (any multiple of 32 works), grid = rows (<= 2^31-1
// blocks; the launcher loops over chunks of rows otherwise).
template <typename T, typename TW>
__global__ void ln_fwd_v1(const T* __restrict__ x, const TW* __restrict__ w, const TW* __restrict__ b,
                          T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                          int64_t row0, int64_t D, float eps) {
  __shared__ float red[32];
  const int64_t row = row0 + blockIdx.x;
  const T* xr = x + row * D;
  float s = 0.f;
  const bool center = mean_out != nullptr;  // null: RMSNorm (mean taken as 0)
  if (center)
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) s += kc::to_float(xr[c]);
  const float mean = center ? kc::block_reduce_sum(s, red) / float(D) : 0.f;
  float q = 0.f;
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
    const float d = kc::to_float(xr[c]) - mean;
    q += d * d;
  }
  const float rstd = rsqrtf(kc::block_reduce_sum(q, red) / float(D) + eps);
  T* yr = y + row * D;
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x)
    yr[c] = kc::from_float<T>((kc::to_float(xr[c]) - mean) * rstd * load_w(w, c) + load_b(b, c));
  if (threadIdx.x == 0) {
    if (center) mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

}  // namespace

// one block per row, in chunks that fit a grid
cudaError_t fwd_launch_v1(const LnForwardArgs& a, cudaStream_t stream) {
  return ln_typed(a.dt, a.wdt, [&](auto t, auto tw) -> cudaError_t {
    using T = decltype(t);
    using TW = decltype(tw);
    const T* x = static_cast<const T*>(a.x);
    T* y = static_cast<T*>(a.y);
    const TW* w = static_cast<const TW*>(a.weight);
    const TW* b = static_cast<const TW*>(a.bias);
    for (int64_t r0 = 0; r0 < a.rows; r0 += 0x7fffffff) {
      const int64_t n = a.rows - r0 < 0x7fffffff ? a.rows - r0 : 0x7fffffff;
      ln_fwd_v1<T, TW><<<unsigned(n), 256, 0, stream>>>(x, w, b, y, a.mean, a.rstd, r0, a.cols, a.eps);
      KC_CUDA_LAUNCH_TRY();
    }
    return cudaSuccess;
  });
}

}  // namespace day26
