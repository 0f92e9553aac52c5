// naive.cu: the seed's step-by-step attention, made general (batched, strided,
// causal, any head dim, float64 / float32 / float16 / bfloat16).
//
// Forward (3 launches):  S = scale * Q K^T            tiled_matmul  (S in an N x N workspace)
//                        P = softmax(S), lse          softmax_forward_kernel (in place)
//                        O = P V                      tiled_matmul
// Backward (7 launches, the seed's steps; P is recomputed from lse):
//                        S = scale * Q K^T            tiled_matmul
//                        P = exp(S - lse)             probs_from_lse_kernel (in place)
//                        dV = P^T dO                  tiled_matmul (trans_a)
//                        dP = dO V^T                  tiled_matmul (trans_b)
//                        dS = P * (dP - rowsum(dP * P) + grad_lse)   softmax_backward_kernel (in place)
//                        dQ = scale * dS K            tiled_matmul
//                        dK = scale * dS^T Q          tiled_matmul (trans_a)
// Grouped-query attention (k, v with Hk heads, G = H / Hk): the matmuls that read
// k or v map q head h to kv head h / G (the matmul's b_hdiv), and dV = P^T dO,
// dK = scale dS^T Q sum over the G q heads of a group inside the matmul (kgroups:
// the K loop runs over the group's heads one after the other, one accumulator).
// The seed's defects fixed here: the transpose path indexed as if matrices were
// square (here op(A) is M x K from a K x M store, any M, N, K), one 2D head
// (here batch x heads with arbitrary strides), fp32 only.
//
// Kernel versions kept: this file is "v0", the baseline the fused kernels
// (flash_fwd.cu, flash_bwd*.cu) are measured against.
#include "attention.h"

#include <type_traits>

#include "kc/check.cuh"
#include "kc/convert.cuh"
#include "kc/reduce.cuh"

