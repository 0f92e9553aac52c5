// kc/launch.cuh: programmatic dependent launch (PDL, sm_90+).
//
// A kernel launched with programmatic stream serialization may start while the
// kernel before it on the stream is still running, so its launch latency and
// prologue overlap the predecessor's tail.
//
//   grid_dependency_wait()  in the dependent kernel: block until the
//                           predecessor grid has completed and its memory
//                           writes are visible. Everything that reads what the
//                           predecessor wrote (or writes what it reads) must
//                           come after it. Returns at once for a kernel launched
//                           normally, and compiles to nothing below sm_90.
//   launch_dependents()     in the predecessor: the next kernel's blocks may be
//                           scheduled once every block of this grid has called
//                           it (or exited). Only a scheduling hint: it does NOT
//                           make this grid's writes visible; the dependent's
//                           grid_dependency_wait still waits for completion.
//   launch(kernel, grid, block, smem, stream, pdl, args...)
//                           <<<>>> when pdl is false; cudaLaunchKernelEx with
//                           the serialization attribute when true. The caller
//                           decides pdl (sm90_or_newer(): the attribute is
//                           meant for sm_90+).
//   launch_ex(kernel, grid, block, smem, stream, attrs, nattrs, args...)
//                           cudaLaunchKernelEx with the given launch attributes
//                           (used by launch and by kc/cluster.cuh's launch_cluster)
//   sm90_or_newer()         host: whether the current device has compute
//                           capability 9.0 or newer (kc/device.h).
//   allow_dynamic_smem(kernel, bytes)
//                           host: lets `kernel` launch with `bytes` of dynamic
//                           shared memory (past 48 KB with its static memory, a
//                           launch needs the kernel's raised limit). cudaSuccess,
//                           or cudaErrorInvalidValue where the device has less.
//                           One API call per kernel, device and thread, then a
//                           lookup (below).
#pragma once

#include <utility>

#include <cuda_runtime.h>

#include "kc/device.h"

namespace kc {

__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// cudaLaunchKernelEx with `nattrs` launch attributes (the helpers below and kc/cluster.cuh's).
template <typename... KArgs, typename... Args>
cudaError_t launch_ex(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      cudaLaunchAttribute* attrs, unsigned nattrs, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attrs;
  cfg.numAttrs = nattrs;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

template <typename... KArgs, typename... Args>
cudaError_t launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                   Args&&... args) {
  if (!pdl) {
    kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  return launch_ex(kernel, grid, block, smem, stream, attr, 1, std::forward<Args>(args)...);
}

inline bool sm90_or_newer() { return compute_capability() >= 90; }

// The kernel's limit (cudaFuncAttributeMaxDynamicSharedMemorySize) is process-wide,
// while launches come from several threads (autograd's backward has its own), so
// it is set once per kernel and device to the most a block may have beside the
// kernel's static shared memory: the same value from every thread, never one
// call's need. (Set to each call's bytes, one thread could lower the limit another
// thread had just raised for its own launch: "invalid argument" there.) Past the
// device's limit the request is refused here, with no failing API call (which
// compute-sanitizer would count). The record is per thread (no lock); a thread
// using more than kEntries kernels re-queries the last entry's.
template <typename Kernel>
cudaError_t allow_dynamic_smem(Kernel kernel, size_t dynamic) {
  if (dynamic == 0) return cudaSuccess;
  constexpr int kEntries = 64;
  struct Entry {
    const void* k;
    int dev;
    size_t limit;
  };
  static thread_local Entry cache[kEntries];
  static thread_local int used = 0;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return cudaGetLastError();
  const void* key = reinterpret_cast<const void*>(kernel);
  int i = 0;
  while (i < used && !(cache[i].k == key && cache[i].dev == dev)) ++i;
  if (i == used) {
    cudaFuncAttributes fa{};
    const int optin = smem_optin_bytes();
    if (cudaFuncGetAttributes(&fa, kernel) != cudaSuccess || optin <= 0) {
      cudaGetLastError();  // returned, not left behind for the next launch check to report
      return cudaErrorInvalidValue;
    }
    const size_t limit = size_t(optin) > fa.sharedSizeBytes ? size_t(optin) - fa.sharedSizeBytes : 0;
    if (limit > 0) {
      const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(limit));
      if (e != cudaSuccess) {
        cudaGetLastError();
        return e;
      }
    }
    i = used < kEntries ? used++ : kEntries - 1;
    cache[i] = Entry{key, dev, limit};
  }
  return dynamic <= cache[i].limit ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace kc
