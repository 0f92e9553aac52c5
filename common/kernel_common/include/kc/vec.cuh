// kc/vec.cuh: aligned vector loads and stores.
//
// Vec<T, N> is N elements of T stored as one aligned chunk of sizeof(T) * N
// bytes (16 bytes for N = 16 / sizeof(T): one LDG.128 / STG.128 per thread).
//
// Contract: load_vec / store_vec require the pointer to be aligned to
// sizeof(Vec<T, N>). Never assume it: check at launch with kc::is_aligned (for
// every base pointer) and kc::can_vectorize (base pointers *and* the row
// length, so that every row start stays aligned), and take the N = 1 path
// otherwise. Debug builds (-DKC_DEBUG) also assert the alignment on device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cassert>

namespace kc {

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// Largest vector width (in elements) that makes a 16-byte access.
template <typename T>
constexpr int max_vec_elems() { return 16 / sizeof(T) > 0 ? 16 / sizeof(T) : 1; }

__host__ __device__ __forceinline__ bool is_aligned(const void* p, size_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) % bytes) == 0;
}

// True when rows of `row_len` elements starting at `p` can all be read with
// Vec<T, N>: the base is aligned and every row start is too.
template <typename T, int N>
__host__ __device__ __forceinline__ bool can_vectorize(const void* p, int64_t row_len) {
  return is_aligned(p, sizeof(T) * N) && (row_len % N == 0);
}

template <int N, typename T>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
#ifdef KC_DEBUG
  assert(is_aligned(p, sizeof(Vec<T, N>)));
#endif
  return *reinterpret_cast<const Vec<T, N>*>(p);
}

template <int N, typename T>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& v) {
#ifdef KC_DEBUG
  assert(is_aligned(p, sizeof(Vec<T, N>)));
#endif
  *reinterpret_cast<Vec<T, N>*>(p) = v;
}

}  // namespace kc
