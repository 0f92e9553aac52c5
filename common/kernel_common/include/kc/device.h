// kc/device.h: attributes of the current CUDA device, read from the runtime once per device.
//
// The plans consult the device on every call, and cudaDeviceGetAttribute is a driver call, so
// each (device, attribute) is read once and kept. Host code; safe from several threads (two
// threads reading an attribute at once both ask the driver and keep the same value).
//
//   device_attr(attr)      cudaDeviceGetAttribute of the current device; 0 where the query
//                          fails (a failure is not kept: the next call asks again)
//   num_sms()              multiprocessors (1 where unknown)
//   l2_bytes()             bytes of L2 cache (0 where unknown)
//   smem_optin_bytes()     shared memory a block may opt in to (0 where unknown)
//   compute_capability()   10 major + minor: 90 for sm_90 (0 where unknown)
#pragma once

#include <atomic>

#include <cuda_runtime.h>

namespace kc {

inline int device_attr(cudaDeviceAttr attr) {
  constexpr int kDevices = 64, kAttrs = 256;
  static std::atomic<int> cache[kDevices][kAttrs];  // value + 1 once read; 0: not read yet
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();  // the failure is reported as 0, not left for the next launch check
    return 0;
  }
  const int a = int(attr);
  const bool keep = dev >= 0 && dev < kDevices && a >= 0 && a < kAttrs;
  if (keep) {
    const int v = cache[dev][a].load(std::memory_order_relaxed);
    if (v != 0) return v - 1;
  }
  int v = 0;
  if (cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (keep) cache[dev][a].store(v + 1, std::memory_order_relaxed);
  return v;
}

inline int num_sms() {
  const int n = device_attr(cudaDevAttrMultiProcessorCount);
  return n > 0 ? n : 1;
}

inline int l2_bytes() { return device_attr(cudaDevAttrL2CacheSize); }

inline int smem_optin_bytes() { return device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin); }

inline int compute_capability() {
  return 10 * device_attr(cudaDevAttrComputeCapabilityMajor) + device_attr(cudaDevAttrComputeCapabilityMinor);
}

}  // namespace kc
