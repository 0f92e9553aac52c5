// kc/bulk_copy.cuh: contiguous global -> shared copies by the copy engine (TMA,
// sm_90+), completing on a shared-memory mbarrier. One thread moves a whole row
// with one instruction; no registers hold the bytes in flight.
//
//   mbar_init(bar, count)        one thread, once, before any use; then
//   mbar_init_fence()            by the same thread, and a __syncthreads() before
//                                anyone else touches the barrier
//   mbar_arrive_expect_tx(bar, bytes)
//                                the producer's arrival for this phase, announcing
//                                the bytes the phase's copies will deliver
//   bulk_copy_g2s(dst, src, bytes, bar)
//                                copy `bytes` (a multiple of 16; dst and src
//                                16-byte aligned); completes `bytes` of the phase
//   mbar_arrive(bar)            a plain arrival (consumers releasing a buffer)
//   bulk_prefetch_l2(src, bytes) / bulk_prefetch_l2_range(p, bytes)
//                                a hint: bring bytes into L2 (below)
//   mbar_wait(bar, parity)       wait until the phase with this parity completed
//                                (phase k of a barrier has parity k & 1); after it
//                                every thread may read the copied bytes
//
// Contract: a barrier initialised with count 1 completes a phase when its
// producer has arrived (arrive_expect_tx) and all announced bytes have landed.
// Before a buffer is refilled, every thread that read it must be past its reads
// (a barrier among them): the copy engine's writes are not ordered with the
// threads' earlier reads otherwise. A kernel must not exit, nor reuse the
// buffer for something else, with a copy into it still in flight.
// Below sm_90 these compile to a trap: launchers must select such kernels only
// on compute capability 9.0+.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kc {

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// The first byte at or after a dynamic shared-memory array's start aligned to kAlign (the
// 128-byte swizzle needs 1024), as the array plus an offset: arithmetic on the __shared__
// array's own pointer keeps what the compiler knows about it, so loads and stores through the
// result compile to shared-memory instructions (LDS, STS, 32-bit addresses). A round trip
// through an integer ((uintptr_t(p) + 1023) & ~1023) loses it: generic LD and ST on 64-bit
// addresses, with a generic load's latency.
template <unsigned kAlign>
__device__ __forceinline__ unsigned char* smem_align(unsigned char* p) {
  static_assert((kAlign & (kAlign - 1)) == 0, "a power of two");
  return p + ((kAlign - (smem_u32(p) & (kAlign - 1))) & (kAlign - 1));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
#else
  __trap();
#endif
}

// mbar_arrive(bar): a plain arrival (a consumer releasing a buffer to its producer);
// the barrier's phase completes when `count` threads (mbar_init) have arrived.
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
#else
  __trap();
#endif
}

// bulk_prefetch_l2(src, bytes): ask the copy engine to bring `bytes` (a multiple
// of 16, src 16-byte aligned) into L2, completing on nothing: a hint, so no
// thread waits for it and nothing may rely on it. A no-op below sm_90.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
#endif
}
// bulk_prefetch_l2 of the 16-byte granules that hold [p, p + bytes) (any alignment):
// the range rounded out to 16 bytes at both ends.
__device__ __forceinline__ void bulk_prefetch_l2_range(const void* p, size_t bytes) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(15);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes + 15) & ~uintptr_t(15);
  if (e > b) bulk_prefetch_l2(reinterpret_cast<const void*>(b), unsigned(e - b));
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_AGAIN:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_AGAIN;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
#else
  __trap();
#endif
}

}  // namespace kc
