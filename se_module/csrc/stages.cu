// stages.cu: the seed's four SE stages as kernels of their own, forward and
// backward (the split HW reduction they share with the fused block is planned in
// se_plan.cpp, plan_reduce).
//
//   global average pool  p[n, c] = (1 / L) sum_l x[n, c, l]
//       backward          dx[n, c, l] = dp[n, c] / L
//   swish                 y = x * sigmoid(x)
//       backward          dx = dy * sigmoid(x) * (1 + x * (1 - sigmoid(x)))
//   sigmoid               y = 1 / (1 + exp(-x))
//       backward          dx = dy * y * (1 - y)
//   excitation            out[n, c, l] = x[n, c, l] * s[n, c]
//       backward          dx[n, c, l] = dout * s[n, c]
//                         ds[n, c]    = sum_l dout[n, c, l] * x[n, c, l]
//
// The seed computed ds with one float atomicAdd per element into ds[n, c]:
// L-way contention on one address (L = H * W = 12544 at 112 x 112) and a sum
// whose order, and so whose rounding, changed from run to run. Here ds is a
// reduction: each (n, c, split) is summed by one warp or block
// (kc::warp_reduce_sum / kc::block_reduce_sum in NCHW, a fixed-order column
// reduction in NHWC) and the splits are added in order by a second tiny pass.
// The same pass writes dx = dout * s, so the backward reads dout and x once.
//
// Kernel versions kept:
//   pool v1  pool_naive_kernel: the seed's algorithm, one thread per (n, c)
//            looping over L. In NCHW consecutive threads read addresses L
//            elements apart: every load is its own 32-byte sector.
//   pool v2  reduce_rows_kernel / reduce_cols_kernel (se_reduce.cu): coalesced
//            16-byte loads, HW split across blocks when N * C is small, plus
//            finalize_kernel to add the splits.
// Block shape: kThreads = 256 everywhere; shared memory only in the reductions.
#include "se_kernels.cuh"

namespace se {

using dev::ceil_div;
using dev::kThreads;

namespace {

// pool v1 (seed). One thread per (n, c); element (n, c, l) at n * C * L + c * sc + l * sl.
template <typename T>
__global__ void __launch_bounds__(kThreads) pool_naive_kernel(const T* __restrict__ x, int64_t n, int64_t c,
                                                              int64_t l, int64_t sc, int64_t sl, T* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n * c) return;
  const int64_t nn = i / c, cc = i - nn * c;
  const T* p = x + nn * c * l + cc * sc;
  float acc = 0.f;
  for (int64_t k = 0; k < l; ++k) acc += kc::to_float(p[k * sl]);
  out[i] = kc::from_float<T>(acc / float(l));
}

// Adds the splits of a reduction in order: out[n, c] = scale * sum_sp part[n, sp, c].
template <typename TO>
__global__ void __launch_bounds__(kThreads) finalize_kernel(const float* __restrict__ part, int splits, int64_t n,
                                                            int64_t c, float scale, TO* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n * c) return;
  const int64_t nn = i / c, cc = i - nn * c;
  float acc = 0.f;
  for (int sp = 0; sp < splits; ++sp) acc += part[(nn * splits + sp) * c + cc];
  out[i] = kc::from_float<TO>(acc * scale);
}

template <Pointwise OP>
__device__ __forceinline__ float pointwise_f(float a, float b) {
  if constexpr (OP == Pointwise::SwishFwd) return a / (1.f + expf(-a));
  if constexpr (OP == Pointwise::SigmoidFwd) return 1.f / (1.f + expf(-a));
  if constexpr (OP == Pointwise::SwishBwd) {
    const float sg = 1.f / (1.f + expf(-b));
    return a * sg * (1.f + b * (1.f - sg));
  }
  if constexpr (OP == Pointwise::SigmoidBwd) return a * b * (1.f - b);
  return 0.f;
}

// Dense elementwise; b is read only by the backward ops. Grid-stride over vectors.
template <typename T, int VEC, Pointwise OP>
__global__ void __launch_bounds__(kThreads) pointwise_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                                             T* __restrict__ out, int64_t nvec) {
  constexpr bool kB = OP == Pointwise::SwishBwd || OP == Pointwise::SigmoidBwd;
  for (int64_t v = int64_t(blockIdx.x) * kThreads + threadIdx.x; v < nvec; v += int64_t(gridDim.x) * kThreads) {
    float av[VEC], bv[VEC], o[VEC];
    dev::load_f<VEC>(a + v * VEC, av);
    if constexpr (kB) dev::load_f<VEC>(b + v * VEC, bv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) o[k] = pointwise_f<OP>(av[k], kB ? bv[k] : 0.f);
    dev::store_f<VEC>(out + v * VEC, o, false);
  }
}

