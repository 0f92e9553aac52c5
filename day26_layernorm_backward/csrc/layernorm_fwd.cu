// LayerNorm forward: y = (x - mean) * rstd * weight + bias, per row of D elements,
//   mean = sum(x) / D,  var = sum((x - mean)^2) / D,  rstd = 1 / sqrt(var + eps).
// mean and rstd (fp32) are saved for the backward.
//
// Versions:
//   v1  the seed's structure: one block of 256 threads per row, three passes
//       over the row in global memory (sum, squared deviations, write), scalar
//       loads, block reductions through shared memory. Any D.
//   v2  the row is read once into registers (16-byte vector loads where every
//       pointer and D allow it), both statistics come from the registers
//       (two-pass variance: accurate, no extra memory traffic), then y is written
//       once. One warp per row for D <= 512 (8 rows per block, warp shuffles
//       only), one block per row above that (128..512 threads, <= 32 elements
//       per thread). Rows longer than 16384 fall back to v1.
//   v3  v2's math on a cp.async pipeline: a persistent grid, each block keeps
//       the next `stages - 1` rows in flight into shared memory (each thread
//       copies, and later reads, only its own 16-byte vectors, so no barrier
//       guards the stages). Several rows per block in flight, no registers
//       spent on them. Block path with 16-byte vectors only; else as v2.
// Traffic: v2 reads x once and writes y once (the floor: 2 passes); v1 reads x
// three times (mostly from L2 when the rows of the blocks in flight fit there).
#include <type_traits>

#include "layernorm.h"
#include "layernorm_common.cuh"

#include "kc/async_copy.cuh"
#include "kc/bulk_copy.cuh"
#include "kc/launch.cuh"
#include "kc/check.cuh"
#include "kc/reduce.cuh"
#include "kc/switch.cuh"

namespace day26 {
namespace {

template <typename TW>
__device__ __forceinline__ float load_w(const TW* p, int64_t c) { return p ? kc::to_float(p[c]) : 1.f; }
template <typename TW>
__device__ __forceinline__ float load_b(const TW* p, int64_t c) { return p ? kc::to_float(p[c]) : 0.f; }

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
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) s += kc::to_float(xr[c]);
  const float mean = kc::block_reduce_sum(s, red) / float(D);
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
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// The thread's share of a row in fp32 (entries past the row end: never read).
template <typename T, int VEC, int ITERS>
__device__ __forceinline__ void row_to_float(const RowRegs<T, VEC, ITERS>& r, float (&v)[ITERS][VEC],
                                             const RowCols<VEC, ITERS>& rc) {
#pragma unroll
  for (int it = 0; it < ITERS; ++it)
    if (rc.has(it)) kc::vec_to_float(r.v[it], v[it]);
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
                                            const TW* __restrict__ b, T* __restrict__ yr, float* mean_out,
                                            float* rstd_out, const RowCols<VEC, ITERS>& rc, float inv_d,
                                            float dn, float eps, int t, Reduce&& reduce, Exchange&& ex = {}) {
  constexpr bool kSplit = !std::is_same<std::decay_t<Exchange>, NoExchange>::value;
  float s = 0.f;
#pragma unroll
  for (int it = 0; it < ITERS; ++it)
    if (rc.has(it))
#pragma unroll
      for (int j = 0; j < VEC; ++j) s += v[it][j];
  s = reduce(s);
  // s * (1/D), corrected once by its residual (one FMA computes s - mean * D
  // exactly): within an ulp of s / D and usually equal to it, at two FMAs per
  // row instead of a division. Without it a bf16 row of seven 1000.0s had mean
  // 1000.00006, variance 3.7e-9 and rstd off by 2e-4 (test_forward_large_mean,
  // H200 run 43).
  float mean = s * inv_d;
  mean = fmaf(fmaf(-mean, dn, s), inv_d, mean);
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
      load_param<TW, VEC>(w, c, 1.f, wv);
      load_param<TW, VEC>(b, c, 0.f, bv);
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
    *mean_out = row_mean;
    *rstd_out = rstd;
  }
}

template <typename T, typename TW, int VEC, int ITERS, typename Reduce>
__device__ __forceinline__ void fwd_row(const RowRegs<T, VEC, ITERS>& cur, const TW* __restrict__ w,
                                        const TW* __restrict__ b, T* __restrict__ yr, float* mean_out,
                                        float* rstd_out, const RowCols<VEC, ITERS>& rc, float inv_d, float dn, float eps,
                                        int t, Reduce&& reduce) {
  float v[ITERS][VEC];
  row_to_float(cur, v, rc);
  fwd_row_f32(v, w, b, yr, mean_out, rstd_out, rc, inv_d, dn, eps, t, reduce);
}

