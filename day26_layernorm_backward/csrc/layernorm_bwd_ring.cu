// LayerNorm backward, versions 5 (ring) and 6 (cluster split): version 4's row
// slots and register sums, with each slot's next rows of x and dy in a
// shared-memory ring filled by the copy engine (sm_90+, 16-byte vectors); in
// version 6 each row is also split across the CTAs of a thread-block cluster,
// the two row sums exchanged through distributed shared memory. The kernel's
// comment below has the details. Version 6 that cannot run (a row that does not
// split into whole 16-byte vectors, no cluster that fits) runs 5; 5 runs 4.
#include "layernorm_bwd_common.cuh"

#include "kc/bulk_copy.cuh"
#include "kc/check.cuh"
#include "kc/cluster.cuh"
#include "kc/reduce.cuh"

namespace day26 {
namespace {

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
// in registers when it owns at most 16 columns (kRingWReg; else they are read with
// each row): those kernels are compiled once for both weight dtypes (TW = void,
// the dtype a run-time flag w_f32 read once at kernel start: load_weights_once),
// the others per weight dtype (TW; w_f32 unused).
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
// it (so a row share is a multiple of 16 bytes); D = cluster size * Dc (kCluster:
// Dc over kClusterMinShare columns, kClusterIters' shares); blockDim.x
// = slots * tpr, tpr a multiple of 32; 2 <= stages <= kRingMaxStages; dynamic
// shared memory: slots * stages * 2 * span elements of T, span = tpr * ITERS *
// VEC >= Dc (slot k's ring at k * stages * 2 * span; stage s: x at s * 2 * span,
// dy after it), at least the (slots - 1) * tpr * ITERS * 2 * VEC floats of the
// end-of-kernel slot sum. partial: [clusters (or blocks)][2][D] when kPartials.
// Registers: the dx-only kernels (no column sums) are held to 64, i.e. two
// 512-thread blocks per SM (unbounded, ptxas gave some of them ~100 once pass 2
// got shorter); the others are unbounded (a minimum of 0 blocks leaves it
// unspecified; even an explicit 1 changes ptxas's allocation: probe run 52).
// kDsum (add_norm): dx += dsum (the gradient of the sum output), this thread's
// vectors of the row's dsum loaded into registers from global memory once the
// row has landed, ahead of pass 1 and the reduction that hide their latency (not
// through the ring: no third row of shared memory per stage); dsum unused without it.
// kRms (RMSNorm's split rows with column sums; mean null): no mean, no sum of g,
// no dbias sums (bwd_vec_pass1), one row sum reduced. Only where a row is split:
// there each row's compute is exposed (one slot a CTA waits on the row's
// exchange), and RMSNorm 4096x16384 bf16's backward took 106 against 120 us
// (H200); the unsplit rings keep one kernel for both norms (their own RMSNorm
// kernels were as fast alone, and 1-2% slower in the step at 16-bit rows of
// 4096-8192 columns, 16384-32768 rows, with the finalize's blocks resident
// beside them: ptxas left them room, 85 registers instead of 115).
template <typename T, typename TW, int ITERS, bool kPartials, bool kCluster, bool kDsum = false, bool kRms = false>
__global__ void __launch_bounds__(kV4SmallThreads, kPartials ? 0 : 2)
ln_bwd_ring(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
            const float* __restrict__ rstd, const TW* __restrict__ w, T* __restrict__ dx,
            float* __restrict__ partial, int64_t rows, int64_t D, int64_t Dc, int tpr, int stages, bool w_f32,
            const T* __restrict__ dsum) {
  constexpr int VEC = kc::max_vec_elems<T>();
  constexpr bool kWReg = kRingWReg<T, ITERS>;  // the weights in registers too
  static_assert(kWReg == std::is_void<TW>::value, "TW = void exactly where the weights sit in registers");
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
  const bool center = !kRms && mean != nullptr;  // LayerNorm (RMSNorm: mean null)
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
  if constexpr (kWReg) load_weights_once<T, VEC, ITERS>(wf, w, w_f32, col0, Dc, tpr, t);
  auto weights = [&](int it, int64_t c, float (&wv)[VEC]) {
    if constexpr (kWReg) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) wv[j] = wf[it][j];
    } else {
      load_param<TW, VEC>(w, col0 + c, 1.f, wv);
    }
  };
  const RowCols<VEC, ITERS> rc(Dc, tpr, t);  // this thread's vectors (columns < Dc: a mask, int offsets)
  // The ring read by 32-bit shared-memory addresses: this thread's first vector
  // of x in stage 0, dy span elements after it, stage s at s * stage_bytes.
  const unsigned my_x = kc::smem_u32(ring) + unsigned(rc.first) * unsigned(sizeof(T));
  const unsigned stage_bytes = unsigned(2 * span) * unsigned(sizeof(T));
  const unsigned dy_bytes = unsigned(span) * unsigned(sizeof(T));
  const unsigned step_bytes = unsigned(rc.step) * unsigned(sizeof(T));
  auto row_vecs = [&](int s, int it, kc::Vec<T, VEC>& xv, kc::Vec<T, VEC>& dv) {
    const unsigned a = my_x + unsigned(s) * stage_bytes + unsigned(it) * step_bytes;
    xv = kc::load_shared_vec<T, VEC>(a);
    dv = kc::load_shared_vec<T, VEC>(a + dy_bytes);
  };
  // pass 1 of the row in stage s: this thread's share of the row sums of g = dy * w
  // and g * xhat; dy * xhat and dy added to its column sums
  auto pass1 = [&](int s, float mu, float rs, float (&sums)[2]) {
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      if (rc.has(it)) {
        kc::Vec<T, VEC> xv, dv;
        row_vecs(s, it, xv, dv);
        float wv[VEC];
        weights(it, rc.col(it), wv);
        bwd_vec_pass1<T, VEC, kPartials, kRms>(xv, dv, wv, mu, rs, sums, accw[it], accb[it]);
      }
    }
  };
  // pass 2: dx of row r (in stage s) from the whole row's sums, the row read again from the ring
  auto pass2 = [&](int s, int64_t r, float mu, float rs, const float (&sums)[2],
                   const RowRegs<T, VEC, ITERS>& ds) {
    if (!dx) return;
    const DxRow dr(mu, rs, sums, inv_d, center);
    T* dxr = dx + r * D + col0;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      if (rc.has(it)) {
        kc::Vec<T, VEC> xv, dv;
        row_vecs(s, it, xv, dv);
        float wv[VEC];
        weights(it, rc.col(it), wv);
        if constexpr (kDsum)
          bwd_vec_dx<T, VEC, true>(xv, dv, wv, dr, dxr + rc.col(it), &ds.v[it]);
        else
          bwd_vec_dx<T, VEC>(xv, dv, wv, dr, dxr + rc.col(it));
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
  if (row < rows) mu_next = kRms ? 0.f : load_mean(mean, row), rs_next = rstd[row];

  int stage = 0, parity = 0;
  unsigned phase = 0;  // parity of the ring's current round (every stage completes once per round)
  for (int64_t i = 0; row < rows; row += stride, ++i) {
    const float mu = mu_next, rs = rs_next;
    if (row + stride < rows) mu_next = kRms ? 0.f : load_mean(mean, row + stride), rs_next = rstd[row + stride];
    kc::mbar_wait(&bars[stage], phase);  // this row has landed
    RowRegs<T, VEC, ITERS> ds;
    if constexpr (kDsum) load_row(ds, dsum + row * D + col0, rc);
    float sums[2] = {0.f, 0.f};
    pass1(stage, mu, rs, sums);
    if constexpr (kRms) {  // sums[0] stays 0
      float s1[1] = {sums[1]};
      slot_reduce_sum<1, true>(s1, red[slot], parity, 1 + slot, nw, wis, lane);
      sums[1] = s1[0];
    } else {
      slot_reduce_sum<2, true>(sums, red[slot], parity, 1 + slot, nw, wis, lane);
    }
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
    pass2(stage, row, mu, rs, sums, ds);
    if (++stage == stages) stage = 0, phase ^= 1u;
  }
  // every row issued was waited for above: no copy is in flight into the buffer below.
  // The dbias half is LayerNorm's; a split kernel with column sums runs LayerNorm only
  // (RMSNorm's is kRms), and writes it without the run-time test, which slowed its row
  // loop by 5% (4096x16384 bf16, H200: 115.7 against 109.7 us).
  if constexpr (kPartials)
    slots_store_partial<VEC, ITERS>(accw, accb, reinterpret_cast<float*>(ring_smem),
                                    partial + group * 2 * D + col0, Dc, D, slots, slot, tpr, t,
                                    kCluster ? !kRms : center);
  if constexpr (kCluster) kc::cluster_sync();  // no CTA leaves while a peer may still access its shared memory
}

template <typename T, typename TW>
using RingKernel = void (*)(const T*, const T*, const float*, const float*, const TW*, T*, float*, int64_t, int64_t,
                            int64_t, int, int, bool, const T*);

// Version 5 (no split) holds rows of at most kRingCtaCols columns, as a CTA of
// version 6 does: v4_config gives them at most 16 elements a thread, so every
// unsplit kernel keeps its weights in registers (kRingWReg); the weights are
// read with every row only by the split 16-bit kernels with 4 vectors a thread
// (shares over 8192 columns). (16-bit rows over 8192 columns that do not split
// into whole 16-byte vectors, D = 8 mod 16, ran an unsplit kernel with 4 vectors
// a thread under version 0; they now run version 2, the table's fallback:
// layernorm_bwd_plan.cu.)

// f(kernel) with plan p's instantiation for the dtypes of `a`, nullptr where
// none is compiled: the weights in registers (kRingWReg) -> TW = void, one kernel
// for both weight dtypes; else TW, the weights' dtype. kCluster only at the
// ITERS that shares over kClusterMinShare columns have (kClusterIters: the
// plan's own splits; the cluster knob is refused for smaller shares); unsplit
// only where the weights sit in registers (rows of at most kRingCtaCols).
// p.dsum == 1: the kDsum instantiations, compiled where bwd_fuses_dsum allows
// (partial rows, not split). RMSNorm (a.mean null) split rows with partial rows:
// the kRms instantiations.
template <typename F>
auto with_ring_kernel(const LnBackwardArgs& a, const LnBwdPlan& p, F&& f) {
  return ln_input_typed(a.dt, [&](auto t) {
    using T = decltype(t);
    return KC_BOOL_SWITCH(p.partials, kP, [&] {
      return KC_BOOL_SWITCH(p.cluster > 1, kCl, [&] {
        return KC_BOOL_SWITCH(p.partials && p.cluster > 1 && !a.mean, kRms, [&] {
          auto typed = [&](auto tw) {
            using TW = typename decltype(tw)::type;
            using K = RingKernel<T, TW>;
            return with_iters<4>(p.iters, K(nullptr), [&](auto it) {
              constexpr int I = decltype(it)::value;
              constexpr bool kCompiled = kRingWReg<T, I> == std::is_void<TW>::value &&
                                         (kCl ? kClusterIters<T, I> : kRingWReg<T, I>) && (!kRms || (kP && kCl));
              if constexpr (kCompiled && kP && !kCl) {
                if (p.dsum == 1) return K(ln_bwd_ring<T, TW, I, kP, kCl, true, kRms>);
              }
              if constexpr (kCompiled) return p.dsum == 1 ? K(nullptr) : K(ln_bwd_ring<T, TW, I, kP, kCl, false, kRms>);
              return K(nullptr);
            });
          };
          if (p.iters * kc::max_vec_elems<T>() <= kRingWRegCols) return f(typed(std::common_type<void>{}));
          if (a.wdt == kc::DType::F32) return f(typed(std::common_type<float>{}));
          return f(typed(std::common_type<T>{}));
        });
      });
    });
  });
}

// Launches plan p's kernel: a plain grid (version 5) or clusters of p.cluster CTAs.
template <typename T, typename TW>
cudaError_t launch_ring(RingKernel<T, TW> kernel, const LnBackwardArgs& a, const LnBwdPlan& p, cudaStream_t stream) {
  const int64_t Dc = a.cols / p.cluster;
  const bool w_f32 = a.wdt == kc::DType::F32;
  const T* dsum = static_cast<const T*>(a.dsum);
  if (p.cluster == 1 || !kernel || p.grid <= 0)
    return launch_bwd_main<T, TW>(kernel, a, p, stream, Dc, p.tpr, p.stages, w_f32, dsum);
  const BwdPtrs<T, TW> q(a);
  return kc::launch_cluster(kernel, dim3(unsigned(p.grid)), dim3(unsigned(p.threads)), p.smem, stream,
                            unsigned(p.cluster), q.dy, q.x, a.mean, a.rstd, q.w, q.dx, a.workspace, a.rows, a.cols, Dc,
                            p.tpr, p.stages, w_f32, dsum);
}

// Stages of the ring (knob ring_stages overrides). H200 sweep of 2-6 stages over
// fp32 and bf16 rows of 512-8192 columns, 4096 and 16384 rows, RMSNorm and LayerNorm:
// - 3 by default: 16-bit rows in several slots an SM read 1-6% slower with each
//   stage more (4096x4096 bf16 34.3 / 35.0 / 35.7 / 36.3 us for 3-6), 2 much slower.
// - 16-bit rows with one slot an SM (shares over 4096 columns): 4 (16384x8192 bf16
//   199.6 -> 193.7 us, 16384x6144 166.6 -> 161.2; 4096 rows within 1%).
// - 4-byte rows of 1024-4096 columns: 5 where the block of five stages still holds
//   256 threads (fewer slots, each further ahead): 4096x4096 fp32 61.8 -> 53.3 us
//   (row slots, version 4, ran it), 16384x4096 209.6 -> 194.9, 16384x2048 103.7 -> 99.0,
//   16384x1024 55.9 -> 53.5; else 3. Measured no faster elsewhere: 3072 columns (5 leave
//   one 192-thread slot: 46.9 against 44.0 us at 4096 rows), 512 and 768 (within 1%
//   at 16384 rows, up to 4% slower at 4096), 1536 and 2560 (within 1%), 5120 (1-1.6%
//   slower); 6144 and 8192 fit no five.
constexpr int kRingStages = 3;
constexpr int kRingStagesFp32 = 5, kRingStagesOneSlot = 4;
constexpr int kRingMinThreadsFp32 = 256;
constexpr int64_t kRingDeepMinCols = 1024, kRingDeepMaxCols = 4096;

}  // namespace

