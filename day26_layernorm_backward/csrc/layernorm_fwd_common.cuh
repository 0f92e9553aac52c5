// Shared by the forward's files (layernorm_fwd_*.cu): the math of one row in
// registers (fwd_row_f32: mean, variance, y), the forward plan (FwdPlan) and
// the per-family plan/launch functions the plan (layernorm_fwd_plan.cu) calls.
//
// LayerNorm forward: y = (x - mean) * rstd * weight + bias, per row of D elements,
//   mean = sum(x) / D,  var = sum((x - mean)^2) / D,  rstd = 1 / sqrt(var + eps).
// mean and rstd (fp32) are saved for the backward. RMSNorm runs the same kernels
// with the mean pointer null (the row not centred, no bias).
//
// Versions (layernorm_versions.h; 0 = auto: fwd_plan's table, layernorm_fwd_plan.cu):
//   1  layernorm_fwd_v1.cu  the seed's structure: one block per row, three passes
//      over the row (sum, squared deviations, write), scalar loads, block
//      reductions through shared memory; rows over 8192 columns kept in shared
//      memory after the first pass where they fit (V1Shape). Any D.
//   2  layernorm_fwd_v2.cu  the row is read once into registers (16-byte vector
//      loads where every pointer and D allow it), both statistics come from the
//      registers (two-pass variance: accurate, no extra memory traffic), then y
//      is written once; without 16-byte vectors (a fallback) a run-time loop
//      reads the row three times instead. One warp per row for D <= 512 (8 rows
//      per block, warp shuffles only), one block per row above that (128..512
//      threads, <= 32 elements per thread). Rows longer than 16384 run 1.
//   3  layernorm_fwd_v3.cu  2's math on a cp.async pipeline: a persistent grid,
//      each block keeps the next `stages - 1` rows in flight into shared memory
//      (each thread copies, and later reads, only its own 16-byte vectors, so no
//      barrier guards the stages). Block path; without 16-byte vectors the stages
//      hold the aligned granules that cover each row and 2's run-time loop reads
//      them (ln_fwd_v3_granules, barriers around each stage); else 2.
//   4  layernorm_fwd_v4.cu  row slots (layernorm_common.cuh): independent row
//      teams per block, the next row prefetched into registers for 16-bit rows; else 2.
//   5  no forward kernel (the ring lost to 4's register prefetch: docs/log.md): runs 4.
//   6  layernorm_fwd_v4.cu  4 with each row split across a thread-block cluster
//      (sm_90+); else 4.
// Traffic: v2 reads x once and writes y once (the floor: 2 passes); v1 reads x
// three times (mostly from L2 when the rows of the blocks in flight fit there;
// long rows from shared memory after the first read).
#pragma once

#include <type_traits>

#include "layernorm.h"
#include "layernorm_common.cuh"

#include "kc/reduce.cuh"
#include "kc/switch.cuh"

