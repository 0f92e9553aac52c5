// kc/reduce.cuh: warp and block reductions (sum and max) in fp32.
//
// Warp level ---------------------------------------------------------------
//   warp_reduce_sum<W>(v), warp_reduce_max<W>(v)
//   Reduce over aligned groups of W consecutive lanes (W a power of two, 1..32;
//   W = 32 is the whole warp) with an XOR butterfly.
//   Contract: every lane of each W-group is active and calls it (no divergence
//   inside a group). The result is valid in EVERY lane of the group.
//
// Block level --------------------------------------------------------------
//   block_reduce_sum(v, smem), block_reduce_max(v, smem)
//   block_reduce_sum<N>(float (&v)[N], smem), block_reduce_max<N>(...)
//   Reduce over all threads of the block (any 1D/2D/3D shape; threads are
//   numbered x-fastest). The N-value forms reduce N independent values with one
//   barrier instead of N.
//   Contract:
//   - the number of threads is a multiple of 32, at most 1024;
//   - every thread of the block calls it (it contains __syncthreads());
//   - smem points to shared memory of at least 32 * N floats;
//   - the result is valid in EVERY thread;
//   - with kSyncAfter = true (default) the function ends with __syncthreads(),
//     so smem may be reused (or the function called again) at once. With
//     kSyncAfter = false the caller must __syncthreads() before anything writes
//     smem again.
//
// Moments (mean and squared deviations) -------------------------------------
//   warp_combine_mean_m2(mean, m2, n, inv_total) -> MeanM2{mean, m2}
//   Each lane holds a group of n values (n may be 0) as their mean and
//   m2 = sum of (value - mean)^2 (n = 0: m2 = 0, mean any finite value).
//   Returns, in every lane, the mean and the m2 of all the lanes' values
//   together; inv_total = 1 / (the sum of n over the warp), which the caller
//   knows. Applied level by level (a thread's values, a warp's, a block's), it
//   gives a row's variance with ONE exchange per level instead of two (a sum,
//   then squared deviations from the mean), without the cancellation of
//   sum(x^2) - n * mean^2 when |mean| >> std: a group's m2 is already relative
//   to its own mean, and the groups are combined relative to a shift K, the
//   mean of the first lane with n > 0 (d = mean - K, small):
//     mean_total = K + sum(n d) / n_total
//     m2_total   = sum(m2 + n d^2) - (sum(n d))^2 / n_total
//   Accuracy: exact for exact inputs; an error e in a group's mean enters m2 as
//   about 2 n e d (first order, since that group's m2 was taken about the wrong
//   mean), so compute group means accurately (e.g. about a shift, as
//   common/reduce_test's kernel does, or corrected by their residual, as day26's
//   forward does).
//   Contract: all 32 lanes call it (no divergence); the result is valid in
//   every lane; m2 >= 0 (clamped).
//
// NaN and inf ---------------------------------------------------------------
//   sum: IEEE addition (a NaN or inf - inf anywhere gives NaN; inf otherwise
//   gives inf). max: propagates NaN like torch.max (fmaxf would drop it); the
//   identity is -inf, so the max of an all -inf block is -inf.
//   Summation order is fixed by the block shape, so results are bitwise
//   reproducible run to run for the same launch configuration.
#pragma once

#include <cuda_runtime.h>

namespace kc {

constexpr unsigned kFullMask = 0xffffffffu;

// max that propagates NaN from either side
__device__ __forceinline__ float nan_max(float a, float b) {
  return (a > b || a != a) ? a : b;
}

template <int W = 32>
__device__ __forceinline__ float warp_reduce_sum(float v) {
  static_assert(W >= 1 && W <= 32 && (W & (W - 1)) == 0, "W must be a power of two <= 32");
#pragma unroll
  for (int off = W / 2; off > 0; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off, W);
  return v;
}

template <int W = 32>
__device__ __forceinline__ float warp_reduce_max(float v) {
  static_assert(W >= 1 && W <= 32 && (W & (W - 1)) == 0, "W must be a power of two <= 32");
#pragma unroll
  for (int off = W / 2; off > 0; off >>= 1) v = nan_max(v, __shfl_xor_sync(kFullMask, v, off, W));
  return v;
}

namespace detail {

struct SumOp {
  static __device__ __forceinline__ float identity() { return 0.f; }
  static __device__ __forceinline__ float apply(float a, float b) { return a + b; }
  static __device__ __forceinline__ float warp(float v) { return warp_reduce_sum<32>(v); }
};
struct MaxOp {
  static __device__ __forceinline__ float identity() { return -__int_as_float(0x7f800000); }
  static __device__ __forceinline__ float apply(float a, float b) { return nan_max(a, b); }
  static __device__ __forceinline__ float warp(float v) { return warp_reduce_max<32>(v); }
};

__device__ __forceinline__ int linear_tid() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}
__device__ __forceinline__ int block_threads() { return blockDim.x * blockDim.y * blockDim.z; }

template <typename Op, int N, bool kSyncAfter>
__device__ __forceinline__ void block_reduce(float (&v)[N], float* smem) {
  const int tid = linear_tid();
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int nwarps = block_threads() >> 5;
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = Op::warp(v[i]);
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) smem[i * 32 + warp] = v[i];
  }
  __syncthreads();
  // Every warp reduces the per-warp partials itself, so the result lands in
  // every thread without a second barrier and a broadcast.
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float p = lane < nwarps ? smem[i * 32 + lane] : Op::identity();
    v[i] = Op::warp(p);
  }
  if (kSyncAfter) __syncthreads();
}

}  // namespace detail

template <int N, bool kSyncAfter = true>
__device__ __forceinline__ void block_reduce_sum(float (&v)[N], float* smem) {
  detail::block_reduce<detail::SumOp, N, kSyncAfter>(v, smem);
}
template <int N, bool kSyncAfter = true>
__device__ __forceinline__ void block_reduce_max(float (&v)[N], float* smem) {
  detail::block_reduce<detail::MaxOp, N, kSyncAfter>(v, smem);
}
template <bool kSyncAfter = true>
__device__ __forceinline__ float block_reduce_sum(float v, float* smem) {
  float a[1] = {v};
  detail::block_reduce<detail::SumOp, 1, kSyncAfter>(a, smem);
  return a[0];
}
template <bool kSyncAfter = true>
__device__ __forceinline__ float block_reduce_max(float v, float* smem) {
  float a[1] = {v};
  detail::block_reduce<detail::MaxOp, 1, kSyncAfter>(a, smem);
  return a[0];
}

struct MeanM2 {
  float mean;
  float m2;
};

__device__ __forceinline__ MeanM2 warp_combine_mean_m2(float mean, float m2, float n, float inv_total) {
  const unsigned has = __ballot_sync(kFullMask, n > 0.f);
  const float shift = __shfl_sync(kFullMask, mean, has ? __ffs(has) - 1 : 0);
  const float d = mean - shift;
  float a = n * d;          // sum over this lane's values of (x - shift)
  float u = fmaf(a, d, m2);  // sum over this lane's values of (x - shift)^2
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    a += __shfl_xor_sync(kFullMask, a, off);
    u += __shfl_xor_sync(kFullMask, u, off);
  }
  const float mo = a * inv_total;
  return MeanM2{shift + mo, fmaxf(fmaf(-a, mo, u), 0.f)};
}

}  // namespace kc
