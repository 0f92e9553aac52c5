// se_kernels.cuh: the device code that the kernel files share (stages.cu, se_fused.cu,
// se_spread.cu, se_cluster.cu): fast index division, batched loads, vector loads and
// stores, the weight-gradient tiles; and the two passes over x that they all launch,
// declared here and instantiated once: the HW reductions (se_reduce.cu) and the
// per-channel elementwise pass (se_scale.cu).
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

// The kernels' shapes shared with the plan (se_geometry.h).
using se::ceil_div;
using se::kCastUnroll;
using se::kThreads;
using se::kWgTile;
using se::max_vec;
using se::nchw_team;
using se::nhwc_tiles;

// ------------------------------------------------------------------ PDL
// griddepcontrol and the PDL launch come from kc/launch.cuh (common/).
using kc::grid_dependency_wait;
using kc::launch;
using kc::launch_dependents;

inline cudaError_t check_grid(int64_t blocks) {
  return (blocks >= 1 && blocks <= 0x7fffffffLL) ? cudaSuccess : cudaErrorInvalidConfiguration;
}

// ------------------------------------------------------------------ index math
// n / d with one multiply-high (the IntDivider trick; built on the host or in a
// kernel): valid for 0 <= n < 2^31
// and 1 <= d < 2^31.
struct FastDiv {
  uint32_t d = 1, m = 1, s = 0;
  FastDiv() = default;
  __host__ __device__ explicit FastDiv(uint32_t div) : d(div) {
    s = 0;
    while ((uint64_t(1) << s) < d) ++s;
    m = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << s) - d)) / d + 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const { return (__umulhi(n, m) + n) >> s; }
};

// ------------------------------------------------------------------ batched loads
// for (i = start; i < end; i += step) use(i, load(i)), with the loads of U
// consecutive trips issued before any of them is used. A plain loop whose trips
// each wait on one L2 load runs at one L2 latency per trip (the weight loops of
// the MLP kernels: 36-144 trips of ~0.5 us of latency each at C = 1152); this
// keeps U loads in flight. use() runs in the plain loop's order, so results are
// bitwise those of the plain loop.
template <int U, typename Load, typename Use>
__device__ __forceinline__ void batched_loop(int64_t start, int64_t end, int64_t step, Load load, Use use) {
  using V = decltype(load(start));
  for (int64_t i0 = start; i0 < end; i0 += U * step) {
    V v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (i0 + u * step < end) v[u] = load(i0 + u * step);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (i0 + u * step < end) use(i0 + u * step, v[u]);
    }
  }
}

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

// ------------------------------------------------------------------ parameter copies
// Extra blocks of a reduction kernel that widen the MLP's 16-bit parameters to
// fp32 (dst: the fused kernels' workspace), so that no cast kernel is launched,
// and/or write transposed fp32 copies of the weight matrices (dst_t, for the
// backward's products with w1^T and w2^T). A null dst / dst_t skips that copy.
// The work is cut in units: 16 bytes of a tensor (8 16-bit or 4 fp32 elements) where
// its pointers and length allow, else one element; as few blocks as give every thread
// one batch of kCastUnroll units, all loads in flight before any store (the plan's
// CastPlan counts them). They come first in the grid, and plan_reduce leaves room for
// them in the reduction's wave: their loads queue behind the reduction's, so each takes
// about as long as a reduction block.
// (H100, per-block timestamps, (32, 1632, 12, 12) bf16: 219 blocks of one
// element a thread took 5-7 us each and held the slots that 139 of the 448 reduction
// blocks waited for; those started at 5.6 us and ended the pass at 10.4.)
struct ParamCast {
  const void* src[4];  // w1, b1, w2, b2
  float* dst[4];
  float* dst_t[4];     // [cols, rows] copy of a [rows, cols] tensor
  int64_t len[4];
  int64_t cols[4];     // row length of each tensor (len for a vector)
  int64_t units[4];    // units of each tensor (0: nothing to copy from it)
  int per[4];          // elements per unit: 16 / element size, or 1
  kc::DType dt;
  int blocks;          // 0: nothing to copy
};

