// flash_simt.cu: fused (flash-style) attention forward and backward on CUDA cores, in fp32
// arithmetic, for float32, float16 and bfloat16 storage and any head dim up to kSimtMaxHeadDim.
//
// Why it exists: the tensor-core kernels (flash_fwd.cu, flash_bwd*.cu*, hopper_*.cu) take
// fp16 / bf16 at head dims that are multiples of 8 up to 128. Everything else (fp32 inputs,
// d = 256 as in Gemma, d = 100, deterministic gradients where the Hopper backward does not
// run) used to reach the naive path and its N x N workspaces. This family needs only O and
// lse from the forward and one fp32 row vector (D) in the backward: O(B H N) extra memory.
//
// Math (README, "The backward, step by step"): per (b, h), S = scale Q K^T (optionally
// softcapped: S = c tanh(S / c)), masked to the window, P = exp(S - lse) with
// lse = logsumexp_j S_ij, O = P V. Backward: D_i = rowsum(dO * O)_i - grad_lse_i,
// dP = dO V^T, dS = P * (dP - D) [* (1 - tanh^2) under softcap], dV = P^T dO,
// dQ = scale dS K, dK = scale dS^T Q.
//
// Head dims run in three buckets, kD = 64, 128, 256 (d zero-padded up to the bucket in shared
// memory; the dot products stop at d rounded up to 4). At kD = 256 the key tiles of dQ and
// dK / dV shrink to 32 so that shared memory fits one SM (Cfg). At kD = 64 two CTAs share an
// SM (__launch_bounds__ min 2, at most 128 registers): forward + backward 12-15% faster on the
// H100 (the backward kernels; the forward about even).
//
// Kernels (all 256 threads as 16 x 16: ty = tid / 16 owns rows, tx = tid % 16 columns):
//   simt_fwd_kernel    one CTA per 64 query rows of one q head; K and V tiles of 64 keys
//                      through shared memory (fp32); online softmax in registers (running
//                      max m, per-thread partial row sums l, O rescaled by exp(m_old - m_new)).
//   simt_dsum_kernel   D = rowsum(dO * O) - grad_lse, one warp per query row.
//   simt_dkdv_kernel   one CTA per key block of one kv head: K, V stay in shared memory,
//                      the loop runs over the group's q heads (in order h = 0 .. G-1) and
//                      their query tiles, dK and dV accumulate in registers, written once.
//   simt_dq_kernel     one CTA per 64 query rows of one q head, looping over key tiles,
//                      dQ accumulates in registers, written once.
// No atomics: dQ and dK / dV are recomputed from S in separate kernels (7 products instead
// of 5) so that every sum runs in a fixed order; the results are bitwise reproducible,
// and dK, dV of grouped-query attention need no workspace.
//
// Micro-tiles: an S-type product (rows of X against rows of Y, both d long) gives each
// thread TR rows (ty * TR + i) x NJ columns (tx + 16 j), reading float4s along d; a P V-type
// product gives each thread TR rows x (4 adjacent columns in each 64-column group). Tiles
// live in shared memory as fp32 with a pitch of kD + 4 floats, so the 16-byte reads of 8
// consecutive rows (one phase of an LDS.128) fall in distinct banks.
//
// Assumptions (checked by the launchers): 1 <= d <= kSimtMaxHeadDim, Nk >= 1, Hk divides H,
// any strides for q, k, v, out and dout (4-element vector loads only where sc == 1, d, sr, sh,
// sb are multiples of 4 and the base is 4-element aligned; scalar loads otherwise); o, dq, dk,
// dv have a unit column stride. Rows past a sequence and columns past d are zero-filled in
// shared memory and never stored. Masking (window, causal, bottom-right alignment, varlen)
// follows FusedParams (attention.h); a row that sees no key gets O = 0, lse = +inf and zero
// gradients.
#include "attention.h"

#include <climits>
#include <cmath>

#include "kc/check.cuh"
#include "kc/convert.cuh"
#include "kc/launch.cuh"
#include "kc/reduce.cuh"

