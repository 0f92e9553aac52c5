// LayerNorm forward: y = (x - mean) * rstd * weight + bias, per row of D elements,
//   mean = sum(x) / D,  var = sum((x - mean)^2) / D,  rstd = 1 / sqrt(var + eps).
// mean and rstd (fp32) are saved for the backward.
//
// Versions (layernorm_versions.h; 0 = auto: fwd_plan's table below):
//   1  the seed's structure: one block of 256 threads per row, three passes
//      over the row in global memory (sum, squared deviations, write), scalar
//      loads, block reductions through shared memory. Any D.
//   2  the row is read once into registers (16-byte vector loads where every
//      pointer and D allow it), both statistics come from the registers
//      (two-pass variance: accurate, no extra memory traffic), then y is written
//      once; without 16-byte vectors (a fallback) a run-time loop reads the row
//      three times instead. One warp per row for D <= 512 (8 rows per block, warp shuffles
//      only), one block per row above that (128..512 threads, <= 32 elements
//      per thread). Rows longer than 16384 run 1.
//   3  2's math on a cp.async pipeline: a persistent grid, each block keeps
//      the next `stages - 1` rows in flight into shared memory (each thread
//      copies, and later reads, only its own 16-byte vectors, so no barrier
//      guards the stages). Block path with 16-byte vectors only; else 2.
//   4  row slots (layernorm_common.cuh): independent row teams per block, the
//      next row prefetched into registers for 16-bit rows; else 2.
//   5  no forward kernel (the ring lost to 4's register prefetch: docs/log.md): runs 4.
//   6  4 with each row split across a thread-block cluster (sm_90+); else 4.
// Traffic: v2 reads x once and writes y once (the floor: 2 passes); v1 reads x
// three times (mostly from L2 when the rows of the blocks in flight fit there).
#include <type_traits>

#include "layernorm.h"
#include "layernorm_common.cuh"

#include "kc/async_copy.cuh"
#include "kc/bulk_copy.cuh"
#include "kc/check.cuh"
#include "kc/cluster.cuh"
#include "kc/reduce.cuh"
#include "kc/switch.cuh"

