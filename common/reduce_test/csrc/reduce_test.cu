// Test kernels for kc/reduce.cuh (and its moments combine). Each thread records the reduction result it
// sees, so the test checks both the value and "valid in every thread". The
// block kernel calls three reductions back to back on ONE shared buffer, which
// checks the kSyncAfter = true contract (buffer reusable on return).
#include "reduce_test.h"

#include "kc/check.cuh"
#include "kc/convert.cuh"
#include "kc/reduce.cuh"
#include "kc/switch.cuh"

namespace {

template <typename T>
__global__ void block_reduce_test_kernel(const T* __restrict__ x, int64_t len, float* __restrict__ out) {
  __shared__ float smem[64];  // 32 * N floats for N = 2
  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x;
  float s = 0.f, m = -INFINITY, sq = 0.f;
  for (int64_t i = tid; i < len; i += blockDim.x) {
    float v = kc::to_float(x[row * len + i]);
    s += v;
    m = kc::nan_max(m, v);
    sq += v * v;
  }
  const float bs = kc::block_reduce_sum(s, smem);
  const float bm = kc::block_reduce_max(m, smem);
  float pair[2] = {m, sq};
  kc::block_reduce_sum<2>(pair, smem);  // the N = 2 form: pair[1] = sum of squares
  float* o = out + (row * blockDim.x + tid) * 3;
  o[0] = bs;
  o[1] = bm;
  o[2] = pair[1];
}

template <int W>
__global__ void warp_reduce_test_kernel(const float* __restrict__ x, int64_t groups, float* __restrict__ out) {
  const int64_t lane_global = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t g = lane_global / W;
  const int l = lane_global % W;
  // Out-of-range groups still take part in the shuffles (all lanes active) but write nothing.
  const float v = g < groups ? x[g * W + l] : 0.f;
  const float s = kc::warp_reduce_sum<W>(v);
  const float m = kc::warp_reduce_max<W>(v);
  if (g < groups) {
    out[(g * W + l) * 2 + 0] = s;
    out[(g * W + l) * 2 + 1] = m;
  }
}

// One warp per row: lanes < skip hold no values, the others take the row's
// elements round robin; each lane's group goes in as (mean, m2), both computed
// about the lane's first value (a shift), and every lane records the combined
// (mean, m2) it gets back.
__global__ void warp_mean_m2_test_kernel(const float* __restrict__ x, int64_t rows, int len, int skip,
                                         float* __restrict__ out) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;  // whole warps leave together
  const float* xr = x + row * len;
  const int users = 32 - skip;
  float n = 0.f, a = 0.f, u = 0.f, k = 0.f;
  if (lane >= skip && lane - skip < len) {
    k = xr[lane - skip];
    for (int i = lane - skip; i < len; i += users) {
      const float d = xr[i] - k;
      n += 1.f, a += d, u = fmaf(d, d, u);
    }
  }
  const float mo = n > 0.f ? a / n : 0.f;
  const kc::MeanM2 r = kc::warp_combine_mean_m2(k + mo, fmaxf(fmaf(-a, mo, u), 0.f), n, 1.f / float(len));
  out[(row * 32 + lane) * 2 + 0] = r.mean;
  out[(row * 32 + lane) * 2 + 1] = r.m2;
}

}  // namespace

cudaError_t launch_warp_mean_m2_test(const float* x, int64_t rows, int len, int skip, float* out,
                                    cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (skip < 0 || skip > 31 || len < 1) return cudaErrorInvalidValue;
  const int warps = 4;
  warp_mean_m2_test_kernel<<<unsigned((rows + warps - 1) / warps), warps * 32, 0, stream>>>(x, rows, len, skip, out);
  return cudaGetLastError();
}

cudaError_t launch_block_reduce_test(const void* x, kc::DType dt, int64_t rows, int64_t len,
                                     int threads, float* out, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return KC_DTYPE_SWITCH(dt, T, [&] {
    block_reduce_test_kernel<T><<<rows, threads, 0, stream>>>(static_cast<const T*>(x), len, out);
    return cudaGetLastError();
  });
}

cudaError_t launch_warp_reduce_test(const float* x, int64_t groups, int width, float* out,
                                    cudaStream_t stream) {
  if (groups == 0) return cudaSuccess;
  const int64_t lanes = groups * width;
  const int threads = 128;
  const unsigned blocks = unsigned((lanes + threads - 1) / threads);
  switch (width) {
#define KC_CASE(W) case W: warp_reduce_test_kernel<W><<<blocks, threads, 0, stream>>>(x, groups, out); break;
    KC_CASE(1) KC_CASE(2) KC_CASE(4) KC_CASE(8) KC_CASE(16) KC_CASE(32)
#undef KC_CASE
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