namespace day50 {
namespace {

// ---------------------------------------------------------------- conversions
template <typename Acc, typename T> __device__ __forceinline__ Acc load_as(const T* p) {
  if constexpr (std::is_same_v<T, double>) {
    return Acc(*p);
  } else {
    return Acc(kc::to_float(*p));
  }
}
template <typename T, typename Acc> __device__ __forceinline__ void store_as(T* p, Acc v) {
  if constexpr (std::is_same_v<T, double>) {
    *p = double(v);
  } else {
    *p = kc::from_float<T>(float(v));
  }
}

// -------------------------------------------------------------- block reductions
// float: kc/reduce.cuh. double (the gradcheck path): the same shape of
// reduction (warp butterfly, per-warp partials in shared memory, every warp
// reduces the partials) for double, which kc/reduce.cuh does not cover.
// Contract as kc::block_reduce_*: blockDim a multiple of 32, every thread
// calls, result in every thread, smem reusable on return.
__device__ __forceinline__ double warp_sum_f64(double v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kc::kFullMask, v, off);
  return v;
}
__device__ __forceinline__ double warp_max_f64(double v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const double o = __shfl_xor_sync(kc::kFullMask, v, off);
    v = (o > v || o != o) ? o : v;
  }
  return v;
}
template <bool kMax>
__device__ double block_reduce_f64(double v, double* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = kMax ? warp_max_f64(v) : warp_sum_f64(v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  double p = lane < nwarps ? smem[lane] : (kMax ? -INFINITY : 0.0);
  p = kMax ? warp_max_f64(p) : warp_sum_f64(p);
  __syncthreads();
  return p;
}
template <typename Acc> __device__ __forceinline__ Acc block_sum(Acc v, void* smem) {
  if constexpr (std::is_same_v<Acc, double>) {
    return block_reduce_f64<false>(v, static_cast<double*>(smem));
  } else {
    return kc::block_reduce_sum(v, static_cast<float*>(smem));
  }
}
template <typename Acc> __device__ __forceinline__ Acc block_max(Acc v, void* smem) {
  if constexpr (std::is_same_v<Acc, double>) {
    return block_reduce_f64<true>(v, static_cast<double*>(smem));
  } else {
    return kc::block_reduce_max(v, static_cast<float*>(smem));
  }
}

template <typename Acc> __device__ __forceinline__ Acc exp_acc(Acc x) {
  if constexpr (std::is_same_v<Acc, double>) {
    return exp(x);
  } else {
    return expf(x);  // full-precision expf: the naive path is the accurate one
  }
}

// ------------------------------------------------------------------ tiled matmul
// C[bh] (M x N) = alpha * op(A[bh]) (M x K) @ op(B[bh]) (K x N), fp accumulation in Acc.
// Block: 16 x 16 threads, a 64 x 64 tile of C, 4 x 4 outputs per thread, K in
// steps of 16 through shared memory (stored as Acc, one column of padding).
// kTransA: A is stored K x M (element (m, k) at k * sr + m * sc); the tile loader
// then walks m fastest so that a transposed contiguous store is still read
// along its contiguous dimension. Likewise kTransB (B stored N x K).
// Any M, N, K (bounds-checked loads and stores), any strides, 64-bit offsets.
// grid: (ceil(N / 64), ceil(M / 64), min(batch * heads, 65535)); z loops over the rest.
// Heads (for grouped-query attention): C has `heads` heads; C[b, h] sums over
// g < kgroups the products of A[b, h * kgroups + g] and B[b, (h * kgroups + g) / b_hdiv]
// (kgroups = b_hdiv = 1: the plain batched matmul).
constexpr int kTM = 64, kTN = 64, kTK = 16, kThreads = 256;

template <typename TA, typename TB, typename TC, typename Acc, bool kTransA, bool kTransB>
__global__ void __launch_bounds__(kThreads)
tiled_matmul_kernel(View4 a, View4 b, View4 c, int64_t heads, int64_t nbatch, int64_t M, int64_t N, int64_t K,
                    int64_t kgroups, int64_t b_hdiv, Acc alpha) {
  __shared__ Acc As[kTK][kTM + 1];
  __shared__ Acc Bs[kTK][kTN + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t m0 = int64_t(blockIdx.y) * kTM, n0 = int64_t(blockIdx.x) * kTN;
  for (int64_t z = blockIdx.z; z < nbatch; z += gridDim.z) {
    const int64_t bi = z / heads, hi = z % heads;
    TC* C = static_cast<TC*>(const_cast<void*>(c.ptr)) + bi * c.sb + hi * c.sh;
    Acc acc[4][4] = {};
    for (int64_t gi = 0; gi < kgroups; ++gi) {
      const int64_t ha = hi * kgroups + gi, hb = ha / b_hdiv;
      const TA* A = static_cast<const TA*>(a.ptr) + bi * a.sb + ha * a.sh;
      const TB* Bp = static_cast<const TB*>(b.ptr) + bi * b.sb + hb * b.sh;
      for (int64_t k0 = 0; k0 < K; k0 += kTK) {
        // A tile: 64 (m) x 16 (k) = 1024 elements, 4 per thread.
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int e = threadIdx.x + r * kThreads;
          const int mm = kTransA ? e % kTM : e / kTK;
          const int kk = kTransA ? e / kTM : e % kTK;
          const int64_t gm = m0 + mm, gk = k0 + kk;
          Acc val = Acc(0);
          if (gm < M && gk < K) {
            const int64_t off = kTransA ? gk * a.sr + gm * a.sc : gm * a.sr + gk * a.sc;
            val = load_as<Acc>(A + off);
          }
          As[kk][mm] = val;
        }
        // B tile: 16 (k) x 64 (n).
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int e = threadIdx.x + r * kThreads;
          const int nn = kTransB ? e / kTK : e % kTN;
          const int kk = kTransB ? e % kTK : e / kTN;
          const int64_t gn = n0 + nn, gk = k0 + kk;
          Acc val = Acc(0);
          if (gn < N && gk < K) {
            const int64_t off = kTransB ? gn * b.sr + gk * b.sc : gk * b.sr + gn * b.sc;
            val = load_as<Acc>(Bp + off);
          }
          Bs[kk][nn] = val;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kTK; ++kk) {
          Acc av[4], bv[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) av[i] = As[kk][ty + 16 * i];
#pragma unroll
          for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][tx + 16 * j];
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
        }
        __syncthreads();
      }
    }  // gi
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t gm = m0 + ty + 16 * i;
      if (gm >= M) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t gn = n0 + tx + 16 * j;
        if (gn < N) store_as(C + gm * c.sr + gn * c.sc, alpha * acc[i][j]);
      }
    }
  }
}