// ------------------------------------------------------------------ weight gradients
// The weight gradients as two small products, summed over n in order (deterministic):
// dst[o1, o2] = sum_n A[n, o1] B[n, o2] and bias[o1] = sum_n A[n, o1];
// product 0 dw1 = dz1^T p, db1 (A = dz1 [N, S], B = p [N, C]),
// product 1 dw2 = dz2^T a, db2 (A = dz2 [N, C], B = a [N, S]).
// A block owns a kWgTile x kWgTile tile of one product; thread t adds the outputs
// (rows t / 32 + 8 k, column t % 32), n ascending, over the batch staged kWgTile
// samples at a time in shared memory (so each A and B element is read once per
// tile, not once per output). Used by the cluster path's wgrad_tile_kernel, by
// the extra blocks of the Dx pass and by those of the spread path's last product.
// (H100: an earlier one-output-per-thread dot over n, 8 loads in flight, added ~15 us
// to the Dx pass at (128, 1152, 7, 7); this tiled product's own load order, below,
// cost it about 8 us before it fetched the chunks into registers with every load in
// flight.)
struct WgradProduct {
  const float *a, *b;
  int64_t m1, m2;
  void *dst, *bias;
  int64_t tiles2;  // tiles along o2
  int64_t blocks;  // tiles in all
};
struct WgradTileArgs {
  WgradProduct prod[2];
  int64_t n;
  kc::DType wdt;
};

inline WgradProduct wgrad_product(const float* a, const float* b, int64_t m1, int64_t m2, void* dst, void* bias) {
  WgradProduct p{a, b, m1, m2, dst, bias, ceil_div(m2, int64_t(kWgTile)), 0};
  p.blocks = ceil_div(m1, int64_t(kWgTile)) * p.tiles2;
  return p;
}
// dw1 = dz1^T p, db1; dw2 = dz2^T a, db2 (dz1, a: [N, S]; p, dz2: [N, C]; outputs in wdt)
inline WgradTileArgs wgrad_args(const float* dz1, const float* p, const float* dz2, const float* a, void* dw1,
                                void* db1, void* dw2, void* db2, int64_t n, int64_t c, int64_t s, kc::DType wdt) {
  WgradTileArgs w{};
  w.prod[0] = wgrad_product(dz1, p, s, c, dw1, db1);
  w.prod[1] = wgrad_product(dz2, a, c, s, dw2, db2);
  w.n = n;
  w.wdt = wdt;
  return w;
}
__host__ __device__ inline int64_t wgrad_blocks(const WgradTileArgs& w) { return w.prod[0].blocks + w.prod[1].blocks; }

// One tile (block < wgrad_blocks(w)); the caller has waited for dz1 .. a to be written
// (by an earlier kernel: they are read through the read-only path).
// Each chunk of kWgTile samples is fetched into registers, all 8 loads of a thread
// in flight at once, while the previous chunk's products run; then stored to shared
// memory. (Loading straight into shared memory serialised the 8 loads: the compiler
// kept each global load before the next shared store, 32 L2 round trips a tile at
// N = 128; H100, the Dx pass at (128, 240, 14, 14) bf16 channels_last
// added 15.6 us to a graph replay with these blocks, 8.1 without them, 9.3 as below.)
// kThreads threads (tid 0 .. kThreads - 1) take part; `sync` is their barrier, and
// as / bs are kWgTile x kWgTile floats of shared memory each.
template <typename Sync>
__device__ __forceinline__ void wgrad_tile(const WgradTileArgs& w, int64_t block, int tid, float (*as)[kWgTile],
                                           float (*bs)[kWgTile], Sync sync) {
  static_assert(kThreads == 8 * kWgTile, "a thread per (row group, column) of the tile");
  const bool second = block >= w.prod[0].blocks;
  const WgradProduct P = second ? w.prod[1] : w.prod[0];
  const int64_t tile = second ? block - w.prod[0].blocks : block;
  const int64_t t1 = tile / P.tiles2, t2 = tile - t1 * P.tiles2;
  const int64_t o1b = t1 * kWgTile, o2b = t2 * kWgTile;
  const int col = tid & 31, row = tid >> 5;  // row 0..7
  const bool in1 = o1b + col < P.m1, in2 = o2b + col < P.m2;
  float acc[4] = {0.f, 0.f, 0.f, 0.f}, bacc[4] = {0.f, 0.f, 0.f, 0.f};
  const bool bias = P.bias != nullptr && t2 == 0 && col == 0;
  float ra[4], rb[4];  // this thread's elements of the next chunk: A[n0 + row + 8 k, o1b + col], B likewise
  auto fetch = [&](int64_t n0) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t nn = n0 + row + 8 * k;
      ra[k] = (nn < w.n && in1) ? __ldg(P.a + nn * P.m1 + o1b + col) : 0.f;
      rb[k] = (nn < w.n && in2) ? __ldg(P.b + nn * P.m2 + o2b + col) : 0.f;
    }
  };
  fetch(0);
  for (int64_t n0 = 0; n0 < w.n; n0 += kWgTile) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      as[row + 8 * k][col] = ra[k];
      bs[row + 8 * k][col] = rb[k];
    }
    sync();
    if (n0 + kWgTile < w.n) fetch(n0 + kWgTile);
    const int cnt = int(w.n - n0 < kWgTile ? w.n - n0 : kWgTile);
