// Shared by the forward and backward files (layernorm_fwd_*.cu, layernorm_bwd_*.cu):
// the launch configurations of the families, the row-slot and ring helpers,
// and the dtype dispatch.
#pragma once

#include <cstdint>
#include <tuple>
#include <type_traits>
#include <cuda_runtime.h>

#include "layernorm.h"

#include "kc/cluster.cuh"
#include "kc/convert.cuh"
#include "kc/device.h"
#include "kc/launch.cuh"
#include "kc/reduce.cuh"
#include "kc/switch.cuh"
#include "kc/vec.cuh"

namespace day26 {

// v2 holds a row in registers: each of the row's `tpr` threads owns
// iters * vec elements ("elements per thread").
//   warp path  (rows of <= 512 elements): one warp per row, 8 rows per block,
//              at most 16 elements per thread;
//   block path (rows up to 16384):        one block per row, tpr in 128..512
//              (launch bounds 512: up to 128 registers per thread, so 32
//              elements of x and 32 of dy stay in registers without spills).
constexpr int kMaxEpt = 32;
constexpr int kMaxEptWarp = 16;
constexpr int kMaxTpr = 512;
constexpr int kWarpRowsPerBlock = 8;

struct V2Config {
  bool ok = false;   // false: the row is too long for registers, use v1
  bool warp = false;
  int vec = 1;       // elements per vector access
  int iters = 1;     // vector accesses per thread per row
  int tpr = 32;      // threads per row
  int threads = 256; // threads per block
};

inline int next_pow2(int64_t v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Vector accesses per thread the block path aims at (more: fewer threads per
// row and more bytes in flight per thread; fewer: more threads, fewer
// registers). Knob kKnobTargetIters (1, 2, 4, 8); default kDefaultTargetIters.
constexpr int kDefaultTargetIters = 4;
inline int target_iters() {
  const int v = ln_knob(kKnobTargetIters);
  return (v == 1 || v == 2 || v == 4 || v == 8) ? v : kDefaultTargetIters;
}

// vec: the vector width that every pointer and the row length allow (1 or 16 bytes' worth).
inline V2Config v2_config(int64_t cols, int vec) {
  V2Config c;
  c.vec = vec;
  const int64_t nv = (cols + vec - 1) / vec;  // vector accesses per row
  if (nv <= 32 * (kMaxEptWarp / vec) && cols <= 512) {
    c.warp = true;
    c.tpr = 32;
    c.iters = next_pow2((nv + 31) / 32);
    c.threads = 32 * kWarpRowsPerBlock;
  } else {
    // aim at target_iters() vector accesses per thread, then clamp the block size
    const int ti = target_iters();
    int tpr = next_pow2((nv + ti - 1) / ti);
    tpr = tpr < 128 ? 128 : (tpr > kMaxTpr ? kMaxTpr : tpr);
    c.tpr = tpr;
    c.threads = tpr;
    c.iters = next_pow2((nv + tpr - 1) / tpr);
  }
  c.ok = c.iters * vec <= (c.warp ? kMaxEptWarp : kMaxEpt) && c.iters <= 16;
  return c;
}

// Bytes per element of x, y, dy, dx.
inline size_t elem_size(kc::DType d) { return d == kc::DType::F32 ? 4 : 2; }

// f(std::integral_constant<int, I>{}) for I = iters among 1, 2, 4, 8, 16 up to
// kMax; `otherwise` for any other iters. The compile-time ITERS of a kernel from
// a plan's run-time iters: instantiates nothing above kMax.
template <int kMax, typename R, typename F>
R with_iters(int iters, R otherwise, F&& f) {
  switch (iters) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: if constexpr (kMax >= 2) return f(std::integral_constant<int, 2>{}); break;
    case 4: if constexpr (kMax >= 4) return f(std::integral_constant<int, 4>{}); break;
    case 8: if constexpr (kMax >= 8) return f(std::integral_constant<int, 8>{}); break;
    case 16: if constexpr (kMax >= 16) return f(std::integral_constant<int, 16>{}); break;
  }
  return otherwise;
}

// f(T{}, TW{}) for the input dtype T and the weight dtype TW (T or float).
template <typename F>
auto ln_typed(kc::DType dt, kc::DType wdt, F&& f) {
  const bool w_f32 = wdt == kc::DType::F32;
  return KC_DTYPE_SWITCH(dt, T, [&] {
    return KC_BOOL_SWITCH(w_f32, kWF32, [&] {
      using TW = typename std::conditional<kWF32, float, T>::type;
      return f(T{}, TW{});
    });
  });
}

// f(T{}) for the input dtype T: kernels whose weight dtype is a run-time value
// (TW = void below), one instantiation for both weight dtypes.
template <typename F>
auto ln_input_typed(kc::DType dt, F&& f) {
  return KC_DTYPE_SWITCH(dt, T, [&] { return f(T{}); });
}

// Number of multiprocessors of the current device (read once per device).
using kc::num_sms;

// A thread's share of one row, in the storage dtype: ITERS vectors of VEC
// elements at columns (it * tpr + t) * VEC. Entries past the row end are never
// loaded and never read (every use is guarded by the same column test).
template <typename T, int VEC, int ITERS>
struct RowRegs {
  kc::Vec<T, VEC> v[ITERS];
};

template <typename T, int VEC, int ITERS>
__device__ __forceinline__ void load_row(RowRegs<T, VEC, ITERS>& r, const T* __restrict__ p, int64_t D, int tpr,
                                         int t) {
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int64_t c = (int64_t(it) * tpr + t) * VEC;
    if (c < D) r.v[it] = kc::load_vec<VEC>(p + c);
  }
}

// Which of a thread's ITERS vectors lie inside the row, computed once per
// kernel: the forward tests it for every vector of every row (five times per
// row), and the 64-bit column compare it replaces cost about 4 instructions each
// time (the compiler recomputed it per row).
template <int VEC, int ITERS>
struct RowCols {
  unsigned mask = 0;  // bit it: vector it of this thread is inside the row
  int first = 0;      // column of vector 0 (t * VEC); vector it at first + it * step
  int step = 0;       // tpr * VEC
  __device__ __forceinline__ RowCols(int64_t D, int tpr, int t) : first(t * VEC), step(tpr * VEC) {
#pragma unroll
    for (int it = 0; it < ITERS; ++it)
      if (int64_t(first) + int64_t(it) * step < D) mask |= 1u << it;
  }
  __device__ __forceinline__ bool has(int it) const { return (mask >> it) & 1u; }
  __device__ __forceinline__ int col(int it) const { return first + it * step; }
};

template <typename T, int VEC, int ITERS>
__device__ __forceinline__ void load_row(RowRegs<T, VEC, ITERS>& r, const T* __restrict__ p,
                                         const RowCols<VEC, ITERS>& rc) {
#pragma unroll
  for (int it = 0; it < ITERS; ++it)
    if (rc.has(it)) r.v[it] = kc::load_vec<VEC>(p + rc.col(it));
}

// v3: a cp.async pipeline of `stages` rows per block in shared memory (the
// tensors a row needs: x for the forward, x and dy for the backward).
// Occupancy first: a stage budget that lets four blocks share an SM (each
// warp's per-row compute and reductions need other warps to hide them), then
// two, then one; at least two stages (one in flight while one is used), at
// most kMaxStages. Fewer than two stages in the largest budget: v2 instead.
// (Run 5, H200: a 100 KB budget gave 8 warps/SM and lost to v2 on most shapes.)
constexpr int kMaxStages = 4;
inline int pipe_stages(size_t bytes_per_row) {
  for (size_t budget : {size_t(52) << 10, size_t(104) << 10, size_t(208) << 10}) {
    const size_t s = budget / bytes_per_row;
    if (s >= 2) return s > kMaxStages ? kMaxStages : int(s);
  }
  return 0;
}
// v3 uses more threads per row than v2 (half the vectors per thread): with
// the row in shared memory, threads cost no data registers.
inline V2Config v3_config(int64_t cols, int vec) {
  V2Config c = v2_config(cols, vec);
  if (!c.warp && c.iters > 1 && c.tpr < kMaxTpr) {
    c.tpr *= 2;
    c.threads = c.tpr;
    c.iters /= 2;
  }
  return c;
}

// Blocks of a persistent grid: what fits at once, but no more than rows / 8
// (at least one per SM), so every block sees enough rows to fill its pipeline
// and, in the backward, the per-block partial sums stay small next to the data.
inline int64_t persistent_grid(int64_t rows, int per_sm) {
  const int64_t fit = int64_t(num_sms()) * (per_sm > 0 ? per_sm : 1);
  int64_t want = rows / 8;
  if (want < num_sms()) want = num_sms();
  int64_t g = fit < want ? fit : want;
  return g < rows ? g : rows;
}

// ---------------------------------------------------------------------- v1
// v1: one block per row, a pass over the row per statistic. Two launch shapes
// (V1Shape): rows of up to kV1LongCols columns keep the seed's, 256 threads with
// one access in flight each, eight blocks an SM; longer rows, which run v1 when
// they have no 16-byte vectors (the other families cannot hold them), take 1024
// threads with eight accesses in flight each (the backward four: two rows' loads
// a column) and keep the row's raw elements in dynamic shared memory where they
// fit kV1CacheBytes, so the later passes read shared memory, not global memory.
// At 56 registers that is one block an SM; 256 threads at six blocks an SM
// measured up to 1.6x slower at 16383-32767 columns, 512 at two 5-15% faster at
// 16383 but 10-18% slower at 32767 and 65535 (H200).
constexpr int64_t kV1LongCols = 8192;
constexpr size_t kV1CacheBytes = 96 * 1024;
template <bool kLong>
struct V1Shape {
  static constexpr int kThreads = kLong ? 1024 : 256;
  static constexpr int kMinBlocks = kLong ? 1 : 8;
  static constexpr int kBatch = kLong ? 8 : 1;  // accesses in flight a thread (v1_walk)
};
inline bool v1_long(int64_t cols) { return cols > kV1LongCols; }
inline int v1_threads(int64_t cols) { return v1_long(cols) ? V1Shape<true>::kThreads : V1Shape<false>::kThreads; }
// The shared-memory bytes of a long row of `cols` columns of `bytes_per_col` (0: not cached).
inline size_t v1_cache_bytes(int64_t cols, size_t bytes_per_col) {
  const size_t b = size_t(cols) * bytes_per_col;
  return v1_long(cols) && b <= kV1CacheBytes ? b : 0;
}
// The cache a plan gives `kernel`: `bytes` where the device lets the kernel have
// them (kc::allow_dynamic_smem), else 0 (the row read from global memory per pass).
template <typename Kernel>
size_t v1_cache_granted(Kernel kernel, size_t bytes) {
  return bytes && kc::allow_dynamic_smem(kernel, bytes) == cudaSuccess ? bytes : 0;
}

// v1's walk over a row: use(c, load(c)) for c = threadIdx.x, + blockDim.x, ...
// below D, in batches of K whose loads are all issued before their uses (K
// accesses in flight a thread, not one).
template <int K, typename Load, typename Use>
__device__ __forceinline__ void v1_walk(int64_t D, Load&& load, Use&& use) {
  const int64_t step = blockDim.x;
  for (int64_t c0 = threadIdx.x; c0 < D; c0 += K * step) {
    decltype(load(c0)) v[K];
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (c0 + k * step < D) v[k] = load(c0 + k * step);
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (c0 + k * step < D) use(c0 + k * step, v[k]);
  }
}

// ---------------------------------------------------------------------- v4
// v4 ("row slots"): a block holds `slots` independent row teams ("slots") of
// tpr threads each (tpr a multiple of 32); a slot walks its rows alone, syncing
// only its own threads (a warp shuffle, then a named barrier when tpr > 32),
// so the slots of a block never wait for each other. Each thread owns the same
// iters * vec columns in every row of its slot, which lets the backward keep
// its dgamma/dbeta sums in registers (or in a shared-memory row per slot), and
// one partial row per block (not per row team) goes to the finalize kernel.
// Optionally (kPrefetch) the next row of x (and dy) is loaded into registers
// while the current one is computed.
constexpr int kV4SmallThreads = 512;  // threads per block at most (128 registers a thread)
constexpr int kV4MaxSlots = 16;  // named barriers 1..15 (0 is __syncthreads); warp slots need none

// The one ITERS of the v4 kernels without 16-byte vectors (v4_config's most).
constexpr int kV4ScalarIters = 4;

struct V4Config {
  bool ok = false;  // false: no v4 shape for this row (too long): use v2
  int vec = 1;      // elements per vector access
  int iters = 1;    // vector accesses per thread per row (1, 2 or 4; kV4ScalarIters when vec = 1)
  int tpr = 32;     // threads per row (a multiple of 32, <= 512)
};

// Elements per thread v4 aims at (registers: x, dy and, in the backward, two
// fp32 accumulators per element): 16 (8 or 32 measured no better: README's log).
constexpr int kV4TargetEpt = 16;
// Whether v4's forward, where a thread holds 4 vectors of a row (one row slot
// per SM: 16-bit rows over 8192 columns, fp32 shares of 8192 in the cluster
// split), also asks the copy engine to prefetch into L2 the row after the one
// it prefetches into registers: knob kKnobL2Prefetch (0, 1; default 1; README's log).
inline bool v4_l2_prefetch() { return ln_knob(kKnobL2Prefetch) != 0; }

// The largest iters (most elements per thread, up to the target) whose rounding
// of tpr up to a multiple of 32 leaves at most 1/8 of the lanes idle; failing
// that, the one that leaves the fewest.
inline V4Config v4_config(int64_t cols, int vec) {
  V4Config c;
  c.vec = vec;
  const int64_t nv = (cols + vec - 1) / vec;
  const int ept = kV4TargetEpt;
  int64_t best_waste = -1;
  for (int iters : {4, 2, 1}) {
    if (iters * vec > ept && iters > 1) continue;
    const int64_t tpr = ((nv + iters - 1) / iters + 31) / 32 * 32;
    if (tpr > kV4SmallThreads) continue;
    const int64_t waste = tpr * iters - nv;
    if (waste * 8 <= nv) {
      c.ok = true, c.iters = iters, c.tpr = int(tpr);
      return c;
    }
    if (best_waste < 0 || waste < best_waste) {
      best_waste = waste;
      c.ok = true, c.iters = iters, c.tpr = int(tpr);
    }
  }
  if (!c.ok && vec > 1) {  // long rows: more than the target per thread, up to 4 vectors
    const int64_t tpr = ((nv + 3) / 4 + 31) / 32 * 32;
    if (tpr <= kV4SmallThreads) c.ok = true, c.iters = 4, c.tpr = int(tpr);
  }
  // Without 16-byte vectors (a fallback) one instantiation serves every row:
  // the threads per row chosen above, ITERS = kV4ScalarIters (a thread's
  // accesses past the row end are masked off, as at every row end).
  if (c.ok && vec == 1) c.iters = kV4ScalarIters;
  return c;
}

// Knob kKnobGrid = N (tests): at most N blocks in v4's persistent grids, so each
// slot walks many rows (unset: no cap).
inline int64_t v4_grid_cap() {
  const int v = ln_knob(kKnobGrid);
  return v > 0 ? v : 0;
}

// Launch shape of a v4 kernel: slots per block and the persistent grid.
struct V4Plan {
  int slots = 1;
  int threads = 32;
  size_t smem = 0;
  int64_t grid = 0;
  int per_sm = 1;     // blocks resident per SM
  bool fits = false;  // false: no block shape fits (the plan falls back to one slot)
};

// Picks, among blocks of 1024, 768, 512, 384, 256 or 128 threads or one slot
// (at most max_threads, the kernel's launch bound), the one that keeps the most
// threads resident per SM (ties: the larger block, fewer dgamma/dbeta partials).
// Dynamic shared memory: smem_per_slot for each slot plus smem_per_thread for
// each thread of the slots after the first. Kept per (kernel, tpr, device,
// smem_per_slot) and thread (kc::detail::ThreadTable): occupancy queries cost host time.
// grid = min(blocks that fit at once, blocks with a row to do).
template <typename Kernel>
V4Plan v4_plan(Kernel kernel, int tpr, int max_threads, int64_t rows, size_t smem_per_slot,
               size_t smem_per_thread) {
  auto smem_of = [&](int s) { return size_t(s) * smem_per_slot + size_t(s - 1) * tpr * smem_per_thread; };
  struct Shape { int slots, per_sm; bool fits; };
  static thread_local kc::detail::ThreadTable<std::tuple<const void*, int, int, size_t>, Shape, 64> shapes;
  int dev = 0;
  cudaGetDevice(&dev);
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), tpr, dev, smem_per_slot);
  int slots = 0, per_sm = 0;
  bool fits = true;
  if (const Shape* known = shapes.find(key)) slots = known->slots, per_sm = known->per_sm, fits = known->fits;
  if (slots == 0) {
    const int max_slots = tpr == 32 ? max_threads / 32 : (kV4MaxSlots - 1 < max_threads / tpr ? kV4MaxSlots - 1 : max_threads / tpr);
    int best = -1;
    for (int threads : {1024, 768, 512, 384, 256, 128, tpr}) {
      if (threads % tpr) continue;
      const int s = threads / tpr;
      if (s < 1 || s > max_slots) continue;
      const size_t smem = smem_of(s);
      if (kc::allow_dynamic_smem(kernel, smem) != cudaSuccess) continue;
      int n = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) != cudaSuccess || n < 1) continue;
      if (n * threads > best) best = n * threads, slots = s, per_sm = n;
    }
    cudaGetLastError();  // clear what a refused configuration left
    if (slots == 0) slots = 1, per_sm = 1, fits = false;
    shapes.put(key, Shape{slots, per_sm, fits});
  }
  V4Plan p;
  p.fits = fits;
  p.per_sm = per_sm;
  p.slots = slots;
  p.threads = slots * tpr;
  p.smem = smem_of(slots);
  if (fits) kc::allow_dynamic_smem(kernel, p.smem);
  const int64_t blocks = (rows + slots - 1) / slots;
  int64_t cap = int64_t(num_sms()) * per_sm;
  const int64_t test_cap = v4_grid_cap();
  if (test_cap > 0 && test_cap < cap) cap = test_cap;
  p.grid = blocks < cap ? blocks : cap;
  return p;
}