template <typename TO>
cudaError_t launch_finalize(const float* part, int splits, const Dims& d, float scale, void* out,
                            cudaStream_t stream) {
  const int64_t blocks = ceil_div(d.n * d.c, kThreads);
  KC_CUDA_TRY(dev::check_grid(blocks));
  finalize_kernel<TO><<<unsigned(blocks), kThreads, 0, stream>>>(part, splits, d.n, d.c, scale, static_cast<TO*>(out));
  return cudaGetLastError();
}

}  // namespace

cudaError_t pool_forward(const void* x, kc::DType dt, Dims d, int version, const ReducePlan& p, float* part,
                         void* out, cudaStream_t stream) {
  if (d.n * d.c == 0) return cudaSuccess;
  if (version == 1) {
    return KC_DTYPE_SWITCH(dt, T, [&]() -> cudaError_t {
      const int64_t blocks = ceil_div(d.n * d.c, kThreads);
      KC_CUDA_TRY(dev::check_grid(blocks));
      const bool nchw = d.layout == Layout::NCHW;
      pool_naive_kernel<T><<<unsigned(blocks), kThreads, 0, stream>>>(
          static_cast<const T*>(x), d.n, d.c, d.l, nchw ? d.l : 1, nchw ? 1 : d.c, static_cast<T*>(out));
      return cudaGetLastError();
    });
  }
  KC_CUDA_TRY((dev::launch_reduce<true, false, false>(x, nullptr, nullptr, nullptr, dt, d, p, part, nullptr, stream)));
  return KC_DTYPE_SWITCH(dt, T, [&] { return launch_finalize<T>(part, p.splits, d, 1.f / float(d.l), out, stream); });
}

cudaError_t pool_backward(const float* grad, float alpha, kc::DType dt, Dims d, void* grad_x, int num_sms,
                          cudaStream_t stream) {
  if (d.n * d.c * d.l == 0) return cudaSuccess;
  return dev::launch_ew<dev::Ew::Bcast>(nullptr, grad, nullptr, alpha, grad_x, dt, d, false, false, false, num_sms,
                                        nullptr, stream);
}

cudaError_t pointwise(Pointwise op, const void* a, const void* b, void* out, kc::DType dt, int64_t n, int num_sms,
                      cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return KC_DTYPE_SWITCH(dt, T, [&]() -> cudaError_t {
    constexpr int MV = kc::max_vec_elems<T>();
    const bool vec = kc::is_aligned(a, 16) && kc::is_aligned(out, 16) && (b == nullptr || kc::is_aligned(b, 16)) &&
                     n % MV == 0;
    return KC_BOOL_SWITCH(vec, kVec, [&]() -> cudaError_t {
      constexpr int VEC = kVec ? MV : 1;
      const int64_t nvec = n / VEC;
      const int64_t want = ceil_div(nvec, kThreads);
      const int64_t cap = int64_t(num_sms > 0 ? num_sms : 1) * 16;
      const unsigned blocks = unsigned(want < cap ? want : cap);
      const T* at = static_cast<const T*>(a);
      const T* bt = static_cast<const T*>(b);
      T* ot = static_cast<T*>(out);
      switch (op) {
        case Pointwise::SwishFwd: pointwise_kernel<T, VEC, Pointwise::SwishFwd><<<blocks, kThreads, 0, stream>>>(at, bt, ot, nvec); break;
        case Pointwise::SwishBwd: pointwise_kernel<T, VEC, Pointwise::SwishBwd><<<blocks, kThreads, 0, stream>>>(at, bt, ot, nvec); break;
        case Pointwise::SigmoidFwd: pointwise_kernel<T, VEC, Pointwise::SigmoidFwd><<<blocks, kThreads, 0, stream>>>(at, bt, ot, nvec); break;
        case Pointwise::SigmoidBwd: pointwise_kernel<T, VEC, Pointwise::SigmoidBwd><<<blocks, kThreads, 0, stream>>>(at, bt, ot, nvec); break;
        default: return cudaErrorInvalidValue;
      }
      return cudaGetLastError();
    });
  });
}

cudaError_t excitation_forward(const void* x, const float* s, void* out, kc::DType dt, Dims d, int num_sms,
                               cudaStream_t stream) {
  if (d.n * d.c * d.l == 0) return cudaSuccess;
  return dev::launch_ew<dev::Ew::Scale>(x, s, nullptr, 1.f, out, dt, d, false, false, false, num_sms, nullptr, stream);
}

cudaError_t excitation_backward(const void* grad, const void* x, const float* s, void* grad_x, void* grad_s,
                                kc::DType dt, kc::DType s_dt, Dims d, const ReducePlan& p, float* part,
                                cudaStream_t stream) {
  if (d.n * d.c == 0) return cudaSuccess;
  // the reduction's "x" is x and its "g" is grad: sum_l grad * x, and grad_x = grad * s
  KC_CUDA_TRY((dev::launch_reduce<false, true, true>(x, grad, s, grad_x, dt, d, p, nullptr, part, stream)));
  return KC_DTYPE_SWITCH(s_dt, TS, [&] { return launch_finalize<TS>(part, p.splits, d, 1.f, grad_s, stream); });
}

}  // namespace se