namespace day50 {
namespace simt {
namespace {

constexpr int kThreads = 256;

// Which keys a query sees, for one sequence (FusedParams' masking contract).
struct Mask {
  int64_t off, wl, wr, nq, nk;
  __device__ __forceinline__ bool visible(int64_t i, int64_t j) const {
    return i < nq && j < nk && (wl < 0 || j >= i + off - wl) && (wr < 0 || j <= i + off + wr);
  }
  // Keys [lo, hi] that any of the queries [i0, i1] can see (hi < lo: none).
  __device__ __forceinline__ void keys_of(int64_t i0, int64_t i1, int64_t& lo, int64_t& hi) const {
    lo = wl < 0 ? 0 : max(int64_t(0), i0 + off - wl);
    hi = wr < 0 ? nk - 1 : min(nk - 1, i1 + off + wr);
  }
  // Queries [lo, hi] that can see any of the keys [j0, j1].
  __device__ __forceinline__ void queries_of(int64_t j0, int64_t j1, int64_t& lo, int64_t& hi) const {
    lo = wr < 0 ? 0 : max(int64_t(0), j0 - off - wr);
    hi = wl < 0 ? nq - 1 : min(nq - 1, j1 - off + wl);
  }
};

__device__ __forceinline__ Mask make_mask(const FusedParams& p, const SeqSpan& s) {
  // causal is folded into window_right == 0 by the glue; honouring the flag here as well
  // keeps a caller that sets only `causal` correct.
  return {p.bottom_right ? s.nk - s.nq : 0, p.window_left, p.causal ? 0 : p.window_right, s.nq, s.nk};
}

// Four consecutive elements as fp32; p is 4-element aligned.
__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 load4(const __half* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float4 load4(const __nv_bfloat16* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}

// Rows [r0, r0 + kRows) of a matrix at `base` (row stride sr, column stride sc, elements)
// into s (pitch kP floats) as fp32; rows >= nvalid and columns >= d are stored as zero.
// All kThreads threads call it; the caller synchronises before reading s.
template <typename T, int kRows, int kD, int kP>
__device__ __forceinline__ void load_tile(float* s, const T* base, int64_t sr, int64_t sc, int64_t r0, int64_t nvalid,
                                          int d, bool vec) {
  constexpr int kC = kD / 4;
  for (int idx = threadIdx.x; idx < kRows * kC; idx += kThreads) {
    const int r = idx / kC, c = (idx % kC) * 4;
    const int64_t row = r0 + r;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (row < nvalid && c < d) {
      const T* src = base + row * sr + c * sc;
      if (vec) {
        x = load4(src);
      } else {
        x.x = kc::to_float(src[0]);
        if (c + 1 < d) x.y = kc::to_float(src[sc]);
        if (c + 2 < d) x.z = kc::to_float(src[2 * sc]);
        if (c + 3 < d) x.w = kc::to_float(src[3 * sc]);
      }
    }
    *reinterpret_cast<float4*>(s + r * kP + c) = x;
  }
}

// acc[i][j] += sum_{c < dlen} X[(ty TR + i) kP + c] * Y[(tx + 16 j) kP + c]; dlen % 4 == 0.
template <int TR, int NJ, int kP>
__device__ __forceinline__ void dot_tile(float (&acc)[TR][NJ], const float* X, const float* Y, int dlen) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const float* x0 = X + ty * TR * kP;
  const float* y0 = Y + tx * kP;
#pragma unroll 2
  for (int c = 0; c < dlen; c += 4) {
    float4 a[TR], b[NJ];
#pragma unroll
    for (int i = 0; i < TR; ++i) a[i] = *reinterpret_cast<const float4*>(x0 + i * kP + c);
#pragma unroll
    for (int j = 0; j < NJ; ++j) b[j] = *reinterpret_cast<const float4*>(y0 + 16 * j * kP + c);
#pragma unroll
    for (int i = 0; i < TR; ++i)
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        float s = acc[i][j];
        s = fmaf(a[i].x, b[j].x, s);
        s = fmaf(a[i].y, b[j].y, s);
        s = fmaf(a[i].z, b[j].z, s);
        s = fmaf(a[i].w, b[j].w, s);
        acc[i][j] = s;
      }
  }
}

// acc[i][g][e] += sum_{k < klen} A[(ty TR + i) kPa + k] * B[k kP + 64 g + 4 tx + e]; klen % 4 == 0.
// Column groups at or past d are skipped (their B columns are zero anyway).
template <int TR, int NG, int kPa, int kP>
__device__ __forceinline__ void pv_tile(float (&acc)[TR][NG][4], const float* A, const float* B, int klen, int d) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const float* a0 = A + ty * TR * kPa;
  const float* b0 = B + 4 * tx;
#pragma unroll 1
  for (int k = 0; k < klen; k += 4) {
    float4 a[TR];
#pragma unroll
    for (int i = 0; i < TR; ++i) a[i] = *reinterpret_cast<const float4*>(a0 + i * kPa + k);
#pragma unroll
    for (int g = 0; g < NG; ++g) {
      if (64 * g >= d) break;
      const float4 b[4] = {*reinterpret_cast<const float4*>(b0 + (k + 0) * kP + 64 * g),
                           *reinterpret_cast<const float4*>(b0 + (k + 1) * kP + 64 * g),
                           *reinterpret_cast<const float4*>(b0 + (k + 2) * kP + 64 * g),
                           *reinterpret_cast<const float4*>(b0 + (k + 3) * kP + 64 * g)};
#pragma unroll
      for (int i = 0; i < TR; ++i) {
        const float ai[4] = {a[i].x, a[i].y, a[i].z, a[i].w};
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          acc[i][g][0] = fmaf(ai[kk], b[kk].x, acc[i][g][0]);
          acc[i][g][1] = fmaf(ai[kk], b[kk].y, acc[i][g][1]);
          acc[i][g][2] = fmaf(ai[kk], b[kk].z, acc[i][g][2]);
          acc[i][g][3] = fmaf(ai[kk], b[kk].w, acc[i][g][3]);
        }
      }
    }
  }
}

