// se_reduce.cu: the HW reductions that every SE path but the cluster kernel starts with
// (declared in se_kernels.cuh): sums over l of x and / or g * x per (n, c), in the
// plan's splits, with the blocks that copy the MLP's parameters in the same grid.
// NCHW rows are reduced by a warp or a block per (row, split), or (short rows) in
// tiles of whole rows staged in shared memory; NHWC by blocks of (n, split, column
// tile) with fixed-order column sums. Every sum has a fixed order: no atomics.
#include "kc/async_copy.cuh"
#include "kc/launch.cuh"
#include "se_kernels.cuh"

namespace se {
namespace dev {

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
                          cudaStream_t stream, const ParamCast* cast) {
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
          KC_CUDA_TRY(kc::allow_dynamic_smem(kernel, smem));
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
        KC_CUDA_TRY(kc::allow_dynamic_smem(kernel, smem));
        kernel<<<blocks, kThreads, smem, stream>>>(a);
      }
      return cudaGetLastError();
    });
  });
}

template cudaError_t launch_reduce<true, false, false>(const void*, const void*, const float*, void*, kc::DType,
                                                       const Dims&, const ReducePlan&, float*, float*, cudaStream_t,
                                                       const ParamCast*);
template cudaError_t launch_reduce<true, true, false>(const void*, const void*, const float*, void*, kc::DType,
                                                      const Dims&, const ReducePlan&, float*, float*, cudaStream_t,
                                                      const ParamCast*);
template cudaError_t launch_reduce<false, true, true>(const void*, const void*, const float*, void*, kc::DType,
                                                      const Dims&, const ReducePlan&, float*, float*, cudaStream_t,
                                                      const ParamCast*);

}  // namespace dev
}  // namespace se
