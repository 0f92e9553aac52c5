// se_kernels.cuh: the device code that the stage ops (stages.cu) and the fused
// block (se_fused.cu) share: the HW reductions, the per-channel elementwise
// pass and fast index division.
//
// Assumptions common to every kernel here:
// - blocks of kThreads = 256 threads (a multiple of 32, as kc/reduce.cuh needs);
// - arithmetic in fp32 whatever the storage type (kc/convert.cuh);
// - vector width VEC is 16 bytes' worth of elements (4 fp32, 8 fp16/bf16) or 1.
//   The launcher takes VEC > 1 only after kc::is_aligned(ptr, 16) for every
//   pointer the kernel touches with vectors AND the innermost size (L in NCHW,
//   C in NHWC) is a multiple of VEC, so no vector straddles a row;
// - 64-bit element offsets everywhere; the elementwise pass also has a 32-bit
//   index path (FastDiv) taken only when N * C * L < 2^31.
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>

#include <cuda_runtime.h>

#include "kc/check.cuh"
#include "kc/convert.cuh"
#include "kc/launch.cuh"
#include "kc/reduce.cuh"
#include "kc/switch.cuh"
#include "kc/vec.cuh"
#include "se_module.h"

namespace se {
namespace dev {

constexpr int kThreads = 256;
// NCHW rows up to this long are reduced by one warp per (row, split); longer
// rows by a whole block per (row, split).
constexpr int64_t kWarpTeamMaxL = 4096;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int max_vec(kc::DType dt) { return dt == kc::DType::F32 ? 4 : 8; }
inline int nchw_team(const Dims& d) { return d.l > kWarpTeamMaxL ? kThreads : 32; }

// ------------------------------------------------------------------ PDL
// griddepcontrol and the PDL launch come from kc/launch.cuh (common/).
using kc::grid_dependency_wait;
using kc::launch;
using kc::launch_dependents;

inline cudaError_t check_grid(int64_t blocks) {
  return (blocks >= 1 && blocks <= 0x7fffffffLL) ? cudaSuccess : cudaErrorInvalidConfiguration;
}

// ------------------------------------------------------------------ index math
// n / d with one multiply-high (the IntDivider trick): valid for 0 <= n < 2^31
// and 1 <= d < 2^31.
struct FastDiv {
  uint32_t d = 1, m = 1, s = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t div) : d(div) {
    s = 0;
    while ((uint64_t(1) << s) < d) ++s;
    m = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << s) - d)) / d + 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const { return (__umulhi(n, m) + n) >> s; }
};

// ------------------------------------------------------------------ vectors
template <int VEC, typename T>
__device__ __forceinline__ void load_f(const T* p, float (&f)[VEC]) {
  if constexpr (VEC == 1) {
    f[0] = kc::to_float(p[0]);
  } else {
    const kc::Vec<T, VEC> v = kc::load_vec<VEC>(p);
#pragma unroll
    for (int k = 0; k < VEC; ++k) f[k] = kc::to_float(v.v[k]);
  }
}

// store VEC floats as T; streaming = evict-first (st.global.cs) for 16-byte vectors
template <int VEC, typename T>
__device__ __forceinline__ void store_f(T* p, const float (&f)[VEC], bool streaming) {
  kc::Vec<T, VEC> v;
#pragma unroll
  for (int k = 0; k < VEC; ++k) v.v[k] = kc::from_float<T>(f[k]);
  if constexpr (sizeof(v) == 16) {
    if (streaming) {
      float4 w;
      memcpy(&w, &v, 16);
      __stcs(reinterpret_cast<float4*>(p), w);
      return;
    }
  }
  kc::store_vec<VEC>(p, v);
}

