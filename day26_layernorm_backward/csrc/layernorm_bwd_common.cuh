// Shared by the backward's files (layernorm_bwd_*.cu): the device helpers of
// more than one version, the per-family plan/launch functions the plan
// (layernorm_bwd_plan.cu) calls, and the dtype dispatch.
//
// The backward, with xhat = (x - mean) * rstd, g = dy * weight and D the row
// length (derivation in the README):
//   dx      = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat))      per row
//   dweight = sum_rows(dy * xhat),  dbias = sum_rows(dy)            per column
// Versions 2-6 write one fp32 partial row of (dweight, dbias) per block (or per
// cluster), [partial_rows][2][D], summed in a fixed order by the finalize kernel
// (layernorm_bwd_plan.cu): no float atomics anywhere, so the same inputs on
// the same GPU give bitwise the same dweight/dbias.
#pragma once

#include <type_traits>

#include "layernorm.h"
#include "layernorm_common.cuh"

#include "kc/switch.cuh"

namespace day26 {

// RMSNorm runs the same kernels with the mean pointer null (LnBackwardArgs):
// the row is not centred, so its mean is 0 and dx loses the mean(g) term.
__device__ __forceinline__ float load_mean(const float* mean, int64_t row) { return mean ? mean[row] : 0.f; }
__device__ __forceinline__ float row_a(float sum_g, float inv_d, const float* mean) {
  return mean ? sum_g * inv_d : 0.f;
}

// ------------------------------------------------------------- per family
// bwd_plan_*: the launch shape of the family's kernel for `a`, written into p
// (p.vec and p.partials already set); false when the family cannot run the
// shape (the plan tries the next family of the chain, layernorm_versions.h).
// bwd_launch_*: launches exactly p's main kernel (no choice left); ln_backward
// launches the finalize after it when p.finalize says so.
bool bwd_plan_v1(const LnBackwardArgs& a, LnBwdPlan& p);  // runs every shape: true
bool bwd_plan_v2(const LnBackwardArgs& a, LnBwdPlan& p);
bool bwd_plan_v3(const LnBackwardArgs& a, LnBwdPlan& p);
bool bwd_plan_v4(const LnBackwardArgs& a, LnBwdPlan& p);
bool bwd_plan_ring(const LnBackwardArgs& a, LnBwdPlan& p);  // 5 (p.cluster == 1) and 6
cudaError_t bwd_launch_v1(const LnBackwardArgs& a, const LnBwdPlan& p, cudaStream_t stream);
cudaError_t bwd_launch_v2(const LnBackwardArgs& a, const LnBwdPlan& p, cudaStream_t stream);
cudaError_t bwd_launch_v3(const LnBackwardArgs& a, const LnBwdPlan& p, cudaStream_t stream);
cudaError_t bwd_launch_v4(const LnBackwardArgs& a, const LnBwdPlan& p, cudaStream_t stream);
cudaError_t bwd_launch_ring(const LnBackwardArgs& a, const LnBwdPlan& p, cudaStream_t stream);
// the finalize: p.partial_rows partial rows -> dweight, dbias (PDL on sm_90+)
cudaError_t bwd_launch_finalize(const LnBackwardArgs& a, const LnBwdPlan& p, cudaStream_t stream);
// finalize kernel for rows of at most kFinNarrowMaxD columns (else the wide one)
constexpr int kFinNarrowMaxD = 1024;

// add_norm's backward (a.dsum): the families whose kernels add dsum as they write
// dx (kDsum instantiations), the plan's own choices at the shapes models train
// with: 4 and 5 (not split) with partial rows (dweight or dbias asked for) in
// 16-byte vectors. Elsewhere ln_add adds it after (LnBwdPlan::dsum = 2).
inline bool bwd_fuses_dsum(int family, bool partials, int vec, kc::DType dt) {
  return partials && vec == int(16 / elem_size(dt)) && (family == kRowSlots || family == kRing);
}

// Tensor arguments of every backward kernel, typed (TW = void: a weight pointer
// whose dtype, T or fp32, the kernel gets as a run-time flag).
template <typename T, typename TW>
struct BwdPtrs {
  const T* dy;
  const T* x;
  const TW* w;
  T* dx;
  explicit BwdPtrs(const LnBackwardArgs& a)
      : dy(static_cast<const T*>(a.dy)), x(static_cast<const T*>(a.x)), w(static_cast<const TW*>(a.weight)),
        dx(static_cast<T*>(a.dx)) {}
};

// The weight type (TW or void) of a backward kernel pointer K.
template <typename K>
struct BwdKernelTW;
template <typename T, typename TW, typename... Rest>
struct BwdKernelTW<void (*)(const T*, const T*, const float*, const float*, const TW*, Rest...)> {
  using type = TW;
};

// Launches plan p's main kernel (persistent grid: p.grid blocks of p.threads,
// p.smem bytes) with the arguments every backward kernel takes, then `extra`;
// nothing when p.grid is 0 (no rows). A null kernel: p names no instantiation.
template <typename T, typename TW, typename... KArgs, typename... Extra>
cudaError_t launch_bwd_main(void (*kernel)(KArgs...), const LnBackwardArgs& a, const LnBwdPlan& p,
                            cudaStream_t stream, Extra... extra) {
  if (!kernel) return cudaErrorInvalidConfiguration;
  if (p.grid <= 0) return cudaSuccess;
  const BwdPtrs<T, TW> q(a);
  kernel<<<unsigned(p.grid), p.threads, p.smem, stream>>>(q.dy, q.x, a.mean, a.rstd, q.w, q.dx, a.workspace, a.rows,
                                                          a.cols, extra...);
  return cudaGetLastError();
}

// ------------------------------------------------------- device helpers
// 2 and 3:
// pass 1 of a row: the row sums of g = dy * w and g * xhat; per column dy * xhat
// and dy into pw/pb. pass 2: dx = rstd * (g - a - xhat * b). Version 2 reads the
// weights from w at column c (TW = void: their dtype the flag w_f32,
// load_param_w); version 3 (the _wv forms) gets them in fp32, wv.
// (Version 2's forms keep their own loops: written as a call of the _wv forms,
// ptxas scheduled some of its kernels differently.)
template <typename T, typename TW, int VEC>
__device__ __forceinline__ void bwd_pass1(const kc::Vec<T, VEC>& xv, const kc::Vec<T, VEC>& dv, const TW* w,
                                          bool w_f32, int64_t c, float mu, float rs, float (&sums)[2],
                                          float (&pw)[VEC], float (&pb)[VEC]) {
  float wv[VEC];
  load_param_w<T, TW, VEC>(w, w_f32, c, 1.f, wv);
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
                                          bool w_f32, int64_t c, float mu, float rs, float a, float b, T* dxr) {
  float wv[VEC], out[VEC];
  load_param_w<T, TW, VEC>(w, w_f32, c, 1.f, wv);
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float xhat = (kc::to_float(xv.v[j]) - mu) * rs;
    const float g = kc::to_float(dv.v[j]) * wv[j];
    out[j] = rs * (g - a - xhat * b);
  }
  store_from_f32<T, VEC>(dxr + c, out);
}