#pragma unroll 8
    for (int q = 0; q < cnt; ++q) {
      const float bv = bs[q][col];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float av = as[q][row + 8 * k];
        acc[k] += av * bv;
        if (bias) bacc[k] += av;
      }
    }
    sync();
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t o1 = o1b + row + 8 * k, o2 = o2b + col;
    if (o1 < P.m1 && o2 < P.m2) kc::store_float(P.dst, w.wdt, o1 * P.m2 + o2, acc[k]);
    if (bias && o1 < P.m1) kc::store_float(P.bias, w.wdt, o1, bacc[k]);
  }
}

// One tile by a whole block of kThreads threads
__device__ __forceinline__ void wgrad_tile_block(const WgradTileArgs& w, int64_t block) {
  __shared__ float as[kWgTile][kWgTile];
  __shared__ float bs[kWgTile][kWgTile];
  wgrad_tile(w, block, int(threadIdx.x), as, bs, [] { __syncthreads(); });
}

// Two tiles (2 pair, 2 pair + 1) by a block of 2 kThreads threads, a half each, each half
// with its own named barrier (1 and 2) and its own 8 KB of shared memory (kWgPairSmem
// in all, from smem on).
// Used by the backward's last product, whose grid has room beside its own blocks.
__device__ __forceinline__ void wgrad_tile_pair(const WgradTileArgs& w, int64_t pair, float* smem) {
  const int half = int(threadIdx.x) / kThreads;
  const int64_t tile = 2 * pair + half;
  if (tile >= wgrad_blocks(w)) return;  // the other half does not wait for this one
  float(*as)[kWgTile] = reinterpret_cast<float(*)[kWgTile]>(smem + half * 2 * kWgTile * kWgTile);
  float(*bs)[kWgTile] = as + kWgTile;
  wgrad_tile(w, tile, int(threadIdx.x) - half * kThreads, as, bs,
             [half] { asm volatile("bar.sync %0, %1;" ::"r"(1 + half), "r"(kThreads) : "memory"); });
}
constexpr size_t kWgPairSmem = size_t(4) * kWgTile * kWgTile * sizeof(float);

// ------------------------------------------------------------------ the passes over x
// The HW reductions (se_reduce.cu): sums over l for every (n, c) of x (kSumX) and / or
// g * x (kSumGX), as fp32 partials part_*[(n * splits + split) * C + c] in the plan's
// splits; with kWriteGS also gs_out = g * s[n, c] (the excitation backward's grad_x, in
// the same pass); with cast, the parameter-copying blocks first in the grid. Instantiated
// for <sum x> (pool, fused forward), <sum x, sum g x> (fused backward) and
// <sum g x, write g s> (excitation backward).
template <bool kSumX, bool kSumGX, bool kWriteGS>
cudaError_t launch_reduce(const void* x, const void* g, const float* s, void* gs_out, kc::DType dt,
                          const Dims& d, const ReducePlan& p, float* part_x, float* part_gx,
                          cudaStream_t stream, const ParamCast* cast = nullptr);

// The per-channel elementwise pass (se_scale.cu), over an [N, C, L] / [N, L, C] tensor
// with a per-(n, c) fp32 factor:
//   Scale: out = in * s[n, c]                 (excitation forward, fused forward)
//   Dx:    out = in * s[n, c] + coef[n, c]    (fused backward: grad_x)
//   Bcast: out = s[n, c] * alpha              (pool backward; `in` unused)
// in may be null (Bcast); coef only for Dx; wg only for Dx (its blocks are added to the grid).
enum class Ew : int { Scale = 0, Dx = 1, Bcast = 2 };
template <Ew MODE>
cudaError_t launch_ew(const void* in, const float* s, const float* coef, float alpha, void* out,
                      kc::DType dt, const Dims& d, bool reverse, bool streaming, bool pdl, int num_sms,
                      const WgradTileArgs* wg, cudaStream_t stream);

}  // namespace dev
}  // namespace se