// ------------------------------------------------------------------ reductions
// Sums over l for every (n, c): kSumX -> sum x, kSumGX -> sum g * x; with
// kWriteGS also gs_out = g * s[n, c] (the excitation backward's grad_x, in the
// same pass). Results: fp32 partials part_*[(n * splits + split) * C + c].
template <typename T>
struct ReduceArgs {
  const T* x;
  const T* g;
  const float* s;
  T* gs_out;
  int64_t n, c, l;
  int splits;
  int64_t chunk;  // elements of l per split
  float* part_x;
  float* part_gx;
  int tc;         // NHWC: vector columns per block tile
  int col_tiles;  // NHWC: tiles across C
};

// NCHW: rows r = n * C + c, each L contiguous elements.
// A team (TEAM = 32: one warp; TEAM = kThreads: the whole block) owns one unit
// (row, split). Lanes read consecutive VEC-vectors (coalesced), 4 independent
// vectors in flight per lane, then the team reduces with kc::warp_reduce_sum /
// kc::block_reduce_sum (fixed order: deterministic). Shared memory: 32 * 2 floats.
template <typename T, int VEC, int TEAM, bool kSumX, bool kSumGX, bool kWriteGS>
__global__ void __launch_bounds__(kThreads) reduce_rows_kernel(ReduceArgs<T> a) {
  static_assert(kSumX || kSumGX, "nothing to reduce");
  constexpr int NS = int(kSumX) + int(kSumGX);
  __shared__ float smem[32 * NS];
  grid_dependency_wait();
  launch_dependents();
  int64_t unit;
  int lane;
  if constexpr (TEAM == 32) {
    unit = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
    lane = threadIdx.x & 31;
    if (unit >= a.n * a.c * a.splits) return;  // the whole warp leaves together
  } else {
    unit = blockIdx.x;
    lane = threadIdx.x;
  }
  const int64_t row = unit / a.splits;
  const int sp = int(unit - row * a.splits);
  const int64_t begin = int64_t(sp) * a.chunk;
  const int64_t len = min(a.chunk, a.l - begin);
  const int64_t base = row * a.l + begin;
  const T* xr = a.x + base;
  const T* gr = kSumGX ? a.g + base : nullptr;
  const float srow = kWriteGS ? a.s[row] : 0.f;

  float sx = 0.f, sgx = 0.f;
  auto consume = [&](int64_t i, const float (&xv)[VEC], const float (&gv)[VEC]) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      if constexpr (kSumX) sx += xv[k];
      if constexpr (kSumGX) sgx += gv[k] * xv[k];
    }
    if constexpr (kWriteGS) {
      float o[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) o[k] = gv[k] * srow;
      store_f<VEC>(a.gs_out + base + i, o, false);
    }
  };
  // 4 vectors per lane per trip, all loads issued before any is used (a piece of
  // a row is often only 2-4 vectors per lane: no sequential remainder loop)
  constexpr int64_t STEP = int64_t(TEAM) * VEC;
  for (int64_t i0 = int64_t(lane) * VEC; i0 < len; i0 += 4 * STEP) {
    float xv[4][VEC], gv[4][VEC];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t i = i0 + u * STEP;
      if (i < len) {
        load_f<VEC>(xr + i, xv[u]);
        if constexpr (kSumGX) load_f<VEC>(gr + i, gv[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (i0 + u * STEP < len) consume(i0 + u * STEP, xv[u], gv[u]);
    }
  }

  if constexpr (TEAM == 32) {
    if constexpr (kSumX) sx = kc::warp_reduce_sum<32>(sx);
    if constexpr (kSumGX) sgx = kc::warp_reduce_sum<32>(sgx);
    if (lane != 0) return;
  } else {
    float v[NS];
    if constexpr (kSumX && kSumGX) {
      v[0] = sx;
      v[NS - 1] = sgx;
    } else {
      v[0] = kSumX ? sx : sgx;
    }
    kc::block_reduce_sum<NS, false>(v, smem);  // result in every thread; smem not reused after
    if (threadIdx.x != 0) return;
    if constexpr (kSumX) sx = v[0];
    if constexpr (kSumGX) sgx = v[NS - 1];
  }
  const int64_t n = row / a.c;
  const int64_t o = (n * a.splits + sp) * a.c + (row - n * a.c);
  if constexpr (kSumX) a.part_x[o] = sx;
  if constexpr (kSumGX) a.part_gx[o] = sgx;
}

// NHWC: x is [N, L, C]; a sum per column c over the rows l of one sample.
// Block = one (n, split, column tile). Thread t owns vector column
// t % tc of the tile and rows l = l0 + t / tc, stepping by rows_par = kThreads / tc,
// so a warp reads whole contiguous row segments (coalesced). The rows_par
// partial sums of each column are then added in a fixed order through shared
// memory (kThreads * VEC floats per sum). kc::block_reduce_* reduce a whole
// block to ONE value, which is not the shape of this reduction (one value per
// column), so the column step is written out here.
template <typename T, int VEC, bool kSumX, bool kSumGX, bool kWriteGS>
__global__ void __launch_bounds__(kThreads) reduce_cols_kernel(ReduceArgs<T> a) {
  static_assert(kSumX || kSumGX, "nothing to reduce");
  constexpr int NS = int(kSumX) + int(kSumGX);
  __shared__ float red[NS][kThreads * VEC];
  grid_dependency_wait();
  launch_dependents();
  const int64_t b = blockIdx.x;
  const int tile = int(b % a.col_tiles);
  const int64_t rest = b / a.col_tiles;
  const int sp = int(rest % a.splits);
  const int64_t n = rest / a.splits;
  const int tc = a.tc;
  const int rows_par = kThreads / tc;
  const int col = threadIdx.x % tc;
  const int rp = threadIdx.x / tc;
  const int64_t cv = a.c / VEC;
  const int64_t vcol = int64_t(tile) * tc + col;
  const bool active = rp < rows_par && vcol < cv;
  const int64_t l0 = int64_t(sp) * a.chunk;
  const int64_t l1 = min(a.l, l0 + a.chunk);

  float ax[VEC], agx[VEC], sv[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    ax[k] = 0.f;
    agx[k] = 0.f;
    sv[k] = 0.f;
  }
  if (active) {
    if constexpr (kWriteGS) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) sv[k] = a.s[n * a.c + vcol * VEC + k];
    }
    const int64_t col_off = vcol * VEC;
    auto consume = [&](int64_t off, const float (&xv)[VEC], const float (&gv)[VEC]) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        if constexpr (kSumX) ax[k] += xv[k];
        if constexpr (kSumGX) agx[k] += gv[k] * xv[k];
      }
      if constexpr (kWriteGS) {
        float o[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) o[k] = gv[k] * sv[k];
        store_f<VEC>(a.gs_out + off, o, false);
      }
    };
    for (int64_t l = l0 + rp; l < l1; l += 4 * rows_par) {
      float xv[4][VEC], gv[4][VEC];
      int64_t off[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        off[u] = (n * a.l + l + u * rows_par) * a.c + col_off;
        if (l + u * rows_par < l1) {
          load_f<VEC>(a.x + off[u], xv[u]);
          if constexpr (kSumGX) load_f<VEC>(a.g + off[u], gv[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (l + u * rows_par < l1) consume(off[u], xv[u], gv[u]);
      }
    }
  }
  if (rp < rows_par) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      if constexpr (kSumX) red[0][threadIdx.x * VEC + k] = ax[k];
      if constexpr (kSumGX) red[NS - 1][threadIdx.x * VEC + k] = agx[k];
    }
  }
  __syncthreads();
  // element e of the tile = column tile * tc * VEC + e; thread rp*tc+col wrote
  // its VEC values at (rp * tc + col) * VEC, so rows of the table are tc * VEC apart.
  const int width = tc * VEC;
  for (int e = threadIdx.x; e < width; e += kThreads) {
    const int64_t c = int64_t(tile) * width + e;
    if (c >= a.c) break;
    float s0 = 0.f, s1 = 0.f;
    for (int r = 0; r < rows_par; ++r) {
      if constexpr (kSumX) s0 += red[0][r * width + e];
      if constexpr (kSumGX) s1 += red[NS - 1][r * width + e];
    }
    const int64_t o = (n * a.splits + sp) * a.c + c;
    if constexpr (kSumX) a.part_x[o] = s0;
    if constexpr (kSumGX) a.part_gx[o] = s1;
  }
}