namespace day26 {
namespace {

template <typename TW>
__device__ __forceinline__ float load_w(const TW* p, int64_t c) { return p ? kc::to_float(p[c]) : 1.f; }
template <typename TW>
__device__ __forceinline__ float load_b(const TW* p, int64_t c) { return p ? kc::to_float(p[c]) : 0.f; }
// One weight or bias (`fill` where p is null); TW = void: its dtype fp32 when
// w_f32, else T (as load_param_any).
template <typename T, typename TW>
__device__ __forceinline__ float load_param1(const TW* p, bool w_f32, int64_t c, float fill) {
  if constexpr (std::is_void<TW>::value) {
    if (!p) return fill;
    return w_f32 ? static_cast<const float*>(p)[c] : kc::to_float(static_cast<const T*>(p)[c]);
  } else {
    return p ? kc::to_float(p[c]) : fill;
  }
}

// The kernels that only a forced version or a knob reaches, never version 0's
// plan (fwd_plan below), take their weights' dtype at run time (TW = void, the
// flag w_f32, load_param_any: one instantiation for both weight dtypes): 16-bit
// input's version 2 kernels (but the block-row one without 16-byte vectors: the
// plan's fallback for such rows over 2048 columns, which version 4 cannot hold),
// its version 3 kernels and its cluster-split version 4 kernels (16-bit rows are
// split only with knob cluster set, or version 6). Every other kernel, and every
// fp32 one, has the weight dtype TW as a template argument (w_f32 unused).
template <typename T, typename TW, bool kGeneric>
using FwdTW = typename std::conditional<kGeneric && sizeof(T) == 2, void, TW>::type;

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

// The row's entry of a per-row output that may be absent (mean for RMSNorm).
__device__ __forceinline__ float* row_or_null(float* p, int64_t row) { return p ? p + row : nullptr; }

// The thread's share of a row in fp32 (entries past the row end: never read).
template <typename T, int VEC, int ITERS>
__device__ __forceinline__ void row_to_float(const RowRegs<T, VEC, ITERS>& r, float (&v)[ITERS][VEC],
                                             const RowCols<VEC, ITERS>& rc) {
#pragma unroll
  for (int it = 0; it < ITERS; ++it)
    if (rc.has(it)) kc::vec_to_float(r.v[it], v[it]);
}

// The mean of a row from its sum s: s * (1/D), corrected once by its residual
// (one FMA computes s - mean * D exactly): within an ulp of s / D and usually
// equal to it, at two FMAs per row instead of a division. Without it a bf16 row
// of seven 1000.0s had mean 1000.00006, variance 3.7e-9 and rstd off by 2e-4
// (test_forward_large_mean, H200 run 43).
__device__ __forceinline__ float mean_of_sum(float s, float inv_d, float dn) {
  const float mean = s * inv_d;
  return fmaf(fmaf(-mean, dn, s), inv_d, mean);
}

// One row in registers (fp32) -> y, mean, rstd. reduce(v): the sum of v over
// the row's threads, returned to all of them (a warp, a block or a v4 row slot).
// The second pass replaces x by x - mean in place, which the output reuses: per
// element one add (sum), an add and an FMA (variance), a multiply and an FMA
// (output), plus the conversions of x (once), weight and bias. (The 16-bit
// forward was issue-bound, ncu run 25: it converted x in every pass and
// unpacked each 16-bit element into a register of its own; README's log.)
// Weight and bias are read at every row (L1 hits after the first rows); an fp32
// copy of both in shared memory, staged once per block, measured slower (run
// 35, H200: the ring lost blocks per SM to it at D >= 8192, v4 up to 16 µs at
// D = 16384).
//
// Split rows (Exchange != NoExchange, the cluster kernel): v, rc and inv_d
// cover this CTA's share of the row, whose mean and m2 (squared deviations
// from that mean) come out of the two reductions as above; ex(mean, m2) returns
// the whole row's (kc::MeanM2: the shares' pairs exchanged among the cluster
// and combined), and the output adds (share mean - row mean) * rstd.
struct NoExchange {};

template <typename T, typename TW, int VEC, int ITERS, typename Reduce, typename Exchange = NoExchange>
__device__ __forceinline__ void fwd_row_f32(float (&v)[ITERS][VEC], const TW* __restrict__ w,
                                            const TW* __restrict__ b, bool w_f32, T* __restrict__ yr, float* mean_out,
                                            float* rstd_out, const RowCols<VEC, ITERS>& rc, float inv_d,
                                            float dn, float eps, int t, Reduce&& reduce, Exchange&& ex = {}) {
  constexpr bool kSplit = !std::is_same<std::decay_t<Exchange>, NoExchange>::value;
  // mean_out null: RMSNorm, the row not centred (its mean taken as 0; the
  // split's exchange then combines shares of mean 0, so its m2 is the sum of squares)
  const bool center = mean_out != nullptr;
  float mean = 0.f;
  if (center) {
    float s = 0.f;
#pragma unroll
    for (int it = 0; it < ITERS; ++it)
      if (rc.has(it))
#pragma unroll
        for (int j = 0; j < VEC; ++j) s += v[it][j];
    s = reduce(s);
    mean = mean_of_sum(s, inv_d, dn);
  }
  float q = 0.f;
#pragma unroll
  for (int it = 0; it < ITERS; ++it)
    if (rc.has(it))
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        v[it][j] -= mean;
        q += v[it][j] * v[it][j];
      }
  q = reduce(q);
  float row_mean = mean, rstd, off = 0.f;
  if constexpr (kSplit) {
    const kc::MeanM2 r = ex(mean, q);
    row_mean = r.mean;
    rstd = rsqrtf(r.m2 * ex.inv_d + eps);
    off = (mean - r.mean) * rstd;
  } else {
    rstd = rsqrtf(q * inv_d + eps);
  }
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    if (rc.has(it)) {
      const int c = rc.col(it);
      float wv[VEC], bv[VEC], out[VEC];
      load_param_w<T, TW, VEC>(w, w_f32, c, 1.f, wv);
      load_param_w<T, TW, VEC>(b, w_f32, c, 0.f, bv);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if constexpr (kSplit)
          out[j] = fmaf(fmaf(v[it][j], rstd, off), wv[j], bv[j]);
        else
          out[j] = v[it][j] * rstd * wv[j] + bv[j];
      }
      store_from_f32<T, VEC>(yr + c, out);
    }
  }
  bool writer = t == 0;
  if constexpr (kSplit) writer = writer && ex.writer();
  if (writer) {
    if (center) *mean_out = row_mean;
    *rstd_out = rstd;
  }
}

template <typename T, typename TW, int VEC, int ITERS, typename Reduce>
__device__ __forceinline__ void fwd_row(const RowRegs<T, VEC, ITERS>& cur, const TW* __restrict__ w,
                                        const TW* __restrict__ b, bool w_f32, T* __restrict__ yr, float* mean_out,
                                        float* rstd_out, const RowCols<VEC, ITERS>& rc, float inv_d, float dn, float eps,
                                        int t, Reduce&& reduce) {
  float v[ITERS][VEC];
  row_to_float(cur, v, rc);
  fwd_row_f32(v, w, b, w_f32, yr, mean_out, rstd_out, rc, inv_d, dn, eps, t, reduce);
}

