// flash_bwd.cu: the fused backward's small kernels and its launcher.
//
//   1. bwd_preprocess_vec_kernel / bwd_preprocess_kernel: D = rowsum(dO * O) - grad_lse
//      (fp32), and dq_accum = 0. The vector form where O has the fused layout (it does unless
//      the caller passed a strided out): eight lanes per query row, 16-byte loads of O and dO,
//      16-byte zero stores. Else one warp per row, scalar accesses at any strides of O. The
//      kernel only moves bytes (4 d of O and dO, 4 d of zeros a row): a warp per row with
//      two-byte loads, 64 of them for a 64-wide row, keeps far fewer bytes in flight than the
//      copy bandwidth needs. Packed sequences: the grid covers max_seqlen_q rows of each
//      sequence, and rows past a sequence's end are skipped. Its threads also zero version 2's
//      grouped-query accumulator and the deterministic dq counters (FusedParams says which).
//   2. the main kernel: dK, dV, and dQ accumulated by fp32 atomics. Version 2
//      (hopper_bwd.cu) where it applies, else flash_bwd_dkdv_kernel (flash_bwd.cuh).
//   3. bwd_convert_kernel: dQ = scale * dq_accum (version 2: dq_accum, its dS^T scaled), stored as T
//      (or float32: dq_f32) in q's layout, unless version 2 added into a float32 dq itself; under
//      grouped-query attention with the group split over CTAs, in the same launch, dK, dV =
//      the sum of the fp32 partials of the splits, in split order, stored as T (or float32); after
//      version 2 (not deterministic) one "split": the accumulator its CTAs added into with
//      the copy engine.
// dQ by atomics (FA2's choice) rather than a second pass over K, V per query
// tile: the second pass would recompute S and dP (7 products instead of 5);
// the atomics cost L2 traffic of Nk / kBc * Nq * d floats per (b, h). The
// price is that dQ is not bitwise reproducible run to run (nor, on version 2,
// a grouped-query dK, dV whose group is split over CTAs); deterministic=True orders every sum.
//
// Grouped-query attention (H = G * Hk): dK and dV of a kv head sum the
// contributions of its G q heads. fused_backward_plan picks how many of them one
// CTA takes (heads_per_cta; flash_bwd.cuh and hopper_bwd.cu run them one after the
// other into the same registers). All G (splits = 1): no workspace, no extra pass, K and V read
// once per group, deterministic; but the grid shrinks by G, which at small
// B * Hk * keys (multi-query attention above all) leaves SMs idle. Fewer heads per
// CTA (down to 1, one CTA per q head as in FA2) keep the grid of the multi-head
// kernel, at the price of fp32 partials (2 * B * H / heads_per_cta * Nk * d floats,
// written once and read once) and a small reduction in a fixed order (still
// deterministic; no float atomics; version 2 adds them into one accumulator unless
// deterministic). The plan takes the most heads per CTA that still leave kGqaMinCtas
// CTAs (version 2: kGqaMinCtasV2). Multi-head attention runs none of this.
#include "attention.h"

#include <algorithm>

#include "flash_bwd.cuh"
#include "flash_common.cuh"
#include "kc/check.cuh"
#include "kc/convert.cuh"
#include "kc/device.h"
#include "kc/reduce.cuh"
#include "kc/vec.cuh"

