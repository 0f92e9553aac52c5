// LayerNorm backward, version 4: row slots (layernorm_common.cuh). A block
// holds several independent row teams ("slots") that walk their rows alone;
// each thread owns the same columns in every row of its slot, so the dweight /
// dbias sums stay in registers, and one partial row per block (not per row
// team) goes to the finalize. 16-bit rows of 512 to 1023 columns in 16-byte
// vectors also prefetch the next row into registers (the plan's rule,
// bwd_plan_v4; the only prefetching instantiations compiled). Rows that need
// more than 512 threads of 4 vectors, and 16-bit rows in 16-byte vectors over
// 8192 columns (kV4MaxCols16), run version 2.
#include "layernorm_bwd_common.cuh"

#include "kc/check.cuh"
#include "kc/reduce.cuh"

namespace day26 {
namespace {

// v4. Row slots (layernorm_common.cuh): blockDim.x = slots * tpr; slot k walks
// rows blockIdx.x * slots + k + i * gridDim.x * slots. Each thread keeps dy * xhat
// and dy for its columns in registers across all of its slot's rows; at the end
// the slots of a block add theirs in slot order through shared memory and slot 0
// writes the block's partial row. With kPrefetch the next row's x, dy, mean and
// rstd are loaded before the current row is reduced, so every slot keeps a row's
// loads in flight while it computes. The weights of a thread's columns are read
// once (fp32 registers) instead of once per row, so their dtype is a run-time
// flag (w_f32: fp32, else T; load_weights_once): one kernel for both.
// Dynamic shared memory (kPartials): when slots > 1, (slots - 1) * tpr * ITERS * 2 * VEC
// floats (the end-of-kernel slot sum).
// partial: [gridDim.x][2][D] fp32 when kPartials (every column written).
// kDsum (add_norm): dx += dsum (the gradient of the sum output), the row of
// dsum loaded before pass 1 so that its latency hides behind the row's reduction;
// without kDsum, dsum is unused.
template <typename T, int VEC, int ITERS, bool kPartials, bool kPrefetch, bool kDsum = false>
__global__ void __launch_bounds__(kV4SmallThreads)
ln_bwd_v4(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
          const float* __restrict__ rstd, const void* __restrict__ w, T* __restrict__ dx,
          float* __restrict__ partial, int64_t rows, int64_t D, int tpr, bool w_f32, const T* __restrict__ dsum) {
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
  load_weights_once<T, VEC, ITERS>(wf, w, w_f32, 0, D, tpr, t);

  const int64_t stride = int64_t(gridDim.x) * slots;
  int64_t row = int64_t(blockIdx.x) * slots + slot;
  int parity = 0;
  RowRegs<T, VEC, ITERS> cx, cd;
  float mu = 0.f, rs = 0.f;
  if (kPrefetch && row < rows) {
    load_row(cx, x + row * D, D, tpr, t);
    load_row(cd, dy + row * D, D, tpr, t);
    mu = load_mean(mean, row), rs = rstd[row];
  }
  for (; row < rows; row += stride) {
    RowRegs<T, VEC, ITERS> nx, nd;
    float nmu = 0.f, nrs = 0.f;
    if (kPrefetch) {
      const int64_t next = row + stride;
      if (next < rows) {
        load_row(nx, x + next * D, D, tpr, t);
        load_row(nd, dy + next * D, D, tpr, t);
        nmu = load_mean(mean, next), nrs = rstd[next];
      }
    } else {
      load_row(cx, x + row * D, D, tpr, t);
      load_row(cd, dy + row * D, D, tpr, t);
      mu = load_mean(mean, row), rs = rstd[row];
    }
    RowRegs<T, VEC, ITERS> ds;
    if constexpr (kDsum) load_row(ds, dsum + row * D, D, tpr, t);
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
      const DxRow dr(mu, rs, sums, inv_d, mean != nullptr);
      T* dxr = dx + row * D;
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const int64_t c = (int64_t(it) * tpr + t) * VEC;
        if (c < D) {
          if constexpr (kDsum)
            bwd_vec_dx<T, VEC, true>(cx.v[it], cd.v[it], wf[it], dr, dxr + c, &ds.v[it]);
          else
            bwd_vec_dx<T, VEC>(cx.v[it], cd.v[it], wf[it], dr, dxr + c);
        }
      }
    }
    if (kPrefetch) {
      cx = nx, cd = nd;
      mu = nmu, rs = nrs;
    }
  }
  if constexpr (kPartials) {
    slots_store_partial<VEC, ITERS>(accw, accb, slot_acc, partial + int64_t(blockIdx.x) * 2 * D, D, D, slots, slot,
                                    tpr, t, mean != nullptr);
  }
}

template <typename T>
using V4Kernel = void (*)(const T*, const T*, const float*, const float*, const void*, T*, float*, int64_t, int64_t,
                          int, bool, const T*);