// v2. Assumptions (checked by the launcher):
// - kWarp: blockDim.x = 32 * kWarpRowsPerBlock, one warp per row;
//   else: blockDim.x = threads per row (a multiple of 32, <= kMaxTpr), one block per row;
// - VEC > 1 only when x, y, weight, bias are aligned to a VEC-vector and D % VEC == 0;
// - ITERS * VEC * (threads per row) >= D;
// - rows are visited grid-stride, so any number of rows works with any grid.
template <typename T, typename TW, int VEC, int ITERS, bool kWarp>
__global__ void __launch_bounds__(kMaxTpr)
ln_fwd_v2(const T* __restrict__ x, const TW* __restrict__ w, const TW* __restrict__ b,
          T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
          int64_t rows, int64_t D, float eps) {
  __shared__ float red[32];
  const int tpr = kWarp ? 32 : blockDim.x;
  const int t = kWarp ? (threadIdx.x & 31) : threadIdx.x;
  const int64_t rows_per_block = kWarp ? (blockDim.x >> 5) : 1;
  const int64_t slot = kWarp ? (threadIdx.x >> 5) : 0;
  const RowCols<VEC, ITERS> rc(D, tpr, t);
  const float inv_d = 1.f / float(D);
  // Warps of one block leave this loop at different times in the warp path;
  // the block path keeps the whole block together (its reductions sync).
  for (int64_t row = blockIdx.x * rows_per_block + slot; row < rows; row += int64_t(gridDim.x) * rows_per_block) {
    RowRegs<T, VEC, ITERS> cur;
    load_row(cur, x + row * D, rc);
    fwd_row(cur, w, b, y + row * D, mean_out + row, rstd_out + row, rc, inv_d, float(D), eps, t,
            [&](float v) {
              if constexpr (kWarp) return kc::warp_reduce_sum(v);
              else return kc::block_reduce_sum(v, red);
            });
  }
}

// v3. Block path, VEC = 16 bytes of T, blockDim.x = threads per row; dynamic
// shared memory: stages * D elements of T (16-byte aligned rows, D % VEC == 0).
template <typename T, typename TW, int ITERS>
__global__ void __launch_bounds__(kMaxTpr)
ln_fwd_v3(const T* __restrict__ x, const TW* __restrict__ w, const TW* __restrict__ b,
          T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
          int64_t rows, int64_t D, float eps, int stages) {
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
    fwd_row(cur, w, b, y + row * D, mean_out + row, rstd_out + row, rc, inv_d, float(D), eps, t,
            [&](float v) { return kc::block_reduce_sum(v, red); });
    stage = stage + 1 == stages ? 0 : stage + 1;
  }
  kc::cp_async_wait(0);
}