// The ring (versions 5, 6): each slot keeps its next rows in flight into a
// shared-memory ring of `stages` rows (the tensors a row needs, padded to
// tpr * iters * vec elements), filled by the copy engine (sm_90+), so the loads
// run ahead of the slot's reductions without costing registers. At most
// kRingMaxStages stages.
constexpr int kRingMaxStages = 6;

// Rows split across a cluster of CTAs (sm_90+; the ring backward, and the v4
// forward for fp32): CTA rank r of a cluster owns columns [r * D / size,
// (r + 1) * D / size) of the rows its cluster walks, and the CTAs exchange
// what a row needs (the backward's two row sums, the forward's mean and m2)
// through distributed shared memory. Split so that a CTA owns at most 8192
// columns (H200, README: splitting 8192 into 2 x 4096 measured slower, 16384
// into 4 no faster than into 2), in clusters of at most kRingMaxCluster; only
// sizes whose share is a whole number of 16-byte vectors.
// Knob kKnobCluster = 1, 2 or 4 overrides (1: no split, which in the backward's
// ring holds rows of at most kRingCtaCols; set, it splits 16-bit forward rows
// too), for shares over kClusterMinShare columns only
// (layernorm_knobs.h: smaller shares have no kernel, and the glue refuses them).
constexpr int kRingMaxCluster = 4;
constexpr int64_t kRingCtaCols = 8192;
static_assert(kClusterMinShare == kRingCtaCols / 2, "the plan's own splits leave each CTA over half its most");
// The ITERS (v4_config's, vectors a thread) of a share over kClusterMinShare
// columns, the only ones the split kernels are compiled for: fp32 4 (1025-2048
// vectors: more than 512 threads at 2), 16-bit 2 (513-1024 vectors, 16 elements a
// thread) or, over 8192 columns, 4 (v4_config's long rows).
template <typename T, int ITERS>
constexpr bool kClusterIters = sizeof(T) == 4 ? ITERS == 4 : ITERS >= 2;
// kKnobCluster's value when it is 1, 2 or 4; else 0 (not set).
inline int ring_cluster_env() {
  const int v = ln_knob(kKnobCluster);
  return v == 1 || v == 2 || v == 4 ? v : 0;
}
inline bool ring_cluster_forced() { return ring_cluster_env() != 0; }
inline int ring_cluster(int64_t D, int vec) {
  const int v = ring_cluster_env();
  int c = 1;
  if (v != 0) {
    c = v;
  } else {
    while (c < kRingMaxCluster && D > kRingCtaCols * c) c *= 2;
  }
  while (c > 1 && D % (int64_t(c) * vec) != 0) c /= 2;
  return c;
}

