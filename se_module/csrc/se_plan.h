// se_plan.h: the plan of one fused SE call, computed once per call (se_plan.cpp).
//
// glue (se_cuda.cpp) -> plan_forward / plan_backward -> allocate plan.workspace ->
// launchers (se_fused.cu, se_spread.cu, se_cluster.cu) that read the plan and decide nothing.
// Which path runs (cluster / one block per sample / spread MLP), the reduction's
// splits, the parameter staging and widening, the saved state, where the weight
// gradients run and the workspace all come from here; every threshold behind those
// choices is in se_plan.cpp with the measurement that set it.
//
// Plain C++ (no CUDA, no torch): a CPU-only build compiles it, and the tests check
// the plan table there through the extension's private `_plan` entry (binding.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kc/types.h"
#include "se_geometry.h"

namespace se {

// ------------------------------------------------------------------ versions
// The fused op's `version` argument (se_block, se_block_train, se_block_backward):
// 0 (auto, the default), 1 (the fused block), 2 (+ the spread MLP), 3 (+ the cluster
// kernel); se_plan.cpp says what each lets the plan use.
bool valid_fused_version(int64_t version);
// Whether a forward at this version may keep the values its backward reads (the
// saved state): the autograd then calls se_block_train (binding.cpp).
bool may_keep_state(int64_t version);

// Launch features every launcher of the chain takes.
struct LaunchOpts {
  int num_sms = 1;
  bool reverse = false;    // the elementwise pass walks memory backwards (hits what the reduction left in L2)
  bool streaming = false;  // outputs stored with .cs (evict-first), so they do not push inputs out of L2
  bool pdl = false;        // programmatic dependent launch (sm_90+): next kernel launches while this one drains
};

// The cluster kernel's shape for one call (se_cluster.cu).
struct ClusterPlan {
  int k = 1;          // CTAs per sample (cluster size)
  int unit = 1;       // channels per share unit
  int64_t units = 0;  // ceil(C / unit)
  int cmax = 0;       // most channels in one CTA's share
  int threads = 256;  // threads per CTA (256, 512 or 1024)
  size_t smem = 0;    // dynamic shared memory per CTA, bytes
};

// How the 16-bit parameters reach the spread products and the MLP kernel when they do
// not read them in their own dtype: fp32 copies (widen) and transposed fp32 copies of
// w1 / w2, written by extra blocks of the reduction kernel (se_reduce.cu, ParamCast),
// at the start of the workspace in that order.
struct CastPlan {
  bool widen = false;         // fp32 copies of w1, b1, w2, b2
  bool transpose_w1 = false;  // w1^T [C, S] (the spread backward's Coef product)
  bool transpose_w2 = false;  // w2^T [S, C] (its Da product)
  int64_t units[4] = {0, 0, 0, 0};  // per tensor (w1, b1, w2, b2): units copied (0: none)
  int per[4] = {1, 1, 1, 1};        // elements a unit: 16 bytes' worth where aligned, else 1
  int blocks = 0;                   // extra blocks of the reduction kernel (0: none)
};

enum class Path : int { Block = 0, Spread = 1, Cluster = 2 };

struct SePlan {
  bool backward = false;
  Path path = Path::Block;
  LaunchOpts launch;
  ClusterPlan cluster;   // Path::Cluster
  ReducePlan reduce{1, 1};  // Block, Spread: the HW reduction's splits
  // Block: the parameters staged in the MLP kernel's shared memory (from their own
  // dtype), and the kernel's dynamic shared memory
  bool staged = false;
  size_t mlp_smem = 0;
  bool keep_state = false;   // forward: writes the saved state (se_block_train)
  bool use_state = false;    // backward: reads it instead of recomputing fc1 and fc2
  bool coef_direct = false;  // backward with the state: Coef stages columns of w1 itself
  bool da_direct = false;    // ... and DaState columns of w2
  CastPlan cast;
  bool wgrad_beside = false;  // Spread backward: the weight gradients in Coef's grid, not the Dx pass's
  int64_t workspace = 0;      // fp32 floats
};

struct DeviceInfo {
  int sms = 0, cc_major = 0, smem_optin = 0;
};

// How many clusters of k CTAs (threads each, smem bytes of dynamic shared memory) of
// the cluster kernel fit on the current device at once (se_cluster.cu). A pointer, so
// that this file builds without CUDA and a test can stand one in; null: none fit.
using ClusterCapacityFn = int (*)(kc::DType dt, kc::DType wdt, Layout layout, bool backward, int threads, int k,
                                  size_t smem);

struct PlanInputs {
  Dims d{0, 0, 0, Layout::NCHW};
  int64_t S = 0;
  kc::DType dt = kc::DType::F32;   // x's
  kc::DType wdt = kc::DType::F32;  // the parameters' (one dtype for the four)
  int64_t version = 0;
  DeviceInfo dev;
  // the tensors' addresses (their alignment decides vector paths): x, grad (backward),
  // the output (forward: out; backward: dx), the parameters
  const void *x = nullptr, *g = nullptr, *out = nullptr;
  const void *w1 = nullptr, *b1 = nullptr, *w2 = nullptr, *b2 = nullptr;
  bool state = false;  // forward: a saved state is asked for; backward: one is given
  ClusterCapacityFn capacity = nullptr;
};

// The plans. Each call of the fused op computes one, at its start, and every launch
// of the call reads it. The backward's plan is computed once at the start of the
// backward from the same inputs as the forward's and x itself: the forward's
// path is a function of the shape, the dtypes, the device, the version and x's
// alignment (its output is a fresh, aligned allocation), so plan_backward knows
// whether the forward kept the saved state without asking the forward.
SePlan plan_forward(const PlanInputs& in);
SePlan plan_backward(const PlanInputs& in);
// Plans computed by this process (plan_forward and plan_backward calls); tests read it
// to see one plan per call.
int64_t plan_count();

// The HW reduction's splits for a stage op, or the fused block's with extra_blocks
// beside the reduction's in its grid (the parameter-widening ones). Fewer splits than
// with none, never more.
ReducePlan plan_reduce(const Dims& d, kc::DType dt, int num_sms, int extra_blocks = 0);

}  // namespace se