template <typename T, int VEC>
__device__ __forceinline__ void bwd_pass1_wv(const kc::Vec<T, VEC>& xv, const kc::Vec<T, VEC>& dv,
                                             const float (&wv)[VEC], float mu, float rs, float (&sums)[2],
                                             float (&pw)[VEC], float (&pb)[VEC]) {
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

template <typename T, int VEC>
__device__ __forceinline__ void bwd_pass2_wv(const kc::Vec<T, VEC>& xv, const kc::Vec<T, VEC>& dv,
                                             const float (&wv)[VEC], int64_t c, float mu, float rs, float a, float b,
                                             T* dxr) {
  float out[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float xhat = (kc::to_float(xv.v[j]) - mu) * rs;
    const float g = kc::to_float(dv.v[j]) * wv[j];
    out[j] = rs * (g - a - xhat * b);
  }
  store_from_f32<T, VEC>(dxr + c, out);
}

// 3, 4, 5, 6:
// Write a thread's register sums (columns (it * tpr + t) * VEC + j < D) into a
// partial row: out[c] = dweight partial, out[ld + c] = dbias partial, the latter
// only with_b (LayerNorm; RMSNorm has no bias, and its finalize reads no dbias half).
template <int VEC, int ITERS>
__device__ __forceinline__ void store_partial_row(float* out, const float (&accw)[ITERS][VEC],
                                                  const float (&accb)[ITERS][VEC], int64_t D, int64_t ld, int tpr,
                                                  int t, bool with_b) {
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int64_t c = (int64_t(it) * tpr + t) * VEC;
    if (c < D) {
      if constexpr (VEC % 4 == 0) {
#pragma unroll
        for (int j = 0; j < VEC; j += 4) {
          *reinterpret_cast<float4*>(out + c + j) =
              make_float4(accw[it][j], accw[it][j + 1], accw[it][j + 2], accw[it][j + 3]);
          if (with_b)
            *reinterpret_cast<float4*>(out + ld + c + j) =
                make_float4(accb[it][j], accb[it][j + 1], accb[it][j + 2], accb[it][j + 3]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          out[c + j] = accw[it][j];
          if (with_b) out[ld + c + j] = accb[it][j];
        }
      }
    }
  }
}

// The end of a row-slot kernel (v4, v4 ring) with register sums: slots 1, 2, ...
// park their sums in `buf` ([slots - 1][ITERS][2 * VEC][tpr] floats: consecutive
// threads, consecutive words; written once, read once), slot 0 adds them in slot
// order and writes the block's partial row `out` (columns < D, dbias at out + ld
// with_b: the dbias sums are neither parked nor written without it).
// Every thread of the block calls it, after its last use of the shared memory
// that `buf` overlays.
template <int VEC, int ITERS>
__device__ __forceinline__ void slots_store_partial(float (&accw)[ITERS][VEC], float (&accb)[ITERS][VEC],
                                                    float* buf, float* out, int64_t D, int64_t ld, int slots,
                                                    int slot, int tpr, int t, bool with_b) {
  if (slots > 1) {
    __syncthreads();  // every slot is done with its rows (and with what buf overlays)
    if (slot > 0) {
      float* b = buf + int64_t(slot - 1) * ITERS * 2 * VEC * tpr + t;
#pragma unroll
      for (int it = 0; it < ITERS; ++it)
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          b[(it * 2 * VEC + j) * tpr] = accw[it][j];
          if (with_b) b[(it * 2 * VEC + VEC + j) * tpr] = accb[it][j];
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
            if (with_b) accb[it][j] += b[(it * 2 * VEC + VEC + j) * tpr];
          }
      }
    }
  }
  if (slot == 0) store_partial_row<VEC, ITERS>(out, accw, accb, D, ld, tpr, t, with_b);
}