namespace day26 {

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

// Whether a row is centred (LayerNorm) or not (RMSNorm, mean_out null), as the
// row functions below are told: RowCentering reads mean_out at every row, for
// the loops that serve both norms; Centered<true> or <false> fixes it at compile
// time, for the loops with_centering compiles once for each norm, picking one per
// launch: version 4's 16-bit and split rows. There the one loop held 6-27
// registers more than LayerNorm's alone (ptxas, sm_90a: 16-bit rows of one vector
// a thread 56 against 48, of four 115 against 104); versions 2 and 3, and
// version 4's unsplit fp32 rows, took more registers split (version 2 at fp32
// rows of four 58 -> 84) and keep RowCentering.
struct RowCentering {};
template <bool kCenter>
using Centered = std::bool_constant<kCenter>;

__device__ __forceinline__ bool centers(RowCentering, const float* mean_out) { return mean_out != nullptr; }
template <bool kCenter>
__device__ __forceinline__ constexpr bool centers(Centered<kCenter>, const float*) { return kCenter; }

template <typename F>
__device__ __forceinline__ void with_centering(const float* mean_out, F&& f) {
  if (mean_out != nullptr)
    f(Centered<true>{});
  else
    f(Centered<false>{});
}

template <typename C, typename T, typename TW, int VEC, int ITERS, typename Reduce, typename Exchange = NoExchange>
__device__ __forceinline__ void fwd_row_f32(C centering, float (&v)[ITERS][VEC], const TW* __restrict__ w,
                                            const TW* __restrict__ b, bool w_f32, T* __restrict__ yr, float* mean_out,
                                            float* rstd_out, const RowCols<VEC, ITERS>& rc, float inv_d,
                                            float dn, float eps, int t, Reduce&& reduce, Exchange&& ex = {}) {
  constexpr bool kSplit = !std::is_same<std::decay_t<Exchange>, NoExchange>::value;
  // RMSNorm (not centred): the row's mean taken as 0; the split's exchange then
  // combines shares of mean 0, so its m2 is the sum of squares
  const bool center = centers(centering, mean_out);
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

// add_norm, fused (kAdd kernels): v (this thread's share of a row of x, in fp32)
// += the residual's share r; each sum is rounded to T, stored to the sum row
// `sr`, and v keeps the rounded value, so the norm sees exactly the stored sum
// (y is then bitwise the unfused norm of x + residual).
template <typename T, int VEC, int ITERS>
__device__ __forceinline__ void add_residual(float (&v)[ITERS][VEC], const RowRegs<T, VEC, ITERS>& r,
                                             T* __restrict__ sr, const RowCols<VEC, ITERS>& rc) {
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    if (rc.has(it)) {
      float rf[VEC];
      kc::vec_to_float(r.v[it], rf);
#pragma unroll
      for (int j = 0; j < VEC; ++j) rf[j] += v[it][j];
      const kc::Vec<T, VEC> s = kc::vec_from_float<T>(rf);
      kc::store_vec<VEC>(sr + rc.col(it), s);
      kc::vec_to_float(s, v[it]);
    }
  }
}

// The same for a row kept in its dtype (version 4's bf16 add_norm rows): cur =
// the rounded sums of x and r, stored to `sr`. Half the registers of fp32 values.
template <typename T, int VEC, int ITERS>
__device__ __forceinline__ void add_residual(RowRegs<T, VEC, ITERS>& cur, const RowRegs<T, VEC, ITERS>& x,
                                             const RowRegs<T, VEC, ITERS>& r, T* __restrict__ sr,
                                             const RowCols<VEC, ITERS>& rc) {
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    if (rc.has(it)) {
      float xf[VEC], rf[VEC];
      kc::vec_to_float(x.v[it], xf);
      kc::vec_to_float(r.v[it], rf);
#pragma unroll
      for (int j = 0; j < VEC; ++j) rf[j] += xf[j];
      cur.v[it] = kc::vec_from_float<T>(rf);
      kc::store_vec<VEC>(sr + rc.col(it), cur.v[it]);
    }
  }
}

// fwd_row_f32 (unsplit) for a row kept in its dtype: each pass converts the
// thread's vectors again instead of holding them in fp32 (at 2 vectors of 8,
// 16 registers fewer), with the same operations in the same order, so y, mean
// and rstd are bitwise fwd_row_f32's.
template <typename C, typename T, typename TW, int VEC, int ITERS, typename Reduce>
__device__ __forceinline__ void fwd_row_packed(C centering, const RowRegs<T, VEC, ITERS>& cur,
                                               const TW* __restrict__ w, const TW* __restrict__ b, bool w_f32,
                                               T* __restrict__ yr, float* mean_out, float* rstd_out,
                                               const RowCols<VEC, ITERS>& rc, float inv_d, float dn, float eps, int t,
                                               Reduce&& reduce) {
  const bool center = centers(centering, mean_out);  // RMSNorm: mean taken as 0
  float mean = 0.f;
  if (center) {
    float s = 0.f;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      if (rc.has(it)) {
        float f[VEC];
        kc::vec_to_float(cur.v[it], f);
#pragma unroll
        for (int j = 0; j < VEC; ++j) s += f[j];
      }
    }
    s = reduce(s);
    mean = mean_of_sum(s, inv_d, dn);
  }
  float q = 0.f;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    if (rc.has(it)) {
      float f[VEC];
      kc::vec_to_float(cur.v[it], f);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float d = f[j] - mean;
        q += d * d;
      }
    }
  }
  q = reduce(q);
  const float rstd = rsqrtf(q * inv_d + eps);
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    if (rc.has(it)) {
      const int c = rc.col(it);
      float f[VEC], wv[VEC], bv[VEC], out[VEC];
      kc::vec_to_float(cur.v[it], f);
      load_param_w<T, TW, VEC>(w, w_f32, c, 1.f, wv);
      load_param_w<T, TW, VEC>(b, w_f32, c, 0.f, bv);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float d = f[j] - mean;
        out[j] = d * rstd * wv[j] + bv[j];
      }
      store_from_f32<T, VEC>(yr + c, out);
    }
  }
  if (t == 0) {
    if (center) *mean_out = mean;
    *rstd_out = rstd;
  }
}

