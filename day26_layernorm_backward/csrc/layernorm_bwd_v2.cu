// LayerNorm backward, version 2: x and dy read once into registers (16-byte
// vectors where every pointer and D allow them; without them, a fallback, one
// element at a time in a run-time loop that reads the row twice), both row
// sums in one reduction, dx written once. A persistent grid (the blocks that
// fit at once) walks the rows; each block accumulates dy * xhat and dy for its
// columns in shared memory (fp32), then writes one partial row per block,
// which the finalize sums in a fixed order. One warp per row for D <= 512 (8
// rows a block), one block per row above (128..512 threads). Rows longer than
// 16384 (8192 without 16-byte vectors) run version 1.
// Traffic: x, dy read once, dx written once (the 3-pass floor), plus
// 2 * grid * D * 4 bytes of partials written and read back.
#include "layernorm_bwd_common.cuh"

#include "kc/check.cuh"
#include "kc/reduce.cuh"

namespace day26 {
namespace {

// Assumptions (checked by the launcher):
// - kWarp: blockDim.x = 32 * kWarpRowsPerBlock, one warp per row, each warp has
//   its own accumulator slot; else blockDim.x = threads per row (<= kMaxTpr).
// - dynamic shared memory: slots * 2 * D floats (accumulators), 16-byte aligned.
// - VEC > 1 only when dy, x, dx, weight are VEC-aligned and D % VEC == 0.
// - partial: [gridDim.x][2][D] fp32 (row 0: dweight partial, row 1: dbias), written
//   fully when the kernel keeps partials (every column, zeros for columns no row
//   touched): kPartials, and for the warp path (version 2 only: the plan runs
//   version 4 for rows of up to 512 columns) partial not null, a run-time test,
//   so that one warp kernel serves the whole backward and dx alone.
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

// ITERS = 0 (with VEC = 1: a pointer or D that allows no 16-byte vectors, a
// fallback): no row in registers; the same threads per row and columns per
// thread, in the same order, in a run-time loop, pass 2 reading x and dy again
// (the row was just read: L1 or L2), so that one instantiation serves every D.
template <typename T, typename TW, int VEC, int ITERS, bool kWarp, bool kPartials>
__global__ void __launch_bounds__(kMaxTpr)
ln_bwd_v2(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
          const float* __restrict__ rstd, const TW* __restrict__ w, T* __restrict__ dx,
          float* __restrict__ partial, int64_t rows, int64_t D, bool w_f32) {
  static_assert(ITERS > 0 || VEC == 1, "ITERS = 0: the scalar loop");
  extern __shared__ __align__(16) float acc[];  // [slots][2][D]
  __shared__ float red[64];
  // the warp path's kernels are compiled with kPartials only (with_v2_kernel)
  const bool partials = kPartials && (!kWarp || partial != nullptr);
  kc::launch_dependents();  // see launch_finalize
  const int tpr = kWarp ? 32 : blockDim.x;
  const int t = kWarp ? (threadIdx.x & 31) : threadIdx.x;
  const int64_t slots = kWarp ? (blockDim.x >> 5) : 1;
  const int64_t slot = kWarp ? (threadIdx.x >> 5) : 0;
  const float inv_d = 1.f / float(D);

  if (partials) {
    for (int64_t i = threadIdx.x; i < slots * 2 * D; i += blockDim.x) acc[i] = 0.f;
    __syncthreads();
  }
  float* acc_w = acc + slot * 2 * D;
  float* acc_b = acc_w + D;
  // the row's two sums over its threads (a warp, or the block)
  auto row_sums = [&](float (&sums)[2]) {
    if (kWarp) {
      sums[0] = kc::warp_reduce_sum(sums[0]);
      sums[1] = kc::warp_reduce_sum(sums[1]);
    } else {
      kc::block_reduce_sum<2>(sums, red);
    }
  };

  for (int64_t row = blockIdx.x * slots + slot; row < rows; row += int64_t(gridDim.x) * slots) {
    if constexpr (ITERS == 0) {
      const T* xr = x + row * D;
      const T* dr = dy + row * D;
      const float mu = load_mean(mean, row), rs = rstd[row];
      float sums[2] = {0.f, 0.f};
      for (int64_t c = t; c < D; c += tpr) {
        float pw[1], pb[1];
        bwd_pass1<T, TW, 1>(kc::load_vec<1>(xr + c), kc::load_vec<1>(dr + c), w, w_f32, c, mu, rs, sums, pw, pb);
        if (partials) {
          smem_accumulate<1>(acc_w + c, pw);
          smem_accumulate<1>(acc_b + c, pb);
        }
      }
      row_sums(sums);
      if (dx)
        for (int64_t c = t; c < D; c += tpr)
          bwd_pass2<T, TW, 1>(kc::load_vec<1>(xr + c), kc::load_vec<1>(dr + c), w, w_f32, c, mu, rs,
                              row_a(sums[0], inv_d, mean), sums[1] * inv_d, dx + row * D);
    } else {
      RowRegs<T, VEC, ITERS> cx, cd;
      load_row(cx, x + row * D, D, tpr, t);
      load_row(cd, dy + row * D, D, tpr, t);
      const float mu = load_mean(mean, row), rs = rstd[row];
      float sums[2] = {0.f, 0.f};
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const int64_t c = (int64_t(it) * tpr + t) * VEC;
        if (c < D) {
          float pw[VEC], pb[VEC];
          bwd_pass1<T, TW, VEC>(cx.v[it], cd.v[it], w, w_f32, c, mu, rs, sums, pw, pb);
          if (partials) {
            smem_accumulate<VEC>(acc_w + c, pw);
            smem_accumulate<VEC>(acc_b + c, pb);
          }
        }
      }
      row_sums(sums);
      if (dx) {
#pragma unroll
        for (int it = 0; it < ITERS; ++it) {
          const int64_t c = (int64_t(it) * tpr + t) * VEC;
          if (c < D)
            bwd_pass2<T, TW, VEC>(cx.v[it], cd.v[it], w, w_f32, c, mu, rs, row_a(sums[0], inv_d, mean), sums[1] * inv_d,
                                  dx + row * D);
        }
      }
    }
  }
  if (partials) {
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

template <typename T, typename TW>
using V2Kernel =
    void (*)(const T*, const T*, const float*, const float*, const TW*, T*, float*, int64_t, int64_t, bool);

// Version 0's plan runs version 2 only for rows that versions 4-6 cannot run
// (layernorm_bwd_plan.cu): block rows, either without 16-byte vectors (the
// scalar loop, ITERS = 0) or, in 16-byte vectors, longer than version 4 holds
// (fp32 over 8192 columns; 16-bit over 4096, where the ring cannot run), which
// v2_config gives the most vectors a thread (kMaxEpt). Those kernels have the
// weight dtype as a template argument (TW); the others, which only version 2 or
// 3 forced (or knob target_iters) reach, take it at run time for 16-bit input
// (TW = void, the flag w_f32: one branch per weight vector, one kernel for both
// weight dtypes).
template <typename T, bool kWarp, int ITERS>
constexpr bool kV2Typed = sizeof(T) == 4 || (!kWarp && (ITERS == 0 || ITERS == kMaxEpt / kc::max_vec_elems<T>()));

// f(kernel): the instantiation plan p names, its weight type TW or void
// (kV2Typed). 16-byte vectors: ITERS from the plan (warp rows hold at most
// kMaxEptWarp elements a thread, block rows kMaxEpt: v2_config's limits, nothing
// above them is instantiated); else the scalar loop (ITERS = 0), whatever the
// plan's iters. Warp rows: the kPartials kernel for dx alone too (partial null:
// the kernel tests it).
template <typename T, typename TW, typename F>
auto with_v2_kernel(const LnBwdPlan& p, F&& f) {
  constexpr int V = kc::max_vec_elems<T>();
  return KC_BOOL_SWITCH(p.warp, kWarp, [&] {
    return KC_BOOL_SWITCH(p.partials || kWarp, kP, [&] {
      if constexpr (kWarp && !kP) {
        return f(V2Kernel<T, TW>(nullptr));  // not reached: warp rows take the kPartials kernel
      } else {
        if (p.vec != V) {
          using KW = std::conditional_t<kV2Typed<T, kWarp, 0>, TW, void>;
          return f(V2Kernel<T, KW>(ln_bwd_v2<T, KW, 1, 0, kWarp, kP>));
        }
        constexpr int kMax = (kWarp ? kMaxEptWarp : kMaxEpt) / V;
        V2Kernel<T, TW> typed = nullptr;
        V2Kernel<T, void> generic = nullptr;
        with_iters<kMax>(p.iters, 0, [&](auto it) {
          constexpr int I = decltype(it)::value;
          if constexpr (kV2Typed<T, kWarp, I>)
            typed = ln_bwd_v2<T, TW, V, I, kWarp, kP>;
          else
            generic = ln_bwd_v2<T, void, V, I, kWarp, kP>;
          return 0;
        });
        return generic ? f(generic) : f(typed);
      }
    });
  });
}

}  // namespace

// Grid: the blocks that fit at once (occupancy), capped by the row groups.
bool bwd_plan_v2(const LnBackwardArgs& a, LnBwdPlan& p) {
  const V2Config cfg = v2_config(a.cols, p.vec);
  if (!cfg.ok) return false;
  p.warp = cfg.warp;
  p.iters = cfg.iters;
  p.tpr = cfg.tpr;
  p.threads = cfg.threads;
  p.smem = p.partials ? size_t(cfg.warp ? kWarpRowsPerBlock : 1) * 2 * size_t(a.cols) * sizeof(float) : 0;
  return ln_typed(a.dt, a.wdt, [&](auto t, auto tw) {
    return with_v2_kernel<decltype(t), decltype(tw)>(p, [&](auto kernel) {
      if (!kernel || kc::allow_dynamic_smem(kernel, p.smem) != cudaSuccess) return false;
      int per_sm = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, p.threads, p.smem) != cudaSuccess) {
        cudaGetLastError();  // not left behind for the next launch check to report
        per_sm = 1;
      }
      if (per_sm < 1) per_sm = 1;
      const int64_t rpb = cfg.warp ? kWarpRowsPerBlock : 1;
      const int64_t groups = (a.rows + rpb - 1) / rpb;
      const int64_t cap = int64_t(num_sms()) * per_sm;
      p.grid = groups < cap ? groups : cap;
      p.partial_rows = p.grid;
      return true;
    });
  });
}

cudaError_t bwd_launch_v2(const LnBackwardArgs& a, const LnBwdPlan& p, cudaStream_t stream) {
  return ln_typed(a.dt, a.wdt, [&](auto t, auto tw) {
    using T = decltype(t);
    return with_v2_kernel<T, decltype(tw)>(p, [&](auto kernel) {
      using KW = typename BwdKernelTW<decltype(kernel)>::type;
      return launch_bwd_main<T, KW>(kernel, a, p, stream, a.wdt == kc::DType::F32);
    });
  });
}

}  // namespace day26