// fwd_row's math for one row without the row in registers (v2 without 16-byte
// vectors: one instantiation for every D): the thread's columns t, t + tpr, ...
// in that order, in run-time loops that read the row three times (the later
// reads from L1 or L2).
template <typename T, typename TW, typename Reduce>
__device__ __forceinline__ void fwd_row_scalar(const T* __restrict__ xr, const TW* __restrict__ w,
                                               const TW* __restrict__ b, bool w_f32, T* __restrict__ yr,
                                               float* mean_out,
                                               float* rstd_out, int64_t D, int tpr, int t, float inv_d, float eps,
                                               Reduce&& reduce) {
  const bool center = mean_out != nullptr;  // null: RMSNorm (mean taken as 0)
  float mean = 0.f;
  if (center) {
    float s = 0.f;
    for (int64_t c = t; c < D; c += tpr) s += kc::to_float(xr[c]);
    mean = mean_of_sum(reduce(s), inv_d, float(D));
  }
  float q = 0.f;
  for (int64_t c = t; c < D; c += tpr) {
    const float v = kc::to_float(xr[c]) - mean;
    q += v * v;
  }
  const float rstd = rsqrtf(reduce(q) * inv_d + eps);
  for (int64_t c = t; c < D; c += tpr)
    yr[c] = kc::from_float<T>((kc::to_float(xr[c]) - mean) * rstd * load_param1<T>(w, w_f32, c, 1.f) +
                              load_param1<T>(b, w_f32, c, 0.f));
  if (t == 0) {
    if (center) *mean_out = mean;
    *rstd_out = rstd;
  }
}

// v2. Assumptions (checked by the launcher):
// - kWarp: blockDim.x = 32 * kWarpRowsPerBlock, one warp per row;
//   else: blockDim.x = threads per row (a multiple of 32, <= kMaxTpr), one block per row;
// - VEC > 1 only when x, y, weight, bias are aligned to a VEC-vector and D % VEC == 0;
// - ITERS * VEC * (threads per row) >= D; or ITERS = 0 (with VEC = 1: no 16-byte
//   vectors, a fallback): no row in registers, fwd_row_scalar's run-time loops;
// - rows are visited grid-stride, so any number of rows works with any grid.
template <typename T, typename TW, int VEC, int ITERS, bool kWarp>
__global__ void __launch_bounds__(kMaxTpr)
ln_fwd_v2(const T* __restrict__ x, const TW* __restrict__ w, const TW* __restrict__ b,
          T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
          int64_t rows, int64_t D, float eps, bool w_f32) {
  static_assert(ITERS > 0 || VEC == 1, "ITERS = 0: the scalar loop");
  __shared__ float red[32];
  const int tpr = kWarp ? 32 : blockDim.x;
  const int t = kWarp ? (threadIdx.x & 31) : threadIdx.x;
  const int64_t rows_per_block = kWarp ? (blockDim.x >> 5) : 1;
  const int64_t slot = kWarp ? (threadIdx.x >> 5) : 0;
  const RowCols<VEC, ITERS> rc(D, tpr, t);
  const float inv_d = 1.f / float(D);
  auto reduce = [&](float v) {
    if constexpr (kWarp) return kc::warp_reduce_sum(v);
    else return kc::block_reduce_sum(v, red);
  };
  // Warps of one block leave this loop at different times in the warp path;
  // the block path keeps the whole block together (its reductions sync).
  for (int64_t row = blockIdx.x * rows_per_block + slot; row < rows; row += int64_t(gridDim.x) * rows_per_block) {
    if constexpr (ITERS == 0) {
      fwd_row_scalar(x + row * D, w, b, w_f32, y + row * D, row_or_null(mean_out, row), rstd_out + row, D, tpr, t, inv_d, eps,
                     reduce);
    } else {
      RowRegs<T, VEC, ITERS> cur;
      load_row(cur, x + row * D, rc);
      fwd_row(cur, w, b, w_f32, y + row * D, row_or_null(mean_out, row), rstd_out + row, rc, inv_d, float(D), eps, t, reduce);
    }
  }
}

