// LayerNorm launchers (torch-free). Kernels live in layernorm_fwd.cu and
// layernorm_bwd.cu; the torch glue in layernorm_cuda.cpp calls these.
//
// Shapes: x, y, dy, dx are [rows, cols] row-major with rows contiguous
// (row stride = cols). mean and rstd are fp32 [rows]. weight and bias are
// [cols], in wdt (the input dtype or fp32); either may be null (identity).
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "kc/types.h"
#include "layernorm_knobs.h"

namespace day26 {

struct LnForwardArgs {
  const void* x;
  const void* weight;  // may be null
  const void* bias;    // may be null
  void* y;
  float* mean;
  float* rstd;
  int64_t rows, cols;
  float eps;
  kc::DType dt;   // x and y
  kc::DType wdt;  // weight and bias
};

struct LnBackwardArgs {
  const void* dy;
  const void* x;
  const float* mean;
  const float* rstd;
  const void* weight;  // may be null
  void* dx;            // may be null (not requested)
  void* dweight;       // may be null (not requested, or no weight)
  void* dbias;         // may be null
  float* workspace;    // ln_backward_workspace_floats() floats, fp32
  int64_t rows, cols;
  kc::DType dt, wdt;
};

// version 1: the seed's algorithm; 2: the row in registers; 3: v2's math on a
// cp.async pipeline (block path with 16-byte vectors; otherwise v2). 2 and 3
// fall back to 1 for rows longer than 16384 (8192 without 16-byte vectors).
cudaError_t ln_forward(const LnForwardArgs& a, int version, cudaStream_t stream);

// fp32 scratch the backward needs for the dweight/dbias partials (0 if none),
// for the arguments `a` (all set but `workspace`). It depends on the sizes,
// dtypes, pointer alignment and device only: the same inputs give the same
// partition of rows, hence bitwise-identical dweight/dbias.
int64_t ln_backward_workspace_floats(const LnBackwardArgs& a, int version);
cudaError_t ln_backward(const LnBackwardArgs& a, int version, cudaStream_t stream);


}  // namespace day26