namespace day50 {
namespace flash {

// About 8 waves of CTAs on an H100 / H200 (132 SMs, one CTA of the dK/dV kernel per
// SM: 8 warps at 226-255 registers): the partial last wave then costs at most ~1/8
// of the kernel, and fewer CTAs per group are not worth more than that. A starting
// point, not yet tuned by measurement.
constexpr int64_t kGqaMinCtas = 1024;
// Version 2 launches its longest key blocks first, so two waves of CTAs balance well, and each
// CTA that takes a whole group saves the group's fp32 workspace: its zeroing, the reduce-adds
// and the post-kernel's pass over it. Deterministic too: its CTAs walk their heads tile by
// tile (hopper_bwd.cu), so the key block before is a step ahead on every head.
constexpr int64_t kGqaMinCtasV2 = 256;

namespace {

constexpr int kPreWarps = 8;

// The workspaces the main kernel adds into, zeroed by the pre-kernel's threads (grid-stride):
// one launch fewer than a fill of its own.
__device__ __forceinline__ void zero_workspaces(const FusedParams& p) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, n = int64_t(gridDim.x) * blockDim.x;
  float4* acc = reinterpret_cast<float4*>(p.dkv_partial);
  for (int64_t i = t; i < p.dkv_zero_floats / 4; i += n) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int64_t i = t; i < p.dq_sem_ints; i += n) p.dq_sem[i] = 0;
}

template <typename T>
__global__ void __launch_bounds__(kPreWarps * 32) bwd_preprocess_kernel(const FusedParams p) {
  zero_workspaces(p);
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kPreWarps + threadIdx.x / 32;
  if (row >= p.B * p.H * p.Nq) return;  // whole warps leave together
  const int64_t bh = row / p.Nq, i = row % p.Nq, b = bh / p.H, h = bh % p.H;
  const SeqSpan sp = seq_span(p, b);
  if (i >= sp.nq) return;
  const int64_t q = sp.q0 + i, r = b * p.row_sb + h * p.row_sh + q;  // r: the row's index in dsum, lse
  const T* o = static_cast<const T*>(p.out.ptr) + b * p.out.sb + h * p.out.sh + q * p.out.sr;
  const T* go = static_cast<const T*>(p.dout.ptr) + b * p.dout.sb + h * p.dout.sh + q * p.dout.sr;
  float acc = 0.f;
  for (int64_t c = lane; c < p.d; c += 32) acc += kc::to_float(o[c * p.out.sc]) * kc::to_float(go[c * p.dout.sc]);
  acc = kc::warp_reduce_sum(acc);
  if (lane == 0) p.dsum[r] = acc - (p.grad_lse != nullptr ? p.grad_lse[r] : 0.f);
  float* dqa = p.dq_accum + r * p.d;
  for (int64_t c = lane; c < p.d; c += 32) dqa[c] = 0.f;
}

// The vector form: kPreLanes lanes per row, each taking 8-element chunks c = 8 * sub,
// c + 64, ... (d % 8 == 0; d = 96 leaves half the lanes one chunk short). Assumptions:
// fused_layout_ok for O and dO (unit column stride, row / head / batch strides multiples of
// 8, 16-byte aligned bases), dq_accum 16-byte aligned (torch's allocation; d % 8 == 0 keeps
// every row start aligned). O is not read again in the backward: streamed past the caches;
// dO is, by the main kernel, so it keeps the default policy.
constexpr int kPreLanes = 8;

template <typename T>
__global__ void __launch_bounds__(kPreWarps * 32) bwd_preprocess_vec_kernel(const FusedParams p) {
  zero_workspaces(p);
  const int sub = threadIdx.x % kPreLanes;
  const int64_t row = (int64_t(blockIdx.x) * kPreWarps * 32 + threadIdx.x) / kPreLanes;
  // No early return: every lane reaches the full-warp shuffles below; a row past the end (of
  // the grid or of its sequence) adds nothing and stores nothing.
  float acc = 0.f;
  int64_t r = -1;  // the row's index in dsum, lse; -1: no row
  if (row < p.B * p.H * p.Nq) {
    const int64_t bh = row / p.Nq, i = row % p.Nq, b = bh / p.H, h = bh % p.H;
    const SeqSpan sp = seq_span(p, b);
    if (i < sp.nq) {
      const int64_t q = sp.q0 + i;
      r = b * p.row_sb + h * p.row_sh + q;
      const T* o = static_cast<const T*>(p.out.ptr) + b * p.out.sb + h * p.out.sh + q * p.out.sr;
      const T* go = static_cast<const T*>(p.dout.ptr) + b * p.dout.sb + h * p.dout.sh + q * p.dout.sr;
      float* dqa = p.dq_accum + r * p.d;
      const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int64_t c = sub * 8; c < p.d; c += kPreLanes * 8) {
        const kc::Vec<T, 8> a = kc::load_vec_stream<8>(o + c);
        const kc::Vec<T, 8> g = kc::load_vec<8>(go + c);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc += kc::to_float(a.v[e]) * kc::to_float(g.v[e]);
        reinterpret_cast<float4*>(dqa + c)[0] = zero;
        reinterpret_cast<float4*>(dqa + c)[1] = zero;
      }
    }
  }
  // A row's lanes are an aligned run of kPreLanes in the warp: xor offsets below kPreLanes stay
  // inside it.
#pragma unroll
  for (int off = kPreLanes / 2; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (sub == 0 && r >= 0) p.dsum[r] = acc - (p.grad_lse != nullptr ? p.grad_lse[r] : 0.f);
}

// The post-kernel, one launch for both conversions: dQ = scale * dq_accum (rows numbered as
// lse's; scale 1 after version 2, whose dS^T carried it) as T in dq's layout, and under grouped-query attention dK, dV = the sum over s <
// splits of the fp32 partials (B*Hk, splits, Nk, d) (dK's first, then dV's), in order s = 0,
// 1, ..: deterministic; splits = 1 converts version 2's accumulator. The first dq_blocks
// blocks take dQ, the rest dK, dV; a thread takes 8 elements of a row (d % 8 == 0): two
// 16-byte loads (a split), one 16-byte store. The fp32 buffers are torch's allocations and
// every output row starts 16-byte aligned (strides multiples of d). I: int where every index
// fits (its divisions cost a fraction of 64-bit ones), else int64_t. Packed sequences: dQ rows
// past a sequence's end are skipped; the partials span all key rows as one batch (p.B = 1,
// p.Nk = total_k, set by the caller).
template <typename T>
__device__ __forceinline__ void store_scaled8(T* dst, const float4& x, const float4& y, float s) {
  kc::Vec<T, 8> o;
  const float f[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
#pragma unroll
  for (int e = 0; e < 8; ++e) o.v[e] = kc::from_float<T>(f[e] * s);
  kc::store_vec<8>(dst, o);
}

// Eight elements as T, or as float32 where the caller asked for float32 gradients (FusedParams'
// dq_f32, dk_f32, dv_f32; the output's element strides are the same either way).
template <typename T>
__device__ __forceinline__ void store_scaled8(void* base, int64_t offset, bool f32, const float4& x, const float4& y,
                                              float s) {
  if (f32)
    store_scaled8(static_cast<float*>(base) + offset, x, y, s);
  else
    store_scaled8(static_cast<T*>(base) + offset, x, y, s);
}

template <typename T, typename I>
__global__ void __launch_bounds__(256) bwd_convert_kernel(const FusedParams p, I n_dq, I n_kv, I dq_blocks, I splits) {
  const I cpr = I(p.d / 8);  // 8-element chunks a row
  if (I(blockIdx.x) < dq_blocks) {
    const I i = I(blockIdx.x) * 256 + I(threadIdx.x);
    if (i >= n_dq) return;
    const I row = i / cpr, bh = row / I(p.Nq), b = bh / I(p.H);
    const I c = (i - row * cpr) * 8, q = row - bh * I(p.Nq), h = bh - b * I(p.H);
    const SeqSpan sp = seq_span(p, b);
    if (q >= sp.nq) return;
    const int64_t r = b * p.row_sb + h * p.row_sh + sp.q0 + q;  // the row's index in lse, dq_accum
    const float4* src = reinterpret_cast<const float4*>(p.dq_accum + r * p.d + c);
    store_scaled8<T>(p.dq, b * p.dq_sb + h * p.dq_sh + (sp.q0 + q) * p.dq_sr + c, p.dq_f32, __ldcs(src),
                     __ldcs(src + 1), p.scale);
    return;
  }
  const I j = (I(blockIdx.x) - dq_blocks) * 256 + I(threadIdx.x);
  if (j >= 2 * n_kv) return;
  const bool is_v = j >= n_kv;
  const I jj = is_v ? j - n_kv : j, per_head = I(p.Nk) * cpr, kv = jj / per_head, r = jj - kv * per_head;
  const I row = r / cpr, c = (r - row * cpr) * 8, hk = kv % I(p.Hk);
  const int64_t nkd = p.Nk * p.d;
  const float4* src = reinterpret_cast<const float4*>(p.dkv_partial + (is_v ? int64_t(n_kv) * 8 * splits : 0) +
                                                      int64_t(kv) * splits * nkd + int64_t(row) * p.d + c);
  float4 x = __ldcs(src), y = __ldcs(src + 1);
  for (I s = 1; s < splits; ++s) {
    const float4 x1 = __ldcs(src + s * nkd / 4), y1 = __ldcs(src + s * nkd / 4 + 1);
    x = make_float4(x.x + x1.x, x.y + x1.y, x.z + x1.z, x.w + x1.w);
    y = make_float4(y.x + y1.x, y.y + y1.y, y.z + y1.z, y.w + y1.w);
  }
  store_scaled8<T>(is_v ? p.dv : p.dk, (kv / I(p.Hk)) * p.dk_sb + hk * p.dk_sh + row * p.dk_sr + c,
                   is_v ? p.dv_f32 : p.dk_f32, x, y, 1.f);
}

template <typename T, typename I>
cudaError_t launch_convert(const FusedParams& p, int64_t n_dq, int64_t n_kv, int64_t splits, cudaStream_t stream) {
  const int64_t dq_blocks = (n_dq + 255) / 256, blocks = dq_blocks + (2 * n_kv + 255) / 256;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  bwd_convert_kernel<T, I><<<unsigned(blocks), 256, 0, stream>>>(p, I(n_dq), I(n_kv), I(dq_blocks), I(splits));
  return cudaGetLastError();
}

template <typename T>
cudaError_t preprocess(const FusedParams& p, cudaStream_t stream) {
  const int64_t rows = p.B * p.H * p.Nq;
  if (rows == 0 && p.dkv_zero_floats == 0 && p.dq_sem_ints == 0) return cudaSuccess;  // else a block for the zeros
  if (fused_layout_ok(p.out) && fused_layout_ok(p.dout) && kc::is_aligned(p.dq_accum, 16)) {
    const int64_t rows_per_block = kPreWarps * 32 / kPreLanes;
    const int64_t blocks = std::max<int64_t>((rows + rows_per_block - 1) / rows_per_block, 1);
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    bwd_preprocess_vec_kernel<T><<<unsigned(blocks), kPreWarps * 32, 0, stream>>>(p);
  } else {
    const int64_t blocks = std::max<int64_t>((rows + kPreWarps - 1) / kPreWarps, 1);
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    bwd_preprocess_kernel<T><<<unsigned(blocks), kPreWarps * 32, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const FusedParams& p_in, cudaStream_t stream) {
  FusedParams p = p_in;
  const int64_t rows = p.B * p.H * p.Nq;
  // A float32 dq (FusedParams::dq_f32) that version 2 adds into itself: dense (the caller
  // allocates it so), zeroed by the pre-kernel as the workspace would be; dQ's pass of the
  // post-kernel (read the workspace, write dq) is gone. Version 2 folds the softmax scale into
  // dS^T, so its sums are dQ.
  p.dq_direct = p.dq_f32 && p.bwd_version != 1 && hopper_backward_applies(p);
  if (p.dq_direct) p.dq_accum = static_cast<float*>(p.dq);
  KC_CUDA_TRY(preprocess<T>(p, stream));
  // main kernel: version 2 (hopper_bwd.cu) where it applies (dense attention and packed
  // sequences, windows and softcaps included: hopper_masking), else version 1
  const cudaError_t v2 = p.bwd_version != 1 ? hopper_attention_backward_main(p, stream) : cudaErrorNotSupported;
  int64_t splits = p.H / p.Hk / p.heads_per_cta;
  if (v2 != cudaErrorNotSupported) {
    KC_CUDA_TRY(v2);
    if (!p.deterministic) splits = 1;  // version 2 summed each group into the accumulator: converted below
  } else {
    if (p.dq_direct) {  // version 2 turned the input down at launch (a map it could not make): the workspace
      p.dq_direct = false;
      p.dq_accum = p_in.dq_accum;
      KC_CUDA_TRY(preprocess<T>(p, stream));
    }
    if (p.bwd_version == 2 || p.deterministic) return cudaErrorNotSupported;  // version 1 cannot order its adds
    // packed sequences: version 1 takes a whole group per CTA (the plan's split was version 2's)
    if (p.cu_seqlens_q != nullptr && p.heads_per_cta * p.Hk != p.H) return cudaErrorNotSupported;
    KC_CUDA_TRY((p.d <= 64    ? launch_bwd_dkdv<T, 64>(p, stream)
                 : p.d <= 128 ? launch_bwd_dkdv<T, 128>(p, stream)
                              : launch_bwd_dkdv<T, 256>(p, stream)));
  }
  // the post-kernel: dQ and, under grouped-query attention with partials or version 2's
  // accumulator, dK and dV (chunks of 8 elements each)
  FusedParams pc = p;  // packed sequences: the partials span all key rows as one batch
  if (p.cu_seqlens_q != nullptr) {
    pc.B = 1;
    pc.Nk = p.total_k;
  }
  if (v2 != cudaErrorNotSupported) pc.scale = 1.f;  // dS^T carried it
  const int64_t n_dq = p.dq_direct ? 0 : rows * p.d / 8;
  const int64_t n_kv = p.H != p.Hk && p.dkv_partial != nullptr ? pc.B * pc.Hk * pc.Nk * pc.d / 8 : 0;
  if (n_dq + n_kv > 0) {
    const bool narrow = 8 * (n_dq + 2 * n_kv) < 0x7fffffff;  // every element index fits an int
    KC_CUDA_TRY((narrow ? launch_convert<T, int>(pc, n_dq, n_kv, splits, stream)
                        : launch_convert<T, int64_t>(pc, n_dq, n_kv, splits, stream)));
  }
  return cudaSuccess;
}

}  // namespace
}  // namespace flash

FusedBwdPlan fused_backward_plan(const FusedParams& p) {
  FusedBwdPlan plan;
  if (p.Hk <= 0 || p.H <= p.Hk || p.H % p.Hk != 0) return plan;  // multi-head (or invalid: the launcher says)
  const int64_t G = p.H / p.Hk, n_kt = (p.Nk + flash::kBwdBc - 1) / flash::kBwdBc;
  int64_t hpc = 1;
  // Version 2's main kernel (hopper_bwd.cu) takes the same plan with its own floor of CTAs
  // (kGqaMinCtasV2), deterministic too (it walks a CTA's heads tile by tile); a version 1
  // fallback at launch runs it as given.
  const bool v2 = p.bwd_version != 1 && hopper_backward_applies(p);
  // Packed sequences: version 1 takes a whole group per CTA (its partials' layout is dense
  // (B, Hk, Nk, d)); version 2 one q head, its accumulator or partials over all key rows.
  if (p.cu_seqlens_q != nullptr) {
    if (!v2) {
      plan.heads_per_cta = G;
      return plan;
    }
  } else {
    const int64_t min_ctas = v2 ? flash::kGqaMinCtasV2 : flash::kGqaMinCtas;
    for (int64_t c = G; c > 1; --c) {
      if (G % c == 0 && p.B * (p.H / c) * n_kt >= min_ctas) {
        hpc = c;
        break;
      }
    }
  }
  const int64_t Bm = p.cu_seqlens_q != nullptr ? 1 : p.B, Nm = p.cu_seqlens_q != nullptr ? p.total_k : p.Nk;
  plan.heads_per_cta = hpc;
  plan.splits = G / hpc;
  plan.partial_floats = plan.splits > 1 ? 2 * Bm * (p.H / hpc) * Nm * p.d : 0;
  if (v2 && !p.deterministic && plan.splits > 1) plan.accum_floats = 2 * Bm * p.Hk * Nm * p.d;
  return plan;
}

bool fused_backward_wide_fits() {
  constexpr int need = flash::BwdTile<256, flash::kBwdWarps, flash::kWideBr, flash::kWideCols>::smem_bytes<__half>();
  return kc::smem_optin_bytes() >= need;
}

cudaError_t fused_attention_backward(const FusedParams& p, cudaStream_t stream) {
  if (p.d % 8 != 0 || p.d > kFusedBwdMaxHeadDim || p.d <= 0 || p.Nk <= 0) return cudaErrorInvalidValue;
  if (!fused_layout_ok(p.q) || !fused_layout_ok(p.k) || !fused_layout_ok(p.v) || !fused_layout_ok(p.dout))
    return cudaErrorMisalignedAddress;
  if (p.B * p.H == 0) return cudaSuccess;
  if (p.Hk <= 0 || p.H % p.Hk != 0) return cudaErrorInvalidValue;
  if (p.H != p.Hk) {  // grouped-query attention: heads_per_cta divides G; partials unless it is G
    const int64_t G = p.H / p.Hk;
    if (p.heads_per_cta < 1 || G % p.heads_per_cta != 0) return cudaErrorInvalidValue;
    if ((p.heads_per_cta < G) != (p.dkv_partial != nullptr)) return cudaErrorInvalidValue;
  }
  switch (p.dtype) {
    case kc::DType::F16: return flash::backward<__half>(p, stream);
    case kc::DType::BF16: return flash::backward<__nv_bfloat16>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace day50
