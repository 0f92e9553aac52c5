// flash_fwd.cu: fused attention forward (flash-style), fp16 / bf16 on tensor cores.
//
// Computes O = softmax(scale Q K^T [causal]) V and lse = logsumexp of the scaled
// scores, one pass over K and V per query tile, keeping only O and lse: the
// N x N scores exist only as one (16 x kBc) register tile per warp at a time
// (online softmax: running row max m and sum l, O rescaled by exp(m_old - m_new)).
//
// Kernel (one version kept, "v1" of the forward; naive.cu is v0):
//   block: kWarps = 4 warps, kBr = 64 query rows (16 per warp), kBc = 64 keys per step
//   grid:  (B*H, ceil(Nq / kBr)); tiles in reverse order so the long causal rows start first
//   smem:  Q tile (kBr x kD), K and V tiles double-buffered (2 x kBc x kD each), pitch kD + 8
//          (kD = 128: 87 KB; kD = 64: 46 KB)
//   per step: cp.async of the next K/V tile, then S = Q K^T (Q fragments held in
//   registers, K by ldmatrix), mask, online softmax in fp32 (exp2 with the scale
//   folded in), P packed to 16-bit as the A operand of O += P V (V by ldmatrix.trans).
// Grouped-query attention (kGQA, H > Hk): q head h reads K, V of kv head h / (H / Hk);
// consecutive CTAs (blockIdx.x = b * H + h) of a group read the same K, V, which stay
// in L2. A template flag so that the multi-head kernel stays exactly what it was.
// Masking (attention.h, FusedParams): kLocal = a window bound is set (causal is the window
// (-1, 0)); the CTA's key loop runs only over the tiles its rows' windows reach
// ([lo(first row), hi(last row)]), so a windowed call costs N x window, not N^2, and only the
// tiles that straddle a bound (or the sequence end) pay for the per-element mask. A row may
// see no key of a tile (or of any): the running max is then -inf and the exponentials use 0
// in its place (no inf - inf); a row that saw nothing stores out 0, lse +inf.
// kSoftcap: s = softcap * tanh(scale q.k / softcap) before the mask and the softmax.
// Packed sequences (kVarlen, cu_seqlens_q != nullptr): grid.x = b * H + h over the B sequences,
// grid.y over max_seqlen_q; a CTA adds its sequence's first rows (seq_span) and leaves when its
// tile starts past the sequence's end. A template flag so that dense kernels read Nq, Nk and
// the window (kernel_masking) as parameters: held in registers, they cost the backward spills.
// Assumptions (checked by the launcher / glue): d % 8 == 0, d <= kD, 16-byte
// aligned rows (fused_layout_ok), Nk >= 1. Rows >= Nq and columns >= d are
// zero-filled on load and never stored.
#include "attention.h"

#include <cmath>

#include "flash_common.cuh"
#include "kc/check.cuh"
#include "kc/launch.cuh"
#include "kc/types.h"

