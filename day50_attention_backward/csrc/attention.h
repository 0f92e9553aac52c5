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
                        // (flash_bwd.cuh), 2 Hopper TMA + wgmma (hopper_bwd.cu: multi-head, d 64 / 128)
  bool deterministic = false;  // backward: dq's adds in a fixed order (version 2 only; dq_sem below)
  int* dq_sem = nullptr;       // deterministic: B * H * hopper_bwd_query_tiles(Nq) * 2 ints, zeroed
  int variant = 0;  // backward tiling variant (0 = default); see flash_bwd.cu
  // Backward, grouped-query attention only (H > Hk), as fused_backward_plan says:
  int64_t heads_per_cta = 1;     // q heads of a group one CTA of the dK/dV kernel sums in registers (divides H / Hk)
  float* dkv_partial = nullptr;  // fp32 workspace, 2 * B * (H / heads_per_cta) * Nk * d floats, when
                                 // heads_per_cta < H / Hk (a group split over several CTAs)
};

// How the fused backward sums dK and dV over a group of G = H / Hk q heads
// (flash_bwd.cu explains the choice). One CTA of the dK/dV kernel owns a block of
// keys of one kv head and heads_per_cta (a divisor of G) of its q heads, summing
// their contributions in registers; the G / heads_per_cta CTAs of a group
// (`splits`) write fp32 partial sums that a second kernel adds in a fixed order.
// splits == 1: no workspace, no second kernel. Multi-head attention (H == Hk) is
// always heads_per_cta = splits = 1 and runs the kernel it always ran.
struct FusedBwdPlan {
  int64_t heads_per_cta = 1;
  int64_t splits = 1;
  int64_t partial_floats = 0;  // fp32 workspace for the partial sums (0 when splits == 1)
};
FusedBwdPlan fused_backward_plan(const FusedParams& p);

// Runs version p.fwd_version (see FusedParams); cudaErrorNotSupported when version 2
// was asked for and cannot run these inputs here.
cudaError_t fused_attention_forward(const FusedParams& p, cudaStream_t stream);
// Version 2 alone: whether it can run p on the current device (an sm_90a build, a
// compute capability 9.0 GPU, fp16/bf16, d a multiple of 8 up to 128), and the launch
// (cudaErrorNotSupported when it cannot, e.g. a stride the copy engine refuses).
bool hopper_forward_applies(const FusedParams& p);
cudaError_t hopper_attention_forward(const FusedParams& p, cudaStream_t stream);
// Version 2 of the backward's main kernel (the pre- and post-kernels are version 1's):
// where it applies (hopper_forward_applies, multi-head attention, d = 64 or 128), and
// the launch (cudaErrorNotSupported when it cannot run p).
bool hopper_backward_applies(const FusedParams& p);
int64_t hopper_bwd_query_tiles(int64_t Nq);  // query tiles of version 2's backward (its semaphores)
cudaError_t hopper_attention_backward_main(const FusedParams& p, cudaStream_t stream);
// p.heads_per_cta and p.dkv_partial as fused_backward_plan(p) says. Runs main-kernel
// version p.bwd_version; cudaErrorNotSupported when 2 was asked for and cannot run p.
cudaError_t fused_attention_backward(const FusedParams& p, cudaStream_t stream);

}  // namespace day50
