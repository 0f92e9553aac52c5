// flash_bwd.cuh: the main kernel of the fused backward (dK, dV, and dQ by atomics).
// Included by flash_bwd_<dtype>_hd<kD>.cu, one instantiation set per file so that
// the heavy kernels compile in parallel.
//
// Backward of O = softmax(scale Q K^T) V per (b, h), the seed's steps with P
// recomputed from lse instead of stored:
//   P   = exp(scale Q K^T - lse)              (recomputed, tile by tile)
//   dV  = P^T dO
//   dP  = dO V^T
//   dS  = P * (dP - D),  D = rowsum(dO * O) - grad_lse   (flash_bwd.cu: preprocess kernel)
//   dK  = scale dS^T Q
//   dQ  = scale dS K                          (fp32 atomics into dq_accum; flash_bwd.cu scales
//                                              and converts)
// Why recompute: storing P (or S) costs B*H*Nq*Nk elements (8 GB in bf16 at
// B=4, H=16, N=8192) and two passes over it through DRAM; recomputing it costs
// one more Q K^T product per tile (5 products instead of 4) on tensor cores,
// which is cheaper than the memory traffic and needs no N x N buffer at all.
//
// Kernel (FA2-style loop order, transposed score tile so P^T and dS^T stay in registers):
//   block: kWarps warps own kBc = 16 * kWarps keys (16 per warp): dK, dV for
//          those keys live in registers for the whole kernel (kD / 2 fp32 each per thread).
//   grid:  (B*H, ceil(Nk / kBc)).
//   loop over query tiles of kBr rows (causal: from the first tile with a query >= the
//   block's first key), cp.async double-buffered Q, dO, lse, D:
//     S^T  = K Q^T      (16 x kBr per warp; A = K rows by ldmatrix, B = Q by ldmatrix)
//     dP^T = V dO^T
//     P^T  = exp2(S^T scale log2e - lse log2e) masked, dS^T = P^T (dP^T - D)
//     dV  += P^T dO,  dK += dS^T Q   (A = P^T, dS^T straight from the accumulators,
//                                     B = dO, Q by ldmatrix.trans)
//     dS^T -> shared memory; barrier
//     dQ_tile = dS K    (warps split kBr x kD; A = dS by ldmatrix.trans of dS^T,
//                        B = K by ldmatrix.trans), float2 atomicAdd into dq_accum
//   epilogue: dK * scale, dV stored as T.
//   smem: K, V (kBc x kD), Q, dO (2 x kBr x kD), dS^T (kBc x kBr), lse, D (2 x kBr), pitch +8.
// Head dims over 128 (kDo < kD): dK, dV of 256 columns would not fit the registers, so
//   kD / kDo CTAs share a key block (grid z), each keeping dK, dV of its kDo columns
//   [c0, c0 + kDo) and adding the same columns of dQ. Each computes S^T and dP^T over all
//   of d (the reductions need every column), so those two products run kD / kDo times.
//   d = 256: 8 warps, 32-query tiles (K, V, Q, dO of 256 columns fill 213 KB).
// Grouped-query attention (kGQA: H = G * Hk q heads, q head h reads kv head h / G):
//   dK and dV of a kv head are sums over its G q heads. A CTA owns heads_per_cta
//   (a divisor of G) consecutive q heads of one group and runs the query-tile loop
//   over all of them in turn (one flat loop, so the cp.async pipeline runs on across
//   head boundaries), adding into the same dK, dV registers: a fixed order, no atomics.
//   grid: (B*H / heads_per_cta, ceil(Nk / kBc)); CTA x = (b*Hk + hk) * splits + s with
//   splits = G / heads_per_cta. splits == 1: the epilogue stores dK, dV as T; else it
//   stores fp32 partials (B, Hk, splits, Nk, d) to dkv_partial and flash_bwd.cu's
//   bwd_convert_kernel adds the splits in order. kGQA = false is the multi-head kernel,
//   unchanged (heads_per_cta = 1, kv head = q head).
// Masking (attention.h): kLocal = a window bound is set (causal is the window (-1, 0)). A
// CTA's key block [k0, k0 + kBc) is seen only by queries i with j - off - right <= i <=
// j - off + left for some key j of the block: the query-tile loop runs over those tiles
// alone (N x window work), and only tiles that straddle a bound pay for the element mask.
// A row that saw no key has lse = +inf, so its P = exp2(s - inf) = 0 with no special case.
// kSoftcap: the scores are recomputed capped, t = tanh(scale q.k / softcap), and dS is
// multiplied by 1 - t^2 before the dK and dQ products.
// Packed sequences (kVarlen; dense kernels read sizes and window as parameters, flash_fwd.cu
// says why): a CTA adds its sequence's first rows (seq_span) to every index, takes the
// sequence's own nq, nk, and stores dK, dV through the dk_s* strides; the row arrays (lse,
// dsum, dq_accum) are indexed b * row_sb + h * row_sh + row. The plan (flash_bwd.cu) gives
// packed sequences a whole group per CTA (no fp32 partials).
// Assumptions: d % 8 == 0, d <= kD, fused_layout_ok for q, k, v, dout; dq_accum zeroed and
// dsum written by the preprocess kernel on the same stream.
#pragma once

