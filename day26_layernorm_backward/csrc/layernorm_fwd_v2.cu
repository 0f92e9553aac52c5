// LayerNorm forward, version 2: the row in registers (layernorm_fwd_common.cuh
// has the math and the list of versions): read once, both statistics from the
// registers, y written once; one warp per row up to 512 columns, one block per
// row above; without 16-byte vectors a run-time loop that reads the row again.
#include "layernorm_fwd_common.cuh"

#include "kc/check.cuh"

namespace day26 {
namespace {

// v2. Assumptions (checked by the launcher):
// - kWarp: blockDim.x = 32 * kWarpRowsPerBlock, one warp per row;
//   else: blockDim.x = threads per row (a multiple of 32, <= kMaxTpr), one block per row;
// - VEC > 1 only when x, y, weight, bias are aligned to a VEC-vector and D % VEC == 0;
// - ITERS * VEC * (threads per row) >= D; or ITERS = 0 (with VEC = 1: no 16-byte
//   vectors, a fallback): no row in registers, fwd_row_scalar's run-time loops;
// - rows are visited grid-stride, so any number of rows works with any grid;
// - kAdd (add_norm; ITERS > 0): the residual's row is read beside x's and x +
//   residual is written to `sum` and normalised (add_residual); res and sum
//   aligned as x. Without kAdd, res and sum are unused.
template <typename T, typename TW, int VEC, int ITERS, bool kWarp, bool kAdd = false>
__global__ void __launch_bounds__(kMaxTpr)
ln_fwd_v2(const T* __restrict__ x, const TW* __restrict__ w, const TW* __restrict__ b,
          T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
          int64_t rows, int64_t D, float eps, bool w_f32, const T* __restrict__ res, T* __restrict__ sum) {
  static_assert(ITERS > 0 || VEC == 1, "ITERS = 0: the scalar loop");
  static_assert(!kAdd || ITERS > 0, "kAdd: the row in registers");
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
    } else if constexpr (kAdd) {
      RowRegs<T, VEC, ITERS> cur, rr;
      load_row(cur, x + row * D, rc);
      load_row(rr, res + row * D, rc);
      float v[ITERS][VEC];
      row_to_float(cur, v, rc);
      add_residual(v, rr, sum + row * D, rc);
      fwd_row_f32(RowCentering{}, v, w, b, w_f32, y + row * D, row_or_null(mean_out, row), rstd_out + row, rc, inv_d,
                  float(D), eps, t, reduce);
    } else {
      RowRegs<T, VEC, ITERS> cur;
      load_row(cur, x + row * D, rc);
      fwd_row(RowCentering{}, cur, w, b, w_f32, y + row * D, row_or_null(mean_out, row), rstd_out + row, rc, inv_d,
              float(D), eps, t, reduce);
    }
  }
}

template <typename T, typename TW>
using FwdV2Kernel = void (*)(const T*, const TW*, const TW*, T*, float*, float*, int64_t, int64_t, float, bool, const T*,
                             T*);

// f(kernel): version 2's instantiation of plan p, its weight type FwdTW's. 16-byte
// vectors: ITERS from the plan (warp rows: at most kMaxEptWarp elements a thread,
// block rows kMaxEpt: v2_config's limits); else the scalar loop (ITERS = 0),
// whatever the plan's iters. p.add: the kAdd instantiations, compiled where
// fwd_fuses_add allows (fp32 in 16-byte vectors), else nullptr.
template <typename T, typename TW, typename F>
auto with_fwd_v2_kernel(const FwdPlan& p, F&& f) {
  constexpr int V = kc::max_vec_elems<T>();
  return KC_BOOL_SWITCH(p.c2.warp, kWarp, [&] {
    if (p.add) {
      using K = FwdV2Kernel<T, TW>;
      if constexpr (!fwd_fuses_add<T>(kRegisters, V)) {
        return f(K(nullptr));
      } else {
        constexpr int kMax = (kWarp ? kMaxEptWarp : kMaxEpt) / V;
        return f(p.vec != V ? K(nullptr) : with_iters<kMax>(p.c2.iters, K(nullptr), [&](auto it) {
          return K(ln_fwd_v2<T, TW, V, decltype(it)::value, kWarp, true>);
        }));
      }
    }
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

}  // namespace

cudaError_t fwd_launch_v2(const LnForwardArgs& a, const FwdPlan& p, cudaStream_t stream) {
  return ln_typed(a.dt, a.wdt, [&](auto t, auto tw) {
    using T = decltype(t);
    using TW = decltype(tw);
    const T* x = static_cast<const T*>(a.x);
    T* y = static_cast<T*>(a.y);
    const bool w_f32 = a.wdt == kc::DType::F32;  // read by the kernels with TW = void only
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
          a.eps, w_f32, static_cast<const T*>(a.residual), static_cast<T*>(a.sum));
      return cudaGetLastError();
    });
  });
}

}  // namespace day26
