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

#include <tuple>
#include <utility>

#include <cuda_runtime.h>

#include "kc/device.h"

namespace kc {

namespace detail {
// A small per-thread table (each thread its own: no lock) of what a host helper
// learnt or set once per key (a kernel and the current device, ...); past N
// entries the last one is overwritten, so a key may be asked again.
template <typename Key, typename Value, int N>
struct ThreadTable {
  Key keys[N];
  Value values[N];
  int used = 0;
  const Value* find(const Key& k) const {
    for (int i = 0; i < used; ++i)
      if (keys[i] == k) return &values[i];
    return nullptr;
  }
  void put(const Key& k, const Value& v) {
    const int i = used < N ? used++ : N - 1;
    keys[i] = k;
    values[i] = v;
  }
};
}  // namespace detail

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
// compute-sanitizer would count). The record is per thread (detail::ThreadTable).
template <typename Kernel>
cudaError_t allow_dynamic_smem(Kernel kernel, size_t dynamic) {
  if (dynamic == 0) return cudaSuccess;
  static thread_local detail::ThreadTable<std::tuple<const void*, int>, size_t, 64> limits;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return cudaGetLastError();
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), dev);
  const size_t* known = limits.find(key);
  size_t limit = known ? *known : 0;
  if (!known) {
    cudaFuncAttributes fa{};
    const int optin = smem_optin_bytes();
    if (cudaFuncGetAttributes(&fa, kernel) != cudaSuccess || optin <= 0) {
      cudaGetLastError();  // returned, not left behind for the next launch check to report
      return cudaErrorInvalidValue;
    }
    limit = size_t(optin) > fa.sharedSizeBytes ? size_t(optin) - fa.sharedSizeBytes : 0;
    if (limit > 0) {
      const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(limit));
      if (e != cudaSuccess) {
        cudaGetLastError();
        return e;
      }
    }
    limits.put(key, limit);
  }
  return dynamic <= limit ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace kc