// v3. Block path, VEC = 16 bytes of T, blockDim.x = threads per row; dynamic
// shared memory: stages * D elements of T (16-byte aligned rows, D % VEC == 0).
template <typename T, typename TW, int ITERS>
__global__ void __launch_bounds__(kMaxTpr)
ln_fwd_v3(const T* __restrict__ x, const TW* __restrict__ w, const TW* __restrict__ b,
          T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
          int64_t rows, int64_t D, float eps, int stages, bool w_f32) {
  constexpr int VEC = kc::max_vec_elems<T>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sx = reinterpret_cast<T*>(smem_raw);  // [stages][D]
  __shared__ float red[32];
  const int tpr = blockDim.x, t = threadIdx.x;
  const int64_t stride = gridDim.x;
  auto issue = [&](int64_t r, int stage) {  // this thread's vectors of row r -> stage
    if (r < rows) {
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const int64_t c = (int64_t(it) * tpr + t) * VEC;
        if (c < D) kc::cp_async_16(sx + stage * D + c, x + r * D + c);
      }
    }
    kc::cp_async_commit();  // one group per row, empty past the end, so counts stay uniform
  };
  const int64_t first = blockIdx.x;
  const RowCols<VEC, ITERS> rc(D, tpr, t);
  const float inv_d = 1.f / float(D);
  for (int s = 0; s < stages - 1; ++s) issue(first + s * stride, s);
  int stage = 0;
  for (int64_t row = first; row < rows; row += stride) {
    issue(row + (stages - 1) * stride, stage == 0 ? stages - 1 : stage - 1);  // the stage read last iteration
    kc::cp_async_wait(stages - 1);                                            // this row's group has landed
    RowRegs<T, VEC, ITERS> cur;
#pragma unroll
    for (int it = 0; it < ITERS; ++it)
      if (rc.has(it)) cur.v[it] = *reinterpret_cast<const kc::Vec<T, VEC>*>(sx + stage * D + rc.col(it));
    fwd_row(cur, w, b, w_f32, y + row * D, row_or_null(mean_out, row), rstd_out + row, rc, inv_d, float(D), eps, t,
            [&](float v) { return kc::block_reduce_sum(v, red); });
    stage = stage + 1 == stages ? 0 : stage + 1;
  }
  kc::cp_async_wait(0);
}