template <typename C, typename T, typename TW, int VEC, int ITERS, typename Reduce>
__device__ __forceinline__ void fwd_row(C centering, const RowRegs<T, VEC, ITERS>& cur,
                                        const TW* __restrict__ w, const TW* __restrict__ b, bool w_f32,
                                        T* __restrict__ yr, float* mean_out, float* rstd_out,
                                        const RowCols<VEC, ITERS>& rc, float inv_d, float dn, float eps, int t,
                                        Reduce&& reduce) {
  float v[ITERS][VEC];
  row_to_float(cur, v, rc);
  fwd_row_f32(centering, v, w, b, w_f32, yr, mean_out, rstd_out, rc, inv_d, dn, eps, t, reduce);
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

// v3 without 16-byte vectors (ln_fwd_v3_granules): a row's stage holds the
// aligned 16-byte granules that cover it, whatever its first element's offset in
// the first (up to V - 1): granule_row elements of T.
__host__ __device__ inline int64_t granule_row(int64_t D, int64_t V) { return (D + 2 * V - 2) / V * V; }
// A stage's bytes: the row, or its granules.
inline size_t v3_row_bytes(int64_t D, size_t elem, bool granules) {
  return size_t(granules ? granule_row(D, int64_t(16 / elem)) : D) * elem;
}

// ------------------------------------------------------------------ the plan
// The forward's plan: the family that runs (layernorm_versions.h) and its
// launch shape, computed once per call (fwd_plan, layernorm_fwd_plan.cu),
// launched by the family's fwd_launch_* (no choice left).
struct FwdPlan {
  int family = kSeed;
  int vec = 1;
  V2Config c2;        // 2, 3
  int stages = 0;     // 3
  V4Config c4;        // 4, 6 (6: a CTA's share of D / cluster columns)
  V4Plan p4;          // 4, 6: slots, threads, grid (6: grid = clusters * cluster)
  int cluster = 1;    // 6
  bool l2pf = false;  // 4, 6: the row after next prefetched into L2
  // add_norm (a.residual set): add, the kernel reads x and the residual and writes
  // the sum (fwd_fuses_add); else add_first, ln_add writes the sum and the plan
  // above is the plain norm's of the sum.
  bool add = false;
  bool add_first = false;
  // 4 with add: the current row kept as its 16-bit sums (fwd_row_packed), where
  // that buys a second slot an SM (fwd_plan_v4)
  bool pack = false;
  // 1: the long row's shared-memory cache, bytes (v1_cache_bytes; 0: none)
  size_t smem = 0;
};

// The weight type (TW or void: FwdTW) of a forward kernel pointer K.
template <typename K>
struct FwdKernelTW;
template <typename T, typename TW, typename... Rest>
struct FwdKernelTW<void (*)(const T*, const TW*, const TW*, Rest...)> {
  using type = TW;
};

// add_norm: the families whose kernels take the residual (kAdd instantiations),
// the plan's own choices at the shapes models use: 2 for fp32 and 4 for 16-bit
// rows, in 16-byte vectors. Elsewhere (other families, versions forced, no
// vectors) the plan runs ln_add first (FwdPlan::add_first).
template <typename T>
constexpr bool fwd_fuses_add(int family, int vec) {
  return vec == kc::max_vec_elems<T>() &&
         ((family == kRegisters && sizeof(T) == 4) || (family == kRowSlots && sizeof(T) == 2));
}

// Per family (each in its file): fwd_plan_v4 writes the launch shape of 4 (split
// = false) or 6 (split = true) into p (p.vec already set) and returns false when
// the family cannot run the shape, fwd_plan_v1 that of 1 (any shape);
// fwd_launch_* launch exactly p.
bool fwd_plan_v1(const LnForwardArgs& a, FwdPlan& p);  // runs every shape: true
bool fwd_plan_v4(const LnForwardArgs& a, bool split, const LnDevice& dev, FwdPlan& p);
cudaError_t fwd_launch_v1(const LnForwardArgs& a, const FwdPlan& p, cudaStream_t stream);
cudaError_t fwd_launch_v2(const LnForwardArgs& a, const FwdPlan& p, cudaStream_t stream);
cudaError_t fwd_launch_v3(const LnForwardArgs& a, const FwdPlan& p, cudaStream_t stream);
cudaError_t fwd_launch_v4(const LnForwardArgs& a, const FwdPlan& p, cudaStream_t stream);  // 4 and 6

}  // namespace day26