// v4. Row slots (layernorm_common.cuh): blockDim.x = slots * tpr; slot k walks
// rows blockIdx.x * slots + k + i * gridDim.x * slots, syncing only its own
// threads; with kPrefetch the next row is loaded into registers before the
// current one is reduced.
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
template <typename T, typename TW, int VEC, int ITERS, bool kPrefetch, bool kCluster, bool kL2pf = false>
__global__ void __launch_bounds__(kV4SmallThreads)
ln_fwd_v4(const T* __restrict__ x, const TW* __restrict__ w, const TW* __restrict__ b,
          T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
          int64_t rows, int64_t D, int64_t Dc, float eps, int tpr) {
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
    if (w) w += col0;
    if (b) b += col0;
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
      fwd_row_f32(v, w, b, y + r * D, mean_out + r, rstd_out + r, rc, inv_dc, float(Dc), eps, t, reduce, ex);
    else
      fwd_row_f32(v, w, b, y + r * D, mean_out + r, rstd_out + r, rc, inv_dc, float(Dc), eps, t, reduce);
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

// v4 on a ring of rows in shared memory, filled by the copy engine: row slots as
// ln_fwd_v4, each slot keeping its next `stages` rows in its own ring; one
// thread of the slot copies a whole row with one bulk copy (kc/bulk_copy.cuh)
// that completes on the stage's mbarrier. A row is copied from the ring into
// registers before its first reduction, so the stage is refilled (with the row
// `stages` rows later) right after that reduction's barrier.
// Assumptions (launcher): sm_90+; VEC = 16 bytes of T, every pointer and D allow
// it; blockDim.x = slots * tpr; 2 <= stages <= kRingMaxStages; dynamic shared
// memory: slots * stages * span elements of T, span = tpr * ITERS * VEC.
template <typename T, typename TW, int ITERS>
__global__ void __launch_bounds__(kV4SmallThreads)
ln_fwd_ring(const T* __restrict__ x, const TW* __restrict__ w, const TW* __restrict__ b,
            T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
            int64_t rows, int64_t D, float eps, int tpr, int stages) {
  constexpr int VEC = kc::max_vec_elems<T>();
  extern __shared__ __align__(128) unsigned char ring_smem[];
  __shared__ float red[kV4MaxSlots][2 * 32];
  __shared__ uint64_t full[kV4MaxSlots][kRingMaxStages];
  const int slots = blockDim.x / tpr;
  const int slot = threadIdx.x / tpr, t = threadIdx.x - slot * tpr;
  const int lane = threadIdx.x & 31, wis = t >> 5, nw = tpr >> 5;
  const int64_t span = int64_t(tpr) * ITERS * VEC;
  T* const ring = reinterpret_cast<T*>(ring_smem) + int64_t(slot) * stages * span;
  uint64_t* const bars = full[slot];
  const unsigned row_bytes = unsigned(D * int64_t(sizeof(T)));
  const int64_t stride = int64_t(gridDim.x) * slots;
  int64_t row = int64_t(blockIdx.x) * slots + slot;
  auto issue = [&](int64_t r, int s) {  // thread 0 of the slot: row r -> stage s
    kc::mbar_arrive_expect_tx(&bars[s], row_bytes);
    kc::bulk_copy_g2s(ring + s * span, x + r * D, row_bytes, &bars[s]);
  };
  if (t == 0) {
    for (int s = 0; s < stages; ++s) kc::mbar_init(&bars[s], 1);
    kc::mbar_init_fence();
  }
  __syncthreads();
  if (t == 0)
    for (int s = 0; s < stages; ++s)
      if (row + s * stride < rows) issue(row + s * stride, s);
  const RowCols<VEC, ITERS> rc(D, tpr, t);
  const float inv_d = 1.f / float(D);
  int stage = 0, parity = 0;
  unsigned phase = 0;  // parity of the ring's current round
  for (; row < rows; row += stride) {
    kc::mbar_wait(&bars[stage], phase);  // this row has landed
    RowRegs<T, VEC, ITERS> cur;
#pragma unroll
    for (int it = 0; it < ITERS; ++it)
      if (rc.has(it)) cur.v[it] = *reinterpret_cast<const kc::Vec<T, VEC>*>(ring + stage * span + rc.col(it));
    bool refilled = false;
    fwd_row(cur, w, b, y + row * D, mean_out + row, rstd_out + row, rc, inv_d, float(D), eps, t, [&](float v) {
      float r[1] = {v};
      slot_reduce_sum<1>(r, red[slot], parity, 1 + slot, nw, wis, lane);
      if (!refilled) {  // every thread of the slot holds this row in registers now
        refilled = true;
        if (nw == 1) __syncwarp();
        const int64_t next = row + int64_t(stages) * stride;
        if (t == 0 && next < rows) issue(next, stage);
      }
      return r[0];
    });
    if (++stage == stages) stage = 0, phase ^= 1u;
  }
  // every row issued was waited for above: no copy is in flight at exit
}

// *ran = false when no ring fits the shared memory (the caller runs v4 without one).
template <typename T, typename TW, int ITERS>
cudaError_t launch_fwd_ring(const LnForwardArgs& a, const V4Config& cfg, int want, cudaStream_t stream, bool* ran) {
  auto kernel = ln_fwd_ring<T, TW, ITERS>;
  const RingPlan r =
      ring_plan(kernel, cfg.tpr, a.rows, size_t(cfg.tpr) * ITERS * cfg.vec * sizeof(T), want);
  *ran = r.stages > 0;
  if (*ran && r.p.grid > 0) {
    kernel<<<unsigned(r.p.grid), r.p.threads, r.p.smem, stream>>>(
        static_cast<const T*>(a.x), static_cast<const TW*>(a.weight), static_cast<const TW*>(a.bias),
        static_cast<T*>(a.y), a.mean, a.rstd, a.rows, a.cols, a.eps, cfg.tpr, r.stages);
    KC_CUDA_LAUNCH_TRY();
  }
  return cudaSuccess;
}

template <typename T, typename TW>
cudaError_t dispatch_fwd_ring(const LnForwardArgs& a, const V4Config& cfg, int want, cudaStream_t stream, bool* ran) {
  switch (cfg.iters) {
    case 1: return launch_fwd_ring<T, TW, 1>(a, cfg, want, stream, ran);
    case 2: return launch_fwd_ring<T, TW, 2>(a, cfg, want, stream, ran);
    case 4: return launch_fwd_ring<T, TW, 4>(a, cfg, want, stream, ran);
  }
  *ran = false;
  return cudaSuccess;
}

// csize > 1: each row split across a cluster of csize CTAs (cfg: the
// configuration of a share of D / csize columns; sm_90+, 16-byte vectors);
// *ran = false when no such cluster fits the GPU (the caller runs another kernel).
template <typename T, typename TW, int VEC, int ITERS, bool kPrefetch, bool kCluster, bool kL2pf = false>
cudaError_t launch_fwd_v4(const LnForwardArgs& a, const V4Config& cfg, int csize, cudaStream_t stream, bool* ran) {
  auto kernel = ln_fwd_v4<T, TW, VEC, ITERS, kPrefetch, kCluster, kL2pf>;
  const V4Plan p = v4_plan(kernel, cfg.tpr, kV4SmallThreads, a.rows, 0, 0);
  const T* x = static_cast<const T*>(a.x);
  const TW* w = static_cast<const TW*>(a.weight);
  const TW* b = static_cast<const TW*>(a.bias);
  T* y = static_cast<T*>(a.y);
  if constexpr (kCluster) {
    const int64_t groups = cluster_groups(kernel, p, csize, a.rows);
    *ran = groups > 0;
    if (groups > 0)
      KC_CUDA_TRY(kc::launch_cluster(kernel, dim3(unsigned(groups * csize)), dim3(unsigned(p.threads)), 0, stream,
                                     unsigned(csize), x, w, b, y, a.mean, a.rstd, a.rows, a.cols, a.cols / csize,
                                     a.eps, cfg.tpr));
  } else {
    *ran = true;
    if (p.grid > 0) {
      kernel<<<unsigned(p.grid), p.threads, 0, stream>>>(x, w, b, y, a.mean, a.rstd, a.rows, a.cols, a.cols, a.eps,
                                                         cfg.tpr);
      KC_CUDA_LAUNCH_TRY();
    }
  }
  return cudaSuccess;
}

template <typename T, typename TW, int VEC>
cudaError_t dispatch_fwd_v4(const LnForwardArgs& a, const V4Config& cfg, int csize, bool prefetch,
                            cudaStream_t stream, bool* ran) {
  constexpr bool kFullVec = VEC == kc::max_vec_elems<T>();
  *ran = false;
  return KC_BOOL_SWITCH(prefetch, kPrefetch, [&] {
    auto go = [&](auto iters) -> cudaError_t {
      constexpr int I = decltype(iters)::value;
      // one row slot per SM (4 vectors a thread, the next row in registers):
      // also the row after it into L2 (sm_90+: the bulk-copy engine)
      constexpr bool kL2able = kFullVec && kPrefetch && I == 4;
      const bool l2pf = kc::sm90_or_newer() && v4_l2_prefetch();  // (used where kL2able)
      if (csize > 1) {
        if constexpr (kL2able)
          if (l2pf) return launch_fwd_v4<T, TW, VEC, I, kPrefetch, true, true>(a, cfg, csize, stream, ran);
        if constexpr (kFullVec) return launch_fwd_v4<T, TW, VEC, I, kPrefetch, true>(a, cfg, csize, stream, ran);
        return cudaErrorInvalidConfiguration;
      }
      if constexpr (kL2able && sizeof(T) == 2)  // (fp32 rows of 4 vectors a thread fit two slots per SM)
        if (l2pf) return launch_fwd_v4<T, TW, VEC, I, kPrefetch, false, true>(a, cfg, 1, stream, ran);
      return launch_fwd_v4<T, TW, VEC, I, kPrefetch, false>(a, cfg, 1, stream, ran);
    };
    switch (cfg.iters) {
      case 1: return go(std::integral_constant<int, 1>{});
      case 2: return go(std::integral_constant<int, 2>{});
      case 4: return go(std::integral_constant<int, 4>{});
    }
    return cudaErrorInvalidConfiguration;
  });
}

template <typename T, typename TW, int VEC, int ITERS, bool kWarp>
cudaError_t launch_fwd_v2(const LnForwardArgs& a, const V2Config& cfg, cudaStream_t stream) {
  auto kernel = ln_fwd_v2<T, TW, VEC, ITERS, kWarp>;
  int per_sm = 0;
  KC_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, cfg.threads, 0));
  const int64_t rows_per_block = kWarp ? cfg.threads / 32 : 1;
  const int64_t needed = (a.rows + rows_per_block - 1) / rows_per_block;
  const int64_t cap = int64_t(num_sms()) * (per_sm > 0 ? per_sm : 1) * 4;  // up to 4 waves
  const unsigned grid = unsigned(needed < cap ? needed : cap);
  kernel<<<grid, cfg.threads, 0, stream>>>(static_cast<const T*>(a.x), static_cast<const TW*>(a.weight),
                                           static_cast<const TW*>(a.bias), static_cast<T*>(a.y), a.mean,
                                           a.rstd, a.rows, a.cols, a.eps);
  return cudaGetLastError();
}