// ------------------------------------------------------------------ softmax kernels
// One block (128 threads) per row of S (rows = B*H*Nq, row length Nk), Acc storage.
// Causal (top-left): in row i (query index i = row % Nq) keys j > i are masked.
constexpr int kRowThreads = 128;

__device__ __forceinline__ int64_t valid_keys(int64_t row, int64_t Nq, int64_t Nk, bool causal) {
  if (!causal) return Nk;
  const int64_t i = row % Nq;
  return i + 1 < Nk ? i + 1 : Nk;
}

// P = softmax(S) in place (masked entries 0), lse = max + log(sum exp(S - max)).
template <typename Acc>
__global__ void __launch_bounds__(kRowThreads)
softmax_forward_kernel(Acc* __restrict__ s, Acc* __restrict__ lse, int64_t rows, int64_t Nq, int64_t Nk, bool causal) {
  __shared__ Acc red[32];
  const int64_t row = blockIdx.x;
  Acc* x = s + row * Nk;
  const int64_t nv = valid_keys(row, Nq, Nk, causal);
  Acc m = -INFINITY;
  for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) m = x[j] > m || x[j] != x[j] ? x[j] : m;
  m = block_max<Acc>(m, red);
  Acc sum = 0;
  for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) sum += exp_acc<Acc>(x[j] - m);
  sum = block_sum<Acc>(sum, red);
  const Acc inv = Acc(1) / sum;
  for (int64_t j = threadIdx.x; j < Nk; j += blockDim.x) x[j] = j < nv ? exp_acc<Acc>(x[j] - m) * inv : Acc(0);
  if (threadIdx.x == 0) lse[row] = m + log(sum);
}

// P = exp(S - lse) in place (masked entries 0): the backward's recompute.
template <typename Acc>
__global__ void __launch_bounds__(kRowThreads)
probs_from_lse_kernel(Acc* __restrict__ s, const Acc* __restrict__ lse, int64_t Nq, int64_t Nk, bool causal) {
  const int64_t row = blockIdx.x;
  Acc* x = s + row * Nk;
  const int64_t nv = valid_keys(row, Nq, Nk, causal);
  const Acc l = lse[row];
  for (int64_t j = threadIdx.x; j < Nk; j += blockDim.x) x[j] = j < nv ? exp_acc<Acc>(x[j] - l) : Acc(0);
}

// dS = P * (dP - (rowsum(dP * P) - grad_lse)), written over dP.
template <typename Acc>
__global__ void __launch_bounds__(kRowThreads)
softmax_backward_kernel(const Acc* __restrict__ p, Acc* __restrict__ dp, const Acc* __restrict__ grad_lse,
                        int64_t Nk) {
  __shared__ Acc red[32];
  const int64_t row = blockIdx.x;
  const Acc* pr = p + row * Nk;
  Acc* g = dp + row * Nk;
  Acc dot = 0;
  for (int64_t j = threadIdx.x; j < Nk; j += blockDim.x) dot += pr[j] * g[j];
  dot = block_sum<Acc>(dot, red);
  if (grad_lse != nullptr) dot -= grad_lse[row];
  for (int64_t j = threadIdx.x; j < Nk; j += blockDim.x) g[j] = pr[j] * (g[j] - dot);
}