// NHWC tiling: vector columns per tile and number of tiles. At most kNhwcMaxTc
// vector columns per tile (balanced across the tiles), so that a block always
// walks several rows at once: with a whole row per tile (up to 256 vector columns),
// many channels over a small image left one row per block step and few blocks.
constexpr int kNhwcMaxTc = 32;
inline void nhwc_tiles(int64_t c, int vec, int* tc, int* col_tiles) {
  const int64_t cv = ceil_div(c, vec);
  *col_tiles = int(ceil_div(cv, kNhwcMaxTc));
  *tc = int(ceil_div(cv, *col_tiles));
}

template <bool kSumX, bool kSumGX, bool kWriteGS>
cudaError_t launch_reduce(const void* x, const void* g, const float* s, void* gs_out, kc::DType dt,
                          const Dims& d, const ReducePlan& p, float* part_x, float* part_gx,
                          cudaStream_t stream) {
  return KC_DTYPE_SWITCH(dt, T, [&]() -> cudaError_t {
    constexpr int MV = kc::max_vec_elems<T>();
    const int64_t inner = d.layout == Layout::NCHW ? d.l : d.c;
    const bool vec = kc::is_aligned(x, 16) && (g == nullptr || kc::is_aligned(g, 16)) &&
                     (gs_out == nullptr || kc::is_aligned(gs_out, 16)) && inner % MV == 0;
    ReduceArgs<T> a{static_cast<const T*>(x), static_cast<const T*>(g), s, static_cast<T*>(gs_out),
                    d.n, d.c, d.l, p.splits, p.chunk, part_x, part_gx, 0, 0};
    return KC_BOOL_SWITCH(vec, kVec, [&]() -> cudaError_t {
      constexpr int VEC = kVec ? MV : 1;
      if (d.layout == Layout::NCHW) {
        const int64_t units = d.n * d.c * p.splits;
        if (nchw_team(d) == 32) {
          const int64_t blocks = ceil_div(units, kThreads / 32);
          KC_CUDA_TRY(check_grid(blocks));
          reduce_rows_kernel<T, VEC, 32, kSumX, kSumGX, kWriteGS><<<unsigned(blocks), kThreads, 0, stream>>>(a);
        } else {
          KC_CUDA_TRY(check_grid(units));
          reduce_rows_kernel<T, VEC, kThreads, kSumX, kSumGX, kWriteGS><<<unsigned(units), kThreads, 0, stream>>>(a);
        }
      } else {
        nhwc_tiles(d.c, VEC, &a.tc, &a.col_tiles);
        const int64_t blocks = d.n * p.splits * a.col_tiles;
        KC_CUDA_TRY(check_grid(blocks));
        reduce_cols_kernel<T, VEC, kSumX, kSumGX, kWriteGS><<<unsigned(blocks), kThreads, 0, stream>>>(a);
      }
      return cudaGetLastError();
    });
  });
}