// 4, 5, 6:
// A thread's weights read once, into fp32 registers, for all of its rows (v4;
// the ring where a thread owns at most 16 columns): the weight dtype (fp32 when
// w_f32, else T) is then a run-time value, one uniform branch here at kernel
// start, and one instantiation serves both weight dtypes. (Kernels that read the
// weights in every row keep the dtype a template argument: a branch there
// compiled both dtypes' row loops into one kernel, with more registers and a
// slower forward; docs/log.md, 2026-11-25.) Vector it of the thread covers columns
// col0 + (it * tpr + t) * VEC ...; those at or past D get 0, a null w weight 1.
template <typename T, int VEC, int ITERS>
__device__ __forceinline__ void load_weights_once(float (&wf)[ITERS][VEC], const void* w, bool w_f32, int64_t col0,
                                                  int64_t D, int tpr, int t) {
  auto load = [&](auto tw) {
    using TW = decltype(tw);
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int64_t c = (int64_t(it) * tpr + t) * VEC;
      if (c < D) {
        load_param<TW, VEC>(static_cast<const TW*>(w), col0 + c, 1.f, wf[it]);
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) wf[it][j] = 0.f;
      }
    }
  };
  if (std::is_same<T, float>::value || w_f32) {
    load(float{});
  } else {
    load(T{});
  }
}

