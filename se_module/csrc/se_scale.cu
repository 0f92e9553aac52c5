// se_scale.cu: the per-channel elementwise pass that ends every SE path but the
// cluster kernel (declared in se_kernels.cuh, with its three modes).
// Grid-stride over VEC-vectors with 4 vectors in flight per thread. reverse:
// walk from the end, so the first vectors read are the ones the preceding
// reduction read last (still in L2). In Dx mode, wg_blocks extra blocks (the first)
// compute the weight gradients (wgrad_tile_block), saving a launch.
#include "se_kernels.cuh"

namespace se {
namespace dev {

template <typename T>
struct EwArgs {
  const T* in;
  const float* s;
  const float* coef;
  float alpha;
  T* out;
  int64_t total_vec;  // N * C * L / VEC
  int64_t c, l;
  FastDiv div_a, div_b;  // NCHW: div_a = L. NHWC: div_a = C, div_b = L * C (32-bit path only)
  bool reverse, streaming;
  bool straddle;  // NCHW with L not a multiple of VEC: a vector's elements may lie in two rows
  int ew_blocks;  // blocks of the elementwise pass (grid-stride)
  int wg_blocks;  // Dx: blocks before them that compute the weight gradients (wgrad_tile_block)
  WgradTileArgs wg;
};

template <Layout LAY, bool k64, typename T>
__device__ __forceinline__ int64_t channel_of(const EwArgs<T>& a, int64_t e) {
  if constexpr (LAY == Layout::NCHW) {
    return k64 ? e / a.l : int64_t(a.div_a.div(uint32_t(e)));
  } else {
    if constexpr (k64) {
      return (e / (a.l * a.c)) * a.c + e % a.c;
    } else {
      const uint32_t ue = uint32_t(e);
      const uint32_t q = a.div_a.div(ue);
      return int64_t(a.div_b.div(ue)) * a.c + int64_t(ue - q * uint32_t(a.c));
    }
  }
}

// The per-channel fp32 factors f[ch .. ch + VEC) (NHWC) or f[ch] (NCHW) of one vector.
template <Layout LAY, int VEC>
__device__ __forceinline__ void channel_factors(const float* f, int64_t ch, float (&out)[VEC]) {
  if constexpr (LAY == Layout::NHWC && VEC % 4 == 0) {
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(f + ch) + q);
      out[4 * q] = v.x, out[4 * q + 1] = v.y, out[4 * q + 2] = v.z, out[4 * q + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = __ldg(f + (LAY == Layout::NCHW ? ch : ch + k));
  }
}

template <typename T, int VEC, Layout LAY, Ew MODE, bool k64>
__global__ void __launch_bounds__(kThreads) channel_ew_kernel(EwArgs<T> a) {
  // Dx: the first wg_blocks blocks compute the weight gradients. They go first so
  // that their latency-bound staging overlaps the elementwise blocks' streaming
  // instead of trailing it (the block scheduler starts blocks in index order).
  int64_t block = blockIdx.x;
  if constexpr (MODE == Ew::Dx) {
    if (block < a.wg_blocks) {
      grid_dependency_wait();
      wgrad_tile_block(a.wg, block);
      return;
    }
    block -= a.wg_blocks;
  }
  const int64_t stride = int64_t(a.ew_blocks) * kThreads;
  const int64_t total = a.total_vec;
  float xv[4][VEC];
  int64_t vv[4];
  // in (x, or grad in Dx mode) was written before the previous kernel of this
  // chain ran, so the first 4 vectors are loaded before grid_dependency_wait:
  // under PDL they arrive while the MLP kernel is still computing s.
  auto load_batch = [&](int64_t v0) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t v = v0 + u * stride;
      vv[u] = v < total ? (a.reverse ? total - 1 - v : v) : -1;
      if constexpr (MODE != Ew::Bcast) {
        if (vv[u] >= 0) load_f<VEC>(a.in + vv[u] * VEC, xv[u]);
      }
    }
  };
  int64_t v0 = block * kThreads + threadIdx.x;
  load_batch(v0);
  grid_dependency_wait();
  while (v0 < total) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (vv[u] < 0) continue;
      const int64_t e = vv[u] * VEC;
      const int64_t ch = channel_of<LAY, k64>(a, e);
      // NCHW: all VEC elements share one channel; NHWC: VEC consecutive channels
      // (ch a multiple of VEC, so their factors are whole 16-byte vectors of s)
      float sv[VEC], cv[VEC];
      if (LAY == Layout::NCHW && VEC > 1 && a.straddle) {  // short odd rows (7x7): a channel per element
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const int64_t chk = channel_of<LAY, k64>(a, e + k);
          sv[k] = __ldg(a.s + chk);
          if constexpr (MODE == Ew::Dx) cv[k] = __ldg(a.coef + chk);
        }
      } else {
        channel_factors<LAY, VEC>(a.s, ch, sv);
        if constexpr (MODE == Ew::Dx) channel_factors<LAY, VEC>(a.coef, ch, cv);
      }
      float o[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        if constexpr (MODE == Ew::Scale) o[k] = xv[u][k] * sv[k];
        if constexpr (MODE == Ew::Dx) o[k] = xv[u][k] * sv[k] + cv[k];
        if constexpr (MODE == Ew::Bcast) o[k] = sv[k] * a.alpha;
      }
      store_f<VEC>(a.out + e, o, a.streaming);
    }
    v0 += 4 * stride;
    if (v0 < total) load_batch(v0);
  }
}

