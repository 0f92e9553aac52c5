// kc/cluster.cuh: thread-block clusters (sm_90+): the CTAs of a cluster run at
// the same time on one GPC and can read and write each other's shared memory
// (distributed shared memory), and complete transactions on each other's mbarriers.
//
// Device:
//   cluster_rank()            this CTA's rank in its cluster (0 .. size - 1)
//   cluster_size_x()          CTAs per cluster along x
//   cluster_id(), cluster_count()
//                             the cluster's index along x, and how many there are
//   cluster_sync()            every thread of every CTA of the cluster arrives
//                             (release) and waits (acquire): all of them must
//                             call it, the same number of times
//   cluster_arrive(), cluster_wait()
//                             cluster_sync() in two halves (arrive with release,
//                             wait with acquire): work placed between them overlaps
//                             the other CTAs' arrival. Each thread alternates them.
//   map_rank(p, rank)         the shared::cluster address of `p` (a variable in
//                             this CTA's shared memory) in CTA `rank`'s copy
//   ld_cluster(addr)          load a float from a shared::cluster address (a peer's
//                             shared memory, written before a cluster_sync /
//                             cluster_arrive + cluster_wait that separates the two)
//   st_async_cluster(addr, a, b, bar)
//                             store two floats at a shared::cluster address (a
//                             peer's, or this CTA's own) and complete 8 bytes of
//                             the current phase of the mbarrier at shared::cluster
//                             address `bar` (in the same CTA as addr). Asynchronous,
//                             no ordering with the sender's other memory accesses;
//                             the receiver arms the phase (mbar_arrive_expect_tx
//                             with the bytes expected, before or after the stores
//                             land) and reads after mbar_wait.
// Contract: a peer's mbarrier may receive stores only after it was initialised
// (mbar_init + mbar_init_fence) and a cluster_sync() separates the two; a CTA
// must not exit while a peer may still access its shared memory (end kernels
// that use distributed shared memory with a cluster_sync()).
//
// Host:
//   launch_cluster(kernel, grid, block, smem, stream, cluster_x, args...)
//                             cudaLaunchKernelEx with a (cluster_x, 1, 1) cluster;
//                             grid.x must be a multiple of cluster_x
//   max_active_clusters(kernel, block, smem, cluster_x)
//                             how many such clusters fit on the device at once
//                             (0 when none or on error; the error is cleared)
//   allow_nonportable_cluster(kernel)
//                             lets `kernel` launch with clusters of more than 8 CTAs
//                             (the portable size; sm_90 allows 16): one API call per
//                             kernel, device and thread, then a lookup
//   max_active_clusters_cached(kernel, block, smem, cluster_x, prepare)
//                             the same, asked once per (device, kernel, block, smem,
//                             cluster_x) and calling thread, then kept (plans query it
//                             on every call); prepare() runs before the query only,
//                             to set the kernel's attributes it depends on (dynamic
//                             shared memory above 48 KB, non-portable cluster sizes)
// Below sm_90 the device helpers trap: launchers must select cluster kernels
// only on compute capability 9.0+.
#pragma once

#include <cstdint>
#include <tuple>
#include <utility>

#include <cuda_runtime.h>

#include "kc/bulk_copy.cuh"
#include "kc/launch.cuh"

namespace kc {

__device__ __forceinline__ unsigned cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
#else
  __trap();
  return 0;
#endif
}

__device__ __forceinline__ unsigned cluster_size_x() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_nctaid.x;\n" : "=r"(r));
  return r;
#else
  __trap();
  return 0;
#endif
}

__device__ __forceinline__ unsigned cluster_id() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned r;
  asm volatile("mov.u32 %0, %%clusterid.x;\n" : "=r"(r));
  return r;
#else
  __trap();
  return 0;
#endif
}

__device__ __forceinline__ unsigned cluster_count() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned r;
  asm volatile("mov.u32 %0, %%nclusterid.x;\n" : "=r"(r));
  return r;
#else
  __trap();
  return 0;
#endif
}

__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ float ld_cluster(unsigned addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
#else
  __trap();
  return 0.f;
#endif
}

__device__ __forceinline__ unsigned map_rank(const void* p, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(smem_u32(p)), "r"(rank));
  return r;
#else
  __trap();
  return 0;
#endif
}

__device__ __forceinline__ void st_async_cluster(unsigned addr, float a, float b, unsigned bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];\n" ::"r"(addr),
               "f"(a), "f"(b), "r"(bar)
               : "memory");
#else
  __trap();
#endif
}

template <typename... KArgs, typename... Args>
cudaError_t launch_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                           unsigned cluster_x, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster_x;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  return launch_ex(kernel, grid, block, smem, stream, attr, 1, std::forward<Args>(args)...);
}

template <typename... KArgs>
int max_active_clusters(void (*kernel)(KArgs...), int block, size_t smem, unsigned cluster_x) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(cluster_x);
  cfg.blockDim = dim3(unsigned(block));
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster_x;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

template <typename Kernel>
cudaError_t allow_nonportable_cluster(Kernel kernel) {
  static thread_local detail::ThreadTable<std::tuple<const void*, int>, bool, 64> done;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return cudaGetLastError();
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), dev);
  if (done.find(key)) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return e;
  }
  done.put(key, true);
  return cudaSuccess;
}

template <typename... KArgs, typename Prepare>
int max_active_clusters_cached(void (*kernel)(KArgs...), int block, size_t smem, unsigned cluster_x,
                               Prepare prepare) {
  static thread_local detail::ThreadTable<std::tuple<const void*, int, int, size_t, unsigned>, int, 32> counts;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), dev, block, smem, cluster_x);
  if (const int* n = counts.find(key)) return *n;
  const int n = prepare() == cudaSuccess ? max_active_clusters(kernel, block, smem, cluster_x) : 0;
  if (n == 0) cudaGetLastError();
  counts.put(key, n);
  return n;
}

template <typename... KArgs>
int max_active_clusters_cached(void (*kernel)(KArgs...), int block, size_t smem, unsigned cluster_x) {
  return max_active_clusters_cached(kernel, block, smem, cluster_x, [] { return cudaSuccess; });
}

}  // namespace kc
