// LayerNorm backward. With xhat = (x - mean) * rstd, g = dy * weight and D the
// row length (derivation in the README):
//   dx      = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat))      per row
//   dweight = sum_rows(dy * xhat),  dbias = sum_rows(dy)            per column
//
// Versions:
//   v1  the seed's algorithm, fixed: one block of 256 threads per row; pass 1
//       reduces sum(g) and sum(g * xhat) through shared memory, pass 2 writes dx
//       (x and dy read twice). dweight/dbias: a second kernel with one thread per
//       column walking all rows (coalesced across the warp, deterministic).
//   v2  x and dy read once into registers (16-byte vectors where allowed), both
//       row sums in one reduction, dx written once. A persistent grid (a few
//       blocks per SM) walks the rows; each block accumulates dy * xhat and dy
//       for its columns in shared memory (fp32), then writes one partial row per
//       block. A small finalize kernel sums the partials in a fixed order. No
//       float atomics anywhere: the same inputs on the same GPU give bitwise the
//       same dweight/dbias. Rows longer than 16384 fall back to v1.
//   v3  v2's math on a cp.async pipeline: each block of the persistent grid
//       keeps the next `stages - 1` rows of x and dy in flight into shared
//       memory (each thread copies and reads back only its own 16-byte vectors,
//       so the stages need no barrier), and, since the rows no longer occupy
//       shared memory for the accumulators, dy * xhat and dy per column are
//       accumulated in registers (each thread owns fixed columns). Block path
//       with 16-byte vectors only; else as v2.
// Traffic of v2: x, dy read once, dx written once (the 3-pass floor), plus
// 2 * grid * D * 4 bytes of partials written and read back.
#include <algorithm>

#include "layernorm.h"
#include "layernorm_common.cuh"

#include "kc/async_copy.cuh"
#include "kc/bulk_copy.cuh"
#include "kc/check.cuh"
#include "kc/cluster.cuh"
#include "kc/launch.cuh"
#include "kc/reduce.cuh"
#include "kc/switch.cuh"

namespace day26 {
namespace {

template <typename TW>
__device__ __forceinline__ float load_w(const TW* p, int64_t c) { return p ? kc::to_float(p[c]) : 1.f; }

// ----------------------------------------------------------------------------- v1
// Assumes blockDim.x a multiple of 32; grid = rows in this chunk.
template <typename T, typename TW>
__global__ void ln_bwd_dx_v1(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
                             const float* __restrict__ rstd, const TW* __restrict__ w, T* __restrict__ dx,
                             int64_t row0, int64_t D) {
  __shared__ float red[64];
  const int64_t row = row0 + blockIdx.x;
  const T* xr = x + row * D;
  const T* dyr = dy + row * D;
  const float mu = mean[row], rs = rstd[row];
  float sums[2] = {0.f, 0.f};  // sum(g), sum(g * xhat)
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
    const float g = kc::to_float(dyr[c]) * load_w(w, c);
    sums[0] += g;
    sums[1] += g * (kc::to_float(xr[c]) - mu) * rs;
  }
  kc::block_reduce_sum<2>(sums, red);
  const float a = sums[0] / float(D), b = sums[1] / float(D);
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
    sw += g * (kc::to_float(x[r * D + c]) - mean[r]) * rstd[r];
    sb += g;
  }
  if (dw) dw[c] = kc::from_float<TW>(sw);
  if (db) db[c] = kc::from_float<TW>(sb);
}

// ----------------------------------------------------------------------------- v2
// Assumptions (checked by the launcher):
// - kWarp: blockDim.x = 32 * kWarpRowsPerBlock, one warp per row, each warp has
//   its own accumulator slot; else blockDim.x = threads per row (<= kMaxTpr).
// - dynamic shared memory: slots * 2 * D floats (accumulators), 16-byte aligned.
// - VEC > 1 only when dy, x, dx, weight are VEC-aligned and D % VEC == 0.
// - partial: [gridDim.x][2][D] fp32 (row 0: dweight partial, row 1: dbias), written
//   fully when kPartials (every column, zeros for columns no row touched).
template <int VEC>
__device__ __forceinline__ void smem_accumulate(float* p, const float (&v)[VEC]) {
  if constexpr (VEC % 4 == 0) {
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) {
      float4 t = reinterpret_cast<float4*>(p)[q];
      t.x += v[4 * q]; t.y += v[4 * q + 1]; t.z += v[4 * q + 2]; t.w += v[4 * q + 3];
      reinterpret_cast<float4*>(p)[q] = t;
    }
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) p[j] += v[j];
  }
}

// pass 1 of a row: the row sums of g = dy * w and g * xhat; per column dy * xhat
// and dy into pw/pb. pass 2: dx = rstd * (g - a - xhat * b).
template <typename T, typename TW, int VEC>
__device__ __forceinline__ void bwd_pass1(const kc::Vec<T, VEC>& xv, const kc::Vec<T, VEC>& dv, const TW* w,
                                          int64_t c, float mu, float rs, float (&sums)[2], float (&pw)[VEC],
                                          float (&pb)[VEC]) {
  float wv[VEC];
  load_param<TW, VEC>(w, c, 1.f, wv);
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float xhat = (kc::to_float(xv.v[j]) - mu) * rs;
    const float d = kc::to_float(dv.v[j]);
    const float g = d * wv[j];
    sums[0] += g;
    sums[1] += g * xhat;
    pw[j] = d * xhat;
    pb[j] = d;
  }
}

template <typename T, typename TW, int VEC>
__device__ __forceinline__ void bwd_pass2(const kc::Vec<T, VEC>& xv, const kc::Vec<T, VEC>& dv, const TW* w,
                                          int64_t c, float mu, float rs, float a, float b, T* dxr) {
  float wv[VEC], out[VEC];
  load_param<TW, VEC>(w, c, 1.f, wv);
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float xhat = (kc::to_float(xv.v[j]) - mu) * rs;
    const float g = kc::to_float(dv.v[j]) * wv[j];
    out[j] = rs * (g - a - xhat * b);
  }
  store_from_f32<T, VEC>(dxr + c, out);
}