// A slot's exchange of one pair of floats per row among the CTAs of a cluster
// (the ring backward's two row sums, the cluster forward's mean and m2): every
// CTA sends its pair to every CTA (itself included) with an asynchronous store
// into distributed shared memory (st.async) that completes 8 bytes on the
// receiver's mbarrier, which thread 0 of the receiving slot arms each round
// with the bytes expected. kX buffers rotate by row: round j uses buffer j % kX
// and its mbarrier's phase j / kX. Reusing a buffer two rows later is safe when
// a CTA sends row j + 1 only after every thread of its slot finished reading
// row j's pairs (both kernels send after the slot's barrier of row j + 1).
// Device code, sm_90+; buf: [kX][kRingMaxCluster] float2, bar: [kX] uint64_t,
// both in this CTA's shared memory.
struct ClusterPairs {
  static constexpr int kX = 2;
  float2* buf;
  uint64_t* bar;
  unsigned csize, crank;
  // thread 0 of the slot, before the cluster_sync that precedes any send
  __device__ __forceinline__ void init() const {
    for (int k = 0; k < kX; ++k) kc::mbar_init(&bar[k], 1);
  }
  __device__ __forceinline__ void arm_all() const {  // thread 0, after mbar_init_fence
    for (int k = 0; k < kX; ++k) kc::mbar_arrive_expect_tx(&bar[k], bytes());
  }
  __device__ __forceinline__ unsigned bytes() const { return csize * unsigned(sizeof(float2)); }
  // threads t < csize of the slot: this CTA's pair of row j to rank t
  __device__ __forceinline__ void send(int64_t j, int t, float a, float b) const {
    const int xb = int(j % kX);
    if (t < int(csize))
      kc::st_async_cluster(kc::map_rank(&buf[xb * kRingMaxCluster + crank], unsigned(t)), a, b,
                           kc::map_rank(&bar[xb], unsigned(t)));
  }
  // every thread of the slot: wait for row j's pairs; rank q's at [q]
  __device__ __forceinline__ const float2* wait(int64_t j) const {
    const int xb = int(j % kX);
    kc::mbar_wait(&bar[xb], unsigned(j / kX) & 1u);
    return buf + xb * kRingMaxCluster;
  }
  // thread 0, after its wait(j): arm the buffer's next round (row j + kX)
  __device__ __forceinline__ void rearm(int64_t j, int t) const {
    if (t == 0) kc::mbar_arrive_expect_tx(&bar[int(j % kX)], bytes());
  }
};

