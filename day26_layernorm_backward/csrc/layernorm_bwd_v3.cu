// LayerNorm backward, version 3: version 2's math on a cp.async pipeline. Each
// block of the persistent grid keeps the next `stages - 1` rows of x and dy in
// flight into shared memory (each thread copies and reads back only its own
// 16-byte vectors, so the stages need no barrier), and, since the rows no
// longer leave shared memory to the accumulators, dy * xhat and dy per column
// are summed in registers (each thread owns fixed columns). Block path with
// 16-byte vectors and two stages that fit only; else version 2.
// Selectable only (version=3; the plan never picks it), so compiled once per
// input dtype and ITERS: the weight dtype is a run-time flag (one uniform branch
// per weight vector, load_param_any) and the column sums are always kept and
// written only when asked for (partial not null).
#include "layernorm_bwd_common.cuh"

#include "kc/async_copy.cuh"
#include "kc/check.cuh"
#include "kc/reduce.cuh"

namespace day26 {
namespace {

// v3. Block path, VEC = 16 bytes of T, blockDim.x = threads per row <= kMaxTpr;
// dynamic shared memory: stages * 2 * D elements of T ([stages][x | dy][D]);
// w: fp32 when w_f32, else T (or null); partial: [gridDim.x][2][D] fp32 when not
// null (every column written).
template <typename T, int ITERS>
__global__ void __launch_bounds__(kMaxTpr)
ln_bwd_v3(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
          const float* __restrict__ rstd, const void* __restrict__ w, T* __restrict__ dx,
          float* __restrict__ partial, int64_t rows, int64_t D, int stages, bool w_f32) {
  constexpr int VEC = kc::max_vec_elems<T>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sbuf = reinterpret_cast<T*>(smem_raw);  // stage s: x at s * 2D, dy at s * 2D + D
  __shared__ float red[64];
  kc::launch_dependents();  // see launch_finalize
  const int tpr = blockDim.x, t = threadIdx.x;
  const int64_t stride = gridDim.x;
  const float inv_d = 1.f / float(D);
  auto issue = [&](int64_t r, int stage) {  // this thread's vectors of row r -> stage
    if (r < rows) {
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const int64_t c = (int64_t(it) * tpr + t) * VEC;
        if (c < D) {
          kc::cp_async_16(sbuf + (2 * stage) * D + c, x + r * D + c);
          kc::cp_async_16(sbuf + (2 * stage + 1) * D + c, dy + r * D + c);
        }
      }
    }
    kc::cp_async_commit();  // one group per row, empty past the end, so counts stay uniform
  };
  float accw[ITERS][VEC], accb[ITERS][VEC];
#pragma unroll
  for (int it = 0; it < ITERS; ++it)
#pragma unroll
    for (int j = 0; j < VEC; ++j) accw[it][j] = accb[it][j] = 0.f;

  const int64_t first = blockIdx.x;
  for (int s = 0; s < stages - 1; ++s) issue(first + s * stride, s);
  int stage = 0;
  for (int64_t row = first; row < rows; row += stride) {
    issue(row + (stages - 1) * stride, stage == 0 ? stages - 1 : stage - 1);  // the stage read last iteration
    const float mu = load_mean(mean, row), rs = rstd[row];
    kc::cp_async_wait(stages - 1);  // this row's group has landed
    const T* sx = sbuf + (2 * stage) * D;
    const T* sd = sx + D;
    float sums[2] = {0.f, 0.f};
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int64_t c = (int64_t(it) * tpr + t) * VEC;
      if (c < D) {
        float wv[VEC], pw[VEC], pb[VEC];
        load_param_any<T, VEC>(w, w_f32, c, 1.f, wv);
        bwd_pass1_wv<T, VEC>(*reinterpret_cast<const kc::Vec<T, VEC>*>(sx + c),
                             *reinterpret_cast<const kc::Vec<T, VEC>*>(sd + c), wv, mu, rs, sums, pw, pb);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          accw[it][j] += pw[j];
          accb[it][j] += pb[j];
        }
      }
    }
    kc::block_reduce_sum<2>(sums, red);
    if (dx) {
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const int64_t c = (int64_t(it) * tpr + t) * VEC;
        if (c < D) {
          float wv[VEC];
          load_param_any<T, VEC>(w, w_f32, c, 1.f, wv);
          bwd_pass2_wv<T, VEC>(*reinterpret_cast<const kc::Vec<T, VEC>*>(sx + c),
                               *reinterpret_cast<const kc::Vec<T, VEC>*>(sd + c), wv, c, mu, rs, row_a(sums[0], inv_d, mean),
                               sums[1] * inv_d, dx + row * D);
        }
      }
    }
    stage = stage + 1 == stages ? 0 : stage + 1;
  }
  kc::cp_async_wait(0);
  if (partial) store_partial_row<VEC, ITERS>(partial + int64_t(blockIdx.x) * 2 * D, accw, accb, D, D, tpr, t,
                                                         mean != nullptr);
}

template <typename T>
using V3Kernel = void (*)(const T*, const T*, const float*, const float*, const void*, T*, float*, int64_t, int64_t,
                          int, bool);

template <typename T>
V3Kernel<T> v3_kernel(const LnBwdPlan& p) {
  constexpr int V = kc::max_vec_elems<T>();
  return with_iters<kMaxEpt / V>(p.iters, V3Kernel<T>(nullptr),
                                 [&](auto it) { return V3Kernel<T>(ln_bwd_v3<T, decltype(it)::value>); });
}

}  // namespace

// 16-byte vectors, the block path of v2_config, at least two stages of x and dy
// in the shared-memory budget (pipe_stages); the block shape of v3_config.
bool bwd_plan_v3(const LnBackwardArgs& a, LnBwdPlan& p) {
  const size_t elem = elem_size(a.dt);
  const int V = int(16 / elem);
  const V2Config c2 = v2_config(a.cols, p.vec);
  const int stages = pipe_stages(2 * size_t(a.cols) * elem);
  if (!c2.ok || p.vec != V || c2.warp || stages < 2) return false;
  const V2Config cfg = v3_config(a.cols, V);
  p.iters = cfg.iters;
  p.tpr = cfg.tpr;
  p.threads = cfg.threads;
  p.stages = stages;
  p.smem = size_t(stages) * 2 * size_t(a.cols) * elem;
  return ln_input_typed(a.dt, [&](auto t) {
    const auto kernel = v3_kernel<decltype(t)>(p);
    if (!kernel || kc::allow_dynamic_smem(kernel, p.smem) != cudaSuccess) return false;
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, p.threads, p.smem) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    p.grid = persistent_grid(a.rows, per_sm);
    p.partial_rows = p.grid;
    return true;
  });
}

cudaError_t bwd_launch_v3(const LnBackwardArgs& a, const LnBwdPlan& p, cudaStream_t stream) {
  return ln_input_typed(a.dt, [&](auto t) {
    using T = decltype(t);
    return launch_bwd_main<T, void>(v3_kernel<T>(p), a, p, stream, p.stages, a.wdt == kc::DType::F32);
  });
}

}  // namespace day26