// Reductions over the 16 threads (tx) that share a ty: lanes 0-15 or 16-31 of a warp.
__device__ __forceinline__ float max16(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float sum16(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// scale * q.k, softcapped when softcap > 0 (t: tanh of the capped argument, for the backward).
__device__ __forceinline__ float score(float dot, float scale, float softcap, float& t) {
  const float x = dot * scale;
  if (softcap > 0.f) {
    t = tanhf(x / softcap);
    return softcap * t;
  }
  t = 0.f;
  return x;
}

// exp(score - m) for a visible score: v is the raw dot, or the capped score under softcap.
// Without softcap, one FFMA forms dot * scale - m, one rounding fewer than scaling first.
__device__ __forceinline__ float exp_shifted(float v, float scale, float softcap, float m) {
  return expf(softcap > 0.f ? v - m : fmaf(v, scale, -m));
}

// Tile shapes per head-dim bucket kD (64, 128, 256), sized so the shared memory of every
// kernel fits one H100 / H200 SM (227 KB): kD = 256 halves the key tile of dQ and dK / dV.
template <int kD>
struct Cfg {
  static constexpr int kP = kD + 4;  // fp32 pitch of the d-long tiles
  static constexpr int NG = kD / 64;
  // forward: 64 query rows (TR = 4) x 64 keys (NJ = 4)
  static constexpr int kFwdTR = 4, kFwdNJ = 4;
  // dQ: 64 query rows x kDqNJ * 16 keys
  static constexpr int kDqTR = 4, kDqNJ = kD > 128 ? 2 : 4;
  // dK / dV: kKvTR * 16 keys x 64 query rows
  static constexpr int kKvTR = kD > 128 ? 2 : 4, kKvNJ = 4;
};

// ------------------------------------------------------------------ forward
// grid: B * H * n_qt CTAs (query tiles fastest, the last tile first: under a causal mask it
// is the longest); smem: Q (64 x kP), K or V (64 x kP), P (64 x 68) floats.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads, kD <= 64 ? 2 : 1) simt_fwd_kernel(const FusedParams p, int64_t n_qt, bool vq, bool vk,
                                                            bool vv) {
  using C = Cfg<kD>;
  constexpr int TR = C::kFwdTR, NJ = C::kFwdNJ, kBr = 16 * TR, kBc = 16 * NJ, kP = C::kP, kPs = kBc + 4,
                NG = C::NG;
  extern __shared__ float4 smem4[];
  float* sQ = reinterpret_cast<float*>(smem4);
  float* sKV = sQ + kBr * kP;
  float* sP = sKV + kBc * kP;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t bh = int64_t(blockIdx.x) / n_qt, b = bh / p.H, h = bh % p.H, hk = h / (p.H / p.Hk);
  const int64_t m0 = (n_qt - 1 - int64_t(blockIdx.x) % n_qt) * kBr;
  const SeqSpan sp = seq_span(p, b);
  if (m0 >= sp.nq) return;
  const Mask mk = make_mask(p, sp);
  const int d = int(p.d), dlen = (d + 3) & ~3;
  const T* Q = static_cast<const T*>(p.q.ptr) + b * p.q.sb + h * p.q.sh + sp.q0 * p.q.sr;
  const T* K = static_cast<const T*>(p.k.ptr) + b * p.k.sb + hk * p.k.sh + sp.k0 * p.k.sr;
  const T* V = static_cast<const T*>(p.v.ptr) + b * p.v.sb + hk * p.v.sh + sp.k0 * p.v.sr;
  int64_t jlo, jhi;
  mk.keys_of(m0, min(m0 + kBr, sp.nq) - 1, jlo, jhi);

  load_tile<T, kBr, kD, kP>(sQ, Q, p.q.sr, p.q.sc, m0, sp.nq, d, vq);
  float o[TR][NG][4];
  float m[TR], l[TR];
#pragma unroll
  for (int i = 0; i < TR; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int g = 0; g < NG; ++g) o[i][g][0] = o[i][g][1] = o[i][g][2] = o[i][g][3] = 0.f;
  }
  for (int64_t n0 = jlo < 0 ? 0 : (jlo / kBc) * kBc; n0 <= jhi; n0 += kBc) {
    __syncthreads();  // the previous tile's V (and P) reads are done
    load_tile<T, kBc, kD, kP>(sKV, K, p.k.sr, p.k.sc, n0, sp.nk, d, vk);
    __syncthreads();
    float s[TR][NJ] = {};
    dot_tile<TR, NJ, kP>(s, sQ, sKV, dlen);
#pragma unroll
    for (int i = 0; i < TR; ++i) {
      const int64_t row = m0 + ty * TR + i;
      float mx = -INFINITY;
      // s keeps the raw dot (the capped score under softcap), -inf where masked
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        float t;
        const float x = score(s[i][j], p.scale, p.softcap, t);
        const bool vis = mk.visible(row, n0 + tx + 16 * j);
        if (p.softcap > 0.f) s[i][j] = x;
        if (!vis) s[i][j] = -INFINITY;
        mx = fmaxf(mx, vis ? x : -INFINITY);
      }
      const float mnew = fmaxf(m[i], max16(mx));
      const float muse = mnew == -INFINITY ? 0.f : mnew;  // a row that has seen no key yet
      const float alpha = expf(m[i] - muse);
      m[i] = mnew;
      l[i] *= alpha;
#pragma unroll
      for (int g = 0; g < NG; ++g) {
        o[i][g][0] *= alpha;
        o[i][g][1] *= alpha;
        o[i][g][2] *= alpha;
        o[i][g][3] *= alpha;
      }
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        s[i][j] = s[i][j] == -INFINITY ? 0.f : exp_shifted(s[i][j], p.scale, p.softcap, muse);
        l[i] += s[i][j];
      }
    }
    __syncthreads();  // every thread is done reading K