// ------------------------------------------------------------------ per-channel elementwise
// One pass over an [N, C, L] / [N, L, C] tensor with a per-(n, c) fp32 factor:
//   Scale: out = in * s[n, c]                 (excitation forward, fused forward)
//   Dx:    out = in * s[n, c] + coef[n, c]    (fused backward: grad_x)
//   Bcast: out = s[n, c] * alpha              (pool backward; `in` unused)
// Grid-stride over VEC-vectors with 4 vectors in flight per thread. reverse:
// walk from the end, so the first vectors read are the ones the preceding
// reduction read last (still in L2). In Dx mode, blocks past ew_blocks compute
// the weight gradients instead (see wgrad_block), saving a launch.
enum class Ew : int { Scale = 0, Dx = 1, Bcast = 2 };

struct WgradArgs {
  const float* dz1;  // [N, S]
  const float* p;    // [N, C]
  const float* dz2;  // [N, C]
  const float* a;    // [N, S]
  float *dw1, *db1, *dw2, *db2;
  int64_t n, c, s;
};

// Weight gradients, one output per thread, summed over n in order (deterministic):
//   dw1[j, c] = sum_n dz1[n, j] p[n, c]     db1[j] = sum_n dz1[n, j]
//   dw2[c, j] = sum_n dz2[n, c] a[n, j]     db2[c] = sum_n dz2[n, c]
__device__ __forceinline__ void wgrad_block(const WgradArgs& w, int64_t block) {
  const int64_t o = block * kThreads + threadIdx.x;
  const int64_t sc = w.s * w.c;
  float acc = 0.f;
  if (o < sc) {
    const int64_t j = o / w.c, c = o - (o / w.c) * w.c;
    for (int64_t n = 0; n < w.n; ++n) acc += w.dz1[n * w.s + j] * w.p[n * w.c + c];
    w.dw1[o] = acc;
  } else if (o < 2 * sc) {
    const int64_t q = o - sc;
    const int64_t c = q / w.s, j = q - (q / w.s) * w.s;
    for (int64_t n = 0; n < w.n; ++n) acc += w.dz2[n * w.c + c] * w.a[n * w.s + j];
    w.dw2[q] = acc;
  } else if (o < 2 * sc + w.s) {
    const int64_t j = o - 2 * sc;
    for (int64_t n = 0; n < w.n; ++n) acc += w.dz1[n * w.s + j];
    w.db1[j] = acc;
  } else if (o < 2 * sc + w.s + w.c) {
    const int64_t c = o - 2 * sc - w.s;
    for (int64_t n = 0; n < w.n; ++n) acc += w.dz2[n * w.c + c];
    w.db2[c] = acc;
  }
}
inline int64_t wgrad_blocks(int64_t c, int64_t s) { return ceil_div(2 * s * c + s + c, kThreads); }