// v4. Row slots (layernorm_common.cuh): blockDim.x = slots * tpr; slot k walks
// rows blockIdx.x * slots + k + i * gridDim.x * slots, syncing only its own
// threads; with kPrefetch (16-bit rows, and every cluster split: the plan's
// measured choice, fwd_plan; fp32 rows unsplit measured no consistent gain from
// it) the next row is loaded into registers before the current one is reduced.
// kCluster (sm_90+): each row split across the CTAs of a cluster, as the ring
// backward does: CTA rank r owns columns [r * Dc, (r + 1) * Dc) of every row its
// cluster walks (slot k of every CTA walks the same rows). Each CTA reduces its
// share to a mean and an m2 (squared deviations from that mean: the two
// reductions above), sends the pair to every CTA of the cluster (ClusterPairs:
// st.async into distributed shared memory, completing on the receiver's
// mbarrier) and combines the csize pairs in rank order with
// kc::warp_combine_mean_m2: one exchange per row, and every CTA gets bitwise
// the same mean and rstd. Rank 0 writes them. The pair buffers alternate by row:
// a CTA sends row i + 1 after its slot's barriers of row i + 1, which every
// thread of the slot reaches only after reading row i's pairs. Without
// kCluster, Dc = D.
// kL2pf (with kPrefetch; sm_90+, 16-byte vectors): thread 0 of the slot also
// asks the copy engine to prefetch the row after next (this CTA's Dc columns)
// into L2, so the register prefetch of the next row finds it there.
// Assumptions (launcher): blockDim.x = slots * tpr, tpr a multiple of 32,
// ITERS * VEC * tpr >= Dc; kCluster: VEC = 16 bytes of T, D = cluster size *
// Dc, every pointer and Dc allow VEC.
template <typename T, typename TW, int VEC, int ITERS, bool kCluster, bool kL2pf>
__global__ void __launch_bounds__(kV4SmallThreads)
ln_fwd_v4(const T* __restrict__ x, const TW* __restrict__ w, const TW* __restrict__ b,
          T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
          int64_t rows, int64_t D, int64_t Dc, float eps, int tpr, bool w_f32) {
  constexpr bool kPrefetch = sizeof(T) == 2 || kCluster;
  __shared__ float red[kV4MaxSlots][2 * 32];
  __shared__ float2 xsum[kCluster ? kV4MaxSlots : 1][ClusterPairs::kX][kRingMaxCluster];
  __shared__ uint64_t xbar[kCluster ? kV4MaxSlots : 1][ClusterPairs::kX];
  const int slots = blockDim.x / tpr;
  const int slot = threadIdx.x / tpr, t = threadIdx.x - slot * tpr;
  const int lane = threadIdx.x & 31, wis = t >> 5, nw = tpr >> 5;
  const unsigned csize = kCluster ? kc::cluster_size_x() : 1u, crank = kCluster ? kc::cluster_rank() : 0u;
  const int64_t group = kCluster ? int64_t(kc::cluster_id()) : int64_t(blockIdx.x);  // row team of CTAs
  const int64_t groups = kCluster ? int64_t(kc::cluster_count()) : int64_t(gridDim.x);
  if constexpr (kCluster) {  // this CTA's columns: [crank * Dc, (crank + 1) * Dc)
    const int64_t col0 = int64_t(crank) * Dc;
    x += col0;
    y += col0;
    if constexpr (std::is_void<TW>::value) {  // the weights' dtype a run-time value: fp32 or T
      const int64_t off = col0 * (w_f32 ? int64_t(sizeof(float)) : int64_t(sizeof(T)));
      if (w) w = static_cast<const char*>(w) + off;
      if (b) b = static_cast<const char*>(b) + off;
    } else {
      if (w) w += col0;
      if (b) b += col0;
    }
  }
  const int64_t stride = groups * slots;
  int64_t row = group * slots + slot;
  const RowCols<VEC, ITERS> rc(Dc, tpr, t);
  const float inv_dc = 1.f / float(Dc);
  int parity = 0;
  auto reduce = [&](float v) {
    float r[1] = {v};
    slot_reduce_sum<1>(r, red[slot], parity, 1 + slot, nw, wis, lane);
    return r[0];
  };
  // kCluster: the whole row's mean and m2 from every rank's share (Dc columns each)
  const ClusterPairs pairs{&xsum[kCluster ? slot : 0][0][0], &xbar[kCluster ? slot : 0][0], csize, crank};
  struct Exchange {
    const ClusterPairs& pairs;
    int64_t& round;
    int t, lane, nw;
    float dc, inv_d;
    __device__ bool writer() const { return pairs.crank == 0; }
    __device__ kc::MeanM2 operator()(float mean, float m2) const {
      if (nw == 1) __syncwarp();  // (several warps: the slot's barriers already ordered the reads)
      pairs.send(round, t, mean, m2);
      const float2* p = pairs.wait(round);
      const bool mine = lane < int(pairs.csize);
      const float2 q = mine ? p[lane] : make_float2(0.f, 0.f);
      const kc::MeanM2 r = kc::warp_combine_mean_m2(q.x, q.y, mine ? dc : 0.f, inv_d);
      pairs.rearm(round, t);
      ++round;
      return r;
    }
  };
  int64_t round = 0;  // rows done by this slot: the exchange's round
  const Exchange ex{pairs, round, t, lane, nw, float(Dc), 1.f / float(D)};
  if constexpr (kCluster) {
    if (t == 0) {
      pairs.init();
      kc::mbar_init_fence();
      pairs.arm_all();
    }
    kc::cluster_sync();  // every CTA's barriers are initialised before any peer sends
  }
  auto one_row = [&](float (&v)[ITERS][VEC], int64_t r) {
    if constexpr (kCluster)
      fwd_row_f32(v, w, b, w_f32, y + r * D, row_or_null(mean_out, r), rstd_out + r, rc, inv_dc, float(Dc), eps, t, reduce, ex);
    else
      fwd_row_f32(v, w, b, w_f32, y + r * D, row_or_null(mean_out, r), rstd_out + r, rc, inv_dc, float(Dc), eps, t, reduce);
  };
  if constexpr (kPrefetch) {
    // The next row is converted to fp32 at the end of the current one, before
    // the load after it is issued. (Copying the prefetched registers instead,
    // `cur = nxt`, let ptxas move the wait for that load past the next load,
    // on the same scoreboard: every row then waited for its successor's load;
    // run 36, ncu and the SASS's wait masks.)
    float v[ITERS][VEC];
    RowRegs<T, VEC, ITERS> nxt;
    if (row < rows) {
      load_row(nxt, x + row * D, rc);
      row_to_float(nxt, v, rc);
    }
    for (; row < rows; row += stride) {
      const bool more = row + stride < rows;
      if constexpr (kL2pf) {  // the row after next into L2 (a hint: nothing waits for it)
        const int64_t r2 = row + 2 * stride;
        if (t == 0 && r2 < rows) kc::bulk_prefetch_l2(x + r2 * D, unsigned(Dc * int64_t(sizeof(T))));
      }
      if (more) load_row(nxt, x + (row + stride) * D, rc);
      one_row(v, row);
      if (more) row_to_float(nxt, v, rc);
    }
  } else {
    for (; row < rows; row += stride) {
      RowRegs<T, VEC, ITERS> cur;
      load_row(cur, x + row * D, rc);
      float v[ITERS][VEC];
      row_to_float(cur, v, rc);
      one_row(v, row);
    }
  }
  if constexpr (kCluster) kc::cluster_sync();  // no CTA leaves while a peer may still access its shared memory
}