#pragma unroll
    for (int i = 0; i < TR; ++i)
#pragma unroll
      for (int j = 0; j < NJ; ++j) sP[(ty * TR + i) * kPs + tx + 16 * j] = s[i][j];
    load_tile<T, kBc, kD, kP>(sKV, V, p.v.sr, p.v.sc, n0, sp.nk, d, vv);
    __syncthreads();
    pv_tile<TR, NG, kPs, kP>(o, sP, sKV, kBc, d);
  }
  T* O = static_cast<T*>(p.o) + b * p.o_sb + h * p.o_sh + sp.q0 * p.o_sr;
  float* lse = p.lse + b * p.row_sb + h * p.row_sh + sp.q0;
#pragma unroll
  for (int i = 0; i < TR; ++i) {
    const float li = sum16(l[i]);
    const int64_t row = m0 + ty * TR + i;
    if (row >= sp.nq) continue;
#pragma unroll
    for (int g = 0; g < NG; ++g)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = 64 * g + 4 * tx + e;
        if (c < d) O[row * p.o_sr + c] = kc::from_float<T>(li > 0.f ? o[i][g][e] / li : 0.f);
      }
    if (tx == 0) lse[row] = li > 0.f ? m[i] + logf(li) : INFINITY;
  }
}

// ------------------------------------------------------------------ backward
// D = rowsum(dO * O) - grad_lse for every query row (one warp a row; any strides).
constexpr int kDsumWarps = 8;

