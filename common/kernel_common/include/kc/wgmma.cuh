// kc/wgmma.cuh: Hopper warpgroup matrix multiply-accumulate (wgmma, sm_90a only).
//
// A warpgroup is 4 consecutive warps starting at a warp index divisible by 4; all
// 128 threads issue each call together. One instruction computes a 64 x N x 16
// product, D (64 x N, fp32, in registers) (+)= A (64 x 16) B (16 x N), asynchronously:
//
//   wgmma_fence()                 before the first wgmma of a batch: orders earlier
//                                 register writes (accumulators, A fragments) before it
//   WgmmaOp<T, N>::ss / ::rs      issue (kc/wgmma_ops.cuh: A from shared memory or
//                                 registers, B from shared memory)
//   wgmma_commit()                close the batch issued since the last commit
//   wgmma_wait<n>()               wait until at most n batches are still in flight;
//                                 only then may the accumulators be read, or the
//                                 shared memory they read be overwritten
//   fence_operands(d)             keeps the compiler from moving accesses to d across
//                                 the asynchronous region (call before the fence and
//                                 after the wait)
//
// Accumulator layout (m64nNk16, fp32): warp w of the warpgroup holds rows 16 w + g and
// 16 w + g + 8 (g = lane / 4); for each 8-column chunk c, d[4c + 0..1] are row 16 w + g,
// columns 8c + 2t + 0..1 (t = lane % 4), d[4c + 2..3] the same columns of row + 8.
// The register A operand of a k-step uses the same positions for its 16 columns:
// a[0] = (row, cols 2t..), a[1] = (row + 8, 2t..), a[2] = (row, 8 + 2t..), a[3] = (row + 8, 8 + 2t..),
// so an fp32 accumulator block converts to the next product's A without any shuffle.
//
// Shared-memory operands (gmma_desc_sw128): tiles with 128-byte rows swizzled as TMA
// writes them with CU_TENSOR_MAP_SWIZZLE_128B (kc/tma.cuh), bases 1024-byte aligned.
// - K-major operand (K contiguous within a 128-byte row = 64 16-bit elements): rows
//   are M (or N) indices, 8-row groups 1024 bytes apart (SBO); a k-step of 16 elements
//   is the start address advanced by 32 bytes inside the row; K beyond 64 lives in the
//   next "panel" of rows x 128 bytes.
// - MN-major operand (M or N contiguous, 64 elements per 128-byte row): rows are K
//   indices, 8-row groups 1024 bytes apart (SBO); the next 64 M/N indices live in the
//   next panel, LBO bytes further; a k-step of 16 is the start advanced by 16 rows.
#pragma once

#include <cstdint>

#include "kc/bulk_copy.cuh"
#include "kc/wgmma_ops.cuh"

namespace kc {

__device__ __forceinline__ uint64_t gmma_desc_sw128(const void* smem, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  const uint64_t addr = smem_u32(smem);
  uint64_t d = (addr & 0x3FFFF) >> 4;                       // start address, 16-byte units
  d |= uint64_t((lbo_bytes >> 4) & 0x3FFF) << 16;           // leading-dimension byte offset
  d |= uint64_t((sbo_bytes >> 4) & 0x3FFF) << 32;           // stride-dimension byte offset
  d |= uint64_t(1) << 62;                                    // layout: 128-byte swizzle
  return d;
}

__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

template <int kInFlight>
__device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kInFlight) : "memory");
#endif
}

template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// This thread's warpgroup (threadIdx.x / 128), broadcast from lane 0 so that the compiler
// sees it warp-uniform: what derives from it (a role's loop bounds, its operand descriptors)
// can then live in uniform registers. Computed from threadIdx.x alone, the compiler treats it
// as varying per thread, and descriptors built from it take vector arithmetic and a move to
// uniform registers at every wgmma.
__device__ __forceinline__ int warpgroup_index() { return __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0); }

// Register budget of a warpgroup (sm_90a): the kernel needs a register cap at entry
// (__launch_bounds__(threads, 1)); each warpgroup role calls one of these first.
template <int kRegs>
__device__ __forceinline__ void warpgroup_reg_alloc() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

template <int kRegs>
__device__ __forceinline__ void warpgroup_reg_dealloc() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

// Named barriers (ids 1..15; 0 is __syncthreads) among `threads` threads, a multiple of
// 32: sync waits until `threads` threads have reached the barrier by sync or arrive;
// arrive counts this thread and goes on. Two warpgroups take turns with them
// ("pingpong"): each syncs on its own barrier before issuing its wgmma batch and arrives
// on the other's after, so the batches alternate and one warpgroup's non-matrix work
// runs while the other's products occupy the tensor cores.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// bar.arrive / bar.sync when `p`: a warp-uniform choice made by a predicate, with no branch
// that the compiler would see around the code that follows
__device__ __forceinline__ void named_barrier_arrive_if(int id, int threads, bool p) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p bar.arrive %0, %1;\n}\n" ::"r"(id), "r"(threads),
               "r"(int(p))
               : "memory");
}
__device__ __forceinline__ void named_barrier_sync_if(int id, int threads, bool p) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p bar.sync %0, %1;\n}\n" ::"r"(id), "r"(threads),
               "r"(int(p))
               : "memory");
}

}  // namespace kc
