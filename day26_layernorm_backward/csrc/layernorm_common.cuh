// Shared by layernorm_fwd.cu and layernorm_bwd.cu: the launch configuration
// of the v2 kernels, chosen from the row length and the dtype.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cuda_runtime.h>

#include "kc/convert.cuh"
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
// registers). A tuning knob: DAY26_TARGET_ITERS=1|2|4|8 (read at every launch,
// so a benchmark can sweep it); default kDefaultTargetIters.
constexpr int kDefaultTargetIters = 4;
inline int target_iters() {
  const char* e = std::getenv("DAY26_TARGET_ITERS");
  const int v = e ? std::atoi(e) : 0;
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

// Number of multiprocessors of the current device (cached per device).
inline int num_sms() {
  static int cache[64] = {0};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) dev = 0;
  if (cache[dev] == 0) {
    int n = 0;
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    cache[dev] = n > 0 ? n : 1;
  }
  return cache[dev];
}

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

// Allow `dynamic` bytes of dynamic shared memory for `kernel`. The default cap
// (48 KB) counts static shared memory too, so raise it with a margin whenever
// the dynamic part comes near it.
template <typename Kernel>
cudaError_t allow_dynamic_smem(Kernel kernel, size_t dynamic) {
  if (dynamic + 4096 <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dynamic));
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

// Load VEC elements of T starting at p (aligned when VEC > 1) as fp32.
template <typename T, int VEC>
__device__ __forceinline__ void load_f32(const T* p, float (&out)[VEC]) {
  const kc::Vec<T, VEC> v = kc::load_vec<VEC>(p);
#pragma unroll
  for (int j = 0; j < VEC; ++j) out[j] = kc::to_float(v.v[j]);
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

template <typename T, int VEC>
__device__ __forceinline__ void store_from_f32(T* p, const float (&in)[VEC]) {
  kc::Vec<T, VEC> v;
#pragma unroll
  for (int j = 0; j < VEC; ++j) v.v[j] = kc::from_float<T>(in[j]);
  kc::store_vec<VEC>(p, v);
}

}  // namespace day26