template <typename T, typename TW, int VEC, int ITERS, bool kWarp, bool kPartials>
__global__ void __launch_bounds__(kMaxTpr)
ln_bwd_v2(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
          const float* __restrict__ rstd, const TW* __restrict__ w, T* __restrict__ dx,
          float* __restrict__ partial, int64_t rows, int64_t D) {
  extern __shared__ __align__(16) float acc[];  // [slots][2][D]
  __shared__ float red[64];
  kc::launch_dependents();  // see launch_finalize
  const int tpr = kWarp ? 32 : blockDim.x;
  const int t = kWarp ? (threadIdx.x & 31) : threadIdx.x;
  const int64_t slots = kWarp ? (blockDim.x >> 5) : 1;
  const int64_t slot = kWarp ? (threadIdx.x >> 5) : 0;
  const float inv_d = 1.f / float(D);

  if (kPartials) {
    for (int64_t i = threadIdx.x; i < slots * 2 * D; i += blockDim.x) acc[i] = 0.f;
    __syncthreads();
  }
  float* acc_w = acc + slot * 2 * D;
  float* acc_b = acc_w + D;

  for (int64_t row = blockIdx.x * slots + slot; row < rows; row += int64_t(gridDim.x) * slots) {
    RowRegs<T, VEC, ITERS> cx, cd;
    load_row(cx, x + row * D, D, tpr, t);
    load_row(cd, dy + row * D, D, tpr, t);
    const float mu = mean[row], rs = rstd[row];
    float sums[2] = {0.f, 0.f};
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int64_t c = (int64_t(it) * tpr + t) * VEC;
      if (c < D) {
        float pw[VEC], pb[VEC];
        bwd_pass1<T, TW, VEC>(cx.v[it], cd.v[it], w, c, mu, rs, sums, pw, pb);
        if (kPartials) {
          smem_accumulate<VEC>(acc_w + c, pw);
          smem_accumulate<VEC>(acc_b + c, pb);
        }
      }
    }
    if (kWarp) {
      sums[0] = kc::warp_reduce_sum(sums[0]);
      sums[1] = kc::warp_reduce_sum(sums[1]);
    } else {
      kc::block_reduce_sum<2>(sums, red);
    }
    if (dx) {
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const int64_t c = (int64_t(it) * tpr + t) * VEC;
        if (c < D) bwd_pass2<T, TW, VEC>(cx.v[it], cd.v[it], w, c, mu, rs, sums[0] * inv_d, sums[1] * inv_d, dx + row * D);
      }
    }
  }
  if (kPartials) {
    __syncthreads();
    // Sum the slots in a fixed order and write this block's partial row.
    float* out = partial + int64_t(blockIdx.x) * 2 * D;
    for (int64_t i = threadIdx.x; i < 2 * D; i += blockDim.x) {
      const int64_t which = i / D, c = i - which * D;
      float s = 0.f;
      for (int64_t k = 0; k < slots; ++k) s += acc[k * 2 * D + which * D + c];
      out[i] = s;
    }
  }
}

// Write a thread's register sums (columns (it * tpr + t) * VEC + j < D) into a
// partial row: out[c] = dweight partial, out[ld + c] = dbias partial.
template <int VEC, int ITERS>
__device__ __forceinline__ void store_partial_row(float* out, const float (&accw)[ITERS][VEC],
                                                  const float (&accb)[ITERS][VEC], int64_t D, int64_t ld, int tpr,
                                                  int t) {
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int64_t c = (int64_t(it) * tpr + t) * VEC;
    if (c < D) {
      if constexpr (VEC % 4 == 0) {
#pragma unroll
        for (int j = 0; j < VEC; j += 4) {
          *reinterpret_cast<float4*>(out + c + j) =
              make_float4(accw[it][j], accw[it][j + 1], accw[it][j + 2], accw[it][j + 3]);
          *reinterpret_cast<float4*>(out + ld + c + j) =
              make_float4(accb[it][j], accb[it][j + 1], accb[it][j + 2], accb[it][j + 3]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          out[c + j] = accw[it][j];
          out[ld + c + j] = accb[it][j];
        }
      }
    }
  }
}

// The end of a row-slot kernel (v4, v4 ring) with register sums: slots 1, 2, ...
// park their sums in `buf` ([slots - 1][ITERS][2 * VEC][tpr] floats: consecutive
// threads, consecutive words; written once, read once), slot 0 adds them in slot
// order and writes the block's partial row `out` (columns < D, dbias at out + ld).
// Every thread of the block calls it, after its last use of the shared memory
// that `buf` overlays.
template <int VEC, int ITERS>
__device__ __forceinline__ void slots_store_partial(float (&accw)[ITERS][VEC], float (&accb)[ITERS][VEC],
                                                    float* buf, float* out, int64_t D, int64_t ld, int slots,
                                                    int slot, int tpr, int t) {
  if (slots > 1) {
    __syncthreads();  // every slot is done with its rows (and with what buf overlays)
    if (slot > 0) {
      float* b = buf + int64_t(slot - 1) * ITERS * 2 * VEC * tpr + t;
#pragma unroll
      for (int it = 0; it < ITERS; ++it)
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          b[(it * 2 * VEC + j) * tpr] = accw[it][j];
          b[(it * 2 * VEC + VEC + j) * tpr] = accb[it][j];
        }
    }
    __syncthreads();
    if (slot == 0) {
      for (int k = 1; k < slots; ++k) {
        const float* b = buf + int64_t(k - 1) * ITERS * 2 * VEC * tpr + t;
#pragma unroll
        for (int it = 0; it < ITERS; ++it)
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            accw[it][j] += b[(it * 2 * VEC + j) * tpr];
            accb[it][j] += b[(it * 2 * VEC + VEC + j) * tpr];
          }
      }
    }
  }
  if (slot == 0) store_partial_row<VEC, ITERS>(out, accw, accb, D, ld, tpr, t);
}

// v3. Block path, VEC = 16 bytes of T, blockDim.x = threads per row <= kMaxTpr;
// dynamic shared memory: stages * 2 * D elements of T ([stages][x | dy][D]);
// partial: [gridDim.x][2][D] fp32 when kPartials (every column written).
template <typename T, typename TW, int ITERS, bool kPartials>
__global__ void __launch_bounds__(kMaxTpr)
ln_bwd_v3(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
          const float* __restrict__ rstd, const TW* __restrict__ w, T* __restrict__ dx,
          float* __restrict__ partial, int64_t rows, int64_t D, int stages) {
  constexpr int VEC = kc::max_vec_elems<T>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sbuf = reinterpret_cast<T*>(smem_raw);  // stage s: x at s * 2D, dy at s * 2D + D
  __shared__ float red[64];
  kc::launch_dependents();  // see launch_finalize
  const int tpr = blockDim.x, t = threadIdx.x;
  const int64_t stride = gridDim.x;
  const float inv_d = 1.f / float(D);
  auto issue = [&](int64_t r, int stage) {  // this thread's vectors of row r -> stage
    if (r < rows) {
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const int64_t c = (int64_t(it) * tpr + t) * VEC;
        if (c < D) {
          kc::cp_async_16(sbuf + (2 * stage) * D + c, x + r * D + c);
          kc::cp_async_16(sbuf + (2 * stage + 1) * D + c, dy + r * D + c);
        }
      }
    }
    kc::cp_async_commit();  // one group per row, empty past the end, so counts stay uniform
  };
  float accw[ITERS][VEC], accb[ITERS][VEC];
#pragma unroll
  for (int it = 0; it < ITERS; ++it)
#pragma unroll
    for (int j = 0; j < VEC; ++j) accw[it][j] = accb[it][j] = 0.f;

  const int64_t first = blockIdx.x;
  for (int s = 0; s < stages - 1; ++s) issue(first + s * stride, s);
  int stage = 0;
  for (int64_t row = first; row < rows; row += stride) {
    issue(row + (stages - 1) * stride, stage == 0 ? stages - 1 : stage - 1);  // the stage read last iteration
    const float mu = mean[row], rs = rstd[row];
    kc::cp_async_wait(stages - 1);  // this row's group has landed
    const T* sx = sbuf + (2 * stage) * D;
    const T* sd = sx + D;
    float sums[2] = {0.f, 0.f};
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int64_t c = (int64_t(it) * tpr + t) * VEC;
      if (c < D) {
        float pw[VEC], pb[VEC];
        bwd_pass1<T, TW, VEC>(*reinterpret_cast<const kc::Vec<T, VEC>*>(sx + c),
                              *reinterpret_cast<const kc::Vec<T, VEC>*>(sd + c), w, c, mu, rs, sums, pw, pb);
        if (kPartials) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            accw[it][j] += pw[j];
            accb[it][j] += pb[j];
          }
        }
      }
    }
    kc::block_reduce_sum<2>(sums, red);
    if (dx) {
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const int64_t c = (int64_t(it) * tpr + t) * VEC;
        if (c < D)
          bwd_pass2<T, TW, VEC>(*reinterpret_cast<const kc::Vec<T, VEC>*>(sx + c),
                                *reinterpret_cast<const kc::Vec<T, VEC>*>(sd + c), w, c, mu, rs, sums[0] * inv_d,
                                sums[1] * inv_d, dx + row * D);
      }
    }
    stage = stage + 1 == stages ? 0 : stage + 1;
  }
  kc::cp_async_wait(0);
  if (kPartials) store_partial_row<VEC, ITERS>(partial + int64_t(blockIdx.x) * 2 * D, accw, accb, D, D, tpr, t);
}