// ------------------------------------------------------------------ launch helpers
// heads: of C (nbatch = batch * heads); kgroups, b_hdiv as tiled_matmul_kernel.
template <typename TA, typename TB, typename TC, typename Acc>
cudaError_t matmul(View4 a, View4 b, View4 c, int64_t heads, int64_t nbatch, int64_t M, int64_t N, int64_t K,
                   bool ta, bool tb, double alpha, cudaStream_t stream, int64_t kgroups = 1, int64_t b_hdiv = 1) {
  if (nbatch == 0 || M == 0 || N == 0) return cudaSuccess;
  if ((N + kTN - 1) / kTN > 0x7fffffff || (M + kTM - 1) / kTM > 65535) return cudaErrorInvalidConfiguration;
  const dim3 grid(unsigned((N + kTN - 1) / kTN), unsigned((M + kTM - 1) / kTM),
                  unsigned(nbatch < 65535 ? nbatch : 65535));
  const Acc al = Acc(alpha);
  if (ta && tb) {
    tiled_matmul_kernel<TA, TB, TC, Acc, true, true>
        <<<grid, kThreads, 0, stream>>>(a, b, c, heads, nbatch, M, N, K, kgroups, b_hdiv, al);
  } else if (ta) {
    tiled_matmul_kernel<TA, TB, TC, Acc, true, false>
        <<<grid, kThreads, 0, stream>>>(a, b, c, heads, nbatch, M, N, K, kgroups, b_hdiv, al);
  } else if (tb) {
    tiled_matmul_kernel<TA, TB, TC, Acc, false, true>
        <<<grid, kThreads, 0, stream>>>(a, b, c, heads, nbatch, M, N, K, kgroups, b_hdiv, al);
  } else {
    tiled_matmul_kernel<TA, TB, TC, Acc, false, false>
        <<<grid, kThreads, 0, stream>>>(a, b, c, heads, nbatch, M, N, K, kgroups, b_hdiv, al);
  }
  return cudaGetLastError();
}

// Dispatch on the storage type: T, and Acc = double for double, float otherwise.
template <typename F> cudaError_t dispatch(NaiveType t, F&& f) {
  switch (t) {
    case NaiveType::F64: return f(double{}, double{});
    case NaiveType::F16: return f(__half{}, float{});
    case NaiveType::BF16: return f(__nv_bfloat16{}, float{});
    default: return f(float{}, float{});
  }
}

// A contiguous (B, H, rows, cols) view.
View4 contiguous_view(const void* p, int64_t H, int64_t rows, int64_t cols) {
  View4 v;
  v.ptr = p;
  v.sr = cols;
  v.sh = rows * cols;
  v.sb = H * rows * cols;
  v.sc = 1;
  return v;
}

// One block per row of S: the row count must fit grid.x.
bool rows_fit_grid(int64_t rows) { return rows <= 0x7fffffff; }

}  // namespace

cudaError_t naive_matmul(View4 a, View4 b, View4 c, int64_t batch, int64_t heads, int64_t M, int64_t N, int64_t K,
                         bool trans_a, bool trans_b, double alpha, NaiveType t, cudaStream_t stream) {
  return dispatch(t, [&](auto tv, auto av) {
    using T = decltype(tv);
    using Acc = decltype(av);
    return matmul<T, T, T, Acc>(a, b, c, heads, batch * heads, M, N, K, trans_a, trans_b, alpha, stream);
  });
}

cudaError_t naive_attention_forward(View4 q, View4 k, View4 v, void* out, void* lse, void* ws_s, int64_t B,
                                    int64_t H, int64_t Hk, int64_t Nq, int64_t Nk, int64_t d, bool causal,
                                    double scale, NaiveType t, cudaStream_t stream) {
  const int64_t BH = B * H, rows = BH * Nq;
  if (rows == 0) return cudaSuccess;
  if (Hk <= 0 || H % Hk != 0) return cudaErrorInvalidValue;
  if (!rows_fit_grid(rows)) return cudaErrorInvalidConfiguration;
  const int64_t G = H / Hk;  // q heads per kv head
  return dispatch(t, [&](auto tv, auto av) -> cudaError_t {
    using T = decltype(tv);
    using Acc = decltype(av);
    const View4 s = contiguous_view(ws_s, H, Nq, Nk);
    KC_CUDA_TRY((matmul<T, T, Acc, Acc>(q, k, s, H, BH, Nq, Nk, d, false, true, scale, stream, 1, G)));
    softmax_forward_kernel<Acc><<<unsigned(rows), kRowThreads, 0, stream>>>(
        static_cast<Acc*>(ws_s), static_cast<Acc*>(lse), rows, Nq, Nk, causal);
    KC_CUDA_LAUNCH_TRY();
    const View4 o = contiguous_view(out, H, Nq, d);
    return matmul<Acc, T, T, Acc>(s, v, o, H, BH, Nq, d, Nk, false, false, 1.0, stream, 1, G);
  });
}