#include "attention.h"

#include <cmath>
#include <type_traits>

#include "flash_common.cuh"
#include "kc/check.cuh"
#include "kc/launch.cuh"

namespace day50 {
namespace flash {

constexpr float kLog2eBwd = 1.4426950408889634f;

template <int kD, int kWarps, int kBr, int kDo = kD>
struct BwdTile {
  static constexpr int kThreads = kWarps * 32, kBc = 16 * kWarps, kP = kD + 8, kPs = kBr + 8;
  static constexpr int kWM = kBr / 16, kWN = kWarps / kWM, kNq = kDo / kWN;  // dQ split
  static_assert(kWarps % kWM == 0 && kNq % 16 == 0, "dQ warp split must tile kBr x kDo");
  static_assert(kD % kDo == 0, "a CTA's output columns: a whole part of kD");
  template <typename T> static constexpr int smem_bytes() {
    return (2 * kBc * kP + 4 * kBr * kP + kBc * kPs) * int(sizeof(T)) + 4 * kBr * int(sizeof(float));
  }
};

__device__ __forceinline__ void atomic_add2(float* addr, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(addr), make_float2(a, b));
#else
  atomicAdd(addr, a);
  atomicAdd(addr + 1, b);
#endif
}

// The main kernel's one tiling (multi-head and grouped-query): 8 warps own 128 keys, query
// tiles of 64 rows; fused_backward_plan counts CTAs with its kBc. Head dims over 128: 32-row
// query tiles and 128 columns of dK, dV, dQ a CTA (flash_bwd_*_hd256.cu).
constexpr int kBwdWarps = 8, kBwdBr = 64, kBwdBc = 16 * kBwdWarps;
constexpr int kWideBr = 32, kWideCols = 128;

template <typename T, int kD, int kWarps, int kBr, bool kLocal, bool kGQA, bool kSoftcap, bool kVarlen,
          int kDo = kD>
__global__ void __launch_bounds__(kWarps * 32, 8 / kWarps) flash_bwd_dkdv_kernel(const FusedParams p) {
  using Tile = BwdTile<kD, kWarps, kBr, kDo>;
  constexpr int kThreads = Tile::kThreads, kBc = Tile::kBc, kP = Tile::kP, kPs = Tile::kPs;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + kBc * kP;
  T* sQ = sV + kBc * kP;       // [2][kBr][kP]
  T* sdO = sQ + 2 * kBr * kP;  // [2][kBr][kP]
  T* sdS = sdO + 2 * kBr * kP;  // [kBc][kPs]: dS^T, key-major
  float* sLse = reinterpret_cast<float*>(sdS + kBc * kPs);  // [2][kBr]
  float* sD = sLse + 2 * kBr;                               // [2][kBr]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int c0 = kDo < kD ? int(blockIdx.z) * kDo : 0;  // this CTA's columns of dK, dV, dQ: [c0, c0 + kDo)
  // bh = b * H + h: this CTA's (first) q head; hk: the kv head it reads.
  const int64_t bh = kGQA ? int64_t(blockIdx.x) * p.heads_per_cta : int64_t(blockIdx.x), b = bh / p.H, h = bh % p.H;
  const int64_t hk = kGQA ? h / (p.H / p.Hk) : h;
  const int64_t k0 = int64_t(blockIdx.y) * kBc;
  const SeqSpan sp = kVarlen ? seq_span(p, b) : SeqSpan{0, 0, p.Nq, p.Nk};
  const int64_t nq = sp.nq, nk = sp.nk;
  if (k0 >= nk) return;  // packed sequences: this key block is past the sequence's end
  const T* Q = static_cast<const T*>(p.q.ptr) + b * p.q.sb + h * p.q.sh + sp.q0 * p.q.sr;
  const T* K = static_cast<const T*>(p.k.ptr) + b * p.k.sb + hk * p.k.sh + sp.k0 * p.k.sr;
  const T* V = static_cast<const T*>(p.v.ptr) + b * p.v.sb + hk * p.v.sh + sp.k0 * p.v.sr;
  const T* dO = static_cast<const T*>(p.dout.ptr) + b * p.dout.sb + h * p.dout.sh + sp.q0 * p.dout.sr;
  const int64_t row0 = b * p.row_sb + h * p.row_sh + sp.q0;  // this head's row 0 in lse, dsum, dq_accum
  const float* lse = p.lse + row0;
  const float* dsum = p.dsum + row0;
  float* dqa = p.dq_accum + row0 * p.d;

  // Queries that see a key of this block: [qbeg, qend) (attention.h's window, off the diagonal's shift)
  const int64_t off = kVarlen && p.bottom_right ? nk - nq : 0;  // dense: folded (kernel_masking)
  const int64_t k_last = (k0 + kBc < nk ? k0 + kBc : nk) - 1;
  int64_t qbeg = 0, qend = nq;
  if (kLocal) {  // p's window bounds are kernel_masking's (never negative for "unbounded")
    qbeg = k0 - off - p.window_right > 0 ? k0 - off - p.window_right : 0;
    const int64_t hi = k_last - off + p.window_left + 1;
    qend = hi < nq ? hi : nq;
  }
  const int q_begin = int(qbeg / kBr);
  const int n_qt = qend > qbeg ? int((qend + kBr - 1) / kBr) : q_begin;
  // The loop runs `it` over [q_begin, it_end): query tile it for multi-head; for kGQA
  // the (head, tile) pairs of heads_per_cta heads, head-major (the launcher checks that
  // heads_per_cta * n_qt fits an int).
  const int per_head = n_qt > q_begin ? n_qt - q_begin : 0;
  const int it_end = kGQA ? q_begin + per_head * int(p.heads_per_cta) : n_qt;
  auto tile_of = [&](int it, int& hl) -> int {  // query tile of iteration it; hl: head within the CTA
    if constexpr (kGQA) {
      hl = (it - q_begin) / per_head;
      return q_begin + (it - q_begin) % per_head;
    } else {
      hl = 0;
      return it;
    }
  };

  float dk[kDo / 8][4], dv[kDo / 8][4];
#pragma unroll
  for (int i = 0; i < kDo / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.f;

  auto load_q_tile = [&](int it, int buf) {
    int hl;
    const int64_t q0 = int64_t(tile_of(it, hl)) * kBr;
    const T* Qh = Q;
    const T* dOh = dO;
    const float* lseh = lse;
    const float* dsumh = dsum;
    if constexpr (kGQA) {
      Qh += hl * p.q.sh;
      dOh += hl * p.dout.sh;
      lseh += hl * p.row_sh;
      dsumh += hl * p.row_sh;
    }
    load_tile_async<T, kBr, kD, kThreads>(sQ + buf * kBr * kP, Qh, p.q.sr, q0, nq, p.d, Qh);
    load_tile_async<T, kBr, kD, kThreads>(sdO + buf * kBr * kP, dOh, p.dout.sr, q0, nq, p.d, dOh);
    if (threadIdx.x < kBr) {
      const bool ok = q0 + threadIdx.x < nq;
      cp_async_4(smem_addr(sLse + buf * kBr + threadIdx.x), ok ? lseh + q0 + threadIdx.x : lseh, ok);
      cp_async_4(smem_addr(sD + buf * kBr + threadIdx.x), ok ? dsumh + q0 + threadIdx.x : dsumh, ok);
    }
    cp_async_commit();
  };

  if (q_begin < it_end) {
    load_tile_async<T, kBc, kD, kThreads>(sK, K, p.k.sr, k0, nk, p.d, K);
    load_tile_async<T, kBc, kD, kThreads>(sV, V, p.v.sr, k0, nk, p.d, V);
    cp_async_commit();
    load_q_tile(q_begin, 0);
  }
  const float sl2 = p.scale * kLog2eBwd;
  const float cap_in = kSoftcap ? p.scale / p.softcap : 0.f, cap_out = kSoftcap ? p.softcap * kLog2eBwd : 0.f;
  // Window bounds relative to the diagonal (i + off); kernel_masking made an unbounded side kNoBound.
  const int64_t wr = p.window_right, wl = p.window_left;
  const int key_w = warp * 16;  // this warp's first key row in the tile

  for (int it = q_begin; it < it_end; ++it) {
    const int buf = (it - q_begin) & 1;
    if (it + 1 < it_end) {
      load_q_tile(it + 1, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    int hl;
    const int qt = tile_of(it, hl);
    const int64_t q0 = int64_t(qt) * kBr;
    const T* sQb = sQ + buf * kBr * kP;
    const T* sdOb = sdO + buf * kBr * kP;
    const float* sLseb = sLse + buf * kBr;
    const float* sDb = sD + buf * kBr;

    // S^T = K Q^T and dP^T = V dO^T (16 keys x kBr queries per warp)
    float s[kBr / 8][4], dp[kBr / 8][4];
#pragma unroll
    for (int i = 0; i < kBr / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t ak[4], av[4];
      const int arow = key_w + (lane & 7) + 8 * ((lane >> 3) & 1), acol = kk * 16 + 8 * (lane >> 4);
      ldmatrix_x4(ak, smem_addr(sK + arow * kP + acol));
      ldmatrix_x4(av, smem_addr(sV + arow * kP + acol));
#pragma unroll
      for (int np = 0; np < kBr / 16; ++np) {
        const int brow = np * 16 + (lane & 7) + 8 * (lane >> 4), bcol = kk * 16 + 8 * ((lane >> 3) & 1);
        uint32_t bq[4], bo[4];
        ldmatrix_x4(bq, smem_addr(sQb + brow * kP + bcol));
        ldmatrix_x4(bo, smem_addr(sdOb + brow * kP + bcol));
        mma16816<T>(s[2 * np], ak, bq[0], bq[1]);
        mma16816<T>(s[2 * np + 1], ak, bq[2], bq[3]);
        mma16816<T>(dp[2 * np], av, bo[0], bo[1]);
        mma16816<T>(dp[2 * np + 1], av, bo[2], bo[3]);
      }
    }

    // P^T = exp2(S^T * scale * log2e - lse * log2e), dS^T = P^T (dP^T - D); masked entries 0
    // a tile straddles a bound when its last key is past the first query's hi or its first
    // key before the last query's lo
    const bool need_mask = (q0 + kBr > nq) || (k0 + kBc > nk) ||
                           (kLocal && (k0 + kBc - 1 > q0 + off + wr || k0 < q0 + kBr - 1 + off - wl));
    // flash::with_mask's two compiled paths, written out here: called through it, this
    // kernel's machine code came out different (the other kernels' did not), unmeasured
    auto probabilities = [&](auto masked) {
#pragma unroll
      for (int nt = 0; nt < kBr / 8; ++nt) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int col = nt * 8 + 2 * t + c;
          const float l2 = sLseb[col] * kLog2eBwd, dd = sDb[col];
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int e = 2 * r + c;
            float pv, dcap = 1.f;  // dcap: d(capped score) / d(scale q.k)
            if constexpr (kSoftcap) {
              const float th = tanhf(s[nt][e] * cap_in);
              pv = fast_exp2(cap_out * th - l2);
              dcap = 1.f - th * th;
            } else {
              pv = fast_exp2(s[nt][e] * sl2 - l2);
            }
            if constexpr (decltype(masked)::value) {
              const int64_t key = k0 + key_w + g + 8 * r, q = q0 + col;
              if (q >= nq || key >= nk || (kLocal && (key > q + off + wr || key < q + off - wl))) pv = 0.f;
            }
            s[nt][e] = pv;
            dp[nt][e] = pv * (dp[nt][e] - dd) * dcap;
          }
        }
      }
    };
    if (need_mask)
      probabilities(std::true_type{});
    else
      probabilities(std::false_type{});

    // dV += P^T dO, dK += dS^T Q  (K-dim: the kBr queries)
#pragma unroll
    for (int kk = 0; kk < kBr / 16; ++kk) {
      const uint32_t ap[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                              pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const uint32_t ad[4] = {pack2<T>(dp[2 * kk][0], dp[2 * kk][1]), pack2<T>(dp[2 * kk][2], dp[2 * kk][3]),
                              pack2<T>(dp[2 * kk + 1][0], dp[2 * kk + 1][1]),
                              pack2<T>(dp[2 * kk + 1][2], dp[2 * kk + 1][3])};
      // dS^T (16-bit, as the dK product uses it) to shared memory for the dQ product
      {
        T* row = sdS + (key_w + g) * kPs + kk * 16 + 2 * t;
        *reinterpret_cast<uint32_t*>(row) = ad[0];
        *reinterpret_cast<uint32_t*>(row + 8 * kPs) = ad[1];
        *reinterpret_cast<uint32_t*>(row + 8) = ad[2];
        *reinterpret_cast<uint32_t*>(row + 8 * kPs + 8) = ad[3];
      }
#pragma unroll
      for (int np = 0; np < kDo / 16; ++np) {
        const int brow = kk * 16 + (lane & 7) + 8 * ((lane >> 3) & 1), bcol = c0 + np * 16 + 8 * (lane >> 4);
        uint32_t bo[4], bq[4];
        ldmatrix_x4_trans(bo, smem_addr(sdOb + brow * kP + bcol));
        ldmatrix_x4_trans(bq, smem_addr(sQb + brow * kP + bcol));
        mma16816<T>(dv[2 * np], ap, bo[0], bo[1]);
        mma16816<T>(dv[2 * np + 1], ap, bo[2], bo[3]);
        mma16816<T>(dk[2 * np], ad, bq[0], bq[1]);
        mma16816<T>(dk[2 * np + 1], ad, bq[2], bq[3]);
      }
    }
    __syncthreads();  // dS^T complete; Q, dO of this tile no longer read

    // dQ_tile (kBr x kD) = dS K: warp (wm, wn) computes rows wm*16.., columns wn*kNq..
    {
      constexpr int kWM = Tile::kWM, kNq = Tile::kNq;
      const int wm = warp % kWM, wn = warp / kWM;
      float acc[kNq / 8][4];
#pragma unroll
      for (int i = 0; i < kNq / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4_trans(a, smem_addr(sdS + (kk * 16 + (lane & 7) + 8 * (lane >> 4)) * kPs + wm * 16 +
                                       8 * ((lane >> 3) & 1)));
#pragma unroll
        for (int np = 0; np < kNq / 16; ++np) {
          uint32_t bk[4];
          ldmatrix_x4_trans(bk, smem_addr(sK + (kk * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * kP + c0 + wn * kNq +
                                          np * 16 + 8 * (lane >> 4)));
          mma16816<T>(acc[2 * np], a, bk[0], bk[1]);
          mma16816<T>(acc[2 * np + 1], a, bk[2], bk[3]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t q = q0 + wm * 16 + g + 8 * r;
        if (q >= nq) continue;
#pragma unroll
        for (int nt = 0; nt < kNq / 8; ++nt) {
          const int col = c0 + wn * kNq + nt * 8 + 2 * t;
          if (col < p.d) atomic_add2(dqa + (hl * p.row_sh + q) * p.d + col, acc[nt][2 * r], acc[nt][2 * r + 1]);
        }
      }
    }
    // The next iteration's first barrier orders these sdS / sK reads before sdS is rewritten.
  }

  // epilogue: dK = scale dS^T Q, dV (rows >= Nk and columns >= d not stored)
  if constexpr (kGQA) {
    if (p.dkv_partial != nullptr) {  // the group is split over CTAs: fp32 partials, reduced in flash_bwd.cu
      float* pK = p.dkv_partial + int64_t(blockIdx.x) * p.Nk * p.d;
      float* pV = pK + int64_t(gridDim.x) * p.Nk * p.d;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t key = k0 + key_w + g + 8 * r;
        if (key >= p.Nk) continue;
#pragma unroll
        for (int nt = 0; nt < kDo / 8; ++nt) {
          const int col = c0 + nt * 8 + 2 * t;
          if (col >= p.d) continue;
          *reinterpret_cast<float2*>(pK + key * p.d + col) =
              make_float2(dk[nt][2 * r] * p.scale, dk[nt][2 * r + 1] * p.scale);
          *reinterpret_cast<float2*>(pV + key * p.d + col) = make_float2(dv[nt][2 * r], dv[nt][2 * r + 1]);
        }
      }
      return;
    }
  }
  const int64_t dkv0 = b * p.dk_sb + hk * p.dk_sh + sp.k0 * p.dk_sr;  // the kv head's key 0
  T* dK = static_cast<T*>(p.dk) + dkv0;
  T* dV = static_cast<T*>(p.dv) + dkv0;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t key = k0 + key_w + g + 8 * r;
    if (key >= nk) continue;
#pragma unroll
    for (int nt = 0; nt < kDo / 8; ++nt) {
      const int col = c0 + nt * 8 + 2 * t;
      if (col >= p.d) continue;
      *reinterpret_cast<uint32_t*>(dK + key * p.dk_sr + col) =
          pack2<T>(dk[nt][2 * r] * p.scale, dk[nt][2 * r + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(dV + key * p.dk_sr + col) = pack2<T>(dv[nt][2 * r], dv[nt][2 * r + 1]);
    }
  }
}

// kGQA: p.heads_per_cta divides H / Hk (checked by fused_attention_backward). kDo < kD:
// kD / kDo CTAs per key block (grid z), each its kDo columns of dK, dV and dQ.
template <typename T, int kD, int kWarps, int kBr, bool kGQA = false, int kDo = kD>
cudaError_t launch_bwd_dkdv_cfg(const FusedParams& p, cudaStream_t stream) {
  using Tile = BwdTile<kD, kWarps, kBr, kDo>;
  constexpr int smem = Tile::template smem_bytes<T>();
  const int64_t n_kt = (p.Nk + Tile::kBc - 1) / Tile::kBc;
  const int64_t ctas = kGQA ? p.B * p.H / p.heads_per_cta : p.B * p.H;
  if (n_kt > 65535 || ctas > 0x7fffffff) return cudaErrorInvalidConfiguration;
  if (kGQA && ((p.Nq + kBr - 1) / kBr) * p.heads_per_cta > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(ctas), static_cast<unsigned>(n_kt), unsigned(kD / kDo));
  const FusedParams kp = kernel_masking(p);
  auto launch = [&](auto kernel) -> cudaError_t {
    KC_CUDA_TRY(kc::allow_dynamic_smem(kernel, smem));
    kernel<<<grid, Tile::kThreads, smem, stream>>>(kp);
    return cudaGetLastError();
  };
  const bool local = p.window_left >= 0 || p.window_right >= 0;
  auto by_varlen = [&](auto local_c, auto softcap_c) -> cudaError_t {
    constexpr bool kL = decltype(local_c)::value, kS = decltype(softcap_c)::value;
    return p.cu_seqlens_q != nullptr ? launch(flash_bwd_dkdv_kernel<T, kD, kWarps, kBr, kL, kGQA, kS, true, kDo>)
                                     : launch(flash_bwd_dkdv_kernel<T, kD, kWarps, kBr, kL, kGQA, kS, false, kDo>);
  };
  using Yes = std::true_type;
  using No = std::false_type;
  if (p.softcap > 0) return local ? by_varlen(Yes{}, Yes{}) : by_varlen(No{}, Yes{});
  return local ? by_varlen(Yes{}, No{}) : by_varlen(No{}, No{});
}

// Defined once per (T, kD) in flash_bwd_<dtype>_hd<kD>.cu.
template <typename T, int kD> cudaError_t launch_bwd_dkdv(const FusedParams& p, cudaStream_t stream);

}  // namespace flash
}  // namespace day50
