// LayerNorm forward, version 1: the seed's structure (layernorm_fwd_common.cuh
// has the math and the list of versions). One block per row, three passes over
// the row, scalar loads; long rows (the fallback's) cached in shared memory.
#include "layernorm_fwd_common.cuh"

#include "kc/check.cuh"
#include "kc/launch.cuh"
#include "kc/switch.cuh"

namespace day26 {
namespace {

// v1. Assumes blockDim.x = V1Shape<kLong>::kThreads; grid = rows (<= 2^31-1
// blocks; the launcher loops over chunks of rows otherwise). cached (kLong): the
// launch gave D * sizeof(T) bytes of dynamic shared memory, where the first pass
// keeps the row; each thread reads back only the elements it stored, so no
// barrier guards them.
template <typename T, typename TW, bool kLong>
__global__ void __launch_bounds__(V1Shape<kLong>::kThreads, V1Shape<kLong>::kMinBlocks)
    ln_fwd_v1(const T* __restrict__ x, const TW* __restrict__ w, const TW* __restrict__ b, T* __restrict__ y,
              float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t row0, int64_t D, float eps,
              bool cached) {
  constexpr int K = V1Shape<kLong>::kBatch;
  cached = kLong && cached;
  extern __shared__ __align__(16) unsigned char v1_row[];
  T* cache = reinterpret_cast<T*>(v1_row);
  __shared__ float red[32];
  const int64_t row = row0 + blockIdx.x;
  const T* xr = x + row * D;
  const bool center = mean_out != nullptr;  // null: RMSNorm (mean taken as 0)
  auto at = [&](int64_t c) { return kc::to_float(cached ? cache[c] : xr[c]); };
  // pass 1, from global memory: sum(x), or sum(x^2) where the mean is 0
  float s = 0.f;
  v1_walk<K>(D, [&](int64_t c) { return xr[c]; }, [&](int64_t c, T v) {
    if (cached) cache[c] = v;
    const float f = kc::to_float(v);
    s += center ? f : f * f;
  });
  float mean = 0.f, q = s;
  if (center) {
    mean = kc::block_reduce_sum(s, red) / float(D);
    q = 0.f;
    v1_walk<K>(D, at, [&](int64_t, float f) {
      const float d = f - mean;
      q += d * d;
    });
  }
  const float rstd = rsqrtf(kc::block_reduce_sum(q, red) / float(D) + eps);
  T* yr = y + row * D;
  v1_walk<K>(D, [&](int64_t c) { return make_float3(at(c), load_w(w, c), load_b(b, c)); },
          [&](int64_t c, float3 v) { yr[c] = kc::from_float<T>((v.x - mean) * rstd * v.y + v.z); });
  if (threadIdx.x == 0) {
    if (center) mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

}  // namespace

// the long row's cache where it fits and the device allows it
bool fwd_plan_v1(const LnForwardArgs& a, FwdPlan& p) {
  p.smem = ln_typed(a.dt, a.wdt, [&](auto t, auto tw) {
    return v1_cache_granted(ln_fwd_v1<decltype(t), decltype(tw), true>, v1_cache_bytes(a.cols, elem_size(a.dt)));
  });
  return true;
}

// one block per row (V1Shape), in chunks that fit a grid
cudaError_t fwd_launch_v1(const LnForwardArgs& a, const FwdPlan& p, cudaStream_t stream) {
  return ln_typed(a.dt, a.wdt, [&](auto t, auto tw) -> cudaError_t {
    using T = decltype(t);
    using TW = decltype(tw);
    const T* x = static_cast<const T*>(a.x);
    T* y = static_cast<T*>(a.y);
    const TW* w = static_cast<const TW*>(a.weight);
    const TW* b = static_cast<const TW*>(a.bias);
    return KC_BOOL_SWITCH(v1_long(a.cols), kLong, [&]() -> cudaError_t {
      for (int64_t r0 = 0; r0 < a.rows; r0 += 0x7fffffff) {
        const int64_t n = a.rows - r0 < 0x7fffffff ? a.rows - r0 : 0x7fffffff;
        ln_fwd_v1<T, TW, kLong><<<unsigned(n), V1Shape<kLong>::kThreads, p.smem, stream>>>(
            x, w, b, y, a.mean, a.rstd, r0, a.cols, a.eps, p.smem > 0);
        KC_CUDA_LAUNCH_TRY();
      }
      return cudaSuccess;
    });
  });
}

}  // namespace day26