template <typename T, typename TW, int ITERS>
cudaError_t launch_fwd_v3(const LnForwardArgs& a, const V2Config& cfg, int stages, cudaStream_t stream) {
  auto kernel = ln_fwd_v3<T, TW, ITERS>;
  const size_t smem = size_t(stages) * size_t(a.cols) * sizeof(T);
  KC_CUDA_TRY(allow_dynamic_smem(kernel, smem));
  int per_sm = 0;
  KC_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, cfg.threads, smem));
  const int64_t grid = persistent_grid(a.rows, per_sm);
  kernel<<<unsigned(grid), cfg.threads, smem, stream>>>(static_cast<const T*>(a.x), static_cast<const TW*>(a.weight),
                                                        static_cast<const TW*>(a.bias), static_cast<T*>(a.y), a.mean,
                                                        a.rstd, a.rows, a.cols, a.eps, stages);
  return cudaGetLastError();
}

template <typename T, typename TW, int VEC>
cudaError_t dispatch_fwd_v2(const LnForwardArgs& a, const V2Config& cfg, cudaStream_t stream) {
  return KC_BOOL_SWITCH(cfg.warp, kWarp, [&] {
    switch (cfg.iters) {
      case 1: return launch_fwd_v2<T, TW, VEC, 1, kWarp>(a, cfg, stream);
      case 2: return launch_fwd_v2<T, TW, VEC, 2, kWarp>(a, cfg, stream);
      case 4: if constexpr (4 * VEC <= kMaxEpt) return launch_fwd_v2<T, TW, VEC, 4, kWarp>(a, cfg, stream); break;
      case 8: if constexpr (8 * VEC <= kMaxEpt) return launch_fwd_v2<T, TW, VEC, 8, kWarp>(a, cfg, stream); break;
      case 16: if constexpr (16 * VEC <= kMaxEpt) return launch_fwd_v2<T, TW, VEC, 16, kWarp>(a, cfg, stream); break;
    }
    return cudaErrorInvalidConfiguration;
  });
}