// Clusters of `csize` blocks of plan p's shape for a persistent grid: as many as
// run at once (the occupancy API; cached), but no more than have rows to do
// (and no more than kKnobGrid blocks' worth). 0: no such cluster fits.
template <typename Kernel>
int64_t cluster_groups(Kernel kernel, const V4Plan& p, int csize, int64_t rows) {
  const int n = p.fits ? kc::max_active_clusters_cached(kernel, p.threads, p.smem, unsigned(csize)) : 0;
  int64_t g = (rows + p.slots - 1) / p.slots;
  if (g > n) g = n;
  if (v4_grid_cap() > 0) {  // tests: at most that many blocks, but at least one cluster
    const int64_t cap = v4_grid_cap() / csize > 0 ? v4_grid_cap() / csize : 1;
    if (g > cap) g = cap;
  }
  return g;
}

// A barrier among the `nthreads` threads (a multiple of 32) that use barrier `id` (1..15).
__device__ __forceinline__ void named_barrier(int id, int nthreads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}

// Sums each of v[0..N) over the threads of one slot (nw warps; the slot's warp
// index wis, lane). All of the slot's threads get the sums. red: this slot's
// 2 * 32 * N floats, used by parity (flipped here): one barrier per call, since
// a slot cannot reach call i + 2 before all of it has passed call i + 1's
// barrier, i.e. finished reading call i's half. After the barrier every warp
// adds the nw warp totals itself (no second barrier): lane w loads warp w's and a
// butterfly adds them. kFew (the ring backward): slots of 2-4 warps read the
// totals directly instead (each thread all of them, broadcast loads, added in
// warp order: no shuffles; the 2-warp slots of 1024-column 16-bit rows paid a
// 5-level butterfly for 2 values). (The same branch in the forward's kernels
// made its 16-bit rows of 8192-16384 columns 1-3% slower on an H200, where
// every slot has 8-16 warps: docs/log.md, 2026-11-26.)
template <int N, bool kFew = false>
__device__ __forceinline__ void slot_reduce_sum(float (&v)[N], float* red, int& parity, int barrier_id, int nw,
                                                int wis, int lane) {
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = kc::warp_reduce_sum(v[k]);
  if (nw == 1) return;
  float* r = red + parity * 32 * N;
  if (lane == 0)
#pragma unroll
    for (int k = 0; k < N; ++k) r[wis * N + k] = v[k];
  named_barrier(barrier_id, nw * 32);
  if (kFew && nw <= 4) {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = r[k];
#pragma unroll
    for (int w = 1; w < 4; ++w)
      if (w < nw)
#pragma unroll
        for (int k = 0; k < N; ++k) v[k] += r[w * N + k];
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = kc::warp_reduce_sum(lane < nw ? r[lane * N + k] : 0.f);
  }
  parity ^= 1;
}