template <typename T>
__global__ void __launch_bounds__(kDsumWarps * 32) simt_dsum_kernel(const FusedParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t r = int64_t(blockIdx.x) * kDsumWarps + threadIdx.x / 32;
  if (r >= p.B * p.H * p.Nq) return;  // whole warps leave together
  const int64_t bh = r / p.Nq, i = r % p.Nq, b = bh / p.H, h = bh % p.H;
  const SeqSpan sp = seq_span(p, b);
  if (i >= sp.nq) return;
  const T* o = static_cast<const T*>(p.out.ptr) + b * p.out.sb + h * p.out.sh + (sp.q0 + i) * p.out.sr;
  const T* go = static_cast<const T*>(p.dout.ptr) + b * p.dout.sb + h * p.dout.sh + (sp.q0 + i) * p.dout.sr;
  float acc = 0.f;
  for (int64_t c = lane; c < p.d; c += 32) acc += kc::to_float(o[c * p.out.sc]) * kc::to_float(go[c * p.dout.sc]);
  acc = kc::warp_reduce_sum(acc);
  const int64_t idx = b * p.row_sb + h * p.row_sh + sp.q0 + i;
  if (lane == 0) p.dsum[idx] = acc - (p.grad_lse != nullptr ? p.grad_lse[idx] : 0.f);
}

// dS from a score: P = exp(S - lse) where visible, dS = P (dP - D) [(1 - t^2) under softcap].
__device__ __forceinline__ void probs_and_ds(float dot, float dp, float lse, float dsum, bool vis, const FusedParams& p,
                                             float& P, float& dS) {
  float t;
  const float x = score(dot, p.scale, p.softcap, t);
  P = vis ? exp_shifted(p.softcap > 0.f ? x : dot, p.scale, p.softcap, lse) : 0.f;
  dS = P * (dp - dsum);
  if (p.softcap > 0.f) dS *= 1.f - t * t;
}

// dQ: grid B * H * n_qt CTAs; smem Q, dO (64 x kP each), K, V (kBc x kP each), dS (64 x kBc + 4),
// lse and D (64 each) floats.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads, kD <= 64 ? 2 : 1) simt_dq_kernel(const FusedParams p, int64_t n_qt, bool vq, bool vk, bool vv,
                                                           bool vdo) {
  using C = Cfg<kD>;
  constexpr int TR = C::kDqTR, NJ = C::kDqNJ, kBr = 16 * TR, kBc = 16 * NJ, kP = C::kP, kPs = kBc + 4,
                NG = C::NG;
  extern __shared__ float4 smem4[];
  float* sQ = reinterpret_cast<float*>(smem4);
  float* sdO = sQ + kBr * kP;
  float* sK = sdO + kBr * kP;
  float* sV = sK + kBc * kP;
  float* sdS = sV + kBc * kP;
  float* sLse = sdS + kBr * kPs;
  float* sD = sLse + kBr;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t bh = int64_t(blockIdx.x) / n_qt, b = bh / p.H, h = bh % p.H, hk = h / (p.H / p.Hk);
  const int64_t m0 = (n_qt - 1 - int64_t(blockIdx.x) % n_qt) * kBr;
  const SeqSpan sp = seq_span(p, b);
  if (m0 >= sp.nq) return;
  const Mask mk = make_mask(p, sp);
  const int d = int(p.d), dlen = (d + 3) & ~3;
  const T* Q = static_cast<const T*>(p.q.ptr) + b * p.q.sb + h * p.q.sh + sp.q0 * p.q.sr;
  const T* dO = static_cast<const T*>(p.dout.ptr) + b * p.dout.sb + h * p.dout.sh + sp.q0 * p.dout.sr;
  const T* K = static_cast<const T*>(p.k.ptr) + b * p.k.sb + hk * p.k.sh + sp.k0 * p.k.sr;
  const T* V = static_cast<const T*>(p.v.ptr) + b * p.v.sb + hk * p.v.sh + sp.k0 * p.v.sr;
  const int64_t rows = b * p.row_sb + h * p.row_sh + sp.q0;
  int64_t jlo, jhi;
  mk.keys_of(m0, min(m0 + kBr, sp.nq) - 1, jlo, jhi);

  load_tile<T, kBr, kD, kP>(sQ, Q, p.q.sr, p.q.sc, m0, sp.nq, d, vq);
  load_tile<T, kBr, kD, kP>(sdO, dO, p.dout.sr, p.dout.sc, m0, sp.nq, d, vdo);
  if (threadIdx.x < kBr) {
    const int64_t r = m0 + threadIdx.x;
    sLse[threadIdx.x] = r < sp.nq ? p.lse[rows + r] : INFINITY;
    sD[threadIdx.x] = r < sp.nq ? p.dsum[rows + r] : 0.f;
  }
  __syncthreads();
  float lse[TR], dsum[TR];
#pragma unroll
  for (int i = 0; i < TR; ++i) {
    lse[i] = sLse[ty * TR + i];
    dsum[i] = sD[ty * TR + i];
  }
  float acc[TR][NG][4];
#pragma unroll
  for (int i = 0; i < TR; ++i)
#pragma unroll
    for (int g = 0; g < NG; ++g) acc[i][g][0] = acc[i][g][1] = acc[i][g][2] = acc[i][g][3] = 0.f;

  for (int64_t n0 = jlo < 0 ? 0 : (jlo / kBc) * kBc; n0 <= jhi; n0 += kBc) {
    __syncthreads();  // the previous tile's K and dS reads are done
    load_tile<T, kBc, kD, kP>(sK, K, p.k.sr, p.k.sc, n0, sp.nk, d, vk);
    load_tile<T, kBc, kD, kP>(sV, V, p.v.sr, p.v.sc, n0, sp.nk, d, vv);
    __syncthreads();
    float s[TR][NJ] = {}, dp[TR][NJ] = {};
    dot_tile<TR, NJ, kP>(s, sQ, sK, dlen);
    dot_tile<TR, NJ, kP>(dp, sdO, sV, dlen);
#pragma unroll
    for (int i = 0; i < TR; ++i)
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        float P, dS;
        probs_and_ds(s[i][j], dp[i][j], lse[i], dsum[i], mk.visible(m0 + ty * TR + i, n0 + tx + 16 * j), p, P, dS);
        sdS[(ty * TR + i) * kPs + tx + 16 * j] = dS;
      }
    __syncthreads();
    pv_tile<TR, NG, kPs, kP>(acc, sdS, sK, kBc, d);
  }
  T* dQ = static_cast<T*>(p.dq) + b * p.dq_sb + h * p.dq_sh + sp.q0 * p.dq_sr;
