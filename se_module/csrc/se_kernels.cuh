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

#include "kc/async_copy.cuh"
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

// ------------------------------------------------------------------ reductions
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

// element k of a unit's raw 16 bytes, widened
__device__ __forceinline__ float unit_elem(const uint4& r, int k, kc::DType dt) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};  // k is a constant (unrolled callers): no local array
  if (dt == kc::DType::F32) return __uint_as_float(w[k & 3]);
  const uint32_t h = (w[k >> 1] >> (16 * (k & 1))) & 0xffffu;
  if (dt == kc::DType::BF16) return __uint_as_float(h << 16);
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}

__device__ __forceinline__ void cast_params_block(const ParamCast& pc, int block) {
  const int64_t total = pc.units[0] + pc.units[1] + pc.units[2] + pc.units[3];
  const int64_t step = int64_t(pc.blocks) * kThreads;
  const int esz = kc::dtype_size(pc.dt);
  auto locate = [&](int64_t u, int& t) {
    t = 0;
    while (u >= pc.units[t]) u -= pc.units[t++];
    return u;
  };
  batched_loop<kCastUnroll>(
      int64_t(block) * kThreads + threadIdx.x, total, step,
      [&](int64_t u) {
        int t;
        const int64_t j = locate(u, t);
        const char* src = static_cast<const char*>(pc.src[t]);
        uint4 r = make_uint4(0, 0, 0, 0);
        if (pc.per[t] > 1) {
          r = __ldg(reinterpret_cast<const uint4*>(src) + j);
        } else {
          r.x = esz == 4 ? __ldg(reinterpret_cast<const uint32_t*>(src) + j)
                         : uint32_t(__ldg(reinterpret_cast<const unsigned short*>(src) + j));
        }
        return r;
      },
      [&](int64_t u, uint4 r) {
        int t;
        const int64_t j = locate(u, t);
        const int per = pc.per[t];
        float* dst = pc.dst[t];
        float* dst_t = pc.dst_t[t];
        // the unit's elements walk the row-major matrix: column c of row rr, wrapping
        const int64_t cols = pc.cols[t], rows = pc.len[t] / cols;
        int64_t i = j * per;
        int64_t rr = i / cols, c = i - rr * cols;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          if (k >= per) break;
          const float v = unit_elem(r, k, pc.dt);
          if (dst != nullptr) dst[i + k] = v;
          if (dst_t != nullptr) dst_t[c * rows + rr] = v;
          if (++c == cols) {
            c = 0;
            ++rr;
          }
        }
      });
}

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
  ParamCast cast;  // its blocks (cast.blocks) come first in the grid, then the reduction's
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
  if (int(blockIdx.x) < a.cast.blocks) return cast_params_block(a.cast, int(blockIdx.x));
  const int64_t block = int64_t(blockIdx.x) - a.cast.blocks;
  grid_dependency_wait();
  launch_dependents();
  int64_t unit;
  int lane;
  if constexpr (TEAM == 32) {
    unit = block * (kThreads / 32) + threadIdx.x / 32;
    lane = threadIdx.x & 31;
    if (unit >= a.n * a.c * a.splits) return;  // the whole warp leaves together
  } else {
    unit = block;
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

// NCHW with short rows (L <= kTileMaxL: EfficientNet's 7x7, 12x12 and 14x14 stages).
// A warp per row reads only L elements (49 at 7x7: two loads per lane; 144 at 12x12:
// one 16-byte load per lane, then a shuffle reduction per row), too few bytes in
// flight per SM to stream from DRAM, and rows that are not a multiple of 16 bytes
// long leave every access scalar. Instead a block stages RB whole rows, one
// contiguous piece of memory, into shared memory with 16-byte loads (8 per thread
// issued before any is stored), then TPR = kThreads / RB threads add each row:
// thread j of a row takes l = j, j + TPR, ... in order, and the TPR partial sums
// meet in a fixed shuffle order (deterministic). RB (a power of two, 8..128) is the
// most rows whose tiles fit in kTileSmem bytes (tile_rows); no splits.
constexpr int64_t kTileMaxL = 256;
constexpr int64_t kTileSmem = 48 * 1024;

inline int tile_rows(int64_t l, int ns, size_t elem) {
  int rb = 128;
  while (rb >= 8 && int64_t(ns) * rb * l * int64_t(elem) > kTileSmem) rb /= 2;
  return rb >= 8 ? rb : 0;
}

template <typename T, int VEC, bool kSumX, bool kSumGX>
__global__ void __launch_bounds__(kThreads) reduce_rows_tile_kernel(ReduceArgs<T> a, int rb) {
  static_assert(kSumX, "sum g x needs x staged too");
  constexpr int NS = int(kSumX) + int(kSumGX);
  extern __shared__ float4 tile4[];
  T* tile = reinterpret_cast<T*>(tile4);
  if (int(blockIdx.x) < a.cast.blocks) return cast_params_block(a.cast, int(blockIdx.x));
  const int64_t block = int64_t(blockIdx.x) - a.cast.blocks;
  grid_dependency_wait();
  launch_dependents();
  const int64_t rows = a.n * a.c;
  const int64_t row0 = block * rb;
  const int nrows = int(min(int64_t(rb), rows - row0));
  const int64_t len = int64_t(nrows) * a.l;  // elements of this block's piece (a multiple of VEC: see the launcher)
  const int64_t base = row0 * a.l;
  using V = kc::Vec<T, VEC>;
  const T* srcs[2] = {kSumX ? a.x : a.g, a.g};
  for (int q = 0; q < NS; ++q) {
    const V* src = reinterpret_cast<const V*>(srcs[q] + base);
    V* dst = reinterpret_cast<V*>(tile + int64_t(q) * rb * a.l);
    batched_loop<8>(threadIdx.x, len / VEC, kThreads, [&](int64_t i) { return kc::load_vec<VEC>(reinterpret_cast<const T*>(src + i)); },
                    [&](int64_t i, V v) { dst[i] = v; });
  }
  __syncthreads();
  const int tpr = kThreads / rb;  // a power of two <= 32: a row's threads share a warp
  const int r = threadIdx.x / tpr, j = threadIdx.x % tpr;
  const bool live = r < nrows;
  const T* xr = tile + int64_t(r) * a.l;
  const T* gr = tile + (int64_t(NS - 1) * rb + r) * a.l;
  float sx = 0.f, sgx = 0.f;
  if (live) {
    for (int64_t l = j; l < a.l; l += tpr) {
      if constexpr (kSumX) sx += kc::to_float(xr[l]);
      if constexpr (kSumGX) sgx += kc::to_float(gr[l]) * kc::to_float(xr[l]);
    }
  }
  for (int off = tpr / 2; off > 0; off /= 2) {  // every lane takes part: no early exit above
    if constexpr (kSumX) sx += __shfl_xor_sync(0xffffffffu, sx, off);
    if constexpr (kSumGX) sgx += __shfl_xor_sync(0xffffffffu, sgx, off);
  }
  if (!live || j != 0) return;
  // splits = 1: part[n * C + c] = part[row]
  if constexpr (kSumX) a.part_x[row0 + r] = sx;
  if constexpr (kSumGX) a.part_gx[row0 + r] = sgx;
}

// NHWC: x is [N, L, C]; a sum per column c over the rows l of one sample.
// Block = one (n, split, column tile). Thread t owns vector column
// t % tc of the tile and rows l = l0 + t / tc, stepping by rows_par = kThreads / tc,
// so a warp reads whole contiguous row segments (coalesced). The rows_par
// partial sums of each column are then added in a fixed order through shared
// memory (kThreads * VEC floats per sum). kc::block_reduce_* reduce a whole
// block to ONE value, which is not the shape of this reduction (one value per
// column), so the column step is written out here.
// Loads: cols_batch(kSumGX) rows per thread in flight, held as raw vectors until
// they are summed; at most 64 registers (kColsMinBlocks blocks of kThreads per SM).
// H100: with 4 rows in flight and no register cap the bf16 kernels took
// 70 / 116 registers (3 / 2 blocks per SM), and the plan's blocks each did about one
// round trip of loads: (128, 1152, 7, 7) read x at 1.0 TB/s (13.9 us of a graph replay).
// The backward's x loads carry the streaming hint (nothing after this pass reads x):
// H100, graph replays, bf16 channels_last: this pass 11.8 -> 10.9 us at
// (128, 240, 14, 14), 29.2 -> 27.5 us at (32, 672, 24, 24); the Dx pass after it unchanged.
constexpr int kColsMinBlocks = 4;
__host__ __device__ constexpr int cols_batch(bool sum_gx) { return sum_gx ? 4 : 8; }
// With 16-byte vectors and no gs_out the rows come through a cp.async pipeline instead
// of register batches: kColsStages stages of cols_stage_rows() rows (x, and g in the
// backward) a thread, 12 rows (forward) / 6 rows of x and g (backward) in flight, 48 KB
// of shared memory a block (still 4 blocks an SM), each stage consumed as it lands.
// H100, per-block timestamps, (32, 1632, 12, 12) bf16: with the register
// batches a thread waited for its whole batch before it asked for the next, so the
// backward's 9 rows a thread (4 + 4 + 1) cost three round trips under load and the
// pass read x and g at 1.8 TB/s (16.9 us); pipelined, 12.4 us. Timeline, fwd + bwd:
// (32, 1632, 12, 12) 70.9 -> 64.1-65.0 us, (32, 2688, 12, 12) 113.3 -> 108.3, (128, 1152,
// 7, 7) 77.6 -> 70.4-71.9. Stages of 2 rows (forward) / 1 row (backward), or two stages,
// changed no row by more than 1.5%.
constexpr int kColsStages = 3;
__host__ __device__ constexpr int cols_stage_rows(bool sum_gx) { return sum_gx ? 2 : 4; }
template <int VEC, bool kWriteGS>
__host__ __device__ constexpr bool cols_async() { return VEC > 1 && !kWriteGS; }
template <typename T, int VEC, bool kSumX, bool kSumGX, bool kWriteGS>
constexpr size_t cols_smem_bytes() {
  const size_t table = size_t(int(kSumX) + int(kSumGX)) * kThreads * VEC * sizeof(float);
  const size_t stages = cols_async<VEC, kWriteGS>()
                            ? size_t(kColsStages) * (1 + int(kSumGX)) * cols_stage_rows(kSumGX) * kThreads * 16
                            : 0;
  return stages > table ? stages : table;
}
template <typename T, int VEC, bool kSumX, bool kSumGX, bool kWriteGS>
__global__ void __launch_bounds__(kThreads, kColsMinBlocks) reduce_cols_kernel(ReduceArgs<T> a) {
  static_assert(kSumX || kSumGX, "nothing to reduce");
  constexpr int NS = int(kSumX) + int(kSumGX);
  constexpr bool kAsync = cols_async<VEC, kWriteGS>();
  constexpr int NL = 1 + int(kSumGX);  // tensors read: x, and g with kSumGX
  extern __shared__ float4 cols_smem[];  // cols_smem_bytes(): the stages (kAsync), then the column table
  float(*red)[kThreads * VEC] = reinterpret_cast<float(*)[kThreads * VEC]>(cols_smem);
  if (int(blockIdx.x) < a.cast.blocks) return cast_params_block(a.cast, int(blockIdx.x));
  const int64_t block = int64_t(blockIdx.x) - a.cast.blocks;
  grid_dependency_wait();
  launch_dependents();
  const int64_t b = block;
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
    constexpr int U = cols_batch(kSumGX);
    const int64_t step = int64_t(rows_par) * a.c;  // elements from one of a thread's rows to its next
    if constexpr (kAsync) {
      // The thread's rows l0 + rp + k rows_par, k < K, in stages of B rows (x, and g),
      // kColsStages stages in flight through this thread's slots of shared memory
      // (cp.async: no registers held), each consumed as it lands.
      constexpr int B = cols_stage_rows(kSumGX);
      constexpr int NST = kColsStages;
      using V = kc::Vec<T, VEC>;
      V* stage = reinterpret_cast<V*>(cols_smem);  // [NST][NL][B][kThreads]
      const int64_t first = l0 + rp;
      const int K = first < l1 ? int((l1 - first + rows_par - 1) / rows_par) : 0;
      const int S = (K + B - 1) / B;
      const T* xs = a.x + (n * a.l + first) * a.c + col_off;
      const T* gs = kSumGX ? a.g + (n * a.l + first) * a.c + col_off : nullptr;
      auto issue = [&](int s) {
        if (s < S) {
          V* st = stage + (s % NST) * (NL * B * kThreads) + threadIdx.x;
#pragma unroll
          for (int u = 0; u < B; ++u) {
            const int k = s * B + u;
            if (k < K) {
              // the backward reads x for the last time: evict-first
              if constexpr (kSumGX) {
                kc::cp_async_16_evict_first(st + u * kThreads, xs + int64_t(k) * step);
                kc::cp_async_16(st + (B + u) * kThreads, gs + int64_t(k) * step);
              } else {
                kc::cp_async_16(st + u * kThreads, xs + int64_t(k) * step);
              }
            }
          }
        }
        kc::cp_async_commit();  // an empty group past the last stage: completes at once
      };
#pragma unroll
      for (int s = 0; s < NST - 1; ++s) issue(s);
      for (int s = 0; s < S; ++s) {
        issue(s + NST - 1);  // into the slots stage s - 1 left
        kc::cp_async_wait_n<NST - 1>();
        const V* st = stage + (s % NST) * (NL * B * kThreads) + threadIdx.x;
#pragma unroll
        for (int u = 0; u < B; ++u) {
          if (s * B + u < K) {
            float xv[VEC], gv[VEC] = {};
            kc::vec_to_float(st[u * kThreads], xv);
            if constexpr (kSumGX) kc::vec_to_float(st[(B + u) * kThreads], gv);
            consume(0, xv, gv);  // the offset is gs_out's, which this path never writes
          }
        }
      }
    } else {
      for (int64_t l = l0 + rp; l < l1; l += U * rows_par) {
        kc::Vec<T, VEC> xr[U], gr[U];
        const int64_t base = (n * a.l + l) * a.c + col_off;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (l + u * rows_par < l1) {
            // the backward (kSumGX) reads x for the last time: streamed (evict-first)
            if constexpr (kSumGX) {
              xr[u] = kc::load_vec_stream<VEC>(a.x + base + u * step);
            } else {
              xr[u] = kc::load_vec<VEC>(a.x + base + u * step);
            }
            if constexpr (kSumGX) gr[u] = kc::load_vec<VEC>(a.g + base + u * step);
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (l + u * rows_par < l1) {
            float xv[VEC], gv[VEC] = {};
            kc::vec_to_float(xr[u], xv);
            if constexpr (kSumGX) kc::vec_to_float(gr[u], gv);
            consume(base + u * step, xv, gv);
          }
        }
      }
    }
  }
  if constexpr (kAsync) {
    kc::cp_async_wait_n<0>();
    __syncthreads();  // the column table below reuses the stages' shared memory
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

// NCHW rows short enough for reduce_rows_tile_kernel (and the plan did not split them)
inline bool use_row_tiles(const Dims& d, const ReducePlan& p) {
  return d.layout == Layout::NCHW && d.l <= kTileMaxL && p.splits == 1;
}

template <bool kSumX, bool kSumGX, bool kWriteGS>
cudaError_t launch_reduce(const void* x, const void* g, const float* s, void* gs_out, kc::DType dt,
                          const Dims& d, const ReducePlan& p, float* part_x, float* part_gx,
                          cudaStream_t stream, const ParamCast* cast = nullptr) {
  return KC_DTYPE_SWITCH(dt, T, [&]() -> cudaError_t {
    constexpr int MV = kc::max_vec_elems<T>();
    const int64_t inner = d.layout == Layout::NCHW ? d.l : d.c;
    const bool vec = kc::is_aligned(x, 16) && (g == nullptr || kc::is_aligned(g, 16)) &&
                     (gs_out == nullptr || kc::is_aligned(gs_out, 16)) && inner % MV == 0;
    ReduceArgs<T> a{static_cast<const T*>(x), static_cast<const T*>(g), s, static_cast<T*>(gs_out),
                    d.n, d.c, d.l, p.splits, p.chunk, part_x, part_gx, 0, 0, ParamCast{}};
    if (cast != nullptr) a.cast = *cast;
    // the grid: the reduction's blocks, then a.cast.blocks that widen the parameters
    auto grid = [&](int64_t reduce_blocks) {
      const int64_t blocks = reduce_blocks + a.cast.blocks;
      return check_grid(blocks) == cudaSuccess ? unsigned(blocks) : 0u;
    };
    return KC_BOOL_SWITCH(vec, kVec, [&]() -> cudaError_t {
      constexpr int VEC = kVec ? MV : 1;
      constexpr int NS = int(kSumX) + int(kSumGX);
      const int rb = tile_rows(d.l, NS, sizeof(T));
      if (kSumX && !kWriteGS && use_row_tiles(d, p) && rb > 0) {
        // every block's piece starts at row0 * L, row0 a multiple of rb: 16-byte
        // aligned when x is; the last piece is a multiple of VEC when N * C * L is.
        const bool tvec = kc::is_aligned(x, 16) && (g == nullptr || kc::is_aligned(g, 16)) &&
                          (d.n * d.c * d.l) % MV == 0 && (int64_t(rb) * d.l) % MV == 0;
        const size_t smem = size_t(NS) * size_t(rb) * size_t(d.l) * sizeof(T);
        const unsigned blocks = grid(ceil_div(d.n * d.c, rb));
        auto go = [&](auto kernel) -> cudaError_t {
          if (smem > 48 * 1024) {
            KC_CUDA_TRY(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
          }
          kernel<<<blocks, kThreads, smem, stream>>>(a, rb);
          return cudaGetLastError();
        };
        if constexpr (kSumX && !kWriteGS) {
          return tvec ? go(reduce_rows_tile_kernel<T, MV, kSumX, kSumGX>) : go(reduce_rows_tile_kernel<T, 1, kSumX, kSumGX>);
        }
      }
      if (d.layout == Layout::NCHW) {
        const int64_t units = d.n * d.c * p.splits;
        if (nchw_team(d) == 32) {
          const unsigned blocks = grid(ceil_div(units, kThreads / 32));
          if (blocks == 0) return cudaErrorInvalidConfiguration;
          reduce_rows_kernel<T, VEC, 32, kSumX, kSumGX, kWriteGS><<<blocks, kThreads, 0, stream>>>(a);
        } else {
          const unsigned blocks = grid(units);
          if (blocks == 0) return cudaErrorInvalidConfiguration;
          reduce_rows_kernel<T, VEC, kThreads, kSumX, kSumGX, kWriteGS><<<blocks, kThreads, 0, stream>>>(a);
        }
      } else {
        nhwc_tiles(d.c, VEC, &a.tc, &a.col_tiles);
        const unsigned blocks = grid(d.n * p.splits * a.col_tiles);
        if (blocks == 0) return cudaErrorInvalidConfiguration;
        constexpr size_t smem = cols_smem_bytes<T, VEC, kSumX, kSumGX, kWriteGS>();
        auto kernel = reduce_cols_kernel<T, VEC, kSumX, kSumGX, kWriteGS>;
        if (smem > 48 * 1024) {
          KC_CUDA_TRY(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        }
        kernel<<<blocks, kThreads, smem, stream>>>(a);
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
// reduction read last (still in L2). In Dx mode, wg_blocks extra blocks (the first)
// compute the weight gradients (wgrad_tile_block), saving a launch.
enum class Ew : int { Scale = 0, Dx = 1, Bcast = 2 };

// The weight gradients as two small products, summed over n in order (deterministic):
// dst[o1, o2] = sum_n A[n, o1] B[n, o2] and bias[o1] = sum_n A[n, o1];
// product 0 dw1 = dz1^T p, db1 (A = dz1 [N, S], B = p [N, C]),
// product 1 dw2 = dz2^T a, db2 (A = dz2 [N, C], B = a [N, S]).
// A block owns a kWgTile x kWgTile tile of one product; thread t adds the outputs
// (rows t / 32 + 8 k, column t % 32), n ascending, over the batch staged kWgTile
// samples at a time in shared memory (so each A and B element is read once per
// tile, not once per output). Used by the cluster path's wgrad_tile_kernel and by
// the extra blocks of the spread path's Dx pass. (H100: its earlier one-output-per-thread
// dot over n, 8 loads in flight, added ~15 us to the Dx pass at (128, 1152, 7, 7);
// this tiled product's own load order, below, cost it about 8 us before it
// fetched the chunks into registers with every load in flight.)
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
  bool straddle;  // NCHW with L not a multiple of VEC: a vector's elements may lie in two rows
  int ew_blocks;  // blocks of the elementwise pass (grid-stride)
  int wg_blocks;  // Dx: blocks before them that compute the weight gradients (wgrad_tile_block)
  WgradTileArgs wg;
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

// The per-channel fp32 factors f[ch .. ch + VEC) (NHWC) or f[ch] (NCHW) of one vector.
template <Layout LAY, int VEC>
__device__ __forceinline__ void channel_factors(const float* f, int64_t ch, float (&out)[VEC]) {
  if constexpr (LAY == Layout::NHWC && VEC % 4 == 0) {
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(f + ch) + q);
      out[4 * q] = v.x, out[4 * q + 1] = v.y, out[4 * q + 2] = v.z, out[4 * q + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = __ldg(f + (LAY == Layout::NCHW ? ch : ch + k));
  }
}

template <typename T, int VEC, Layout LAY, Ew MODE, bool k64>
__global__ void __launch_bounds__(kThreads) channel_ew_kernel(EwArgs<T> a) {
  // Dx: the first wg_blocks blocks compute the weight gradients. They go first so
  // that their latency-bound staging overlaps the elementwise blocks' streaming
  // instead of trailing it (the block scheduler starts blocks in index order).
  int64_t block = blockIdx.x;
  if constexpr (MODE == Ew::Dx) {
    if (block < a.wg_blocks) {
      grid_dependency_wait();
      wgrad_tile_block(a.wg, block);
      return;
    }
    block -= a.wg_blocks;
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
  int64_t v0 = block * kThreads + threadIdx.x;
  load_batch(v0);
  grid_dependency_wait();
  while (v0 < total) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (vv[u] < 0) continue;
      const int64_t e = vv[u] * VEC;
      const int64_t ch = channel_of<LAY, k64>(a, e);
      // NCHW: all VEC elements share one channel; NHWC: VEC consecutive channels
      // (ch a multiple of VEC, so their factors are whole 16-byte vectors of s)
      float sv[VEC], cv[VEC];
      if (LAY == Layout::NCHW && VEC > 1 && a.straddle) {  // short odd rows (7x7): a channel per element
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const int64_t chk = channel_of<LAY, k64>(a, e + k);
          sv[k] = __ldg(a.s + chk);
          if constexpr (MODE == Ew::Dx) cv[k] = __ldg(a.coef + chk);
        }
      } else {
        channel_factors<LAY, VEC>(a.s, ch, sv);
        if constexpr (MODE == Ew::Dx) channel_factors<LAY, VEC>(a.coef, ch, cv);
      }
      float o[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        if constexpr (MODE == Ew::Scale) o[k] = xv[u][k] * sv[k];
        if constexpr (MODE == Ew::Dx) o[k] = xv[u][k] * sv[k] + cv[k];
        if constexpr (MODE == Ew::Bcast) o[k] = sv[k] * a.alpha;
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
                      const WgradTileArgs* wg, cudaStream_t stream) {
  return KC_DTYPE_SWITCH(dt, T, [&]() -> cudaError_t {
    constexpr int MV = kc::max_vec_elems<T>();
    const int64_t inner = d.layout == Layout::NCHW ? d.l : d.c;
    // NHWC vectors also read their VEC factors of s (and coef) as 16-byte vectors
    const bool factors_ok = d.layout == Layout::NCHW ||
                            (kc::is_aligned(s, 16) && (coef == nullptr || kc::is_aligned(coef, 16)));
    const int64_t total = d.n * d.c * d.l;
    // NCHW vectors may straddle rows (each element then finds its own channel)
    const bool straddle = d.layout == Layout::NCHW && inner % MV != 0;
    const bool vec = (in == nullptr || kc::is_aligned(in, 16)) && kc::is_aligned(out, 16) &&
                     (straddle ? total % MV == 0 : inner % MV == 0) && factors_ok;
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
      a.straddle = straddle && VEC > 1;
      const int64_t want = ceil_div(a.total_vec, int64_t(kThreads) * 4);
      const int64_t cap = int64_t(num_sms > 0 ? num_sms : 1) * 8;
      a.ew_blocks = int(want < cap ? want : cap);
      int64_t blocks = a.ew_blocks;
      if (wg != nullptr) {
        a.wg = *wg;
        a.wg_blocks = int(wgrad_blocks(*wg));
        blocks += a.wg_blocks;
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