namespace day50 {

bool fused_layout_ok(const View4& v) {
  return v.sc == 1 && v.sr % 8 == 0 && v.sh % 8 == 0 && v.sb % 8 == 0 &&
         reinterpret_cast<uintptr_t>(v.ptr) % 16 == 0;
}

namespace flash {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <typename T, int kD, int kWarps, int kBc, bool kLocal, bool kGQA, bool kSoftcap, bool kVarlen>
__global__ void __launch_bounds__(kWarps * 32) flash_fwd_kernel(const FusedParams p) {
  constexpr int kThreads = kWarps * 32, kBr = 16 * kWarps, kP = kD + 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + kBr * kP;      // [2][kBc][kP]
  T* sV = sK + 2 * kBc * kP;  // [2][kBc][kP]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int64_t bh = blockIdx.x, b = bh / p.H, h = bh % p.H;
  const int64_t hk = kGQA ? h / (p.H / p.Hk) : h;  // kv head
  const int64_t q0 = int64_t(gridDim.y - 1 - blockIdx.y) * kBr;
  const SeqSpan sp = kVarlen ? seq_span(p, b) : SeqSpan{0, 0, p.Nq, p.Nk};
  const int64_t nq = sp.nq, nk = sp.nk;
  if (q0 >= nq) return;  // packed sequences: this tile is past the sequence's end
  const T* Q = static_cast<const T*>(p.q.ptr) + b * p.q.sb + h * p.q.sh + sp.q0 * p.q.sr;
  const T* K = static_cast<const T*>(p.k.ptr) + b * p.k.sb + hk * p.k.sh + sp.k0 * p.k.sr;
  const T* V = static_cast<const T*>(p.v.ptr) + b * p.v.sb + hk * p.v.sh + sp.k0 * p.v.sr;
  // Keys this tile's rows may see: [kbeg, kend) (attention.h: lo(i) <= j <= hi(i), i + off the diagonal)
  const int64_t off = kVarlen && p.bottom_right ? nk - nq : 0;  // dense: folded (kernel_masking)
  const int64_t q_last = (q0 + kBr < nq ? q0 + kBr : nq) - 1;
  int64_t kbeg = 0, kend = nk;
  if (kLocal) {  // p's window bounds are kernel_masking's (never negative for "unbounded")
    kbeg = q0 + off - p.window_left > 0 ? q0 + off - p.window_left : 0;
    const int64_t hi = q_last + off + p.window_right + 1;
    kend = hi < nk ? hi : nk;
  }
  const int kt_begin = int(kbeg / kBc);
  const int kt_end = kend > kbeg ? int((kend + kBc - 1) / kBc) : kt_begin;
  const int n_kt = kt_end - kt_begin;
  const int64_t qrow0 = q0 + warp * 16 + g;  // rows qrow0 and qrow0 + 8 of this thread
  if (n_kt <= 0) {  // no row of this tile sees a key: out 0, lse +inf (attention.h)
    T* O = static_cast<T*>(p.o) + b * p.o_sb + h * p.o_sh + sp.q0 * p.o_sr;
    float* lse_row = p.lse + b * p.row_sb + h * p.row_sh + sp.q0;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t qr = qrow0 + 8 * r;
      if (qr >= nq) continue;
      for (int col = 2 * t; col < p.d; col += 8) *reinterpret_cast<uint32_t*>(O + qr * p.o_sr + col) = 0u;
      if (t == 0) lse_row[qr] = INFINITY;
    }
    return;
  }

  load_tile_async<T, kBr, kD, kThreads>(sQ, Q, p.q.sr, q0, nq, p.d, Q);
  load_tile_async<T, kBc, kD, kThreads>(sK, K, p.k.sr, int64_t(kt_begin) * kBc, nk, p.d, K);
  load_tile_async<T, kBc, kD, kThreads>(sV, V, p.v.sr, int64_t(kt_begin) * kBc, nk, p.d, V);
  cp_async_commit();