// One vector of a row in v4 and the ring (weights wv in fp32). Each 16-byte
// vector of x and dy is converted to fp32 once (kc::vec_to_float: a 16-bit pair
// is one 32-bit word). Pass 1: the row sums of g = dy * w and g * xhat into sums,
// and (kCols) dy * xhat and dy added to the column sums cw, cb.
template <typename T, int VEC, bool kCols>
__device__ __forceinline__ void bwd_vec_pass1(const kc::Vec<T, VEC>& xv, const kc::Vec<T, VEC>& dv,
                                              const float (&wv)[VEC], float mu, float rs, float (&sums)[2],
                                              float (&cw)[VEC], float (&cb)[VEC]) {
  float xf[VEC], df[VEC];
  kc::vec_to_float(xv, xf);
  kc::vec_to_float(dv, df);
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float xhat = (xf[j] - mu) * rs;
    const float g = df[j] * wv[j];
    sums[0] += g;
    sums[1] = fmaf(g, xhat, sums[1]);
    if (kCols) {
      cw[j] = fmaf(df[j], xhat, cw[j]);
      cb[j] += df[j];
    }
  }
}

// Pass 2, one row's terms: dx = rstd * (g - a - xhat * b), a and b the row sums
// over D. fp32 output: computed as written (distributed into FMAs, rstd * b and
// rstd * a are rounded first, and dx is a small difference of large terms for
// short rows: measured 4.5e-6 relative error at D = 3 in fp32, over the tests'
// 3e-6). 16-bit output, whose rounding is 2^-8 or 2^-11 of dx, far above those
// fp32 roundings: dx = k1 * (x - mean) + (rstd * g + k0) with k1 = -rstd^2 * b,
// k0 = -rstd * a per row: 4 instructions an element instead of 6.
struct DxRow {
  float mu, rs, a, b, k0, k1;
  __device__ __forceinline__ DxRow(float mu_, float rs_, const float (&sums)[2], float inv_d)
      : mu(mu_), rs(rs_), a(sums[0] * inv_d), b(sums[1] * inv_d), k0(-rs_ * a), k1(-(rs_ * rs_) * b) {}
};

template <typename T, int VEC>
__device__ __forceinline__ void bwd_vec_dx(const kc::Vec<T, VEC>& xv, const kc::Vec<T, VEC>& dv,
                                           const float (&wv)[VEC], const DxRow& r, T* p) {
  float xf[VEC], df[VEC], out[VEC];
  kc::vec_to_float(xv, xf);
  kc::vec_to_float(dv, df);
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float g = df[j] * wv[j];
    if constexpr (sizeof(T) == 4) {
      const float xhat = (xf[j] - r.mu) * r.rs;
      out[j] = r.rs * (g - r.a - xhat * r.b);
    } else {
      out[j] = fmaf(r.k1, xf[j] - r.mu, fmaf(r.rs, g, r.k0));
    }
  }
  store_from_f32<T, VEC>(p, out);
}

// v4. Row slots (layernorm_common.cuh): blockDim.x = slots * tpr; slot k walks
// rows blockIdx.x * slots + k + i * gridDim.x * slots. Each thread keeps dy * xhat
// and dy for its columns in registers across all of its slot's rows; at the end
// the slots of a block add theirs in slot order through shared memory and slot 0
// writes the block's partial row. With kPrefetch the next row's x, dy, mean and
// rstd are loaded before the current row is reduced, so every slot keeps a row's
// loads in flight while it computes. The weights of a thread's columns are read
// once (fp32 registers) instead of once per row.
// Dynamic shared memory (kPartials): when slots > 1, (slots - 1) * tpr * ITERS * 2 * VEC
// floats (the end-of-kernel slot sum).
// partial: [gridDim.x][2][D] fp32 when kPartials (every column written).
template <typename T, typename TW, int VEC, int ITERS, bool kPartials, bool kPrefetch>
__global__ void __launch_bounds__(kV4SmallThreads)
ln_bwd_v4(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
          const float* __restrict__ rstd, const TW* __restrict__ w, T* __restrict__ dx,
          float* __restrict__ partial, int64_t rows, int64_t D, int tpr) {
  extern __shared__ __align__(16) float slot_acc[];
  __shared__ float red[kV4MaxSlots][2 * 32 * 2];
  kc::launch_dependents();  // see launch_finalize
  const int slots = blockDim.x / tpr;
  const int slot = threadIdx.x / tpr, t = threadIdx.x - slot * tpr;
  const int lane = threadIdx.x & 31, wis = t >> 5, nw = tpr >> 5;
  const float inv_d = 1.f / float(D);
  float accw[ITERS][VEC], accb[ITERS][VEC];
#pragma unroll
  for (int it = 0; it < ITERS; ++it)
#pragma unroll
    for (int j = 0; j < VEC; ++j) accw[it][j] = accb[it][j] = 0.f;
  // the weights of this thread's columns, as fp32, for every row
  float wf[ITERS][VEC];
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int64_t c = (int64_t(it) * tpr + t) * VEC;
    if (c < D) {
      load_param<TW, VEC>(w, c, 1.f, wf[it]);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) wf[it][j] = 0.f;
    }
  }

  const int64_t stride = int64_t(gridDim.x) * slots;
  int64_t row = int64_t(blockIdx.x) * slots + slot;
  int parity = 0;
  RowRegs<T, VEC, ITERS> cx, cd;
  float mu = 0.f, rs = 0.f;
  if (kPrefetch && row < rows) {
    load_row(cx, x + row * D, D, tpr, t);
    load_row(cd, dy + row * D, D, tpr, t);
    mu = mean[row], rs = rstd[row];
  }
  for (; row < rows; row += stride) {
    RowRegs<T, VEC, ITERS> nx, nd;
    float nmu = 0.f, nrs = 0.f;
    if (kPrefetch) {
      const int64_t next = row + stride;
      if (next < rows) {
        load_row(nx, x + next * D, D, tpr, t);
        load_row(nd, dy + next * D, D, tpr, t);
        nmu = mean[next], nrs = rstd[next];
      }
    } else {
      load_row(cx, x + row * D, D, tpr, t);
      load_row(cd, dy + row * D, D, tpr, t);
      mu = mean[row], rs = rstd[row];
    }
    // pass 1: the row sums of g = dy * w and g * xhat; dy * xhat and dy per column
    float sums[2] = {0.f, 0.f};
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int64_t c = (int64_t(it) * tpr + t) * VEC;
      if (c < D) {
        bwd_vec_pass1<T, VEC, kPartials>(cx.v[it], cd.v[it], wf[it], mu, rs, sums, accw[it], accb[it]);
      }
    }
    slot_reduce_sum<2>(sums, red[slot], parity, 1 + slot, nw, wis, lane);
    // pass 2: dx
    if (dx) {
      const DxRow dr(mu, rs, sums, inv_d);
      T* dxr = dx + row * D;
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const int64_t c = (int64_t(it) * tpr + t) * VEC;
        if (c < D) bwd_vec_dx<T, VEC>(cx.v[it], cd.v[it], wf[it], dr, dxr + c);
      }
    }
    if (kPrefetch) {
      cx = nx, cd = nd;
      mu = nmu, rs = nrs;
    }
  }
  if constexpr (kPartials) {
    slots_store_partial<VEC, ITERS>(accw, accb, slot_acc, partial + int64_t(blockIdx.x) * 2 * D, D, D, slots, slot,
                                    tpr, t);
  }
}