// The ring keeps a thread's weights in registers where it owns at most
// kRingWRegCols columns (ITERS vectors of 16 bytes' worth of T); else it reads
// them with every row.
constexpr int kRingWRegCols = 16;
template <typename T, int ITERS>
constexpr bool kRingWReg = ITERS * kc::max_vec_elems<T>() <= kRingWRegCols;

// One vector of a row in v4 and the ring (weights wv in fp32). Each 16-byte
// vector of x and dy is converted to fp32 once (kc::vec_to_float: a 16-bit pair
// is one 32-bit word). Pass 1: the row sums of g = dy * w and g * xhat into sums,
// and (kCols) dy * xhat and dy added to the column sums cw, cb. kRms (the ring's
// RMSNorm kernels, ln_bwd_ring): the row not centred (mu unused), so only g * xhat
// and dy * xhat: sums[0] and cb are left as they are (4 instructions an element
// after the conversions instead of 7; the same roundings as with mu = 0).
template <typename T, int VEC, bool kCols, bool kRms = false>
__device__ __forceinline__ void bwd_vec_pass1(const kc::Vec<T, VEC>& xv, const kc::Vec<T, VEC>& dv,
                                              const float (&wv)[VEC], float mu, float rs, float (&sums)[2],
                                              float (&cw)[VEC], float (&cb)[VEC]) {
  float xf[VEC], df[VEC];
  kc::vec_to_float(xv, xf);
  kc::vec_to_float(dv, df);
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float xhat = kRms ? xf[j] * rs : (xf[j] - mu) * rs;
    const float g = df[j] * wv[j];
    if (!kRms) sums[0] += g;
    sums[1] = fmaf(g, xhat, sums[1]);
    if (kCols) {
      cw[j] = fmaf(df[j], xhat, cw[j]);
      if (!kRms) cb[j] += df[j];
    }
  }
}

// Pass 2, one row's terms: dx = rstd * (g - a - xhat * b), a and b the row sums
// over D. fp32 output: computed as written (distributed into FMAs, rstd * b and
// rstd * a are rounded first, and dx is a small difference of large terms for
// short rows: measured 4.5e-6 relative error at D = 3 in fp32, over the tests'
// 3e-6). 16-bit output, whose rounding is 2^-8 or 2^-11 of dx, far above those
// fp32 roundings: dx = k1 * x + (rstd * g + k0) with k1 = -rstd^2 * b,
// k0 = -rstd * a - k1 * mean per row: 3 instructions an element instead of 6.
// (k1 * x and k1 * mean cancel where the mean is large against the spread: an
// fp32 rounding of k1 * x, 2^-24 of it, is still far below the 16-bit output's.)
// RMSNorm (the backward's mean pointer null, see LnBackwardArgs): mu = 0 and the
// mean(g) term a = 0, since the row is not centred.
struct DxRow {
  float mu, rs, a, b, k1, k0;
  __device__ __forceinline__ DxRow(float mu_, float rs_, const float (&sums)[2], float inv_d, bool center)
      : mu(mu_), rs(rs_), a(center ? sums[0] * inv_d : 0.f), b(sums[1] * inv_d), k1(-(rs_ * rs_) * b),
        k0(fmaf(-k1, mu_, -rs_ * a)) {}
};

// kAdd (add_norm's backward): dx + sv, the gradient reaching the sum output,
// added in fp32 before the one rounding to T (the sum's gradient is x's and the
// residual's: add_norm returns this dx for both).
template <typename T, int VEC, bool kAdd = false>
__device__ __forceinline__ void bwd_vec_dx(const kc::Vec<T, VEC>& xv, const kc::Vec<T, VEC>& dv,
                                           const float (&wv)[VEC], const DxRow& r, T* p,
                                           const kc::Vec<T, VEC>* sv = nullptr) {
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
      out[j] = fmaf(r.k1, xf[j], fmaf(r.rs, g, r.k0));
    }
  }
  if constexpr (kAdd) {
    float sf[VEC];
    kc::vec_to_float(*sv, sf);
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] += sf[j];
  }
  store_from_f32<T, VEC>(p, out);
}

}  // namespace day26