template <typename T>
struct EwArgs {
  const T* in;
  const float* s;
  const float* coef;
  float alpha;
  T* out;
  int64_t total_vec;  // N * C * L / VEC
  int64_t c, l;
  FastDiv div_a, div_b;  // NCHW: div_a = L. NHWC: div_a = C, div_b = L * C (32-bit path only)
  bool reverse, streaming;
  int ew_blocks;
  WgradArgs wg;
};

template <Layout LAY, bool k64, typename T>
__device__ __forceinline__ int64_t channel_of(const EwArgs<T>& a, int64_t e) {
  if constexpr (LAY == Layout::NCHW) {
    return k64 ? e / a.l : int64_t(a.div_a.div(uint32_t(e)));
  } else {
    if constexpr (k64) {
      return (e / (a.l * a.c)) * a.c + e % a.c;
    } else {
      const uint32_t ue = uint32_t(e);
      const uint32_t q = a.div_a.div(ue);
      return int64_t(a.div_b.div(ue)) * a.c + int64_t(ue - q * uint32_t(a.c));
    }
  }
}

template <typename T, int VEC, Layout LAY, Ew MODE, bool k64>
__global__ void __launch_bounds__(kThreads) channel_ew_kernel(EwArgs<T> a) {
  if constexpr (MODE == Ew::Dx) {
    if (int(blockIdx.x) >= a.ew_blocks) {
      grid_dependency_wait();
      wgrad_block(a.wg, int64_t(blockIdx.x) - a.ew_blocks);
      return;
    }
  }
  const int64_t stride = int64_t(a.ew_blocks) * kThreads;
  const int64_t total = a.total_vec;
  float xv[4][VEC];
  int64_t vv[4];
  // in (x, or grad in Dx mode) was written before the previous kernel of this
  // chain ran, so the first 4 vectors are loaded before grid_dependency_wait:
  // under PDL they arrive while the MLP kernel is still computing s.
  auto load_batch = [&](int64_t v0) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t v = v0 + u * stride;
      vv[u] = v < total ? (a.reverse ? total - 1 - v : v) : -1;
      if constexpr (MODE != Ew::Bcast) {
        if (vv[u] >= 0) load_f<VEC>(a.in + vv[u] * VEC, xv[u]);
      }
    }
  };
  int64_t v0 = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  load_batch(v0);
  grid_dependency_wait();
  while (v0 < total) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (vv[u] < 0) continue;
      const int64_t e = vv[u] * VEC;
      const int64_t ch = channel_of<LAY, k64>(a, e);
      float o[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        // NCHW: all VEC elements share one channel; NHWC: VEC consecutive channels
        const int64_t chk = LAY == Layout::NCHW ? ch : ch + k;
        const float sv = __ldg(a.s + chk);
        if constexpr (MODE == Ew::Scale) o[k] = xv[u][k] * sv;
        if constexpr (MODE == Ew::Dx) o[k] = xv[u][k] * sv + __ldg(a.coef + chk);
        if constexpr (MODE == Ew::Bcast) o[k] = sv * a.alpha;
      }
      store_f<VEC>(a.out + e, o, a.streaming);
    }
    v0 += 4 * stride;
    if (v0 < total) load_batch(v0);
  }
}

