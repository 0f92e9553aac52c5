// LayerNorm launchers (torch-free); the torch glue in layernorm_cuda.cpp calls
// these. Versions 0 (auto) and 1-6: layernorm_versions.h. Files:
//   layernorm_fwd_plan.cu      the forward's plan (the auto table, fallbacks) and launch
//   layernorm_fwd_v1.cu .. _v4.cu  one file per forward family (_v4: 4 and 6); the row
//                              math they share: layernorm_fwd_common.cuh
//   layernorm_bwd_plan.cu      the backward's plan (the auto table, fallbacks), launch and
//                              the dweight/dbias finalize (sum of the partial rows)
//   layernorm_bwd_v1.cu        1: the seed's kernels
//   layernorm_bwd_v2.cu        2: registers
//   layernorm_bwd_v3.cu        3: cp.async pipeline
//   layernorm_bwd_v4.cu        4: row slots
//   layernorm_bwd_ring.cu      5: ring, 6: ring with the row split across a cluster
//
// Shapes: x, y, dy, dx are [rows, cols] row-major with rows contiguous
// (row stride = cols). mean and rstd are fp32 [rows]. weight and bias are
// [cols], in wdt (the input dtype or fp32); either may be null (identity).
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "kc/types.h"
#include "layernorm_knobs.h"
#include "layernorm_versions.h"

namespace day26 {

struct LnForwardArgs {
  const void* x;
  const void* weight;  // may be null
  const void* bias;    // may be null
  void* y;
  float* mean;  // null: RMSNorm (the row not centred; give no bias then)
  float* rstd;
  int64_t rows, cols;
  float eps;
  kc::DType dt;   // x and y
  kc::DType wdt;  // weight and bias
  // add_norm: y = norm(x + residual), the sum (in dt) written to `sum`; both null
  // for a plain norm. Fused into the row's load where the plan's kernel has an
  // add instantiation (FwdPlan::add), else an add kernel runs first (add_first).
  const void* residual = nullptr;
  void* sum = nullptr;
};

struct LnBackwardArgs {
  const void* dy;
  const void* x;
  const float* mean;   // null: RMSNorm (mean 0, no mean(g) term; ask no dbias then)
  const float* rstd;
  const void* weight;  // may be null
  void* dx;            // may be null (not requested)
  void* dweight;       // may be null (not requested, or no weight)
  void* dbias;         // may be null
  float* workspace;    // LnBwdPlan::workspace_floats floats, fp32
  int64_t rows, cols;
  kc::DType dt, wdt;
  // add_norm's backward: dx = the norm's dx + dsum (the gradient reaching the sum
  // output directly); null for a plain norm. Only with dx.
  const void* dsum = nullptr;
};

// A backward plan: everything the launch needs, computed once per call by
// ln_backward_plan (layernorm_bwd_plan.cu) from the arguments, the version and
// the device; ln_backward launches exactly it, and the glue allocates
// workspace_floats floats of fp32 workspace before. The same arguments on the
// same device give the same plan, hence the same partition of rows and
// bitwise-identical dweight/dbias.
struct LnBwdPlan {
  int version = 0;           // asked for (0: auto)
  int family = kSeed;        // the kernel family that runs (layernorm_versions.h), after the fallbacks
  bool partials = false;     // dweight or dbias asked for: partial rows, then the finalize kernel
  int vec = 1;               // elements per vector access (1 or 16 bytes' worth)
  int iters = 1;             // vector accesses per thread per row (or row share)
  int tpr = 0;               // threads per row (or per row share)
  bool warp = false;         // 2: one warp per row
  bool prefetch = false;     // 4: the next row prefetched into registers
  int stages = 0;            // 3, 5, 6: rows in flight per block (per row slot for 5, 6)
  int cluster = 1;           // 6: CTAs per row
  int slots = 1;             // 4, 5, 6: row slots per block
  int threads = 0;           // block size
  int64_t grid = 0;          // blocks launched (0: no main kernel)
  size_t smem = 0;           // dynamic shared memory per block, bytes
  int64_t partial_rows = 0;  // rows of [2][cols] fp32 partials (blocks, or clusters for 6)
  int64_t workspace_floats = 0;
  int finalize = 0;          // 0: none (no partials, or 1's column kernel), 1: narrow, 2: wide
  int dsum = 0;              // add_norm (a.dsum): 1 added by the main kernel as it writes dx, 2 by ln_add after
};

// Number of multiprocessors and compute capability of the current device
// (kc/device.h): what the plan tables are keyed on besides the shape.
struct LnDevice {
  int sms = 1;
  int cc = 0;  // 10 * major + minor
  bool sm90() const { return cc >= 90; }
};
LnDevice ln_device();

// version: layernorm_versions.h (0 auto .. 6). Versions the launchers do not
// know run as auto; the range is checked once, by the ops (layernorm_checks.h).
cudaError_t ln_forward(const LnForwardArgs& a, int version, cudaStream_t stream);

// What the forward's plan (layernorm_fwd_plan.cu) picks for `a`: the family that
// runs after the fallbacks and its launch shape, as the private _forward_plan
// shows it (tests, tools/). Fields a family does not use stay 0 (cluster 1).
struct LnFwdPlanInfo {
  int family = kSeed;
  int vec = 1;             // elements per vector access
  int iters = 0, tpr = 0;  // vector accesses per thread per row (or share), threads per row
  bool warp = false;       // 2, 3: one warp per row
  int stages = 0;          // 3: rows in flight per block
  int slots = 0;           // 4, 6: row slots per block
  int threads = 0;         // block size (2 and 3: of the row; 1: V1Shape's)
  int64_t grid = 0;        // 4, 6: blocks launched (1, 2, 3: the launcher's, from the rows)
  int cluster = 1;         // 6: CTAs per row
  int64_t smem = 0;        // 1: the long row's shared-memory cache, bytes
  bool l2pf = false;       // 4, 6: the row after next prefetched into L2
  bool add = false;        // add_norm: the kernel adds the residual
  bool add_first = false;  // add_norm: ln_add first, then this plan on the sum
  bool pack = false;       // 4 with add: the row kept as its 16-bit sums
};
LnFwdPlanInfo ln_forward_plan(const LnForwardArgs& a, int version, const LnDevice& dev);

// `a` with every field set but `workspace`.
LnBwdPlan ln_backward_plan(const LnBackwardArgs& a, int version, const LnDevice& dev);
// `a.workspace`: plan.workspace_floats floats (when > 0).
cudaError_t ln_backward(const LnBackwardArgs& a, const LnBwdPlan& plan, cudaStream_t stream);

// out = a + b, n elements of dt (rounded once to dt; out may be a): add_norm's
// add where no fused kernel runs (layernorm_add.cu).
cudaError_t ln_add(const void* a, const void* b, void* out, int64_t n, kc::DType dt, cudaStream_t stream);

}  // namespace day26
