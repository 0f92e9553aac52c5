// se_module.h: launchers of the SE kernels (torch-free: raw pointers, sizes,
// kc::DType and a cudaStream_t in, a cudaError_t out; no allocation, no sync).
//
// Shapes. x is [N, C, H, W] in one of two dense layouts, seen as a 3-D array
// with L = H * W:
//   NCHW: [N, C, L], element (n, c, l) at (n * C + c) * L + l
//   NHWC: [N, L, C], element (n, c, l) at (n * L + l) * C + c   (channels_last)
// Per-(n, c) vectors (pooled mean, scale s, ...) are dense fp32 [N, C].
// Weights are dense fp32: w1 [S, C], b1 [S], w2 [C, S], b2 [C] (the 1x1
// convolutions fc1: C -> S and fc2: S -> C with their trailing 1x1 dropped).
//
// Workspace. The HW reduction is split over `splits` blocks per (n, c) when
// N * C alone would underfill the GPU; each split writes an fp32 partial sum
// ([N, splits, C]) and a second, fixed-order pass adds them: deterministic, no
// atomics. The plan (se_plan.h) says how many splits a call gets and how large its
// workspace is; the caller allocates the workspace from it, the launchers carve it.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "kc/types.h"
#include "se_plan.h"

namespace se {

enum class Act : int { ReLU = 0, SiLU = 1, Hardswish = 2 };  // the squeeze activation (after fc1)
enum class Gate : int { Sigmoid = 0, Hardsigmoid = 1 };     // the scale activation (after fc2)
enum class Pointwise : int { SwishFwd = 0, SwishBwd = 1, SigmoidFwd = 2, SigmoidBwd = 3 };

// ---------------------------------------------------------------- stages (stages.cu)
// global average pool: out[n, c] = mean_l x (in x's dtype).
//   version 1: the seed's algorithm, one thread per (n, c) looping over L
//              (uncoalesced in NCHW); needs no workspace.
//   version 2: coalesced split reduction; part: [N, plan.splits, C] fp32.
//   plan: plan_reduce(d, dt, num_sms) (version 2).
cudaError_t pool_forward(const void* x, kc::DType dt, Dims d, int version, const ReducePlan& plan, float* part,
                         void* out, cudaStream_t stream);
// grad_x[n, c, l] = grad[n, c] * alpha (grad: dense fp32 [N, C]); out in dt.
cudaError_t pool_backward(const float* grad, float alpha, kc::DType dt, Dims d, void* grad_x,
                          int num_sms, cudaStream_t stream);
// Elementwise on n dense elements: SwishFwd/SigmoidFwd: out = f(a) (b unused);
// SwishBwd: out = a * swish'(b) (a = grad, b = x); SigmoidBwd: out = a * b * (1 - b) (b = y).
cudaError_t pointwise(Pointwise op, const void* a, const void* b, void* out, kc::DType dt, int64_t n,
                      int num_sms, cudaStream_t stream);
// excitation: out[n, c, l] = x[n, c, l] * s[n, c] (s dense fp32 [N, C]).
cudaError_t excitation_forward(const void* x, const float* s, void* out, kc::DType dt, Dims d,
                               int num_sms, cudaStream_t stream);
// excitation backward in one pass over (grad, x): grad_x = grad * s[n, c] and
// grad_s[n, c] = sum_l grad * x, a block reduction per (n, c) (no atomics).
// plan: plan_reduce(d, dt, num_sms); part: [N, plan.splits, C] fp32; grad_s: dense [N, C] in s_dt.
cudaError_t excitation_backward(const void* grad, const void* x, const float* s, void* grad_x,
                                void* grad_s, kc::DType dt, kc::DType s_dt, Dims d, const ReducePlan& plan,
                                float* part, cudaStream_t stream);

// ---------------------------------------------------------------- fused (se_fused.cu)
// out = x * gate(w2 @ act(w1 @ mean_l(x) + b1) + b2), broadcast over l
// (act: ReLU, SiLU or Hardswish; gate: Sigmoid or Hardsigmoid; se_act.cuh).
//
// The MLP's parameters (w1 [S, C], b1 [S], w2 [C, S], b2 [C]), dense, all in one
// dtype: fp32, fp16 or bf16 (a module converted with .to(bfloat16) keeps them in
// bf16). The kernels compute in fp32: 16-bit parameters are widened into the
// workspace by extra blocks of the first kernel, so no separate cast launches.
struct SeParams {
  const void *w1, *b1, *w2, *b2;
  kc::DType dt;
};
// Their gradients (dw1 [S, C], db1 [S], dw2 [C, S], db2 [C]), dense, written in
// the parameters' dtype (each a sum over the batch in fp32, rounded once).
struct SeParamGrads {
  void *dw1, *db1, *dw2, *db2;
};
//
// The saved state (version 2, the spread MLP): a training forward may keep the MLP's per-sample values
// (p, s, z2 [N, C], z1, a [N, S], in that order: N * (3 C + 2 S) floats) for its
// backward, which then reads them instead of recomputing fc1 and fc2 (two launches
// fewer). Written where plan.keep_state, read where plan.use_state (both: the spread
// MLP); elsewhere the forward leaves `state` untouched and the backward ignores it.
//
// se_forward / se_backward run plan.path Block or Spread (se_fused.cu, the spread
// products in se_spread.cu); ws holds
// plan.workspace floats.
cudaError_t se_forward(const void* x, kc::DType dt, Dims d, int64_t S, Act act, Gate gate, const SeParams& w,
                       void* out, float* ws, float* state, const SePlan& plan, cudaStream_t stream);
// Gradients of the fused block. grad and x share x's layout and dtype; dx in
// it too. Recomputes the pooled mean in the same pass that reduces grad * x, so
// the backward moves 4 tensors' worth of bytes (read grad, x; read grad, write
// dx) and nothing more.
cudaError_t se_backward(const void* grad, const void* x, kc::DType dt, Dims d, int64_t S, Act act,
                        Gate gate, const SeParams& w, void* dx, const SeParamGrads& dw, float* ws,
                        const float* state, const SePlan& plan, cudaStream_t stream);

// ---------------------------------------------------------------- version 3 (se_cluster.cu)
// The whole block of one sample in one thread-block cluster of k CTAs, each
// holding a share of the channels in shared memory: x read once, out written
// once (forward: one launch), grad and x read once, dx written once (backward:
// the cluster kernel, then the weight gradients' kernel). Run where plan.path is
// Path::Cluster, in plan.cluster's shape; ws (backward) holds plan.workspace floats.
cudaError_t cluster_forward(const void* x, kc::DType dt, const Dims& d, int64_t S, Act act, Gate gate,
                            const SeParams& w, void* out, const ClusterPlan& p, cudaStream_t stream);
cudaError_t cluster_backward(const void* grad, const void* x, kc::DType dt, const Dims& d, int64_t S, Act act,
                             Gate gate, const SeParams& w, void* dx, const SeParamGrads& dw, float* ws,
                             const ClusterPlan& p, cudaStream_t stream);
// The plan's occupancy query (se_plan.h, ClusterCapacityFn): clusters of k CTAs of the
// cluster kernel for (dt, wdt, layout, direction) that fit on the current device at once.
int cluster_capacity(kc::DType dt, kc::DType wdt, Layout layout, bool backward, int threads, int k, size_t smem);

}  // namespace se