// Sum G partial rows per column in a fixed order (the finalize kernel's body):
// chunks of 32 columns go to the blocks in turn; in a block, blockDim.x / 32 slices each add every
// (blockDim.x / 32)-th partial row of its column (four loads in flight), then
// slice 0 adds the slices' sums in slice order. red: 2 * blockDim.x floats of
// shared memory. Same G, D and block size: the same order, bitwise the same sums.
template <typename TW>
__device__ __forceinline__ void finalize_columns(const float* __restrict__ partial, int64_t G, int64_t D,
                                                 TW* __restrict__ dw, TW* __restrict__ db, float* red) {
  const int nsl = blockDim.x >> 5;
  const int cx = threadIdx.x & 31, sy = threadIdx.x >> 5;
  for (int64_t chunk = blockIdx.x; chunk * 32 < D; chunk += gridDim.x) {
    const int64_t c = chunk * 32 + cx;
    float aw = 0.f, ab = 0.f;
    if (c < D) {
      int64_t g = sy;
      for (; g + 3 * nsl < G; g += 4 * nsl) {
        float vw[4], vb[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          vw[k] = partial[((g + k * nsl) * 2) * D + c];
          vb[k] = partial[((g + k * nsl) * 2 + 1) * D + c];
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) aw += vw[k], ab += vb[k];
      }
      for (; g < G; g += nsl) {
        aw += partial[(g * 2) * D + c];
        ab += partial[(g * 2 + 1) * D + c];
      }
    }
    red[sy * 32 + cx] = aw;
    red[(nsl + sy) * 32 + cx] = ab;
    __syncthreads();
    if (sy == 0 && c < D) {
      float tw = 0.f, tb = 0.f;
      for (int k = 0; k < nsl; ++k) {
        tw += red[k * 32 + cx];
        tb += red[(nsl + k) * 32 + cx];
      }
      if (dw) dw[c] = kc::from_float<TW>(tw);
      if (db) db[c] = kc::from_float<TW>(tb);
    }
    __syncthreads();  // red is reused by the next chunk
  }
}

// The finalize kernel: blocks of 1024 threads (32 slices), one chunk each.
template <typename TW>
__global__ void ln_bwd_finalize(const float* __restrict__ partial, int64_t G, int64_t D, TW* __restrict__ dw,
                                TW* __restrict__ db) {
  __shared__ float red[2 * 1024];
  kc::grid_dependency_wait();  // launched with PDL: the partials are complete and visible after this
  finalize_columns<TW>(partial, G, D, dw, db, red);
}

// The finalize kernel for rows of up to kFinNarrowMaxD columns, where the wide
// kernel's chunks of 32 columns leave most SMs idle (D = 768: 24 blocks on 132
// SMs). It sums the same partials ([G][2][D] fp32: dy * xhat, dy) per column in
// a fixed order. A block of kFinThreads = 256 threads owns kFinCols = 8 columns
// (one 32-byte sector of a partial row; D = 768: 96 blocks): thread t adds rows
// s, s + 32, s + 64, ... (s = t / 8, one of 32 slices) of column t % 8, loading
// kFinRows rows before adding; the slices are then added by a shuffle tree
// inside each warp (4 slices a warp) and by one thread per output in warp order.
// The order depends on G and D only: same inputs, bitwise the same sums.
// H200 (README, runs 65-66): it ends 2.1 / 1.7 us after the main kernel at
// 4096x768 bf16 / fp32, the wide kernel 2.8 / 2.9 us; at 8192 columns 4.7
// against 3.4 (so wide rows keep the wide kernel), at 1024 both 3.0.
constexpr int kFinNarrowMaxD = 1024, kFinThreads = 256, kFinCols = 8, kFinRows = 8;
template <typename TW>
__global__ void __launch_bounds__(kFinThreads)
ln_bwd_finalize_narrow(const float* __restrict__ partial, int64_t G, int64_t D, TW* __restrict__ dw,
                       TW* __restrict__ db) {
  constexpr int kSlices = kFinThreads / kFinCols, kWarps = kFinThreads / 32;
  __shared__ float red[kWarps][2 * kFinCols];
  kc::grid_dependency_wait();  // launched with PDL: the partials are complete and visible after this
  const int cx = threadIdx.x % kFinCols, s = threadIdx.x / kFinCols;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t chunk = blockIdx.x; chunk * kFinCols < D; chunk += gridDim.x) {
    const int64_t c = chunk * kFinCols + cx;
    float aw = 0.f, ab = 0.f;
    if (c < D) {
      // kFinRows rows a batch (one batch when G <= kFinRows * kSlices): a missing row is
      // read at the slice's last row (valid memory; a branch around the load kept the
      // compiler from issuing the loads together) and added as 0
      const int64_t step = int64_t(kSlices) * 2 * D;  // from a slice's row to its next
      const float* p = partial + int64_t(s) * 2 * D + c;
      for (int64_t g = s; g < G; g += kFinRows * kSlices, p += kFinRows * step) {
        const int left = int(std::min<int64_t>((G - g + kSlices - 1) / kSlices, kFinRows));
        float vw[kFinRows], vb[kFinRows];
        const float* q = p;
#pragma unroll
        for (int k = 0; k < kFinRows; ++k) {
          vw[k] = q[0];
          vb[k] = q[D];
          if (k + 1 < left) q += step;
        }
#pragma unroll
        for (int k = 0; k < kFinRows; ++k) aw += k < left ? vw[k] : 0.f, ab += k < left ? vb[k] : 0.f;
      }
    }
    // the warp's 4 slices of each column (lanes cx, cx + 8, cx + 16, cx + 24)
#pragma unroll
    for (int off = kFinCols; off < 32; off <<= 1) {
      aw += __shfl_xor_sync(0xffffffffu, aw, off);
      ab += __shfl_xor_sync(0xffffffffu, ab, off);
    }
    if (lane < kFinCols) {
      red[warp][lane] = aw;
      red[warp][kFinCols + lane] = ab;
    }
    __syncthreads();
    if (threadIdx.x < 2 * kFinCols) {
      const int q = threadIdx.x;  // q < 8: dweight of column q; else dbias of column q - 8
      const int64_t cq = chunk * kFinCols + (q % kFinCols);
      float t = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) t += red[w][q];
      if (cq < D) {
        TW* out = q < kFinCols ? dw : db;
        if (out) out[cq] = kc::from_float<TW>(t);
      }
    }
    __syncthreads();  // red is reused by the next chunk
  }
}

