// LayerNorm forward, version 3: version 2's math on a cp.async pipeline of rows
// in shared memory (layernorm_fwd_common.cuh has the math and the list of
// versions). Block rows; without 16-byte vectors the rows' covering granules.
#include "layernorm_fwd_common.cuh"

#include "kc/async_copy.cuh"
#include "kc/check.cuh"

namespace day26 {
namespace {

// v3. Block path, VEC = 16 bytes of T, blockDim.x = threads per row; dynamic
// shared memory: stages * D elements of T (16-byte aligned rows, D % VEC == 0).
template <typename T, typename TW, int ITERS>
__global__ void __launch_bounds__(kMaxTpr)
ln_fwd_v3(const T* __restrict__ x, const TW* __restrict__ w, const TW* __restrict__ b,
          T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
          int64_t rows, int64_t D, float eps, int stages, bool w_f32) {
  constexpr int VEC = kc::max_vec_elems<T>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sx = reinterpret_cast<T*>(smem_raw);  // [stages][D]
  __shared__ float red[32];
  const int tpr = blockDim.x, t = threadIdx.x;
  const int64_t stride = gridDim.x;
  auto issue = [&](int64_t r, int stage) {  // this thread's vectors of row r -> stage
    if (r < rows) {
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const int64_t c = (int64_t(it) * tpr + t) * VEC;
        if (c < D) kc::cp_async_16(sx + stage * D + c, x + r * D + c);
      }
    }
    kc::cp_async_commit();  // one group per row, empty past the end, so counts stay uniform
  };
  const int64_t first = blockIdx.x;
  const RowCols<VEC, ITERS> rc(D, tpr, t);
  const float inv_d = 1.f / float(D);
  for (int s = 0; s < stages - 1; ++s) issue(first + s * stride, s);
  int stage = 0;
  for (int64_t row = first; row < rows; row += stride) {
    issue(row + (stages - 1) * stride, stage == 0 ? stages - 1 : stage - 1);  // the stage read last iteration
    kc::cp_async_wait(stages - 1);                                            // this row's group has landed
    RowRegs<T, VEC, ITERS> cur;
#pragma unroll
    for (int it = 0; it < ITERS; ++it)
      if (rc.has(it)) cur.v[it] = *reinterpret_cast<const kc::Vec<T, VEC>*>(sx + stage * D + rc.col(it));
    fwd_row(RowCentering{}, cur, w, b, w_f32, y + row * D, row_or_null(mean_out, row), rstd_out + row, rc, inv_d,
            float(D), eps, t, [&](float v) { return kc::block_reduce_sum(v, red); });
    stage = stage + 1 == stages ? 0 : stage + 1;
  }
  kc::cp_async_wait(0);
}

// v3 without 16-byte vectors (a pointer or D that allows none): the pipeline
// copies the aligned 16-byte granules that cover each row, the row's first
// element h elements into its first (h from the row's address), and the math is
// version 2's run-time loop (fwd_row_scalar) on the row in shared memory. Threads
// read each other's copies: a barrier after the wait, and one before a stage is
// refilled. Dynamic shared memory: stages * granule_row(D) elements of T. A row's
// first and last granules also hold bytes of its neighbours (or up to 15 bytes
// before or after the tensor, inside the 16-byte granule of its first or last
// element, so never across a page); the loop reads only the row's elements.
template <typename T, typename TW>
__global__ void __launch_bounds__(kMaxTpr)
ln_fwd_v3_granules(const T* __restrict__ x, const TW* __restrict__ w, const TW* __restrict__ b,
                   T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                   int64_t rows, int64_t D, float eps, int stages, bool w_f32) {
  constexpr int V = kc::max_vec_elems<T>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sx = reinterpret_cast<T*>(smem_raw);  // [stages][ld]
  __shared__ float red[32];
  const int64_t ld = granule_row(D, V);
  const int tpr = blockDim.x, t = threadIdx.x;
  const int64_t stride = gridDim.x;
  auto phase = [&](int64_t r) { return int(reinterpret_cast<uintptr_t>(x + r * D) / sizeof(T) % V); };
  auto issue = [&](int64_t r, int stage) {  // row r's granules -> stage
    if (r < rows) {
      const int h = phase(r);
      const T* xa = x + r * D - h;  // 16-byte aligned
      for (int64_t c = int64_t(t) * V; c < h + D; c += int64_t(tpr) * V) kc::cp_async_16(sx + stage * ld + c, xa + c);
    }
    kc::cp_async_commit();  // one group per row, empty past the end, so counts stay uniform
  };
  const int64_t first = blockIdx.x;
  const float inv_d = 1.f / float(D);
  for (int s = 0; s < stages - 1; ++s) issue(first + s * stride, s);
  int stage = 0;
  for (int64_t row = first; row < rows; row += stride) {
    __syncthreads();  // every thread is done with the stage refilled next
    issue(row + (stages - 1) * stride, stage == 0 ? stages - 1 : stage - 1);
    kc::cp_async_wait(stages - 1);  // this thread's copies of this row have landed
    __syncthreads();                // and everyone's
    fwd_row_scalar(sx + stage * ld + phase(row), w, b, w_f32, y + row * D, row_or_null(mean_out, row),
                   rstd_out + row, D, tpr, t, inv_d, eps, [&](float v) { return kc::block_reduce_sum(v, red); });
    stage = stage + 1 == stages ? 0 : stage + 1;
  }
  kc::cp_async_wait(0);
}

template <typename T, typename TW>
using FwdV3Kernel = void (*)(const T*, const TW*, const TW*, T*, float*, float*, int64_t, int64_t, float, int, bool);

}  // namespace

cudaError_t fwd_launch_v3(const LnForwardArgs& a, const FwdPlan& p, cudaStream_t stream) {
  return ln_typed(a.dt, a.wdt, [&](auto t, auto tw) {
    using T = decltype(t);
    using TW = decltype(tw);
    constexpr int V = kc::max_vec_elems<T>();
    const T* x = static_cast<const T*>(a.x);
    T* y = static_cast<T*>(a.y);
    const bool w_f32 = a.wdt == kc::DType::F32;  // read by the kernels with TW = void only
    using KW = FwdTW<T, TW, true>;
    const auto kernel = p.vec != V ? FwdV3Kernel<T, KW>(ln_fwd_v3_granules<T, KW>)
                                   : with_iters<kMaxEpt / V>(p.c2.iters, FwdV3Kernel<T, KW>(nullptr), [&](auto it) {
                                       return FwdV3Kernel<T, KW>(ln_fwd_v3<T, KW, decltype(it)::value>);
                                     });
    if (!kernel) return cudaErrorInvalidConfiguration;
    const size_t smem = size_t(p.stages) * v3_row_bytes(a.cols, sizeof(T), p.vec != V);
    KC_CUDA_TRY(kc::allow_dynamic_smem(kernel, smem));
    int per_sm = 0;
    KC_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, p.c2.threads, smem));
    const int64_t grid = persistent_grid(a.rows, per_sm);
    kernel<<<unsigned(grid), p.c2.threads, smem, stream>>>(x, static_cast<const KW*>(a.weight),
                                                           static_cast<const KW*>(a.bias), y, a.mean, a.rstd,
                                                           a.rows, a.cols, a.eps, p.stages, w_f32);
    return cudaGetLastError();
  });
}

}  // namespace day26