template <typename T, typename TW>
cudaError_t dispatch_fwd_v3(const LnForwardArgs& a, const V2Config& cfg, int stages, cudaStream_t stream) {
  constexpr int V = kc::max_vec_elems<T>();
  switch (cfg.iters) {
    case 1: return launch_fwd_v3<T, TW, 1>(a, cfg, stages, stream);
    case 2: return launch_fwd_v3<T, TW, 2>(a, cfg, stages, stream);
    case 4: if constexpr (4 * V <= kMaxEpt) return launch_fwd_v3<T, TW, 4>(a, cfg, stages, stream); break;
    case 8: if constexpr (8 * V <= kMaxEpt) return launch_fwd_v3<T, TW, 8>(a, cfg, stages, stream); break;
  }
  return cudaErrorInvalidConfiguration;
}

template <typename T, typename TW>
cudaError_t forward_typed(const LnForwardArgs& a, int version, cudaStream_t stream) {
  const T* x = static_cast<const T*>(a.x);
  if (version >= 2) {
    constexpr int V = kc::max_vec_elems<T>();
    const bool vec_ok = kc::can_vectorize<T, V>(a.x, a.cols) && kc::can_vectorize<T, V>(a.y, a.cols) &&
                        (!a.weight || kc::is_aligned(a.weight, sizeof(TW) * V)) &&
                        (!a.bias || kc::is_aligned(a.bias, sizeof(TW) * V));
    // version 4: fp32 rows longer than 8192 split across a cluster of CTAs
    // (sm_90+, 16-byte vectors), the next row prefetched: 85% of the floor at
    // 4096 x 16384 against v3's 80% (probe run 42, H200); 16-bit rows split
    // that way measured much slower (one 512-thread slot per SM waits for every
    // row's exchange: 110 against 77 µs), so not split. Knob kKnobCluster = 1, 2 or 4
    // overrides (any dtype, any D it divides). Otherwise v4's kernels (next row
    // prefetched) for 16-bit types; for fp32, v2's, and v3's for rows over 8192
    // (v4 with the next row prefetched was 1-3% faster than v2 at 1024 and 8192
    // columns in probe runs 37-38 but 3-8% slower in bench run 39: no consistent
    // gain). Knob kKnobForce = 1: v4's kernels wherever they can run
    // (kKnobPrefetch = 1 with them for fp32). Where a thread holds 4 vectors
    // (one slot per SM), v4 also prefetches the row after next into L2
    // (dispatch_fwd_v4; 4096 x 16384: bf16 77.0 -> 73.5 µs, fp32 148.2 -> 139.8,
    // probe run 49).
    if (version == 4 && vec_ok && kc::sm90_or_newer() && (sizeof(T) == 4 || ring_cluster_forced())) {
      const int csize = ring_cluster(a.cols, V);
      const V4Config cc = v4_config(a.cols / csize, V);
      if (csize > 1 && cc.ok) {
        bool ran = false;
        const cudaError_t e = dispatch_fwd_v4<T, TW, V>(a, cc, csize, v4_prefetch(true), stream, &ran);
        if (ran || e != cudaSuccess) return e;
      }
    }
    const bool use_v4 = version == 4 && (sizeof(T) == 2 || v4_forced());
    if (use_v4) {
      const V4Config c4 = v4_config(a.cols, vec_ok ? V : 1);
      const int ring = kc::sm90_or_newer() ? v4_ring(0) : 0;  // off by default: measured slower (README)
      if (c4.ok && vec_ok && ring) {
        bool ran = false;
        const cudaError_t e = dispatch_fwd_ring<T, TW>(a, c4, ring, stream, &ran);
        if (ran || e != cudaSuccess) return e;
      }
      if (c4.ok) {
        bool ran = false;
        const bool pf = v4_prefetch(sizeof(T) == 2);
        return vec_ok ? dispatch_fwd_v4<T, TW, V>(a, c4, 1, pf, stream, &ran)
                      : dispatch_fwd_v4<T, TW, 1>(a, c4, 1, pf, stream, &ran);
      }
    }
    if (version == 4 && !use_v4 && a.cols > 8192) version = 3;
    const V2Config cfg = v2_config(a.cols, vec_ok ? V : 1);
    if (cfg.ok) {
      const int stages = pipe_stages(size_t(a.cols) * sizeof(T));
      if (version == 3 && vec_ok && !cfg.warp && stages >= 2)
        return dispatch_fwd_v3<T, TW>(a, v3_config(a.cols, V), stages, stream);
      return vec_ok ? dispatch_fwd_v2<T, TW, V>(a, cfg, stream) : dispatch_fwd_v2<T, TW, 1>(a, cfg, stream);
    }
  }
  // v1 (and v2's fallback for long rows): one block per row, in chunks that fit a grid
  for (int64_t r0 = 0; r0 < a.rows; r0 += 0x7fffffff) {
    const int64_t n = a.rows - r0 < 0x7fffffff ? a.rows - r0 : 0x7fffffff;
    ln_fwd_v1<T, TW><<<unsigned(n), 256, 0, stream>>>(x, static_cast<const TW*>(a.weight),
                                                      static_cast<const TW*>(a.bias), static_cast<T*>(a.y),
                                                      a.mean, a.rstd, r0, a.cols, a.eps);
    KC_CUDA_LAUNCH_TRY();
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t ln_forward(const LnForwardArgs& a, int version, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  if (version < 1 || version > 4) return cudaErrorInvalidValue;
  const bool w_f32 = a.wdt == kc::DType::F32;
  return KC_DTYPE_SWITCH(a.dt, T, [&] {
    return KC_BOOL_SWITCH(w_f32, kWF32, [&] {
      using TW = typename std::conditional<kWF32, float, T>::type;
      return forward_typed<T, TW>(a, version, stream);
    });
  });
}

}  // namespace day26