#pragma unroll
  for (int i = 0; i < TR; ++i) {
    const int64_t row = m0 + ty * TR + i;
    if (row >= sp.nq) continue;
#pragma unroll
    for (int g = 0; g < NG; ++g)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = 64 * g + 4 * tx + e;
        if (c < d) dQ[row * p.dq_sr + c] = kc::from_float<T>(acc[i][g][e] * p.scale);
      }
  }
}

// dK, dV: grid B * Hk * n_kt CTAs; smem K, V (kBk x kP each), Q, dO (64 x kP each),
// P^T and dS^T (kBk x 68 each), lse and D (64 each) floats.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads, kD <= 64 ? 2 : 1) simt_dkdv_kernel(const FusedParams p, int64_t n_kt, bool vq, bool vk,
                                                             bool vv, bool vdo) {
  using C = Cfg<kD>;
  constexpr int TR = C::kKvTR, NJ = C::kKvNJ, kBk = 16 * TR, kBq = 16 * NJ, kP = C::kP, kPs = kBq + 4,
                NG = C::NG;
  extern __shared__ float4 smem4[];
  float* sK = reinterpret_cast<float*>(smem4);
  float* sV = sK + kBk * kP;
  float* sQ = sV + kBk * kP;
  float* sdO = sQ + kBq * kP;
  float* sPt = sdO + kBq * kP;
  float* sdSt = sPt + kBk * kPs;
  float* sLse = sdSt + kBk * kPs;
  float* sD = sLse + kBq;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t bhk = int64_t(blockIdx.x) / n_kt, b = bhk / p.Hk, hk = bhk % p.Hk;
  const int64_t n0 = (int64_t(blockIdx.x) % n_kt) * kBk;
  const SeqSpan sp = seq_span(p, b);
  if (n0 >= sp.nk) return;
  const Mask mk = make_mask(p, sp);
  const int d = int(p.d), dlen = (d + 3) & ~3;
  const int64_t G = p.H / p.Hk;
  const T* K = static_cast<const T*>(p.k.ptr) + b * p.k.sb + hk * p.k.sh + sp.k0 * p.k.sr;
  const T* V = static_cast<const T*>(p.v.ptr) + b * p.v.sb + hk * p.v.sh + sp.k0 * p.v.sr;
  int64_t ilo, ihi;
  mk.queries_of(n0, min(n0 + kBk, sp.nk) - 1, ilo, ihi);

  load_tile<T, kBk, kD, kP>(sK, K, p.k.sr, p.k.sc, n0, sp.nk, d, vk);
  load_tile<T, kBk, kD, kP>(sV, V, p.v.sr, p.v.sc, n0, sp.nk, d, vv);
  float dk[TR][NG][4], dv[TR][NG][4];
#pragma unroll
  for (int i = 0; i < TR; ++i)
#pragma unroll
    for (int g = 0; g < NG; ++g)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[i][g][e] = dv[i][g][e] = 0.f;

  for (int64_t hg = 0; hg < G; ++hg) {  // the group's q heads in a fixed order: deterministic
    const int64_t h = hk * G + hg;
    const T* Q = static_cast<const T*>(p.q.ptr) + b * p.q.sb + h * p.q.sh + sp.q0 * p.q.sr;
    const T* dO = static_cast<const T*>(p.dout.ptr) + b * p.dout.sb + h * p.dout.sh + sp.q0 * p.dout.sr;
    const int64_t rows = b * p.row_sb + h * p.row_sh + sp.q0;
    for (int64_t m0 = ilo < 0 ? 0 : (ilo / kBq) * kBq; m0 <= ihi; m0 += kBq) {
      __syncthreads();  // the previous tile's Q, dO, P^T, dS^T reads are done
      load_tile<T, kBq, kD, kP>(sQ, Q, p.q.sr, p.q.sc, m0, sp.nq, d, vq);
      load_tile<T, kBq, kD, kP>(sdO, dO, p.dout.sr, p.dout.sc, m0, sp.nq, d, vdo);
      if (threadIdx.x < kBq) {
        const int64_t r = m0 + threadIdx.x;
        sLse[threadIdx.x] = r < sp.nq ? p.lse[rows + r] : INFINITY;
        sD[threadIdx.x] = r < sp.nq ? p.dsum[rows + r] : 0.f;
      }
      __syncthreads();
      float st[TR][NJ] = {}, dpt[TR][NJ] = {};
      dot_tile<TR, NJ, kP>(st, sK, sQ, dlen);
      dot_tile<TR, NJ, kP>(dpt, sV, sdO, dlen);
#pragma unroll
      for (int i = 0; i < TR; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
          const int qi = tx + 16 * j;
          float P, dS;
          probs_and_ds(st[i][j], dpt[i][j], sLse[qi], sD[qi], mk.visible(m0 + qi, n0 + ty * TR + i), p, P, dS);
          sPt[(ty * TR + i) * kPs + qi] = P;
          sdSt[(ty * TR + i) * kPs + qi] = dS;
        }
      __syncthreads();
      pv_tile<TR, NG, kPs, kP>(dv, sPt, sdO, kBq, d);
      pv_tile<TR, NG, kPs, kP>(dk, sdSt, sQ, kBq, d);
    }
  }
  T* dK = static_cast<T*>(p.dk) + b * p.dk_sb + hk * p.dk_sh + sp.k0 * p.dk_sr;
  T* dV = static_cast<T*>(p.dv) + b * p.dk_sb + hk * p.dk_sh + sp.k0 * p.dk_sr;
#pragma unroll
  for (int i = 0; i < TR; ++i) {
    const int64_t key = n0 + ty * TR + i;
    if (key >= sp.nk) continue;
#pragma unroll
    for (int g = 0; g < NG; ++g)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = 64 * g + 4 * tx + e;
        if (c < d) {
          dK[key * p.dk_sr + c] = kc::from_float<T>(dk[i][g][e] * p.scale);
          dV[key * p.dk_sr + c] = kc::from_float<T>(dv[i][g][e]);
        }
      }
  }
}

