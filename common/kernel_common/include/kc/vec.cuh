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
#include <cstring>
#include <type_traits>
#include <cassert>

#include "kc/convert.cuh"

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

// load_vec for data read once (ld.global.cs, "cache streaming": evict-first in L1
// and L2 where the vector is 16 bytes), so that a stream this kernel will not read
// again does not push out of the L2 the lines a later kernel reads.
template <int N, typename T>
__device__ __forceinline__ Vec<T, N> load_vec_stream(const T* p) {
  if constexpr (sizeof(Vec<T, N>) == 16) {
#ifdef KC_DEBUG
    assert(is_aligned(p, 16));
#endif
    const int4 r = __ldcs(reinterpret_cast<const int4*>(p));
    Vec<T, N> v;
    memcpy(&v, &r, 16);
    return v;
  } else {
    return load_vec<N>(p);
  }
}

template <int N, typename T>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& v) {
#ifdef KC_DEBUG
  assert(is_aligned(p, sizeof(Vec<T, N>)));
#endif
  *reinterpret_cast<Vec<T, N>*>(p) = v;
}

// A 16-byte vector from shared memory at a 32-bit shared-window address
// (kc::smem_u32 of a __shared__ pointer, plus an offset; 16-byte aligned). A
// kernel that keeps its shared-memory offsets as 32-bit integers (a ring of
// stages walked by index) then pays one add per access, where a generic pointer
// into shared memory is converted back to a shared address at each use.
// Volatile, with a memory clobber: never moved above the mbarrier wait or the
// barrier that guards the bytes, nor below a later reuse of the buffer.
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_shared_vec(unsigned addr) {
  static_assert(sizeof(Vec<T, N>) == 16, "16-byte vectors only");
  uint32_t u0, u1, u2, u3;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(u0), "=r"(u1), "=r"(u2), "=r"(u3) : "r"(addr)
               : "memory");
  const uint32_t u[4] = {u0, u1, u2, u3};
  Vec<T, N> v;
  memcpy(&v, u, sizeof(v));
  return v;
}

// A whole vector to fp32 and back, two 16-bit elements per 32-bit word:
// bf16 -> fp32 is a shift (low half) or a mask (high half) of the word, one
// instruction per element, where converting element by element first unpacks
// every element into a register of its own (one more instruction each; H200,
// day26's README). fp16 goes through __half22float2, fp32 is a copy.
template <typename T, int N>
__device__ __forceinline__ void vec_to_float(const Vec<T, N>& v, float (&out)[N]) {
  if constexpr (N % 2 == 0 && std::is_same<T, __nv_bfloat16>::value) {
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
      uint32_t w;
      memcpy(&w, &v.v[2 * k], sizeof(w));
      out[2 * k] = __uint_as_float(w << 16);
      out[2 * k + 1] = __uint_as_float(w & 0xffff0000u);
    }
  } else if constexpr (N % 2 == 0 && std::is_same<T, __half>::value) {
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
      __half2 h;
      memcpy(&h, &v.v[2 * k], sizeof(h));
      const float2 f = __half22float2(h);
      out[2 * k] = f.x;
      out[2 * k + 1] = f.y;
    }
  } else {  // fp32 (a copy), or an odd N
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = to_float(v.v[j]);
  }
}

// fp32 -> a vector of T, round to nearest even (16-bit types packed two at a time).
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> vec_from_float(const float (&in)[N]) {
  Vec<T, N> v;
  if constexpr (N % 2 == 0 && (std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value)) {
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
      if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        const __nv_bfloat162 p = __floats2bfloat162_rn(in[2 * k], in[2 * k + 1]);
        memcpy(&v.v[2 * k], &p, sizeof(p));
      } else {
        const __half2 p = __floats2half2_rn(in[2 * k], in[2 * k + 1]);
        memcpy(&v.v[2 * k], &p, sizeof(p));
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) v.v[j] = from_float<T>(in[j]);
  }
  return v;
}

}  // namespace kc