// ------------------------------------------------------------------ the plan
// The forward's plan: the family that runs (layernorm_versions.h) and its
// launch shape, computed once per call (fwd_plan), launched by fwd_launch.
struct FwdPlan {
  int family = kSeed;
  int vec = 1;
  V2Config c2;        // 2, 3
  int stages = 0;     // 3
  V4Config c4;        // 4, 6 (6: a CTA's share of D / cluster columns)
  V4Plan p4;          // 4, 6: slots, threads, grid (6: grid = clusters * cluster)
  int cluster = 1;    // 6
  bool l2pf = false;  // 4, 6: the row after next prefetched into L2
};

template <typename T, typename TW>
using FwdV4Kernel =
    void (*)(const T*, const TW*, const TW*, T*, float*, float*, int64_t, int64_t, int64_t, float, int, bool);

// f(kernel): the v4 instantiation of a plan (nullptr: none compiled), its weight
// type FwdTW's (void for 16-bit split rows). kL2pf only where a thread holds 4
// full vectors and prefetches the next row (kPrefetch: 16-bit or split rows).
// Split rows (kCluster) only at the ITERS of shares over kClusterMinShare columns
// (kClusterIters: the plan's own splits), and at 4 vectors a thread only with the
// L2 prefetch (on wherever a cluster can run: sm_90); the knobs that would reach
// others are refused (layernorm_knobs.h).
template <typename T, typename TW, typename F>
auto with_fwd_v4_kernel(int vec, int iters, bool cluster, bool l2pf, F&& f) {
  constexpr int V = kc::max_vec_elems<T>();
  if (vec != V)  // without 16-byte vectors: the one scalar instantiation (v4_config), not split
    return f(iters == kV4ScalarIters && !cluster ? FwdV4Kernel<T, TW>(ln_fwd_v4<T, TW, 1, kV4ScalarIters, false, false>)
                                                 : FwdV4Kernel<T, TW>(nullptr));
  return KC_BOOL_SWITCH(cluster, kCl, [&] {
    using KW = FwdTW<T, TW, kCl>;
    using K = FwdV4Kernel<T, KW>;
    return f(with_iters<4>(iters, K(nullptr), [&](auto it) {
      constexpr int I = decltype(it)::value;
      constexpr bool kL2able = I == 4 && (sizeof(T) == 2 || kCl);
      if constexpr (kCl && !kClusterIters<T, I>) {
        return K(nullptr);
      } else if constexpr (kCl && kL2able) {
        return l2pf ? K(ln_fwd_v4<T, KW, V, I, kCl, true>) : K(nullptr);
      } else {
        if constexpr (kL2able)
          if (l2pf) return K(ln_fwd_v4<T, KW, V, I, kCl, true>);
        return K(ln_fwd_v4<T, KW, V, I, kCl, false>);
      }
    }));
  });
}

// Version 0 (auto), the forward's table (H200 measurements, README "The plan"):
// - fp32 rows longer than 8192 on sm_90+ (16-byte vectors): split across a
//   cluster (6), the next row prefetched: 85% of the floor at 4096 x 16384
//   against v3's 80% (probe run 42); else 3 for rows over 8192 (v3 measured
//   faster than v2 there), 2 below (v4 with the next row prefetched was 1-3%
//   faster than v2 at 1024 and 8192 columns in probe runs 37-38 but 3-8% slower
//   in bench run 39: no consistent gain).
// - 16-bit rows: 4 (row slots, the next row prefetched); split across a cluster
//   they measured much slower (one 512-thread slot per SM waits for every row's
//   exchange: 110 against 77 us), so not split unless knob cluster is set.
// Where a thread holds 4 vectors (one slot per SM), 4 and 6 also prefetch the row
// after next into L2 (4096 x 16384: bf16 77.0 -> 73.5 us, fp32 148.2 -> 139.8,
// probe run 49; knob l2_prefetch = 0 turns it off).
template <typename T, typename TW>
int fwd_auto_families(const LnForwardArgs& a, bool vec_ok, const LnDevice& dev, int (&out)[4]) {
  int n = 0;
  if (vec_ok && dev.sm90() && (sizeof(T) == 4 || ring_cluster_forced())) out[n++] = kClusterSplit;
  if (sizeof(T) == 2) out[n++] = kRowSlots;
  else if (a.cols > 8192) out[n++] = kCpAsync;
  out[n++] = kRegisters;
  out[n++] = kSeed;
  return n;
}