// ------------------------------------------------------------------ launchers
template <typename T>
bool vec_ok(const View4& v, int64_t d) {
  return v.sc == 1 && d % 4 == 0 && v.sr % 4 == 0 && v.sh % 4 == 0 && v.sb % 4 == 0 &&
         reinterpret_cast<uintptr_t>(v.ptr) % (4 * sizeof(T)) == 0;
}

constexpr size_t fwd_smem(int kD) {
  return size_t(64 * (kD + 4) * 2 + 64 * 68) * sizeof(float);
}
constexpr size_t dq_smem(int kD, int kBc) {
  return size_t(64 * (kD + 4) * 2 + kBc * (kD + 4) * 2 + 64 * (kBc + 4) + 2 * 64) * sizeof(float);
}
constexpr size_t dkdv_smem(int kD, int kBk) {
  return size_t(kBk * (kD + 4) * 2 + 64 * (kD + 4) * 2 + 2 * kBk * 68 + 2 * 64) * sizeof(float);
}

template <typename K, typename... Args>
cudaError_t launch(K kernel, int64_t blocks, size_t smem, cudaStream_t stream, Args... args) {
  if (blocks <= 0) return cudaSuccess;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  KC_CUDA_TRY(kc::allow_dynamic_smem(kernel, smem));
  kernel<<<unsigned(blocks), kThreads, smem, stream>>>(args...);
  KC_CUDA_LAUNCH_TRY();
  return cudaSuccess;
}