// p.cluster: 1 (version 5) or the CTAs per row (version 6, ring_cluster). A
// CTA's share of a row is D / cluster columns; its block shape is v4_config's for
// that share; slots per block and blocks: v4_plan with a ring of `stages` rows a
// slot (false: not even one slot's ring fits); version 6 launches as many
// clusters as fit at once (cluster_groups; false: none).
bool bwd_plan_ring(const LnBackwardArgs& a, LnBwdPlan& p) {
  const size_t elem = elem_size(a.dt);
  const int V = int(16 / elem);
  if (!kc::sm90_or_newer() || p.vec != V || p.cluster < 1 || a.cols % (int64_t(p.cluster) * V) != 0) return false;
  if (p.cluster == 1 && a.cols > kRingCtaCols) return false;  // no such kernel (with_ring_kernel)
  const V4Config cfg = v4_config(a.cols / p.cluster, V);
  if (!cfg.ok) return false;
  p.iters = cfg.iters;
  p.tpr = cfg.tpr;
  const int knob = ln_knob(kKnobRingStages);
  const bool forced = knob >= 2 && knob <= kRingMaxStages;
  return with_ring_kernel(a, p, [&](auto kernel) {
    if (!kernel) return false;
    const size_t row_bytes = 2 * size_t(p.tpr) * p.iters * V * elem;  // x and dy
    auto plan_of = [&](int stages) {
      return v4_plan(kernel, p.tpr, kV4SmallThreads, a.rows, size_t(stages) * row_bytes, 0);
    };
    // the depth (kRingStages' comment): a deeper ring taken only where it fits as measured
    p.stages = forced ? knob : kRingStages;
    V4Plan vp = plan_of(p.stages);
    if (!forced && vp.fits) {
      const int64_t share = a.cols / p.cluster;
      const bool fp32_deep = share >= kRingDeepMinCols && share <= kRingDeepMaxCols;
      const int deeper = elem == 4 ? (fp32_deep ? kRingStagesFp32 : 0)
                                   : (vp.slots == 1 && vp.per_sm == 1 ? kRingStagesOneSlot : 0);
      if (deeper) {
        const V4Plan d = plan_of(deeper);
        if (d.fits && (elem != 4 || d.threads >= kRingMinThreadsFp32)) p.stages = deeper, vp = d;
      }
    }
    if (!vp.fits) return false;
    const int64_t groups = p.cluster > 1 ? cluster_groups(kernel, vp, p.cluster, a.rows) : vp.grid;
    if (groups <= 0 && a.rows > 0) return false;
    p.slots = vp.slots;
    p.threads = vp.threads;
    p.smem = vp.smem;
    p.grid = groups * p.cluster;
    p.partial_rows = groups;  // one partial row per block, or per cluster
    return true;
  });
}

cudaError_t bwd_launch_ring(const LnBackwardArgs& a, const LnBwdPlan& p, cudaStream_t stream) {
  return with_ring_kernel(a, p, [&](auto kernel) { return launch_ring(kernel, a, p, stream); });
}

}  // namespace day26
