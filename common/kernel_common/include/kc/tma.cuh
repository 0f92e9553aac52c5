// kc/tma.cuh: tiles of a strided tensor copied global -> shared by the copy engine
// (TMA, sm_90+) through a tensor map, completing on a shared-memory mbarrier
// (kc/bulk_copy.cuh has the barrier calls).
//
// Host:   kc::make_tensor_map(&map, dtype, rank, ptr, dims, strides, box, swizzle)
//         describes a tensor of `rank` <= 5 dims (dims[0] the contiguous one; strides
//         in BYTES for dims 1.., multiples of 16; ptr 16-byte aligned) and the box one
//         copy moves. Returns cudaErrorInvalidValue when the description is outside the
//         driver's limits (a zero stride, a misaligned base: checked before the driver is
//         asked) or the driver refuses it, so callers can fall back to another kernel.
//         The map is passed to the kernel by value as a `const __grid_constant__`
//         parameter (or a member of one).
// Device: kc::tma_load_4d(dst, &map, bar, c0, c1, c2, c3) copies the box whose first
//         element is at coordinates (c0, c1, c2, c3) (c0 along dims[0]) to `dst`
//         (aligned as the swizzle needs: 1024 bytes for 128-byte swizzle), completing
//         box-bytes on `bar`. Elements outside the tensor are written as zeros, and
//         still count towards the bytes: a box always delivers its full size.
//         kc::tma_prefetch_map(&map) warms the map's cache line (optional).
//         kc::tma_reduce_add_4d(&map, src, c0, c1, c2, c3) adds the box at `src` (shared,
//         laid out as a load would write it) into global memory element-wise (fp32: the
//         L2 does the adds); elements outside the tensor are left alone.
//         kc::tma_store_4d(&map, src, ...) copies such a box back unchanged (its limits
//         below). Both join the thread's bulk group: kc::bulk_commit() closes the group, then
//         kc::bulk_wait_read<n>() returns when all but the newest n groups have read
//         their shared memory (the buffer may be rewritten), kc::bulk_wait<n>() when
//         their writes are done. Threads that wrote `src` with ordinary stores call
//         kc::fence_async_shared() before the issuing thread learns of it.
// With CU_TENSOR_MAP_SWIZZLE_128B and a 128-byte box row, row r of the box lands at
// dst + 128 r with its 16-byte chunk c stored at chunk c ^ (r % 8): the layout
// wgmma's 128-byte-swizzle descriptors read (kc/wgmma.cuh).
#pragma once

#include <cstdint>
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include "kc/bulk_copy.cuh"

namespace kc {

// The driver's cuTensorMapEncodeTiled, found once through the runtime (no -lcuda).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// The driver's documented limits a caller's layout may miss (a misaligned base, a zero or
// odd stride), checked first, so that a refused layout takes the caller's fallback without a
// failed driver call (compute-sanitizer reports each one as an error).
inline bool tensor_map_layout_ok(int rank, const void* ptr, const uint64_t* dims, const uint64_t* strides_bytes) {
  if (rank < 1 || rank > 5 || reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return false;
  for (int i = 0; i < rank; ++i)
    if (dims[i] == 0 || dims[i] > (uint64_t(1) << 32)) return false;
  for (int i = 0; i + 1 < rank; ++i)  // strides_bytes[i]: dims[i + 1]'s
    if ((strides_bytes[i] == 0 && dims[i + 1] > 1) || strides_bytes[i] % 16 != 0 ||
        strides_bytes[i] >= (uint64_t(1) << 40))
      return false;
  return true;
}

inline cudaError_t make_tensor_map(CUtensorMap* map, CUtensorMapDataType dtype, int rank, const void* ptr,
                                   const uint64_t* dims, const uint64_t* strides_bytes, const uint32_t* box,
                                   CUtensorMapSwizzle swizzle) {
  if (!tensor_map_layout_ok(rank, ptr, dims, strides_bytes)) return cudaErrorInvalidValue;
  auto encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  const CUresult r = encode(map, dtype, cuuint32_t(rank), const_cast<void*>(ptr), dims, strides_bytes, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                            int c2, int c3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void tma_reduce_add_4d(const CUtensorMap* map, const void* src, int c0, int c1, int c2,
                                                  int c3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
#else
  __trap();
#endif
}

// A box of shared memory (laid out as the map's box, swizzle included) stored to the tensor at
// the given coordinates; elements past the tensor's end are not written, but a box starting
// below 0 is an illegal instruction (H100, unlike loads, which fill there with zeros).
// Completion: bulk_commit, then bulk_wait_read before the shared memory is reused (or the
// block exits).
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* src, int c0, int c1, int c2, int c3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void bulk_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}

template <int kInFlight>
__device__ __forceinline__ void bulk_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kInFlight) : "memory");
#endif
}

template <int kInFlight>
__device__ __forceinline__ void bulk_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kInFlight) : "memory");
#endif
}

// Orders this thread's earlier shared-memory stores before later copy-engine reads.
__device__ __forceinline__ void fence_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

}  // namespace kc