// Whether family f can run the shape; if so, its launch shape into p.
template <typename T, typename TW>
bool fwd_plan_family(const LnForwardArgs& a, int f, const LnDevice& dev, FwdPlan& p) {
  constexpr int V = kc::max_vec_elems<T>();
  const bool vec_ok = p.vec == V;
  switch (f) {
    case kSeed: return true;
    case kRegisters: p.c2 = v2_config(a.cols, p.vec); return p.c2.ok;
    case kCpAsync: {
      const V2Config c = v2_config(a.cols, p.vec);
      p.stages = pipe_stages(size_t(a.cols) * sizeof(T));
      if (!c.ok || !vec_ok || c.warp || p.stages < 2) return false;
      p.c2 = v3_config(a.cols, V);
      return true;
    }
    case kRowSlots:
    case kClusterSplit: {
      const bool split = f == kClusterSplit;
      if (split && (!vec_ok || !dev.sm90())) return false;
      p.cluster = split ? ring_cluster(a.cols, V) : 1;
      if (split && p.cluster < 2) return false;
      p.c4 = v4_config(a.cols / p.cluster, p.vec);
      if (!p.c4.ok) return false;
      p.l2pf = dev.sm90() && v4_l2_prefetch() && vec_ok && p.c4.iters == 4 && (split || sizeof(T) == 2);
      return with_fwd_v4_kernel<T, TW>(p.vec, p.c4.iters, split, p.l2pf, [&](auto kernel) {
        if (!kernel) return false;
        p.p4 = v4_plan(kernel, p.c4.tpr, kV4SmallThreads, a.rows, 0, 0);
        if (split) {
          const int64_t groups = cluster_groups(kernel, p.p4, p.cluster, a.rows);
          if (groups <= 0) return false;
          p.p4.grid = groups * p.cluster;
        }
        return true;
      });
    }
  }
  return false;  // 5: no forward ring (layernorm_versions.h)
}

template <typename T, typename TW>
FwdPlan fwd_plan(const LnForwardArgs& a, int version, const LnDevice& dev) {
  constexpr int V = kc::max_vec_elems<T>();
  FwdPlan base;
  const bool vec_ok = kc::can_vectorize<T, V>(a.x, a.cols) && kc::can_vectorize<T, V>(a.y, a.cols) &&
                      (!a.weight || kc::is_aligned(a.weight, sizeof(TW) * V)) &&
                      (!a.bias || kc::is_aligned(a.bias, sizeof(TW) * V));
  base.vec = vec_ok ? V : 1;
  int chain[8], n = 0;
  if (version >= kSeed && version <= kMaxVersion) {
    for (int f = version; f != 0; f = ln_fallback(f, /*forward=*/true)) chain[n++] = f;
  } else {
    int first[4];
    const int k = fwd_auto_families<T, TW>(a, vec_ok, dev, first);
    for (int i = 0; i < k; ++i) chain[n++] = first[i];
  }
  for (int i = 0; i < n; ++i) {
    FwdPlan p = base;
    p.family = chain[i];
    if (fwd_plan_family<T, TW>(a, p.family, dev, p)) return p;
  }
  return base;  // version 1
}

// ---------------------------------------------------------------- launching
template <typename T, typename TW>
using FwdV2Kernel = void (*)(const T*, const TW*, const TW*, T*, float*, float*, int64_t, int64_t, float, bool);
template <typename T, typename TW>
using FwdV3Kernel = void (*)(const T*, const TW*, const TW*, T*, float*, float*, int64_t, int64_t, float, int, bool);

// The weight type (TW or void: FwdTW) of a forward kernel pointer K.
template <typename K>
struct FwdKernelTW;
template <typename T, typename TW, typename... Rest>
struct FwdKernelTW<void (*)(const T*, const TW*, const TW*, Rest...)> {
  using type = TW;
};

// f(kernel): version 2's instantiation of plan p, its weight type FwdTW's. 16-byte
// vectors: ITERS from the plan (warp rows: at most kMaxEptWarp elements a thread,
// block rows kMaxEpt: v2_config's limits); else the scalar loop (ITERS = 0),
// whatever the plan's iters.
template <typename T, typename TW, typename F>
auto with_fwd_v2_kernel(const FwdPlan& p, F&& f) {
  constexpr int V = kc::max_vec_elems<T>();
  return KC_BOOL_SWITCH(p.c2.warp, kWarp, [&] {
    if (p.vec != V) {
      using KW = FwdTW<T, TW, kWarp>;  // the block rows': the plan's fallback
      return f(FwdV2Kernel<T, KW>(ln_fwd_v2<T, KW, 1, 0, kWarp>));
    }
    using KW = FwdTW<T, TW, true>;
    constexpr int kMax = (kWarp ? kMaxEptWarp : kMaxEpt) / V;
    return f(with_iters<kMax>(p.c2.iters, FwdV2Kernel<T, KW>(nullptr), [&](auto it) {
      return FwdV2Kernel<T, KW>(ln_fwd_v2<T, KW, V, decltype(it)::value, kWarp>);
    }));
  });
}