// Load VEC elements of T starting at p (aligned when VEC > 1) as fp32.
template <typename T, int VEC>
__device__ __forceinline__ void load_f32(const T* p, float (&out)[VEC]) {
  kc::vec_to_float(kc::load_vec<VEC>(p), out);
}

// VEC weights (or `fill` when p is null: weight 1, bias 0) as fp32.
template <typename TW, int VEC>
__device__ __forceinline__ void load_param(const TW* p, int64_t c, float fill, float (&out)[VEC]) {
  if (p) {
    load_f32<TW, VEC>(p + c, out);
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] = fill;
  }
}

// VEC parameters (weight or bias) at column c as fp32 (`fill` where p is null),
// their dtype a run-time flag: fp32 when w_f32 (always for T = float), else T.
// One uniform branch per vector, in kernels that only a forced version or a
// knob reaches (never version 0's plan), where one instantiation then serves both
// weight dtypes (TW = void below). A kernel on the plan's path that reads its
// weights with every row keeps their dtype a template argument (a branch there
// cost the forward 9% on an H100: docs/log.md, 2026-11-25).
template <typename T, int VEC>
__device__ __forceinline__ void load_param_any(const void* p, bool w_f32, int64_t c, float fill,
                                               float (&out)[VEC]) {
  if (std::is_same<T, float>::value || w_f32) {
    load_param<float, VEC>(static_cast<const float*>(p), c, fill, out);
  } else {
    load_param<T, VEC>(static_cast<const T*>(p), c, fill, out);
  }
}

// load_param for a weight dtype TW, load_param_any (the flag w_f32) for TW = void.
template <typename T, typename TW, int VEC>
__device__ __forceinline__ void load_param_w(const TW* p, bool w_f32, int64_t c, float fill, float (&out)[VEC]) {
  if constexpr (std::is_void<TW>::value) {
    load_param_any<T, VEC>(p, w_f32, c, fill, out);
  } else {
    load_param<TW, VEC>(p, c, fill, out);
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void store_from_f32(T* p, const float (&in)[VEC]) {
  kc::store_vec<VEC>(p, kc::vec_from_float<T>(in));
}

}  // namespace day26
