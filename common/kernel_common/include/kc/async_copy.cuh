// kc/async_copy.cuh: cp.async (sm_80+) helpers for multi-stage shared-memory
// pipelines that hold several rows in flight without holding registers.
//
//   cp_async_16(smem, gmem)  copy 16 bytes global -> shared, asynchronously
//                            (.cg: cached in L2 only). Both addresses 16-byte aligned.
//   cp_async_16_evict_first  the same, the L2 line marked evict-first
//   cp_async_commit()        close the current group of copies of this thread
//   cp_async_wait(n)         wait until at most n of this thread's groups are
//                            still in flight (n in 0..7, uniform or not)
//
// Contract: completion is per thread. A thread may read, without a barrier,
// exactly the shared-memory bytes its own completed copies wrote; bytes written
// by other threads' copies need cp_async_wait in those threads and then a
// __syncthreads() before anyone reads them.
#pragma once

#include <cstdint>

namespace kc {

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

// the same, the line marked evict-first in L2 (data this kernel reads for the last time).
// The policy is a constant: ptxas folds the createpolicy, so a copy costs no more instructions
// than cp_async_16 (cuobjdump -sass of se_module's reduce_cols_kernel, nvcc 13.0, sm_90a,
// 2026-11-26: no CREATEPOLICY in the kernel).
__device__ __forceinline__ void cp_async_16_evict_first(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "l"(policy)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait_n() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ void cp_async_wait(int n) {
  switch (n) {
    case 0: cp_async_wait_n<0>(); break;
    case 1: cp_async_wait_n<1>(); break;
    case 2: cp_async_wait_n<2>(); break;
    case 3: cp_async_wait_n<3>(); break;
    case 4: cp_async_wait_n<4>(); break;
    case 5: cp_async_wait_n<5>(); break;
    case 6: cp_async_wait_n<6>(); break;
    default: cp_async_wait_n<7>(); break;
  }
}

}  // namespace kc
