// Launchers of the day-50 attention kernels (torch-free: raw pointers, sizes,
// strides in elements, a dtype tag and a stream in; a cudaError_t out).
//
// Shapes follow F.scaled_dot_product_attention: q (B, H, Nq, d), k and v
// (B, Hk, Nk, d), out (B, H, Nq, d), lse (B, H, Nq). Causal masking is aligned
// top-left (query i sees keys j <= i), as SDPA does for Nq != Nk.
// Grouped-query attention (SDPA's enable_gqa=True): Hk divides H, and q head h
// reads k/v head h / (H / Hk); dk and dv (B, Hk, Nk, d) are summed over the
// H / Hk q heads of each group. Hk == H is ordinary multi-head attention.
//
// The kernels allocate nothing: every workspace is passed in by the caller.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "kc/types.h"

namespace day50 {

// Storage type of the naive path. kc::DType has no float64, and gradcheck runs
// through the naive kernels in float64, so the naive path carries its own tag.
enum class NaiveType : int { F32 = 0, F16 = 1, BF16 = 2, F64 = 3 };

inline NaiveType naive_type(kc::DType dt) { return static_cast<NaiveType>(static_cast<int>(dt)); }

// A rank-4 view (b, h, row, col) of some storage; strides in elements.
struct View4 {
  const void* ptr = nullptr;
  int64_t sb = 0, sh = 0, sr = 0, sc = 1;
};

// ------------------------------------------------------------------ naive path
// C[b,h] = alpha * op(A[b,h]) @ op(B[b,h]), op(X) = X or X^T (the trans flags),
// op(A) is M x K, op(B) is K x N, C is M x N. Views describe the *stored*
// matrices (for trans_a, A is stored K x M). All of A, B, C have type `t`.
// (The attention launchers below also use the grouped form of this matmul:
// see naive.cu, tiled_matmul_kernel.)
cudaError_t naive_matmul(View4 a, View4 b, View4 c, int64_t batch, int64_t heads, int64_t M, int64_t N,
                         int64_t K, bool trans_a, bool trans_b, double alpha, NaiveType t, cudaStream_t stream);

// Workspace `s` holds B*H*Nq*Nk elements of the accumulation type (double for
// F64, float otherwise). out is written contiguous (B, H, Nq, d); lse contiguous
// (B, H, Nq) in the accumulation type.
cudaError_t naive_attention_forward(View4 q, View4 k, View4 v, void* out, void* lse, void* ws_s, int64_t B,
                                    int64_t H, int64_t Hk, int64_t Nq, int64_t Nk, int64_t d, bool causal,
                                    double scale, NaiveType t, cudaStream_t stream);

// Two workspaces of B*H*Nq*Nk accumulation-type elements (P and dP/dS).
// grad_lse may be null (contiguous (B, H, Nq), accumulation type). dq (B, H, Nq, d),
// dk and dv (B, Hk, Nk, d) are written contiguous.
cudaError_t naive_attention_backward(View4 dout, View4 q, View4 k, View4 v, const void* lse,
                                     const void* grad_lse, void* dq, void* dk, void* dv, void* ws_p,
                                     void* ws_dp, int64_t B, int64_t H, int64_t Hk, int64_t Nq, int64_t Nk,
                                     int64_t d, bool causal, double scale, NaiveType t, cudaStream_t stream);

// ------------------------------------------------------------------ fused path
// fp16 / bf16, head dim d a multiple of 8 and at most kFusedMaxHeadDim. The
// row stride, head stride and batch stride of q, k, v, dout must be multiples
// of 8 elements, the innermost stride 1 and the base pointers 16-byte aligned
// (fused_layout_ok); the caller copies otherwise.
constexpr int kFusedMaxHeadDim = 128;
// Head dims over 128, up to 256, under "auto" (attention_cuda.cpp): the Hopper forward
// (version 2) and version 1's backward main kernel in column halves (flash_bwd.cuh); the
// fused forward of version 1 stops at 128.
constexpr int kHopperFwdMaxHeadDim = 256, kFusedBwdMaxHeadDim = 256;

bool fused_layout_ok(const View4& v);

struct FusedParams {
  View4 q, k, v;          // inputs
  View4 out, dout;        // backward only (out: any strides; dout: fused layout)
  void* o = nullptr;      // forward output (B, H, Nq, d), unit column stride and these (batch, head, row)
  int64_t o_sb = 0, o_sh = 0, o_sr = 0;  // strides, multiples of 8 (attention_cuda.cpp: q's layout)
  float* lse = nullptr;   // contiguous (B, H, Nq), natural log of sum exp(scale * q.k)
  const float* grad_lse = nullptr;   // backward, optional, contiguous (B, H, Nq)
  void* dq = nullptr;     // backward outputs: dq (B, H, Nq, d) with the dq_s* strides (multiples of 8,
                          // unit column stride); dk, dv (B, Hk, Nk, d) contiguous
  int64_t dq_sb = 0, dq_sh = 0, dq_sr = 0;
  void* dk = nullptr;
  void* dv = nullptr;
  // float32 gradients of 16-bit inputs (attention_backward's dq_dtype, ...: autocast's fp32 q and
  // k after RoPE): the post-kernel stores dq, and the dk, dv it sums (grouped-query attention),
  // as float32 instead of the dtype; the launcher sets these only for the outputs it writes.
  bool dq_f32 = false, dk_f32 = false, dv_f32 = false;
  // Set by flash_bwd.cu's launcher, not the caller: version 2 adds into a float32 dq itself
  // (dq_accum = dq, dense in its dq_s* layout; the pre-kernel zeroes it, the post-kernel skips it).
  bool dq_direct = false;
  float* dsum = nullptr;      // workspace (B*H*Nq): rowsum(dout * out) - grad_lse
  float* dq_accum = nullptr;  // workspace (B*H*Nq*d) fp32
  int64_t B = 0, H = 0, Nq = 0, Nk = 0, d = 0;
  int64_t Hk = 0;  // heads of k and v (grouped-query attention): H % Hk == 0, q head h reads kv head h / (H / Hk)
  float scale = 1.f;
  bool causal = false;
  kc::DType dtype = kc::DType::BF16;
  int fwd_version = 0;  // fused forward: 0 auto (2 where it applies, else 1), 1 mma.sync (flash_fwd.cu),
                        // 2 Hopper TMA + wgmma (hopper_fwd.cu; sm_90a builds on compute capability 9.0)
  int bwd_version = 0;  // fused backward's main kernel: 0 auto (2 where it applies, else 1), 1 mma.sync
                        // (flash_bwd.cuh), 2 Hopper TMA + wgmma (hopper_bwd.cu: d up to 128)
  bool deterministic = false;  // backward: dq's adds in a fixed order (version 2 only; dq_sem below)
  int* dq_sem = nullptr;       // deterministic: B * H * hopper_bwd_query_tiles(Nq) ints (dq_sem_ints)
  // Masking, every fused kernel, forward and backward. Query i of a sequence of nq queries sees
  // key j of its nk keys when lo(i) <= j <= hi(i), around the diagonal i + off, where
  // off = bottom_right ? nk - nq : 0:
  //   hi(i) = i + off + window_right   (window_right < 0: no upper bound)
  //   lo(i) = i + off - window_left    (window_left < 0: no lower bound)
  // The glue folds causal in: causal <=> window_right == 0 with `causal` also set, so a kernel
  // may keep its kCausal template and treat the window as the general case. Dense attention()
  // aligns top-left (off = 0, SDPA's causal); attention_varlen bottom-right (flash-attn's). A
  // query row that sees no key gets out = 0, lse = +inf and zero gradients (flash-attn's rule:
  // P = exp(S - lse) = 0 in the backward).
  int64_t window_left = -1, window_right = -1;
  bool bottom_right = false;
  // softcap > 0: each score s = scale * q.k becomes softcap * tanh(s / softcap) before the mask
  // and the softmax (Gemma 2); the backward multiplies dS by 1 - tanh^2.
  float softcap = 0.f;
  // Packed sequences (attention_varlen; null for dense attention). B sequences: sequence b has
  // queries [cu_seqlens_q[b], cu_seqlens_q[b + 1]) and keys [cu_seqlens_k[b], cu_seqlens_k[b + 1])
  // as rows of q (total_q, H, d) and k, v (total_k, Hk, d). Their View4s (and out, dout, o_s*,
  // dq_s*) carry sb = 0, sh = the head stride, sr = the row stride; a kernel adds the sequence's
  // first row (seq_span below) to its row index. Nq and Nk are then max_seqlen_q and
  // max_seqlen_k: they size the grid; each sequence's own lengths come from the offsets.
  const int* cu_seqlens_q = nullptr;  // device, B + 1 int32, nondecreasing, cu[0] == 0
  const int* cu_seqlens_k = nullptr;
  int64_t total_q = 0, total_k = 0;  // packed sequences: the rows of q and of k, v
  // Per-row fp32 arrays (lse, grad_lse, dsum): row i of (b, h) is element
  //   b * row_sb + h * row_sh + q0 + i        (q0 = the sequence's first row, seq_span)
  // dense: row_sb = H * Nq, row_sh = Nq (contiguous (B, H, Nq)), q0 = 0;
  // varlen: row_sb = 0, row_sh = total_q (lse is (H, total_q), flash-attn's varlen layout).
  // dq_accum (fp32) uses the same row numbering times d: element (row index) * d + c.
  int64_t row_sb = 0, row_sh = 0;
  // Strides of the dk and dv outputs (elements; unit column stride): dense (B, Hk, Nk, d)
  // contiguous; varlen (total_k, Hk, d) contiguous, i.e. sb = 0, sh = d, sr = Hk * d.
  int64_t dk_sb = 0, dk_sh = 0, dk_sr = 0;
  // Backward, grouped-query attention only (H > Hk), as fused_backward_plan says:
  int64_t heads_per_cta = 1;     // q heads of a group one CTA of the dK/dV kernel sums in registers (divides H / Hk)
  float* dkv_partial = nullptr;  // fp32 workspace, 2 * B * (H / heads_per_cta) * Nk * d floats, when
                                 // heads_per_cta < H / Hk (a group split over several CTAs)
  // Zeroed by the backward's pre-kernel, before the main kernel adds into them: version 2's
  // accumulator (the first dkv_zero_floats of dkv_partial, a multiple of 4: fused_backward_plan's
  // accum_floats) and the deterministic dq counters (dq_sem_ints of dq_sem).
  int64_t dkv_zero_floats = 0, dq_sem_ints = 0;
};

// Where sequence b lives: its first query row q0 and key row k0 in the packed tensors, and its
// lengths (dense: 0, 0, Nq, Nk). Device code only (cu_seqlens_* are device pointers).
struct SeqSpan {
  int64_t q0, k0, nq, nk;
};
#ifdef __CUDACC__
__device__ __forceinline__ SeqSpan seq_span(const int* cu_q, const int* cu_k, int64_t b) {
  const int64_t q0 = cu_q[b], k0 = cu_k[b];
  return {q0, k0, cu_q[b + 1] - q0, cu_k[b + 1] - k0};
}
__device__ __forceinline__ SeqSpan seq_span(const FusedParams& p, int64_t b) {
  if (p.cu_seqlens_q == nullptr) return {0, 0, p.Nq, p.Nk};
  return seq_span(p.cu_seqlens_q, p.cu_seqlens_k, b);
}
#endif

// How the fused backward sums dK and dV over a group of G = H / Hk q heads
// (flash_bwd.cu explains the choice). One CTA of the dK/dV kernel owns a block of
// keys of one kv head and heads_per_cta (a divisor of G) of its q heads, summing
// their contributions in registers; the G / heads_per_cta CTAs of a group
// (`splits`) write fp32 partial sums that a second kernel adds in a fixed order
// (version 2, not deterministic: add them into one accumulator the second kernel
// converts). splits == 1: no workspace, no second kernel. Multi-head attention (H == Hk) is
// always heads_per_cta = splits = 1 and runs the kernel it always ran.
struct FusedBwdPlan {
  int64_t heads_per_cta = 1;
  int64_t splits = 1;
  int64_t partial_floats = 0;  // fp32 workspace for the partial sums (0 when splits == 1)
  // Version 2 runs a split group, not deterministic: it adds into a (2, B, Hk, Nk, d) fp32 accumulator
  // (packed sequences: (2, Hk, total_k, d)), the workspace's first accum_floats, which the
  // caller passes as FusedParams::dkv_zero_floats.
  int64_t accum_floats = 0;
};
FusedBwdPlan fused_backward_plan(const FusedParams& p);

// Runs version p.fwd_version (see FusedParams); cudaErrorNotSupported when version 2
// was asked for and cannot run these inputs here, or d is over 128 and version 2 does not run.
cudaError_t fused_attention_forward(const FusedParams& p, cudaStream_t stream);
// The masking version 2 (Hopper) runs: any window (plain causal included; `causal` set exactly
// when window_right == 0, as the glue sets it), top-left for dense attention and bottom-right
// for packed sequences, and softcap; forward and backward.
inline bool hopper_masking(const FusedParams& p) {
  return (p.cu_seqlens_q != nullptr || !p.bottom_right) && p.causal == (p.window_right == 0);
}
// Version 2 alone: whether it can run p on the current device (an sm_90a build, a
// compute capability 9.0 GPU, fp16/bf16, d a multiple of 8 up to kHopperFwdMaxHeadDim,
// hopper_masking), and the launch (cudaErrorNotSupported when it cannot, e.g. a stride the
// copy engine refuses).
bool hopper_forward_applies(const FusedParams& p);
cudaError_t hopper_attention_forward(const FusedParams& p, cudaStream_t stream);
// Version 2 of the backward's main kernel (the pre- and post-kernels are version 1's):
// where it applies (hopper_forward_applies, d up to 128), and
// the launch (cudaErrorNotSupported when it cannot run p).
bool hopper_backward_applies(const FusedParams& p);
int64_t hopper_bwd_query_tiles(int64_t Nq);  // query tiles of version 2's backward (its semaphores)
cudaError_t hopper_attention_backward_main(const FusedParams& p, cudaStream_t stream);
// Whether the current device gives a block the shared memory of the backward's kernel for
// head dims over 128 (213 KB: Hopper has 227, an A100 163).
bool fused_backward_wide_fits();
// p.heads_per_cta and p.dkv_partial as fused_backward_plan(p) says. Runs main-kernel
// version p.bwd_version; cudaErrorNotSupported when 2 was asked for and cannot run p.
cudaError_t fused_attention_backward(const FusedParams& p, cudaStream_t stream);

// ------------------------------------------------------------------ SIMT fused path (flash_simt.cu)
// The fused algorithm on CUDA cores in fp32 arithmetic: float32, float16 and bfloat16 storage,
// any head dim 1..kSimtMaxHeadDim, any Nq / Nk, grouped-query attention, and FusedParams'
// masking (causal, window, bottom_right, softcap) and packed sequences (cu_seqlens_*, row_s*).
// Extra memory: p.dsum (the backward's per-row D) only; no atomics, so every output is
// bitwise reproducible. Fields read: q, k, v, out, dout (any strides, zero included), o (o_s*),
// lse, grad_lse, dsum, dq (dq_s*), dk and dv (dk_s*), B, H, Hk, Nq, Nk, d, scale, causal, dtype
// and the masking fields; fwd_version, bwd_version, deterministic, dq_accum, dq_sem,
// heads_per_cta and dkv_partial are not used.
constexpr int kSimtMaxHeadDim = 256;
cudaError_t simt_attention_forward(const FusedParams& p, cudaStream_t stream);
cudaError_t simt_attention_backward(const FusedParams& p, cudaStream_t stream);

// ------------------------------------------------------------------ packed sequences (varlen_check.cu)
// Checks the offsets on the device (cu[0] == 0, nondecreasing, cu[nseq] == total, every length
// <= max): a violation prints the rule it broke and traps, so the next CUDA call raises, as a
// bad index in a PyTorch kernel does. The host never reads the offsets (graph capture).
cudaError_t varlen_offsets_check(const int* cu_q, const int* cu_k, int64_t nseq, int64_t total_q, int64_t total_k,
                                 int64_t max_q, int64_t max_k, cudaStream_t stream);

}  // namespace day50
