// flash_bwd.cu: the fused backward's small kernels and its launcher.
//
//   1. bwd_preprocess_kernel: D = rowsum(dO * O) - grad_lse (fp32), and dq_accum = 0.
//      One warp per query row; any strides for O and dO.
//   2. flash_bwd_dkdv_kernel (flash_bwd.cuh): dK, dV, and dQ accumulated by fp32 atomics.
//   3. dq_convert_kernel: dQ = scale * dq_accum, stored as T.
// dQ by atomics (FA2's choice) rather than a second pass over K, V per query
// tile: the second pass would recompute S and dP (7 products instead of 5);
// the atomics cost L2 traffic of Nk / kBc * Nq * d floats per (b, h). The
// price is that dQ is not bitwise reproducible run to run (dK and dV are).
#include "attention.h"

#include "flash_common.cuh"
#include "kc/check.cuh"
#include "kc/convert.cuh"
#include "kc/reduce.cuh"

namespace day50 {
namespace flash {

template <typename T, int kD> cudaError_t launch_bwd_dkdv(const FusedParams& p, cudaStream_t stream);

namespace {

constexpr int kPreWarps = 8;

template <typename T>
__global__ void __launch_bounds__(kPreWarps * 32) bwd_preprocess_kernel(const FusedParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kPreWarps + threadIdx.x / 32;
  if (row >= p.B * p.H * p.Nq) return;  // whole warps leave together
  const int64_t bh = row / p.Nq, q = row % p.Nq, b = bh / p.H, h = bh % p.H;
  const T* o = static_cast<const T*>(p.out.ptr) + b * p.out.sb + h * p.out.sh + q * p.out.sr;
  const T* go = static_cast<const T*>(p.dout.ptr) + b * p.dout.sb + h * p.dout.sh + q * p.dout.sr;
  float acc = 0.f;
  for (int64_t c = lane; c < p.d; c += 32) acc += kc::to_float(o[c * p.out.sc]) * kc::to_float(go[c * p.dout.sc]);
  acc = kc::warp_reduce_sum(acc);
  if (lane == 0) p.dsum[row] = acc - (p.grad_lse != nullptr ? p.grad_lse[row] : 0.f);
  float* dqa = p.dq_accum + row * p.d;
  for (int64_t c = lane; c < p.d; c += 32) dqa[c] = 0.f;
}

// n is a multiple of 4 (d % 8 == 0) and dq_accum 16-byte aligned (cudaMalloc'd by torch).
template <typename T>
__global__ void dq_convert_kernel(const float* __restrict__ acc, T* __restrict__ dq, int64_t n, float scale) {
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4; i < n; i += int64_t(gridDim.x) * blockDim.x * 4) {
    const float4 v = *reinterpret_cast<const float4*>(acc + i);
    dq[i] = kc::from_float<T>(v.x * scale);
    dq[i + 1] = kc::from_float<T>(v.y * scale);
    dq[i + 2] = kc::from_float<T>(v.z * scale);
    dq[i + 3] = kc::from_float<T>(v.w * scale);
  }
}

template <typename T>
cudaError_t backward(const FusedParams& p, cudaStream_t stream) {
  const int64_t rows = p.B * p.H * p.Nq;
  if (rows > 0) {
    const int64_t blocks = (rows + kPreWarps - 1) / kPreWarps;
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    bwd_preprocess_kernel<T><<<unsigned(blocks), kPreWarps * 32, 0, stream>>>(p);
    KC_CUDA_LAUNCH_TRY();
  }
  KC_CUDA_TRY((p.d <= 64 ? launch_bwd_dkdv<T, 64>(p, stream) : launch_bwd_dkdv<T, 128>(p, stream)));
  const int64_t n = rows * p.d;
  if (n > 0) {
    const int64_t blocks = (n / 4 + 255) / 256;
    dq_convert_kernel<T><<<unsigned(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(
        p.dq_accum, static_cast<T*>(p.dq), n, p.scale);
    KC_CUDA_LAUNCH_TRY();
  }
  return cudaSuccess;
}

}  // namespace
}  // namespace flash

cudaError_t fused_attention_backward(const FusedParams& p, cudaStream_t stream) {
  if (p.d % 8 != 0 || p.d > kFusedMaxHeadDim || p.d <= 0 || p.Nk <= 0) return cudaErrorInvalidValue;
  if (!fused_layout_ok(p.q) || !fused_layout_ok(p.k) || !fused_layout_ok(p.v) || !fused_layout_ok(p.dout))
    return cudaErrorMisalignedAddress;
  if (p.B * p.H == 0) return cudaSuccess;
  switch (p.dtype) {
    case kc::DType::F16: return flash::backward<__half>(p, stream);
    case kc::DType::BF16: return flash::backward<__nv_bfloat16>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace day50