// in may be null (Bcast); coef only for Dx; wg only for Dx (its blocks are added to the grid).
template <Ew MODE>
cudaError_t launch_ew(const void* in, const float* s, const float* coef, float alpha, void* out,
                      kc::DType dt, const Dims& d, bool reverse, bool streaming, bool pdl, int num_sms,
                      const WgradArgs* wg, cudaStream_t stream) {
  return KC_DTYPE_SWITCH(dt, T, [&]() -> cudaError_t {
    constexpr int MV = kc::max_vec_elems<T>();
    const int64_t inner = d.layout == Layout::NCHW ? d.l : d.c;
    const bool vec = (in == nullptr || kc::is_aligned(in, 16)) && kc::is_aligned(out, 16) && inner % MV == 0;
    const int64_t total = d.n * d.c * d.l;
    const bool big = total >= (int64_t(1) << 31);
    return KC_BOOL_SWITCH(vec, kVec, [&]() -> cudaError_t {
      constexpr int VEC = kVec ? MV : 1;
      EwArgs<T> a{};
      a.in = static_cast<const T*>(in);
      a.s = s;
      a.coef = coef;
      a.alpha = alpha;
      a.out = static_cast<T*>(out);
      a.total_vec = total / VEC;
      a.c = d.c;
      a.l = d.l;
      if (!big) {
        a.div_a = FastDiv(uint32_t(d.layout == Layout::NCHW ? d.l : d.c));
        a.div_b = FastDiv(uint32_t(d.layout == Layout::NCHW ? 1 : d.l * d.c));
      }
      a.reverse = reverse;
      a.streaming = streaming;
      const int64_t want = ceil_div(a.total_vec, int64_t(kThreads) * 4);
      const int64_t cap = int64_t(num_sms > 0 ? num_sms : 1) * 8;
      a.ew_blocks = int(want < cap ? want : cap);
      int64_t blocks = a.ew_blocks;
      if (wg != nullptr) {
        a.wg = *wg;
        blocks += wgrad_blocks(wg->c, wg->s);
      }
      if (a.total_vec == 0) return cudaSuccess;
      KC_CUDA_TRY(check_grid(blocks));
      auto go = [&](auto kernel) { return launch(kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, pdl, a); };
      if (d.layout == Layout::NCHW) {
        return big ? go(channel_ew_kernel<T, VEC, Layout::NCHW, MODE, true>)
                   : go(channel_ew_kernel<T, VEC, Layout::NCHW, MODE, false>);
      }
      return big ? go(channel_ew_kernel<T, VEC, Layout::NHWC, MODE, true>)
                 : go(channel_ew_kernel<T, VEC, Layout::NHWC, MODE, false>);
    });
  });
}

}  // namespace dev
}  // namespace se
