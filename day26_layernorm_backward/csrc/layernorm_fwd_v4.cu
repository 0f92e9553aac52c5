// LayerNorm forward, versions 4 (row slots) and 6 (row slots with each row
// split across a thread-block cluster, sm_90+); layernorm_fwd_common.cuh has the
// math and the list of versions. The kernel's comment below has the details.
#include "layernorm_fwd_common.cuh"

#include "kc/bulk_copy.cuh"
#include "kc/check.cuh"
#include "kc/cluster.cuh"

namespace day26 {
namespace {

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
// kAdd (add_norm, not split): the residual's row is loaded beside x's (and
// prefetched with it; kL2pf: into L2 too), and x + residual is written to `sum`
// and normalised (add_residual). Without kAdd, res and sum are unused.
// Assumptions (launcher): blockDim.x = slots * tpr, tpr a multiple of 32,
// ITERS * VEC * tpr >= Dc; kCluster: VEC = 16 bytes of T, D = cluster size *
// Dc, every pointer and Dc allow VEC; kAdd: res and sum aligned as x.
// Two 512-thread blocks an SM (64 registers a thread) for 16-bit rows of 2
// vectors a thread (2049-8192 columns) with weights of their dtype (ptxas: 71 ->
// 63 registers, no spill): 4 slots an SM instead of 3 at 4096 columns, 2 instead
// of 1 at 8192 (commit e57a452, its results file); with fp32 weights the cap
// spilled and the forward at 4096 columns measured 1-2% slower, so those keep
// ptxas's choice, as every other kernel. add_norm's 16-bit rows of 2 vectors a
// thread (kAdd: the residual's next row in registers too) hold 86-92 registers
// unbounded, two 256-thread slots an SM; a bound of 768 threads holds them to
// 80 without a spill, three slots (the plan still launches at most 512 threads
// a block): forward 10-12% faster at 1024 and 4096 columns (H200, commit
// ba9da9c). The cap of 64 spilled 48 bytes and was 2-7% slower than unbounded.
// kPack (bf16 with bf16 weights, 2 vectors a thread; the plan sets it for rows of
// 4097-8192 columns): the current row kept as its rounded 16-bit sums
// (fwd_row_packed, converted again at each pass) fits the cap of 64 without a
// spill, two 512-thread slots an SM instead of one: forward 13-19% faster at
// 8192 columns; at 4096 (four 256-thread slots instead of three) the conversions
// cost more than the slot buys (2% slower at 7920 and 8192 rows).
// fp32 rows of 4 vectors a thread, unsplit (1025-8192 columns; only a forced
// version runs them): two 512-thread blocks an SM, 64 registers, no spill. The
// one loop for both norms (RowCentering) took 91 unbounded, one block an SM:
// forced version 4 at 8192x8192 fp32 139.4 -> 188.5 us (H200).
template <typename T, typename TW, int VEC, int ITERS, bool kCluster, bool kAdd, bool kPack>
constexpr int kFwdV4MinBlocks =
    (sizeof(T) == 2 && std::is_same<TW, T>::value && ITERS == 2 && !kCluster && !kAdd) || kPack ||
            (sizeof(T) == 4 && VEC == 4 && ITERS == 4 && !kCluster && !kAdd)
        ? 2
        : 0;
template <typename T, int ITERS, bool kAdd, bool kPack>
constexpr int kFwdV4MaxThreads = sizeof(T) == 2 && ITERS == 2 && kAdd && !kPack ? 768 : kV4SmallThreads;

template <typename T, typename TW, int VEC, int ITERS, bool kCluster, bool kL2pf, bool kAdd = false, bool kPack = false>
__global__ void __launch_bounds__(kFwdV4MaxThreads<T, ITERS, kAdd, kPack>,
                                  kFwdV4MinBlocks<T, TW, VEC, ITERS, kCluster, kAdd, kPack>)
ln_fwd_v4(const T* __restrict__ x, const TW* __restrict__ w, const TW* __restrict__ b,
          T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
          int64_t rows, int64_t D, int64_t Dc, float eps, int tpr, bool w_f32, const T* __restrict__ res,
          T* __restrict__ sum) {
  constexpr bool kPrefetch = sizeof(T) == 2 || kCluster;
  static_assert(!(kAdd && kCluster), "kAdd: rows not split");
  static_assert(!kPack || kAdd, "kPack: add_norm's rows");
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
  auto row_loop = [&](auto centering) {
    auto one_row = [&](float (&v)[ITERS][VEC], int64_t r) {
      if constexpr (kCluster)
        fwd_row_f32(centering, v, w, b, w_f32, y + r * D, row_or_null(mean_out, r), rstd_out + r, rc, inv_dc,
                    float(Dc), eps, t, reduce, ex);
      else
        fwd_row_f32(centering, v, w, b, w_f32, y + r * D, row_or_null(mean_out, r), rstd_out + r, rc, inv_dc,
                    float(Dc), eps, t, reduce);
    };
    if constexpr (kPrefetch) {
      // The next row is converted to fp32 at the end of the current one, before
      // the load after it is issued. (Copying the prefetched registers instead,
      // `cur = nxt`, let ptxas move the wait for that load past the next load,
      // on the same scoreboard: every row then waited for its successor's load;
      // run 36, ncu and the SASS's wait masks.)
      float v[ITERS][VEC];
      RowRegs<T, VEC, ITERS> nxt;
      if constexpr (kAdd) {
        // x + residual of row r (in nxt, nres) stored to sum and kept for the norm:
        // as its rounded 16-bit sums in cur (kPack) or in fp32 in v
        RowRegs<T, VEC, ITERS> cur, nres;
        auto take = [&](int64_t r) {
          if constexpr (kPack) {
            add_residual(cur, nxt, nres, sum + r * D, rc);
          } else {
            row_to_float(nxt, v, rc);
            add_residual(v, nres, sum + r * D, rc);
          }
        };
        if (row < rows) {
          load_row(nxt, x + row * D, rc);
          load_row(nres, res + row * D, rc);
          take(row);
        }
        for (; row < rows; row += stride) {
          const bool more = row + stride < rows;
          if constexpr (kL2pf) {
            const int64_t r2 = row + 2 * stride;
            if (t == 0 && r2 < rows) {
              kc::bulk_prefetch_l2(x + r2 * D, unsigned(Dc * int64_t(sizeof(T))));
              kc::bulk_prefetch_l2(res + r2 * D, unsigned(Dc * int64_t(sizeof(T))));
            }
          }
          if (more) {
            load_row(nxt, x + (row + stride) * D, rc);
            load_row(nres, res + (row + stride) * D, rc);
          }
          if constexpr (kPack)
            fwd_row_packed(centering, cur, w, b, w_f32, y + row * D, row_or_null(mean_out, row), rstd_out + row, rc,
                           inv_dc, float(Dc), eps, t, reduce);
          else
            one_row(v, row);
          if (more) take(row + stride);
        }
      } else {
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
      }
    } else {
      for (; row < rows; row += stride) {
        RowRegs<T, VEC, ITERS> cur;
        load_row(cur, x + row * D, rc);
        float v[ITERS][VEC];
        row_to_float(cur, v, rc);
        if constexpr (kAdd) {
          RowRegs<T, VEC, ITERS> rr;
          load_row(rr, res + row * D, rc);
          add_residual(v, rr, sum + row * D, rc);
        }
        one_row(v, row);
      }
    }
  };
  // LayerNorm or RMSNorm: the loop compiled for each (with_centering), but in the
  // fp32 kernels only a forced version reaches (unsplit rows), where the split held
  // more registers than the one loop (2 vectors a thread: 8 bytes spilled)
  if constexpr (sizeof(T) == 4 && !kCluster)
    row_loop(RowCentering{});
  else
    with_centering(mean_out, row_loop);
  if constexpr (kCluster) kc::cluster_sync();  // no CTA leaves while a peer may still access its shared memory
}

template <typename T, typename TW>
using FwdV4Kernel =
    void (*)(const T*, const TW*, const TW*, T*, float*, float*, int64_t, int64_t, int64_t, float, int, bool,
             const T*, T*);

// The add_norm rows with a kPack kernel: bf16 with bf16 weights, 2 vectors a thread.
template <typename T, typename TW, int ITERS>
constexpr bool kCanPack = ITERS == 2 && std::is_same<T, __nv_bfloat16>::value && std::is_same<TW, T>::value;

// f(kernel): the v4 instantiation of a plan (nullptr: none compiled), its weight
// type FwdTW's (void for 16-bit split rows). kL2pf only where a thread holds 4
// full vectors and prefetches the next row (kPrefetch: 16-bit or split rows).
// Split rows (kCluster) only at the ITERS of shares over kClusterMinShare columns
// (kClusterIters: the plan's own splits), and at 4 vectors a thread only with the
// L2 prefetch (on wherever a cluster can run: sm_90); the knobs that would reach
// others are refused (layernorm_knobs.h). add: the kAdd instantiations, compiled
// where fwd_fuses_add allows (16-bit rows in 16-byte vectors, not split); pack:
// the kPack one, where kCanPack has it.
template <typename T, typename TW, typename F>
auto with_fwd_v4_kernel(int vec, int iters, bool cluster, bool l2pf, bool add, bool pack, F&& f) {
  constexpr int V = kc::max_vec_elems<T>();
  if (add) {
    using K = FwdV4Kernel<T, TW>;
    if constexpr (!fwd_fuses_add<T>(kRowSlots, V)) {
      return f(K(nullptr));
    } else {
      if (vec != V || cluster) return f(K(nullptr));
      return f(with_iters<4>(iters, K(nullptr), [&](auto it) {
        constexpr int I = decltype(it)::value;
        if constexpr (I == 4)
          if (l2pf) return K(ln_fwd_v4<T, TW, V, I, false, true, true>);
        if constexpr (kCanPack<T, TW, I>)
          if (pack) return K(ln_fwd_v4<T, TW, V, I, false, false, true, true>);
        return K(ln_fwd_v4<T, TW, V, I, false, false, true>);
      }));
    }
  }
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

}  // namespace

// 16-bit rows are split only where one CTA cannot hold them (fwd_plan.cu): into
// as few CTAs as hold a share in version 4's shape, not into ring_cluster's shares
// of at most 8192 columns. H200, 2026-11-28, LayerNorm forward bf16, 2 CTAs
// against 4: 4096 x 32768 184.5 against 264.9 us (torch 239.9), 8192 x 24576
// 318.5 against 468.0 (torch 348.2), 16384 x 32768 703.8 against 1036.5. 0: none.
static int fwd_cluster_16bit(int64_t cols, int vec) {
  for (int c = 2; c <= kRingMaxCluster; c *= 2)
    if (cols % (int64_t(c) * vec) == 0 && v4_config(cols / c, vec).ok) return c;
  return 0;
}

// 4 (split = false) or 6 (split): a CTA's share of D / cluster columns, its
// block shape v4_config's; slots and grid from v4_plan (occupancy), version 6
// as many clusters as fit at once (cluster_groups; false: none).
bool fwd_plan_v4(const LnForwardArgs& a, bool split, const LnDevice& dev, FwdPlan& p) {
  return ln_typed(a.dt, a.wdt, [&](auto t, auto tw) {
    using T = decltype(t);
    using TW = decltype(tw);
    constexpr int V = kc::max_vec_elems<T>();
    const bool vec_ok = p.vec == V;
    if (split && (!vec_ok || !dev.sm90())) return false;
    // 16-bit rows too long for one CTA: the fewest CTAs whose share fits; else
    // ring_cluster's shares of at most 8192 columns (a forced version 6 on a 16-bit
    // row that one CTA holds: split over 8192 columns, else version 4)
    const bool fewest = sizeof(T) == 2 && !ring_cluster_forced() && !v4_config(a.cols, V).ok;
    p.cluster = !split ? 1 : fewest ? fwd_cluster_16bit(a.cols, V) : ring_cluster(a.cols, V);
    if (split && p.cluster < 2) return false;
    p.c4 = v4_config(a.cols / p.cluster, p.vec);
    if (!p.c4.ok) return false;
    p.l2pf = dev.sm90() && v4_l2_prefetch() && vec_ok && p.c4.iters == 4 && (split || sizeof(T) == 2);
    p.pack = p.add && kCanPack<T, TW, 2> && p.c4.iters == 2 && a.cols > 4096;
    return with_fwd_v4_kernel<T, TW>(p.vec, p.c4.iters, split, p.l2pf, p.add, p.pack, [&](auto kernel) {
      if (!kernel) return false;
      p.p4 = v4_plan(kernel, p.c4.tpr, kV4SmallThreads, a.rows, 0, 0);
      if (split) {
        const int64_t groups = cluster_groups(kernel, p.p4, p.cluster, a.rows);
        if (groups <= 0) return false;
        p.p4.grid = groups * p.cluster;
      }
      return true;
    });
  });
}

cudaError_t fwd_launch_v4(const LnForwardArgs& a, const FwdPlan& p, cudaStream_t stream) {
  return ln_typed(a.dt, a.wdt, [&](auto t, auto tw) {
    using T = decltype(t);
    using TW = decltype(tw);
    const T* x = static_cast<const T*>(a.x);
    T* y = static_cast<T*>(a.y);
    const bool w_f32 = a.wdt == kc::DType::F32;  // read by the kernels with TW = void only
    const bool split = p.family == kClusterSplit;
    return with_fwd_v4_kernel<T, TW>(p.vec, p.c4.iters, split, p.l2pf, p.add, p.pack, [&](auto kernel) {
      using KW = typename FwdKernelTW<decltype(kernel)>::type;
      if (!kernel) return cudaErrorInvalidConfiguration;
      if (p.p4.grid <= 0) return cudaSuccess;
      const KW* w = static_cast<const KW*>(a.weight);
      const KW* b = static_cast<const KW*>(a.bias);
      if (split)
        return kc::launch_cluster(kernel, dim3(unsigned(p.p4.grid)), dim3(unsigned(p.p4.threads)), 0, stream,
                                  unsigned(p.cluster), x, w, b, y, a.mean, a.rstd, a.rows, a.cols,
                                  a.cols / p.cluster, a.eps, p.c4.tpr, w_f32, static_cast<const T*>(nullptr),
                                  static_cast<T*>(nullptr));
      kernel<<<unsigned(p.p4.grid), p.p4.threads, 0, stream>>>(
          x, w, b, y, a.mean, a.rstd, a.rows, a.cols, a.cols, a.eps, p.c4.tpr, w_f32,
          static_cast<const T*>(a.residual), static_cast<T*>(a.sum));
      KC_CUDA_LAUNCH_TRY();
      return cudaSuccess;
    });
  });
}

}  // namespace day26