cudaError_t naive_attention_backward(View4 dout, View4 q, View4 k, View4 v, const void* lse,
                                     const void* grad_lse, void* dq, void* dk, void* dv, void* ws_p,
                                     void* ws_dp, int64_t B, int64_t H, int64_t Hk, int64_t Nq, int64_t Nk,
                                     int64_t d, bool causal, double scale, NaiveType t, cudaStream_t stream) {
  const int64_t BH = B * H, rows = BH * Nq;
  if (BH == 0) return cudaSuccess;
  if (Hk <= 0 || H % Hk != 0) return cudaErrorInvalidValue;
  if (!rows_fit_grid(rows)) return cudaErrorInvalidConfiguration;
  const int64_t G = H / Hk, BHk = B * Hk;  // q heads per kv head; (batch, kv head) pairs
  return dispatch(t, [&](auto tv, auto av) -> cudaError_t {
    using T = decltype(tv);
    using Acc = decltype(av);
    const View4 p = contiguous_view(ws_p, H, Nq, Nk), dp = contiguous_view(ws_dp, H, Nq, Nk);
    const View4 dqv = contiguous_view(dq, H, Nq, d), dkv = contiguous_view(dk, Hk, Nk, d),
                dvv = contiguous_view(dv, Hk, Nk, d);
    if (rows == 0) {  // no queries: every key gradient is zero
      KC_CUDA_TRY(cudaMemsetAsync(dk, 0, size_t(BHk * Nk * d) * sizeof(T), stream));
      return cudaMemsetAsync(dv, 0, size_t(BHk * Nk * d) * sizeof(T), stream);
    }
    // 1. S = scale Q K^T, 2. P = exp(S - lse)
    KC_CUDA_TRY((matmul<T, T, Acc, Acc>(q, k, p, H, BH, Nq, Nk, d, false, true, scale, stream, 1, G)));
    probs_from_lse_kernel<Acc><<<unsigned(rows), kRowThreads, 0, stream>>>(
        static_cast<Acc*>(ws_p), static_cast<const Acc*>(lse), Nq, Nk, causal);
    KC_CUDA_LAUNCH_TRY();
    // 3. dV = P^T dO   (op(P) = P^T: Nk x Nq, stored Nq x Nk), summed over the group's q heads
    KC_CUDA_TRY((matmul<Acc, T, T, Acc>(p, dout, dvv, Hk, BHk, Nk, d, Nq, true, false, 1.0, stream, G, 1)));
    // 4. dP = dO V^T
    KC_CUDA_TRY((matmul<T, T, Acc, Acc>(dout, v, dp, H, BH, Nq, Nk, d, false, true, 1.0, stream, 1, G)));
    // 5. dS = P * (dP - rowsum(dP * P) + grad_lse)
    softmax_backward_kernel<Acc><<<unsigned(rows), kRowThreads, 0, stream>>>(
        static_cast<const Acc*>(ws_p), static_cast<Acc*>(ws_dp), static_cast<const Acc*>(grad_lse), Nk);
    KC_CUDA_LAUNCH_TRY();
    // 6. dQ = scale dS K, 7. dK = scale dS^T Q (summed over the group's q heads)
    KC_CUDA_TRY((matmul<Acc, T, T, Acc>(dp, k, dqv, H, BH, Nq, d, Nk, false, false, scale, stream, 1, G)));
    return matmul<Acc, T, T, Acc>(dp, q, dkv, Hk, BHk, Nk, d, Nq, true, false, scale, stream, G, 1);
  });
}

}  // namespace day50