// v4 on a ring of rows in shared memory, filled by the copy engine. As ln_bwd_v4
// (row slots, dy * xhat and dy summed in registers, one partial row per block),
// but every slot keeps its next rows of x and dy in a shared-memory ring of
// `stages` rows: one thread of the slot copies a whole row of x and of dy with
// one bulk copy each (kc/bulk_copy.cuh), completing on the stage's mbarrier, so
// the bytes in flight cost no registers and almost no instructions (v4 holds the
// row in registers: bytes in flight per SM were bounded by registers, README).
// Pass 1 and pass 2 read the row from the ring. A stage is refilled (with the row
// `stages` rows later) once the slot's reduction barrier of the next row shows
// every thread past its last read of it. The weights of a thread's columns stay
// in registers when it owns at most 16 columns (else they are read with each row).
//
// kCluster: a row is split across the CTAs of a cluster (kc/cluster.cuh): CTA
// rank r of a cluster owns columns [r * Dc, (r + 1) * Dc) of every row, and slot
// k of every CTA of the cluster walks the same rows, so the registers that hold
// a row's dgamma/dbeta sums are spread over several SMs (a 16384-column row no
// longer needs one SM's registers). After its slot's reduction, each CTA sends
// its share of the two row sums to every CTA of the cluster (itself included):
// an asynchronous store into distributed shared memory (st.async) that completes
// 8 bytes on the receiver's exchange mbarrier, which one thread of the receiving
// slot arms each round with the bytes expected. Each CTA waits for all shares
// and adds them in rank order, so every CTA gets the same sums. No release fence:
// a send does not wait for the sender's earlier dx stores (a plain store plus an
// mbarrier arrive with cluster-scope release did, and cost 6%: run 25 vs 26).
// Exchange buffers alternate by row: a CTA can reach row i + 2, and write buffer
// i % 2 again (or complete its mbarrier's next phase), only after every CTA sent
// row i + 1, which each sends after its slot's barrier of row i + 1, i.e. after
// all of its threads read row i's buffer and waited for its phase.
// The partial row of a cluster is written by its CTAs, each its own columns.
//
// Assumptions (launcher): sm_90+; VEC = 16 bytes of T, every pointer and Dc allow
// it (so a row share is a multiple of 16 bytes); D = cluster size * Dc; blockDim.x
// = slots * tpr, tpr a multiple of 32; 2 <= stages <= kRingMaxStages; dynamic
// shared memory: slots * stages * 2 * span elements of T, span = tpr * ITERS *
// VEC >= Dc (slot k's ring at k * stages * 2 * span; stage s: x at s * 2 * span,
// dy after it), at least the (slots - 1) * tpr * ITERS * 2 * VEC floats of the
// end-of-kernel slot sum. partial: [clusters (or blocks)][2][D] when kPartials.
// Registers: the dx-only kernels (no column sums) are held to 64, i.e. two
// 512-thread blocks per SM (unbounded, ptxas gave some of them ~100 once pass 2
// got shorter); the others are unbounded (a minimum of 0 blocks leaves it
// unspecified; even an explicit 1 changes ptxas's allocation: probe run 52).
template <typename T, typename TW, int ITERS, bool kPartials, bool kCluster>
__global__ void __launch_bounds__(kV4SmallThreads, kPartials ? 0 : 2)
ln_bwd_ring(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
            const float* __restrict__ rstd, const TW* __restrict__ w, T* __restrict__ dx,
            float* __restrict__ partial, int64_t rows, int64_t D, int64_t Dc, int tpr, int stages) {
  constexpr int VEC = kc::max_vec_elems<T>();
  constexpr bool kWReg = ITERS * VEC <= 16;  // the weights in registers too
  extern __shared__ __align__(128) unsigned char ring_smem[];
  __shared__ float red[kV4MaxSlots][2 * 32 * 2];
  __shared__ uint64_t full[kV4MaxSlots][kRingMaxStages];  // per slot and stage: the row has landed
  // kCluster: per slot, kX rotating buffers of every rank's row sums, and their mbarriers
  __shared__ float2 xsum[kCluster ? kV4MaxSlots : 1][ClusterPairs::kX][kRingMaxCluster];
  __shared__ uint64_t xbar[kCluster ? kV4MaxSlots : 1][ClusterPairs::kX];
  kc::launch_dependents();  // the finalize kernel (PDL) may be scheduled; it waits for our completion
  const int slots = blockDim.x / tpr;
  const int slot = threadIdx.x / tpr, t = threadIdx.x - slot * tpr;
  const int lane = threadIdx.x & 31, wis = t >> 5, nw = tpr >> 5;
  const float inv_d = 1.f / float(D);
  const unsigned csize = kCluster ? kc::cluster_size_x() : 1u, crank = kCluster ? kc::cluster_rank() : 0u;
  const int64_t group = kCluster ? int64_t(kc::cluster_id()) : int64_t(blockIdx.x);  // row team of CTAs
  const int64_t groups = kCluster ? int64_t(kc::cluster_count()) : int64_t(gridDim.x);
  const int64_t col0 = int64_t(crank) * Dc;  // this CTA's columns: [col0, col0 + Dc)
  const int64_t span = int64_t(tpr) * ITERS * VEC;
  T* const ring = reinterpret_cast<T*>(ring_smem) + int64_t(slot) * stages * 2 * span;
  uint64_t* const bars = full[slot];
  const unsigned row_bytes = unsigned(Dc * int64_t(sizeof(T)));
  x += col0;
  dy += col0;

  float accw[ITERS][VEC], accb[ITERS][VEC];
#pragma unroll
  for (int it = 0; it < ITERS; ++it)
#pragma unroll
    for (int j = 0; j < VEC; ++j) accw[it][j] = accb[it][j] = 0.f;
  float wf[kWReg ? ITERS : 1][VEC];
  if constexpr (kWReg) {
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int64_t c = (int64_t(it) * tpr + t) * VEC;
      if (c < Dc) {
        load_param<TW, VEC>(w, col0 + c, 1.f, wf[it]);
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) wf[it][j] = 0.f;
      }
    }
  }
  auto weights = [&](int it, int64_t c, float (&wv)[VEC]) {
    if constexpr (kWReg) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) wv[j] = wf[it][j];
    } else {
      load_param<TW, VEC>(w, col0 + c, 1.f, wv);
    }
  };
  auto stage_x = [&](int s) -> const T* { return ring + int64_t(s) * 2 * span; };
  const RowCols<VEC, ITERS> rc(Dc, tpr, t);  // this thread's vectors (columns < Dc: a mask, int offsets)
  // pass 1 of the row in stage s: this thread's share of the row sums of g = dy * w
  // and g * xhat; dy * xhat and dy added to its column sums
  auto pass1 = [&](int s, float mu, float rs, float (&sums)[2]) {
    const T* sx = stage_x(s);
    const T* sd = sx + span;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int c = rc.col(it);
      if (rc.has(it)) {
        // one 16-byte load each into registers (handing the helper a reference into
        // shared memory let the compiler read 16-bit elements one by one: run 25)
        const kc::Vec<T, VEC> xv = *reinterpret_cast<const kc::Vec<T, VEC>*>(sx + c);
        const kc::Vec<T, VEC> dv = *reinterpret_cast<const kc::Vec<T, VEC>*>(sd + c);
        float wv[VEC];
        weights(it, c, wv);
        bwd_vec_pass1<T, VEC, kPartials>(xv, dv, wv, mu, rs, sums, accw[it], accb[it]);
      }
    }
  };
  // pass 2: dx of row r (in stage s) from the whole row's sums, the row read again from the ring
  auto pass2 = [&](int s, int64_t r, float mu, float rs, const float (&sums)[2]) {
    if (!dx) return;
    const T* sx = stage_x(s);
    const T* sd = sx + span;
    const DxRow dr(mu, rs, sums, inv_d);
    T* dxr = dx + r * D + col0;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int c = rc.col(it);
      if (rc.has(it)) {
        const kc::Vec<T, VEC> xv = *reinterpret_cast<const kc::Vec<T, VEC>*>(sx + c);
        const kc::Vec<T, VEC> dv = *reinterpret_cast<const kc::Vec<T, VEC>*>(sd + c);
        float wv[VEC];
        weights(it, c, wv);
        bwd_vec_dx<T, VEC>(xv, dv, wv, dr, dxr + c);
      }
    }
  };
  // kCluster: this CTA's share of each row's two sums goes to every rank (lane q of
  // the slot's first warp sends to rank q); the whole row's sums are every rank's
  // share added in rank order, then the buffer is re-armed for its next round (row
  // j + 2): no peer can deliver that before every thread of this slot is past this
  // wait (comment above the kernel)
  const ClusterPairs ex{&xsum[kCluster ? slot : 0][0][0], &xbar[kCluster ? slot : 0][0], csize, crank};
  auto receive = [&](int64_t j, float (&sums)[2]) {
    const float2* p = ex.wait(j);
    float s0 = 0.f, s1 = 0.f;
    for (unsigned q = 0; q < csize; ++q) s0 += p[q].x, s1 += p[q].y;
    sums[0] = s0, sums[1] = s1;
    ex.rearm(j, t);
  };

  const int64_t stride = groups * slots;
  int64_t row = group * slots + slot;
  auto issue = [&](int64_t r, int s) {  // thread 0 of the slot: row r of x and dy -> stage s
    T* sx = ring + int64_t(s) * 2 * span;
    kc::mbar_arrive_expect_tx(&bars[s], 2 * row_bytes);
    kc::bulk_copy_g2s(sx, x + r * D, row_bytes, &bars[s]);
    kc::bulk_copy_g2s(sx + span, dy + r * D, row_bytes, &bars[s]);
  };
  if (t == 0) {
    for (int s = 0; s < stages; ++s) kc::mbar_init(&bars[s], 1);
    if constexpr (kCluster) ex.init();
    kc::mbar_init_fence();
    if constexpr (kCluster) ex.arm_all();  // armed for each buffer's first round
  }
  if constexpr (kCluster) {
    kc::cluster_sync();  // every CTA's barriers are initialised before any peer stores to them
  } else {
    __syncthreads();
  }
  if (t == 0)
    for (int s = 0; s < stages; ++s)
      if (row + s * stride < rows) issue(row + s * stride, s);
  float mu_next = 0.f, rs_next = 0.f;  // the statistics of the next row, loaded a row ahead
  if (row < rows) mu_next = mean[row], rs_next = rstd[row];

  int stage = 0, parity = 0;
  unsigned phase = 0;  // parity of the ring's current round (every stage completes once per round)
  for (int64_t i = 0; row < rows; row += stride, ++i) {
    const float mu = mu_next, rs = rs_next;
    if (row + stride < rows) mu_next = mean[row + stride], rs_next = rstd[row + stride];
    kc::mbar_wait(&bars[stage], phase);  // this row has landed
    float sums[2] = {0.f, 0.f};
    pass1(stage, mu, rs, sums);
    slot_reduce_sum<2>(sums, red[slot], parity, 1 + slot, nw, wis, lane);
    // Every thread of the slot is past pass 2 of the previous row (the barrier
    // above; a one-warp slot: the shuffles, and this __syncwarp): refill its
    // stage (and, kCluster, the previous row's exchange buffer may be reused).
    if (nw == 1) __syncwarp();
    if constexpr (kCluster) ex.send(i, t, sums[0], sums[1]);
    if (t == 0 && i > 0) {
      const int prev = stage == 0 ? stages - 1 : stage - 1;
      const int64_t r = row + int64_t(stages - 1) * stride;
      if (r < rows) issue(r, prev);
    }
    if constexpr (kCluster) receive(i, sums);
    pass2(stage, row, mu, rs, sums);
    if (++stage == stages) stage = 0, phase ^= 1u;
  }
  // every row issued was waited for above: no copy is in flight into the buffer below
  if constexpr (kPartials)
    slots_store_partial<VEC, ITERS>(accw, accb, reinterpret_cast<float*>(ring_smem),
                                    partial + group * 2 * D + col0, Dc, D, slots, slot, tpr, t);
  if constexpr (kCluster) kc::cluster_sync();  // no CTA leaves while a peer may still access its shared memory
}