  uint32_t qf[kD / 16][4];
  float o[kD / 8][4];
#pragma unroll
  for (int i = 0; i < kD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const float sl2 = p.scale * kLog2e;
  // softcap: x = softcap * tanh(scale s / softcap), in the log2 domain cap_out * tanh(cap_in * s)
  const float cap_in = kSoftcap ? p.scale / p.softcap : 0.f, cap_out = kSoftcap ? p.softcap * kLog2e : 0.f;
  // Window bounds relative to the diagonal (i + off): key j is hidden when j > i + off + wr or
  // j < i + off - wl (kernel_masking made an unbounded side kNoBound).
  const int64_t wr = p.window_right, wl = p.window_left;

  for (int kt = kt_begin; kt < kt_end; ++kt) {
    const int buf = (kt - kt_begin) & 1;
    if (kt + 1 < kt_end) {
      load_tile_async<T, kBc, kD, kThreads>(sK + (buf ^ 1) * kBc * kP, K, p.k.sr, int64_t(kt + 1) * kBc, nk, p.d, K);
      load_tile_async<T, kBc, kD, kThreads>(sV + (buf ^ 1) * kBc * kP, V, p.v.sr, int64_t(kt + 1) * kBc, nk, p.d, V);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (kt == kt_begin) {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk)
        ldmatrix_x4(qf[kk], smem_addr(sQ + (warp * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * kP + kk * 16 +
                                      8 * (lane >> 4)));
    }
    const T* sKb = sK + buf * kBc * kP;
    const T* sVb = sV + buf * kBc * kP;

    // S = Q K^T (16 x kBc per warp)
    float s[kBc / 8][4];
#pragma unroll
    for (int i = 0; i < kBc / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < kBc / 16; ++np) {
        uint32_t bk[4];
        ldmatrix_x4(bk, smem_addr(sKb + (np * 16 + (lane & 7) + 8 * (lane >> 4)) * kP + kk * 16 +
                                  8 * ((lane >> 3) & 1)));
        mma16816<T>(s[2 * np], qf[kk], bk[0], bk[1]);
        mma16816<T>(s[2 * np + 1], qf[kk], bk[2], bk[3]);
      }
    }
    // scale (log2 domain) and mask
    const int64_t k0 = int64_t(kt) * kBc;
    // a tile straddles a bound when its last key is past the first row's hi or its first
    // key before the last row's lo
    const bool need_mask =
        (k0 + kBc > nk) || (kLocal && (k0 + kBc - 1 > q0 + off + wr || k0 < q0 + kBr - 1 + off - wl));
    with_mask(need_mask, [&](auto masked) {
#pragma unroll
      for (int nt = 0; nt < kBc / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x;
          if constexpr (kSoftcap) {
            x = cap_out * tanhf(s[nt][e] * cap_in);
          } else {
            x = s[nt][e] * sl2;
          }
          if constexpr (decltype(masked)::value) {
            const int64_t key = k0 + nt * 8 + 2 * t + (e & 1), diag = qrow0 + 8 * (e >> 1) + off;
            if (key >= nk || (kLocal && (key > diag + wr || key < diag - wl))) x = -INFINITY;
          }
          s[nt][e] = x;
        }
      }
    });
    // online softmax
    float mx[2] = {m[0], m[1]}, mu[2];
#pragma unroll
    for (int nt = 0; nt < kBc / 8; ++nt) {
      mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      // a row that has seen no key yet keeps max -inf; 0 stands in for it in the exponentials
      // (exp2(-inf - 0) = 0, where exp2(-inf + inf) would be NaN)
      mu[r] = kLocal && mx[r] == -INFINITY ? 0.f : mx[r];
      const float corr = fast_exp2(m[r] - mu[r]);  // m = -inf on the first tile: 0
      m[r] = mx[r];
      l[r] *= corr;
#pragma unroll
      for (int nt = 0; nt < kD / 8; ++nt) {
        o[nt][2 * r] *= corr;
        o[nt][2 * r + 1] *= corr;
      }
    }
#pragma unroll
    for (int nt = 0; nt < kBc / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = fast_exp2(s[nt][e] - mu[e >> 1]);
        l[e >> 1] += s[nt][e];
      }
    }
    // O += P V
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      const uint32_t a[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                             pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int np = 0; np < kD / 16; ++np) {
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, smem_addr(sVb + (kk * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * kP + np * 16 +
                                        8 * (lane >> 4)));
        mma16816<T>(o[2 * np], a, bv[0], bv[1]);
        mma16816<T>(o[2 * np + 1], a, bv[2], bv[3]);
      }
    }
    __syncthreads();  // the next iteration's cp.async overwrites the buffer just read
  }

  // epilogue: O / l, lse = (m + log2 l) ln 2; a row that saw no key (l = 0): O = 0, lse = +inf
  T* O = static_cast<T*>(p.o) + b * p.o_sb + h * p.o_sh + sp.q0 * p.o_sr;
  float* lse_row = p.lse + b * p.row_sb + h * p.row_sh + sp.q0;  // + row
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int64_t qr = qrow0 + 8 * r;
    if (qr >= nq) continue;
    const float inv = kLocal && l[r] == 0.f ? 0.f : 1.f / l[r];
#pragma unroll
    for (int nt = 0; nt < kD / 8; ++nt) {
      const int col = nt * 8 + 2 * t;
      if (col < p.d)
        *reinterpret_cast<uint32_t*>(O + qr * p.o_sr + col) = pack2<T>(o[nt][2 * r] * inv, o[nt][2 * r + 1] * inv);
    }
    if (t == 0) lse_row[qr] = kLocal && l[r] == 0.f ? INFINITY : (m[r] + __log2f(l[r])) * kLn2;
  }
}

