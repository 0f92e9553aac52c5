// LayerNorm backward, version 1: the seed's algorithm, fixed. One block per row;
// pass 1 reduces sum(g) and sum(g * xhat) through shared memory, pass 2 writes
// dx (x and dy read twice; long rows, the fallback's, keep them in shared
// memory from pass 1). dweight/dbias: a second kernel in which 32 row slices
// per column walk all rows (coalesced across the warp, deterministic; no
// partials, no finalize). Any D. The fallback of every other version
// (layernorm_versions.h).
#include "layernorm_bwd_common.cuh"

#include "kc/check.cuh"
#include "kc/convert.cuh"
#include "kc/launch.cuh"
#include "kc/reduce.cuh"
#include "kc/switch.cuh"

namespace day26 {
namespace {

template <typename TW>
__device__ __forceinline__ float load_w(const TW* p, int64_t c) { return p ? kc::to_float(p[c]) : 1.f; }

// Assumes blockDim.x = V1Shape<kLong>::kThreads; grid = rows in this chunk.
// cached (kLong): the launch gave 2 * D * sizeof(T) bytes of dynamic shared
// memory (dy's row, then x's), filled by pass 1; each thread reads back only the
// elements it stored, so no barrier guards them.
template <typename T, typename TW, bool kLong>
__global__ void __launch_bounds__(V1Shape<kLong>::kThreads, V1Shape<kLong>::kMinBlocks)
    ln_bwd_dx_v1(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
                 const float* __restrict__ rstd, const TW* __restrict__ w, T* __restrict__ dx, int64_t row0,
                 int64_t D, bool cached) {
  constexpr int K = (V1Shape<kLong>::kBatch + 1) / 2;  // columns: two row loads and a weight each
  cached = kLong && cached;
  extern __shared__ __align__(16) unsigned char v1_rows[];
  T* cdy = reinterpret_cast<T*>(v1_rows);
  T* cx = cdy + D;
  __shared__ float red[64];
  const int64_t row = row0 + blockIdx.x;
  const T* xr = x + row * D;
  const T* dyr = dy + row * D;
  const float mu = load_mean(mean, row), rs = rstd[row];
  struct Elem {
    T g, x;
    float w;
  };
  float sums[2] = {0.f, 0.f};  // sum(g), sum(g * xhat)
  v1_walk<K>(D, [&](int64_t c) { return Elem{dyr[c], xr[c], load_w(w, c)}; }, [&](int64_t c, const Elem& e) {
    if (cached) cdy[c] = e.g, cx[c] = e.x;
    const float g = kc::to_float(e.g) * e.w;
    sums[0] += g;
    sums[1] += g * (kc::to_float(e.x) - mu) * rs;
  });
  kc::block_reduce_sum<2>(sums, red);
  const float a = mean ? sums[0] / float(D) : 0.f, b = sums[1] / float(D);
  T* dxr = dx + row * D;
  auto at = [&](int64_t c) {
    return cached ? Elem{cdy[c], cx[c], load_w(w, c)} : Elem{dyr[c], xr[c], load_w(w, c)};
  };
  v1_walk<K>(D, at, [&](int64_t c, const Elem& e) {
    const float g = kc::to_float(e.g) * e.w;
    const float xhat = (kc::to_float(e.x) - mu) * rs;
    dxr[c] = kc::from_float<T>(rs * (g - a - xhat * b));
  });
}

// dweight/dbias: blocks of 32 columns x 32 row slices (1024 threads); slice s
// adds rows s, s + 32, s + 64, ... of its column (four rows' loads in flight),
// then slice 0 adds the 32 slices in slice order: the order depends on the
// shape only, so the same inputs give bitwise the same sums.
template <typename T, typename TW>
__global__ void __launch_bounds__(1024)
    ln_bwd_dwdb_v1(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
                   const float* __restrict__ rstd, TW* __restrict__ dw, TW* __restrict__ db, int64_t rows,
                   int64_t D) {
  __shared__ float red[2][32][33];
  const int cx = threadIdx.x & 31, sy = threadIdx.x >> 5;
  const int64_t c = int64_t(blockIdx.x) * 32 + cx;
  float sw = 0.f, sb = 0.f;
  if (c < D) {
    for (int64_t r0 = sy; r0 < rows; r0 += 4 * 32) {
      float g[4], xh[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int64_t r = r0 + 32 * k;
        g[k] = r < rows ? kc::to_float(dy[r * D + c]) : 0.f;
        xh[k] = r < rows ? (kc::to_float(x[r * D + c]) - load_mean(mean, r)) * rstd[r] : 0.f;
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) sw += g[k] * xh[k], sb += g[k];
    }
  }
  red[0][sy][cx] = sw;
  red[1][sy][cx] = sb;
  __syncthreads();
  if (sy == 0 && c < D) {
    float tw = 0.f, tb = 0.f;
    for (int k = 0; k < 32; ++k) tw += red[0][k][cx], tb += red[1][k][cx];
    if (dw) dw[c] = kc::from_float<TW>(tw);
    if (db) db[c] = kc::from_float<TW>(tb);
  }
}

}  // namespace

// one block per row (V1Shape); long rows of dy and x cached in shared memory
// where they fit (v1_cache_bytes) and the device allows it
bool bwd_plan_v1(const LnBackwardArgs& a, LnBwdPlan& p) {
  p.grid = a.rows;
  p.threads = v1_threads(a.cols);
  p.smem = ln_typed(a.dt, a.wdt, [&](auto t, auto tw) {
    return v1_cache_granted(ln_bwd_dx_v1<decltype(t), decltype(tw), true>,
                            a.dx ? v1_cache_bytes(a.cols, 2 * elem_size(a.dt)) : 0);
  });
  return true;
}

cudaError_t bwd_launch_v1(const LnBackwardArgs& a, const LnBwdPlan& p, cudaStream_t stream) {
  return ln_typed(a.dt, a.wdt, [&](auto t, auto tw) -> cudaError_t {
    using T = decltype(t);
    using TW = decltype(tw);
    const BwdPtrs<T, TW> q(a);
    if (a.dx) {
      const cudaError_t e = KC_BOOL_SWITCH(v1_long(a.cols), kLong, [&]() -> cudaError_t {
        for (int64_t r0 = 0; r0 < a.rows; r0 += 0x7fffffff) {
          const int64_t n = a.rows - r0 < 0x7fffffff ? a.rows - r0 : 0x7fffffff;
          ln_bwd_dx_v1<T, TW, kLong><<<unsigned(n), p.threads, p.smem, stream>>>(q.dy, q.x, a.mean, a.rstd, q.w,
                                                                                   q.dx, r0, a.cols, p.smem > 0);
          KC_CUDA_LAUNCH_TRY();
        }
        return cudaSuccess;
      });
      if (e != cudaSuccess) return e;
    }
    if (a.dweight || a.dbias) {
      ln_bwd_dwdb_v1<T, TW><<<unsigned((a.cols + 31) / 32), 1024, 0, stream>>>(
          q.dy, q.x, a.mean, a.rstd, static_cast<TW*>(a.dweight), static_cast<TW*>(a.dbias), a.rows, a.cols);
      KC_CUDA_LAUNCH_TRY();
    }
    return cudaSuccess;
  });
}

}  // namespace day26