// -------------------------------------------------------------------- launching
template <typename T, typename TW>
int v2_vec(const LnBackwardArgs& a) {
  constexpr int V = kc::max_vec_elems<T>();
  const bool ok = kc::can_vectorize<T, V>(a.x, a.cols) && kc::can_vectorize<T, V>(a.dy, a.cols) &&
                  (!a.dx || kc::can_vectorize<T, V>(a.dx, a.cols)) &&
                  (!a.weight || kc::is_aligned(a.weight, sizeof(TW) * V));
  return ok ? V : 1;
}

template <typename T, typename TW, int VEC, int ITERS, bool kWarp, bool kPartials>
auto v2_kernel() { return ln_bwd_v2<T, TW, VEC, ITERS, kWarp, kPartials>; }

size_t v2_smem(const V2Config& cfg, int64_t D) {
  return size_t(cfg.warp ? kWarpRowsPerBlock : 1) * 2 * size_t(D) * sizeof(float);
}

// Grid of the persistent v2 kernel: blocks that fit at once (occupancy), capped
// by the number of row groups. A pure function of (D, dtype, config, device).
template <typename Kernel>
int64_t v2_grid(Kernel kernel, const V2Config& cfg, int64_t rows, int64_t D, bool partials) {
  const size_t smem = partials ? v2_smem(cfg, D) : 0;
  allow_dynamic_smem(kernel, smem);
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, cfg.threads, smem) != cudaSuccess || per_sm < 1)
    per_sm = 1;
  const int64_t groups = (rows + (cfg.warp ? kWarpRowsPerBlock : 1) - 1) / (cfg.warp ? kWarpRowsPerBlock : 1);
  const int64_t cap = int64_t(num_sms()) * per_sm;
  return groups < cap ? groups : cap;
}

// Calls f.template operator()<VEC, ITERS, kWarp>() for the configuration.
template <int VEC, typename F>
cudaError_t with_v2_config(const V2Config& cfg, F&& f) {
  return KC_BOOL_SWITCH(cfg.warp, kWarp, [&] {
    switch (cfg.iters) {
      case 1: return f.template operator()<VEC, 1, kWarp>();
      case 2: return f.template operator()<VEC, 2, kWarp>();
      case 4: if constexpr (4 * VEC <= kMaxEpt) return f.template operator()<VEC, 4, kWarp>(); break;
      case 8: if constexpr (8 * VEC <= kMaxEpt) return f.template operator()<VEC, 8, kWarp>(); break;
      case 16: if constexpr (16 * VEC <= kMaxEpt) return f.template operator()<VEC, 16, kWarp>(); break;
    }
    return cudaErrorInvalidConfiguration;
  });
}

// Launched with programmatic dependent launch where the GPU has it (sm_90+): its
// launch overlaps the main kernel's tail (the main kernels call
// kc::launch_dependents() early; the finalize waits for their completion).
template <typename TW>
cudaError_t launch_finalize(const LnBackwardArgs& a, int64_t grid, cudaStream_t stream) {
  const float* partial = static_cast<const float*>(a.workspace);
  TW* dw = static_cast<TW*>(a.dweight);
  TW* db = static_cast<TW*>(a.dbias);
  if (a.cols <= kFinNarrowMaxD)
    return kc::launch(ln_bwd_finalize_narrow<TW>, dim3(unsigned((a.cols + kFinCols - 1) / kFinCols)),
                      dim3(kFinThreads), 0, stream, kc::sm90_or_newer(), partial, grid, a.cols, dw, db);
  return kc::launch(ln_bwd_finalize<TW>, dim3(unsigned((a.cols + 31) / 32)), dim3(1024), 0, stream,
                    kc::sm90_or_newer(), partial, grid, a.cols, dw, db);
}

