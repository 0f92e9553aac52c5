// Launchers of the kernels that exercise kc/reduce.cuh (torch-free).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "kc/types.h"

// x: [rows, len] contiguous, any kc dtype. One block of `threads` threads per row.
// out: [rows, threads, 3] fp32: every thread writes (sum, max, sum of squares)
// as it received them, so the test can check the result is valid in every thread.
cudaError_t launch_block_reduce_test(const void* x, kc::DType dt, int64_t rows, int64_t len,
                                     int threads, float* out, cudaStream_t stream);

// x: [groups, width] fp32, width in {1,2,4,8,16,32}. Warps of 32 lanes, each
// group of `width` lanes reduces one row. out: [groups, width, 2] (sum, max) per lane.
cudaError_t launch_warp_reduce_test(const float* x, int64_t groups, int width, float* out,
                                    cudaStream_t stream);

// x: [rows, len] fp32 contiguous. One warp per row: lanes < skip (0..31) hold
// no values, the rest take the row's elements round robin, and the warp
// combines their (mean, m2) with kc::warp_combine_mean_m2. out: [rows, 32, 2]
// (mean, m2) as each lane received it.
cudaError_t launch_warp_mean_m2_test(const float* x, int64_t rows, int len, int skip, float* out,
                                    cudaStream_t stream);
