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

}  // namespace kc