template <typename T, typename TW>
struct V2Launch {
  const LnBackwardArgs& a;
  const V2Config& cfg;
  cudaStream_t stream;
  bool partials;
  int64_t* grid_out;  // when set: only compute the grid

  template <int VEC, int ITERS, bool kWarp>
  cudaError_t operator()() const {
    auto kernel = partials ? v2_kernel<T, TW, VEC, ITERS, kWarp, true>() : v2_kernel<T, TW, VEC, ITERS, kWarp, false>();
    const int64_t grid = v2_grid(kernel, cfg, a.rows, a.cols, partials);
    if (grid_out) {
      *grid_out = grid;
      return cudaSuccess;
    }
    if (grid > 0) {
      kernel<<<unsigned(grid), cfg.threads, partials ? v2_smem(cfg, a.cols) : 0, stream>>>(
          static_cast<const T*>(a.dy), static_cast<const T*>(a.x), a.mean, a.rstd,
          static_cast<const TW*>(a.weight), static_cast<T*>(a.dx), a.workspace, a.rows, a.cols);
      KC_CUDA_LAUNCH_TRY();
    }
    return partials ? launch_finalize<TW>(a, grid, stream) : cudaSuccess;
  }
};

// v3: the pipelined kernel (block path, 16-byte vectors).
template <typename T, typename TW, int ITERS>
cudaError_t launch_v3(const LnBackwardArgs& a, const V2Config& cfg, int stages, bool partials, cudaStream_t stream,
                      int64_t* grid_out) {
  auto kernel = partials ? ln_bwd_v3<T, TW, ITERS, true> : ln_bwd_v3<T, TW, ITERS, false>;
  const size_t smem = size_t(stages) * 2 * size_t(a.cols) * sizeof(T);
  KC_CUDA_TRY(allow_dynamic_smem(kernel, smem));
  int per_sm = 0;
  KC_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, cfg.threads, smem));
  const int64_t grid = persistent_grid(a.rows, per_sm);
  if (grid_out) {
    *grid_out = grid;
    return cudaSuccess;
  }
  if (grid > 0) {
    kernel<<<unsigned(grid), cfg.threads, smem, stream>>>(static_cast<const T*>(a.dy), static_cast<const T*>(a.x),
                                                          a.mean, a.rstd, static_cast<const TW*>(a.weight),
                                                          static_cast<T*>(a.dx), a.workspace, a.rows, a.cols, stages);
    KC_CUDA_LAUNCH_TRY();
  }
  return partials ? launch_finalize<TW>(a, grid, stream) : cudaSuccess;
}

template <typename T, typename TW>
cudaError_t dispatch_v3(const LnBackwardArgs& a, const V2Config& cfg, int stages, bool partials, cudaStream_t stream,
                        int64_t* grid_out) {
  constexpr int V = kc::max_vec_elems<T>();
  switch (cfg.iters) {
    case 1: return launch_v3<T, TW, 1>(a, cfg, stages, partials, stream, grid_out);
    case 2: return launch_v3<T, TW, 2>(a, cfg, stages, partials, stream, grid_out);
    case 4: if constexpr (4 * V <= kMaxEpt) return launch_v3<T, TW, 4>(a, cfg, stages, partials, stream, grid_out); break;
    case 8: if constexpr (8 * V <= kMaxEpt) return launch_v3<T, TW, 8>(a, cfg, stages, partials, stream, grid_out); break;
  }
  return cudaErrorInvalidConfiguration;
}

// v4: row slots (layernorm_common.cuh); dgamma/dbeta sums in registers; next row
// prefetched (kKnobPrefetch).
template <typename T, typename TW, int VEC, int ITERS, bool kPrefetch>
cudaError_t launch_v4(const LnBackwardArgs& a, const V4Config& cfg, bool partials, cudaStream_t stream,
                      int64_t* grid_out) {
  auto kernel = partials ? ln_bwd_v4<T, TW, VEC, ITERS, true, kPrefetch> : ln_bwd_v4<T, TW, VEC, ITERS, false, kPrefetch>;
  const size_t per_thread = partials ? 2 * VEC * ITERS * sizeof(float) : 0;
  const V4Plan p = v4_plan(kernel, cfg.tpr, kV4SmallThreads, a.rows, 0, per_thread);
  if (grid_out) {
    *grid_out = p.grid;
    return cudaSuccess;
  }
  if (p.grid > 0) {
    kernel<<<unsigned(p.grid), p.threads, p.smem, stream>>>(
        static_cast<const T*>(a.dy), static_cast<const T*>(a.x), a.mean, a.rstd, static_cast<const TW*>(a.weight),
        static_cast<T*>(a.dx), a.workspace, a.rows, a.cols, cfg.tpr);
    KC_CUDA_LAUNCH_TRY();
  }
  return partials ? launch_finalize<TW>(a, p.grid, stream) : cudaSuccess;
}

// The next row prefetched by default for 16-bit rows of 512 to 1023 columns in
// 16-byte vectors (H200, probe run 68: 4096x768 bf16 15.2 against 16.2 us,
// 16384x768 31.6 against 37.4, 65536x512 62.3 against 69.4); not for fp32
// (1024-4096 columns: 60% slower) nor at 256 columns (no gain).
template <typename T, typename TW, int VEC>
cudaError_t dispatch_v4(const LnBackwardArgs& a, const V4Config& cfg, bool partials, cudaStream_t stream,
                        int64_t* grid_out) {
  const bool pf = sizeof(T) == 2 && VEC == kc::max_vec_elems<T>() && a.cols >= 512 && a.cols < 1024;
  return KC_BOOL_SWITCH(v4_prefetch(pf), kPrefetch, [&] {
    switch (cfg.iters) {
      case 1: return launch_v4<T, TW, VEC, 1, kPrefetch>(a, cfg, partials, stream, grid_out);
      case 2: return launch_v4<T, TW, VEC, 2, kPrefetch>(a, cfg, partials, stream, grid_out);
      case 4: return launch_v4<T, TW, VEC, 4, kPrefetch>(a, cfg, partials, stream, grid_out);
    }
    return cudaErrorInvalidConfiguration;
  });
}

