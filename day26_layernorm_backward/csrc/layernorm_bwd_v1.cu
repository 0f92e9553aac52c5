// LayerNorm backward, version 1: the seed's algorithm, fixed. One block of 256
// threads per row; pass 1 reduces sum(g) and sum(g * xhat) through shared
// memory, pass 2 writes dx (x and dy read twice). dweight/dbias: a second kernel
// with one thread per column walking all rows (coalesced across the warp,
// deterministic; no partials, no finalize). Any D. The fallback of every other
// version (layernorm_versions.h).
#include "layernorm_bwd_common.cuh"

#include "kc/check.cuh"
#include "kc/convert.cuh"
#include "kc/reduce.cuh"

namespace day26 {
namespace {

template <typename TW>
__device__ __forceinline__ float load_w(const TW* p, int64_t c) { return p ? kc::to_float(p[c]) : 1.f; }

// Assumes blockDim.x a multiple of 32; grid = rows in this chunk.
template <typename T, typename TW>
__global__ void ln_bwd_dx_v1(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
                             const float* __restrict__ rstd, const TW* __restrict__ w, T* __restrict__ dx,
                             int64_t row0, int64_t D) {
  __shared__ float red[64];
  const int64_t row = row0 + blockIdx.x;
  const T* xr = x + row * D;
  const T* dyr = dy + row * D;
  const float mu = load_mean(mean, row), rs = rstd[row];
  float sums[2] = {0.f, 0.f};  // sum(g), sum(g * xhat)
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
    const float g = kc::to_float(dyr[c]) * load_w(w, c);
    sums[0] += g;
    sums[1] += g * (kc::to_float(xr[c]) - mu) * rs;
  }
  kc::block_reduce_sum<2>(sums, red);
  const float a = mean ? sums[0] / float(D) : 0.f, b = sums[1] / float(D);
  T* dxr = dx + row * D;
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
    const float g = kc::to_float(dyr[c]) * load_w(w, c);
    const float xhat = (kc::to_float(xr[c]) - mu) * rs;
    dxr[c] = kc::from_float<T>(rs * (g - a - xhat * b));
  }
}

// One thread per column, all rows in order: coalesced, deterministic, slow for
// few columns (little parallelism) - the seed's "per-feature reduction".
template <typename T, typename TW>
__global__ void ln_bwd_dwdb_v1(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
                               const float* __restrict__ rstd, TW* __restrict__ dw, TW* __restrict__ db,
                               int64_t rows, int64_t D) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= D) return;
  float sw = 0.f, sb = 0.f;
  for (int64_t r = 0; r < rows; ++r) {
    const float g = kc::to_float(dy[r * D + c]);
    sw += g * (kc::to_float(x[r * D + c]) - load_mean(mean, r)) * rstd[r];
    sb += g;
  }
  if (dw) dw[c] = kc::from_float<TW>(sw);
  if (db) db[c] = kc::from_float<TW>(sb);
}

}  // namespace

cudaError_t bwd_launch_v1(const LnBackwardArgs& a, cudaStream_t stream) {
  return ln_typed(a.dt, a.wdt, [&](auto t, auto tw) -> cudaError_t {
    using T = decltype(t);
    using TW = decltype(tw);
    const BwdPtrs<T, TW> q(a);
    if (a.dx) {
      for (int64_t r0 = 0; r0 < a.rows; r0 += 0x7fffffff) {
        const int64_t n = a.rows - r0 < 0x7fffffff ? a.rows - r0 : 0x7fffffff;
        ln_bwd_dx_v1<T, TW><<<unsigned(n), 256, 0, stream>>>(q.dy, q.x, a.mean, a.rstd, q.w, q.dx, r0, a.cols);
        KC_CUDA_LAUNCH_TRY();
      }
    }
    if (a.dweight || a.dbias) {
      ln_bwd_dwdb_v1<T, TW><<<unsigned((a.cols + 255) / 256), 256, 0, stream>>>(
          q.dy, q.x, a.mean, a.rstd, static_cast<TW*>(a.dweight), static_cast<TW*>(a.dbias), a.rows, a.cols);
      KC_CUDA_LAUNCH_TRY();
    }
    return cudaSuccess;
  });
}

}  // namespace day26