template <typename T, int kD, bool kLocal, bool kGQA, bool kSoftcap, bool kVarlen>
cudaError_t launch_fwd(const FusedParams& p, cudaStream_t stream) {
  constexpr int kWarps = 4, kBc = kD > 64 ? 32 : 64, kBr = 16 * kWarps;
  constexpr int smem = (kBr + 4 * kBc) * (kD + 8) * int(sizeof(T));
  auto kernel = flash_fwd_kernel<T, kD, kWarps, kBc, kLocal, kGQA, kSoftcap, kVarlen>;
  KC_CUDA_TRY(kc::allow_dynamic_smem(kernel, smem));
  const int64_t n_qt = (p.Nq + kBr - 1) / kBr;
  if (n_qt > 65535 || p.B * p.H > 0x7fffffff) return cudaErrorInvalidConfiguration;
  kernel<<<dim3(unsigned(p.B * p.H), unsigned(n_qt)), kWarps * 32, smem, stream>>>(kernel_masking(p));
  return cudaGetLastError();
}

template <typename T, int kD, bool kGQA, bool kSoftcap>
cudaError_t dispatch_fwd(const FusedParams& p, cudaStream_t stream) {
  const bool local = p.window_left >= 0 || p.window_right >= 0;
  if (p.cu_seqlens_q != nullptr)
    return local ? launch_fwd<T, kD, true, kGQA, kSoftcap, true>(p, stream)
                 : launch_fwd<T, kD, false, kGQA, kSoftcap, true>(p, stream);
  return local ? launch_fwd<T, kD, true, kGQA, kSoftcap, false>(p, stream)
               : launch_fwd<T, kD, false, kGQA, kSoftcap, false>(p, stream);
}

template <typename T, int kD>
cudaError_t dispatch_fwd(const FusedParams& p, cudaStream_t stream) {
  if (p.softcap > 0)
    return p.H != p.Hk ? dispatch_fwd<T, kD, true, true>(p, stream) : dispatch_fwd<T, kD, false, true>(p, stream);
  return p.H != p.Hk ? dispatch_fwd<T, kD, true, false>(p, stream) : dispatch_fwd<T, kD, false, false>(p, stream);
}

template <typename T>
cudaError_t dispatch_fwd(const FusedParams& p, cudaStream_t stream) {
  return p.d <= 64 ? dispatch_fwd<T, 64>(p, stream) : dispatch_fwd<T, 128>(p, stream);
}

}  // namespace
}  // namespace flash

cudaError_t fused_attention_forward(const FusedParams& p, cudaStream_t stream) {
  if (p.d % 8 != 0 || p.d > kHopperFwdMaxHeadDim || p.d <= 0 || p.Nk <= 0) return cudaErrorInvalidValue;
  if (!fused_layout_ok(p.q) || !fused_layout_ok(p.k) || !fused_layout_ok(p.v)) return cudaErrorMisalignedAddress;
  if (p.B * p.H == 0 || p.Nq == 0) return cudaSuccess;
  if (p.Hk <= 0 || p.H % p.Hk != 0) return cudaErrorInvalidValue;
  // Version 2 (Hopper) runs every masking the glue sets (hopper_masking): dense attention and
  // packed sequences, windows and softcaps included.
  const bool v2_masking = hopper_masking(p);
  if (!v2_masking && p.fwd_version == 2) return cudaErrorNotSupported;
  if (p.fwd_version != 1 && v2_masking) {
    const cudaError_t e = hopper_attention_forward(p, stream);
    if (e != cudaErrorNotSupported || p.fwd_version == 2) return e;
  }
  if (p.d > kFusedMaxHeadDim) return cudaErrorNotSupported;  // version 1 stops at 128
  switch (p.dtype) {
    case kc::DType::F16: return flash::dispatch_fwd<__half>(p, stream);
    case kc::DType::BF16: return flash::dispatch_fwd<__nv_bfloat16>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace day50