// v4 on a ring filled by bulk copies (sm_90+, 16-byte vectors); with csize > 1
// each row split across a cluster of csize CTAs (cfg: the configuration of a
// share of D / csize columns). *ran = false when no ring fits the shared memory
// or no cluster fits the GPU (the caller runs v4 without a ring).
template <typename T, typename TW, int ITERS>
cudaError_t launch_ring(const LnBackwardArgs& a, const V4Config& cfg, int csize, bool partials, int want,
                        cudaStream_t stream, int64_t* grid_out, bool* ran) {
  const bool cl = csize > 1;
  auto kernel = partials ? (cl ? ln_bwd_ring<T, TW, ITERS, true, true> : ln_bwd_ring<T, TW, ITERS, true, false>)
                         : (cl ? ln_bwd_ring<T, TW, ITERS, false, true> : ln_bwd_ring<T, TW, ITERS, false, false>);
  const int64_t Dc = a.cols / csize;
  const size_t row_bytes = 2 * size_t(cfg.tpr) * ITERS * cfg.vec * sizeof(T);  // x and dy
  const RingPlan r = ring_plan(kernel, cfg.tpr, a.rows, row_bytes, want);
  const int64_t groups = r.stages == 0 ? 0 : cl ? cluster_groups(kernel, r.p, csize, a.rows) : r.p.grid;
  *ran = r.stages > 0 && (groups > 0 || a.rows == 0);
  if (!*ran) return cudaSuccess;
  if (grid_out) {  // the partial rows: one per block, or per cluster
    *grid_out = groups;
    return cudaSuccess;
  }
  if (groups > 0) {
    const dim3 grid(unsigned(groups * csize)), block(unsigned(r.p.threads));
    const T* dy = static_cast<const T*>(a.dy);
    const T* x = static_cast<const T*>(a.x);
    const TW* w = static_cast<const TW*>(a.weight);
    T* dx = static_cast<T*>(a.dx);
    if (cl) {
      KC_CUDA_TRY(kc::launch_cluster(kernel, grid, block, r.p.smem, stream, unsigned(csize), dy, x, a.mean, a.rstd,
                                     w, dx, a.workspace, a.rows, a.cols, Dc, cfg.tpr, r.stages));
    } else {
      kernel<<<grid, block, r.p.smem, stream>>>(dy, x, a.mean, a.rstd, w, dx, a.workspace, a.rows, a.cols, Dc,
                                                cfg.tpr, r.stages);
      KC_CUDA_LAUNCH_TRY();
    }
  }
  return partials ? launch_finalize<TW>(a, groups, stream) : cudaSuccess;
}

template <typename T, typename TW>
cudaError_t dispatch_ring(const LnBackwardArgs& a, const V4Config& cfg, int csize, bool partials, int want,
                          cudaStream_t stream, int64_t* grid_out, bool* ran) {
  *ran = false;
  if (!cfg.ok) return cudaSuccess;
  switch (cfg.iters) {
    case 1: return launch_ring<T, TW, 1>(a, cfg, csize, partials, want, stream, grid_out, ran);
    case 2: return launch_ring<T, TW, 2>(a, cfg, csize, partials, want, stream, grid_out, ran);
    case 4: return launch_ring<T, TW, 4>(a, cfg, csize, partials, want, stream, grid_out, ran);
  }
  return cudaSuccess;
}

// Whether version 4 runs the ring, and with how many stages (0: not), for rows
// (or, with a cluster, row shares) of D columns, from the H200 measurements
// (README, runs 17-19): 16-bit rows of 1024 and more; fp32 rows shorter than
// 1024 or longer than 4096. Knob kKnobRing overrides.
int ring_default(size_t elem_bytes, int64_t D) {
  if (elem_bytes == 2) return D >= 1024 ? 3 : 0;
  return D < 1024 || D > 4096 ? 3 : 0;
}

template <typename T, typename TW>
cudaError_t backward_typed(const LnBackwardArgs& a, int version, cudaStream_t stream, int64_t* grid_out) {
  const bool partials = a.dweight || a.dbias;
  // version 4: the ring where it measured fastest (ring_default), else v4's
  // kernels, except for 16-bit rows longer than 4096, where v2's measured faster
  // (H200, README's log), unless knob kKnobForce is 1
  if (version == 4) {
    const int vec = v2_vec<T, TW>(a);
    constexpr int V = kc::max_vec_elems<T>();
    const bool ring_ok = vec == V && kc::sm90_or_newer();
    const int csize = ring_ok ? ring_cluster(a.cols, V) : 1;  // CTAs per row
    const int ring = ring_ok ? v4_ring(ring_default(sizeof(T), a.cols / csize)) : 0;
    if (ring) {
      bool ran = false;
      const cudaError_t e =
          dispatch_ring<T, TW>(a, v4_config(a.cols / csize, vec), csize, partials, ring, stream, grid_out, &ran);
      if (ran || e != cudaSuccess) return e;
    }
    const V4Config cfg = v4_config(a.cols, vec);
    if (cfg.ok && (sizeof(T) == 4 || a.cols <= 4096 || v4_forced()))
      return vec == V ? dispatch_v4<T, TW, V>(a, cfg, partials, stream, grid_out)
                      : dispatch_v4<T, TW, 1>(a, cfg, partials, stream, grid_out);
  }
  if (version >= 2) {
    const int vec = v2_vec<T, TW>(a);
    constexpr int V = kc::max_vec_elems<T>();
    const V2Config cfg = v2_config(a.cols, vec);
    if (cfg.ok) {
      const int stages = pipe_stages(2 * size_t(a.cols) * sizeof(T));
      if (version == 3 && vec == V && !cfg.warp && stages >= 2)
        return dispatch_v3<T, TW>(a, v3_config(a.cols, V), stages, partials, stream, grid_out);
      V2Launch<T, TW> l{a, cfg, stream, partials, grid_out};
      return vec == V ? with_v2_config<V>(cfg, l) : with_v2_config<1>(cfg, l);
    }
  }
  if (grid_out) {
    *grid_out = 0;
    return cudaSuccess;
  }
  // v1, and v2's fallback for rows longer than 16384
  if (a.dx) {
    for (int64_t r0 = 0; r0 < a.rows; r0 += 0x7fffffff) {
      const int64_t n = a.rows - r0 < 0x7fffffff ? a.rows - r0 : 0x7fffffff;
      ln_bwd_dx_v1<T, TW><<<unsigned(n), 256, 0, stream>>>(
          static_cast<const T*>(a.dy), static_cast<const T*>(a.x), a.mean, a.rstd,
          static_cast<const TW*>(a.weight), static_cast<T*>(a.dx), r0, a.cols);
      KC_CUDA_LAUNCH_TRY();
    }
  }
  if (partials) {
    ln_bwd_dwdb_v1<T, TW><<<unsigned((a.cols + 255) / 256), 256, 0, stream>>>(
        static_cast<const T*>(a.dy), static_cast<const T*>(a.x), a.mean, a.rstd, static_cast<TW*>(a.dweight),
        static_cast<TW*>(a.dbias), a.rows, a.cols);
    KC_CUDA_LAUNCH_TRY();
  }
  return cudaSuccess;
}

template <typename F>
cudaError_t typed(kc::DType dt, kc::DType wdt, F&& f) {
  const bool w_f32 = wdt == kc::DType::F32;
  return KC_DTYPE_SWITCH(dt, T, [&] {
    return KC_BOOL_SWITCH(w_f32, kWF32, [&] {
      using TW = typename std::conditional<kWF32, float, T>::type;
      return f(T{}, TW{});
    });
  });
}

}  // namespace

int64_t ln_backward_workspace_floats(const LnBackwardArgs& a, int version) {
  if (version < 2 || (!a.dweight && !a.dbias)) return 0;
  int64_t grid = 0;
  typed(a.dt, a.wdt, [&](auto t, auto tw) {
    return backward_typed<decltype(t), decltype(tw)>(a, version, nullptr, &grid);
  });
  return grid * 2 * a.cols;
}

cudaError_t ln_backward(const LnBackwardArgs& a, int version, cudaStream_t stream) {
  if (version < 1 || version > 4) return cudaErrorInvalidValue;
  if (a.rows == 0 && !a.dweight && !a.dbias) return cudaSuccess;
  return typed(a.dt, a.wdt, [&](auto t, auto tw) {
    return backward_typed<decltype(t), decltype(tw)>(a, version, stream, nullptr);
  });
}

}  // namespace day26