// The next row prefetched (kPrefetch) only where the plan asks for it: 16-bit
// rows in 16-byte vectors of 512 to 1023 columns, hence 1 or 2 vectors a thread.
template <typename T, int VEC, int ITERS>
constexpr bool kV4PrefetchCompiled = sizeof(T) == 2 && VEC == kc::max_vec_elems<T>() && ITERS <= 2;

// 16-bit rows in 16-byte vectors: at most 8192 columns (2 vectors a thread at 512
// threads), so no kernel with 4 vectors of 8 a thread is compiled. Version 0's
// plan never gives version 4 a 16-bit row over 4096 columns; version 4 forced
// runs longer ones on version 2, which measured faster there (bench, H200
// 2026-11-25, 4096x16384 bf16: version 2 163.9 us, version 4 221.3).
constexpr int64_t kV4MaxCols16 = 8192;
template <typename T, int VEC, int ITERS>
constexpr bool kV4Compiled = !(sizeof(T) == 2 && VEC == kc::max_vec_elems<T>() && ITERS == 4);

// p.dsum == 1: the kDsum instantiations, compiled where bwd_fuses_dsum allows
// (partial rows, 16-byte vectors).
template <typename T>
V4Kernel<T> v4_kernel(const LnBwdPlan& p) {
  constexpr int V = kc::max_vec_elems<T>();
  if (p.dsum == 1) {
    if (!p.partials || p.vec != V) return nullptr;
    return with_iters<4>(p.iters, V4Kernel<T>(nullptr), [&](auto it) {
      constexpr int I = decltype(it)::value;
      if constexpr (!kV4Compiled<T, V, I>) {
        return V4Kernel<T>(nullptr);
      } else {
        if constexpr (kV4PrefetchCompiled<T, V, I>) {
          if (p.prefetch) return V4Kernel<T>(ln_bwd_v4<T, V, I, true, true, true>);
        }
        return p.prefetch ? V4Kernel<T>(nullptr) : V4Kernel<T>(ln_bwd_v4<T, V, I, true, false, true>);
      }
    });
  }
  return KC_BOOL_SWITCH(p.partials, kP, [&] {
    if (p.vec != V)  // without 16-byte vectors: the one scalar instantiation (v4_config), no prefetch
      return p.iters == kV4ScalarIters && !p.prefetch ? V4Kernel<T>(ln_bwd_v4<T, 1, kV4ScalarIters, kP, false>)
                                                      : V4Kernel<T>(nullptr);
    return with_iters<4>(p.iters, V4Kernel<T>(nullptr), [&](auto it) {
      constexpr int I = decltype(it)::value;
      if constexpr (!kV4Compiled<T, V, I>) {
        return V4Kernel<T>(nullptr);
      } else {
        if constexpr (kV4PrefetchCompiled<T, V, I>) {
          if (p.prefetch) return V4Kernel<T>(ln_bwd_v4<T, V, I, kP, true>);
        }
        return p.prefetch ? V4Kernel<T>(nullptr) : V4Kernel<T>(ln_bwd_v4<T, V, I, kP, false>);
      }
    });
  });
}

}  // namespace

// The next row prefetched for 16-bit rows of 512 to 1023 columns in 16-byte
// vectors (H200, probe run 68: 4096x768 bf16 15.2 against 16.2 us, 16384x768
// 31.6 against 37.4, 65536x512 62.3 against 69.4); not for fp32 (1024-4096
// columns: 60% slower) nor at 256 columns (no gain). Slots per block and the
// grid: v4_plan (occupancy). 16-bit rows in 16-byte vectors over kV4MaxCols16
// columns: false (version 2 runs them).
bool bwd_plan_v4(const LnBackwardArgs& a, LnBwdPlan& p) {
  const V4Config cfg = v4_config(a.cols, p.vec);
  if (!cfg.ok) return false;
  const size_t elem = elem_size(a.dt);
  if (elem == 2 && p.vec == int(16 / elem) && a.cols > kV4MaxCols16) return false;
  p.iters = cfg.iters;
  p.tpr = cfg.tpr;
  p.prefetch = elem == 2 && p.vec == int(16 / elem) && a.cols >= 512 && a.cols < 1024;
  return ln_input_typed(a.dt, [&](auto t) {
    const auto kernel = v4_kernel<decltype(t)>(p);
    if (!kernel) return false;
    const size_t per_thread = p.partials ? 2 * size_t(p.vec) * p.iters * sizeof(float) : 0;
    const V4Plan vp = v4_plan(kernel, p.tpr, kV4SmallThreads, a.rows, 0, per_thread);
    p.slots = vp.slots;
    p.threads = vp.threads;
    p.smem = vp.smem;
    p.grid = vp.grid;
    p.partial_rows = vp.grid;
    return true;
  });
}

cudaError_t bwd_launch_v4(const LnBackwardArgs& a, const LnBwdPlan& p, cudaStream_t stream) {
  return ln_input_typed(a.dt, [&](auto t) {
    using T = decltype(t);
    return launch_bwd_main<T, void>(v4_kernel<T>(p), a, p, stream, p.tpr, a.wdt == kc::DType::F32,
                                    static_cast<const T*>(a.dsum));
  });
}

}  // namespace day26