// in may be null (Bcast); coef only for Dx; wg only for Dx (its blocks are added to the grid).
template <Ew MODE>
cudaError_t launch_ew(const void* in, const float* s, const float* coef, float alpha, void* out,
                      kc::DType dt, const Dims& d, bool reverse, bool streaming, bool pdl, int num_sms,
                      const WgradTileArgs* wg, cudaStream_t stream) {
  return KC_DTYPE_SWITCH(dt, T, [&]() -> cudaError_t {
    constexpr int MV = kc::max_vec_elems<T>();
    const int64_t inner = d.layout == Layout::NCHW ? d.l : d.c;
    // NHWC vectors also read their VEC factors of s (and coef) as 16-byte vectors
    const bool factors_ok = d.layout == Layout::NCHW ||
                            (kc::is_aligned(s, 16) && (coef == nullptr || kc::is_aligned(coef, 16)));
    const int64_t total = d.n * d.c * d.l;
    // NCHW vectors may straddle rows (each element then finds its own channel)
    const bool straddle = d.layout == Layout::NCHW && inner % MV != 0;
    const bool vec = (in == nullptr || kc::is_aligned(in, 16)) && kc::is_aligned(out, 16) &&
                     (straddle ? total % MV == 0 : inner % MV == 0) && factors_ok;
    const bool big = total >= (int64_t(1) << 31);
    return KC_BOOL_SWITCH(vec, kVec, [&]() -> cudaError_t {
      constexpr int VEC = kVec ? MV : 1;
      EwArgs<T> a{};
      a.in = static_cast<const T*>(in);
      a.s = s;
      a.coef = coef;
      a.alpha = alpha;
      a.out = static_cast<T*>(out);
      a.total_vec = total / VEC;
      a.c = d.c;
      a.l = d.l;
      if (!big) {
        a.div_a = FastDiv(uint32_t(d.layout == Layout::NCHW ? d.l : d.c));
        a.div_b = FastDiv(uint32_t(d.layout == Layout::NCHW ? 1 : d.l * d.c));
      }
      a.reverse = reverse;
      a.streaming = streaming;
      a.straddle = straddle && VEC > 1;
      const int64_t want = ceil_div(a.total_vec, int64_t(kThreads) * 4);
      const int64_t cap = int64_t(num_sms > 0 ? num_sms : 1) * 8;
      a.ew_blocks = int(want < cap ? want : cap);
      int64_t blocks = a.ew_blocks;
      if (wg != nullptr) {
        a.wg = *wg;
        a.wg_blocks = int(wgrad_blocks(*wg));
        blocks += a.wg_blocks;
      }
      if (a.total_vec == 0) return cudaSuccess;
      KC_CUDA_TRY(check_grid(blocks));
      auto go = [&](auto kernel) { return launch(kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, pdl, a); };
      if (d.layout == Layout::NCHW) {
        return big ? go(channel_ew_kernel<T, VEC, Layout::NCHW, MODE, true>)
                   : go(channel_ew_kernel<T, VEC, Layout::NCHW, MODE, false>);
      }
      return big ? go(channel_ew_kernel<T, VEC, Layout::NHWC, MODE, true>)
                 : go(channel_ew_kernel<T, VEC, Layout::NHWC, MODE, false>);
    });
  });
}

template cudaError_t launch_ew<Ew::Scale>(const void*, const float*, const float*, float, void*, kc::DType, const Dims&,
                                          bool, bool, bool, int, const WgradTileArgs*, cudaStream_t);
template cudaError_t launch_ew<Ew::Dx>(const void*, const float*, const float*, float, void*, kc::DType, const Dims&,
                                       bool, bool, bool, int, const WgradTileArgs*, cudaStream_t);
template cudaError_t launch_ew<Ew::Bcast>(const void*, const float*, const float*, float, void*, kc::DType, const Dims&,
                                          bool, bool, bool, int, const WgradTileArgs*, cudaStream_t);

}  // namespace dev
}  // namespace se