template <typename T, typename TW>
cudaError_t fwd_launch(const LnForwardArgs& a, const FwdPlan& p, cudaStream_t stream) {
  constexpr int V = kc::max_vec_elems<T>();
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  const bool w_f32 = a.wdt == kc::DType::F32;  // read by the kernels with TW = void only
  switch (p.family) {
    case kRegisters:
      return with_fwd_v2_kernel<T, TW>(p, [&](auto kernel) {
        using KW = typename FwdKernelTW<decltype(kernel)>::type;
        if (!kernel) return cudaErrorInvalidConfiguration;
        int per_sm = 0;
        KC_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, p.c2.threads, 0));
        const int64_t rows_per_block = p.c2.warp ? p.c2.threads / 32 : 1;
        const int64_t needed = (a.rows + rows_per_block - 1) / rows_per_block;
        const int64_t cap = int64_t(num_sms()) * (per_sm > 0 ? per_sm : 1) * 4;  // up to 4 waves
        kernel<<<unsigned(needed < cap ? needed : cap), p.c2.threads, 0, stream>>>(
            x, static_cast<const KW*>(a.weight), static_cast<const KW*>(a.bias), y, a.mean, a.rstd, a.rows, a.cols,
            a.eps, w_f32);
        return cudaGetLastError();
      });
    case kCpAsync: {
      using KW = FwdTW<T, TW, true>;
      const auto kernel = with_iters<kMaxEpt / V>(p.c2.iters, FwdV3Kernel<T, KW>(nullptr), [&](auto it) {
        return FwdV3Kernel<T, KW>(ln_fwd_v3<T, KW, decltype(it)::value>);
      });
      if (!kernel) return cudaErrorInvalidConfiguration;
      const size_t smem = size_t(p.stages) * size_t(a.cols) * sizeof(T);
      KC_CUDA_TRY(allow_dynamic_smem(kernel, smem));
      int per_sm = 0;
      KC_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, p.c2.threads, smem));
      const int64_t grid = persistent_grid(a.rows, per_sm);
      kernel<<<unsigned(grid), p.c2.threads, smem, stream>>>(x, static_cast<const KW*>(a.weight),
                                                             static_cast<const KW*>(a.bias), y, a.mean, a.rstd,
                                                             a.rows, a.cols, a.eps, p.stages, w_f32);
      return cudaGetLastError();
    }
    case kRowSlots:
    case kClusterSplit: {
      const bool split = p.family == kClusterSplit;
      return with_fwd_v4_kernel<T, TW>(p.vec, p.c4.iters, split, p.l2pf, [&](auto kernel) {
        using KW = typename FwdKernelTW<decltype(kernel)>::type;
        if (!kernel) return cudaErrorInvalidConfiguration;
        if (p.p4.grid <= 0) return cudaSuccess;
        const KW* w = static_cast<const KW*>(a.weight);
        const KW* b = static_cast<const KW*>(a.bias);
        if (split)
          return kc::launch_cluster(kernel, dim3(unsigned(p.p4.grid)), dim3(unsigned(p.p4.threads)), 0, stream,
                                    unsigned(p.cluster), x, w, b, y, a.mean, a.rstd, a.rows, a.cols,
                                    a.cols / p.cluster, a.eps, p.c4.tpr, w_f32);
        kernel<<<unsigned(p.p4.grid), p.p4.threads, 0, stream>>>(x, w, b, y, a.mean, a.rstd, a.rows, a.cols, a.cols,
                                                                 a.eps, p.c4.tpr, w_f32);
        KC_CUDA_LAUNCH_TRY();
        return cudaSuccess;
      });
    }
  }
  const TW* w = static_cast<const TW*>(a.weight);
  const TW* b = static_cast<const TW*>(a.bias);
  // 1: one block per row, in chunks that fit a grid
  for (int64_t r0 = 0; r0 < a.rows; r0 += 0x7fffffff) {
    const int64_t n = a.rows - r0 < 0x7fffffff ? a.rows - r0 : 0x7fffffff;
    ln_fwd_v1<T, TW><<<unsigned(n), 256, 0, stream>>>(x, w, b, y, a.mean, a.rstd, r0, a.cols, a.eps);
    KC_CUDA_LAUNCH_TRY();
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t ln_forward(const LnForwardArgs& a, int version, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  const LnDevice dev = ln_device();
  const bool w_f32 = a.wdt == kc::DType::F32;
  return KC_DTYPE_SWITCH(a.dt, T, [&] {
    return KC_BOOL_SWITCH(w_f32, kWF32, [&] {
      using TW = typename std::conditional<kWF32, float, T>::type;
      return fwd_launch<T, TW>(a, fwd_plan<T, TW>(a, version, dev), stream);
    });
  });
}

}  // namespace day26