template <typename T, int kD>
cudaError_t forward(const FusedParams& p, cudaStream_t stream) {
  const int64_t n_qt = (p.Nq + 63) / 64;
  return launch(simt_fwd_kernel<T, kD>, p.B * p.H * n_qt, fwd_smem(kD), stream, p, n_qt, vec_ok<T>(p.q, p.d),
                vec_ok<T>(p.k, p.d), vec_ok<T>(p.v, p.d));
}

template <typename T, int kD>
cudaError_t backward(const FusedParams& p, cudaStream_t stream) {
  using C = Cfg<kD>;
  const bool vq = vec_ok<T>(p.q, p.d), vk = vec_ok<T>(p.k, p.d), vv = vec_ok<T>(p.v, p.d),
             vdo = vec_ok<T>(p.dout, p.d);
  const int64_t rows = p.B * p.H * p.Nq;
  if (rows > 0) {
    const int64_t blocks = (rows + kDsumWarps - 1) / kDsumWarps;
    if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
    simt_dsum_kernel<T><<<unsigned(blocks), kDsumWarps * 32, 0, stream>>>(p);
    KC_CUDA_LAUNCH_TRY();
  }
  constexpr int kBk = 16 * C::kKvTR, kBc = 16 * C::kDqNJ;
  const int64_t n_kt = (p.Nk + kBk - 1) / kBk, n_qt = (p.Nq + 63) / 64;
  KC_CUDA_TRY(launch(simt_dkdv_kernel<T, kD>, p.B * p.Hk * n_kt, dkdv_smem(kD, kBk), stream, p, n_kt, vq, vk, vv,
                     vdo));
  if (rows > 0)
    KC_CUDA_TRY(launch(simt_dq_kernel<T, kD>, p.B * p.H * n_qt, dq_smem(kD, kBc), stream, p, n_qt, vq, vk, vv, vdo));
  return cudaSuccess;
}

cudaError_t check(const FusedParams& p) {
  if (p.d <= 0 || p.d > kSimtMaxHeadDim || p.Nk <= 0 || p.Nq < 0 || p.B < 0 || p.H < 0) return cudaErrorInvalidValue;
  if (p.Hk <= 0 || p.H % p.Hk != 0) return cudaErrorInvalidValue;
  return cudaSuccess;
}

template <typename F>
cudaError_t dispatch(const FusedParams& p, F&& f) {
  switch (p.dtype) {
    case kc::DType::F16: return f(__half());
    case kc::DType::BF16: return f(__nv_bfloat16());
    default: return f(float());
  }
}

}  // namespace
}  // namespace simt

cudaError_t simt_attention_forward(const FusedParams& p, cudaStream_t stream) {
  KC_CUDA_TRY(simt::check(p));
  if (p.B * p.H * p.Nq == 0) return cudaSuccess;
  if (p.o == nullptr || p.lse == nullptr) return cudaErrorInvalidValue;
  return simt::dispatch(p, [&](auto t) {
    using T = decltype(t);
    if (p.d <= 64) return simt::forward<T, 64>(p, stream);
    if (p.d <= 128) return simt::forward<T, 128>(p, stream);
    return simt::forward<T, 256>(p, stream);
  });
}

cudaError_t simt_attention_backward(const FusedParams& p, cudaStream_t stream) {
  KC_CUDA_TRY(simt::check(p));
  if (p.B * p.Hk * p.Nk == 0) return cudaSuccess;
  if (p.dk == nullptr || p.dv == nullptr) return cudaErrorInvalidValue;
  if (p.B * p.H * p.Nq > 0 && (p.dq == nullptr || p.dsum == nullptr || p.lse == nullptr)) return cudaErrorInvalidValue;
  return simt::dispatch(p, [&](auto t) {
    using T = decltype(t);
    if (p.d <= 64) return simt::backward<T, 64>(p, stream);
    if (p.d <= 128) return simt::backward<T, 128>(p, stream);
    return simt::backward<T, 256>(p, stream);
  });
}

}  // namespace day50
