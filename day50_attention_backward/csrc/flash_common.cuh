// flash_common.cuh: the tensor-core building blocks of the fused kernels
// (mma.sync m16n8k16 with fp32 accumulation, ldmatrix, cp.async), written
// with inline PTX, sm_80 and later.
//
// Fragment layouts (PTX ISA, "mma.m16n8k16", 16-bit A/B; g = lane / 4, t = lane % 4):
//   A (16 x 16, row-major), 4 x b32: a0 = (row g,   cols 2t, 2t+1)   a1 = (row g+8, cols 2t, 2t+1)
//                                    a2 = (row g,   cols 2t+8, +9)   a3 = (row g+8, cols 2t+8, +9)
//   B (16 x 8, "col"),      2 x b32: b0 = (rows 2t, 2t+1, col g)     b1 = (rows 2t+8, 2t+9, col g)
//   C (16 x 8, fp32),       4 x f32: c0, c1 = (row g, cols 2t, 2t+1) c2, c3 = (row g+8, cols 2t, 2t+1)
// So the C fragments of two neighbouring n8 tiles, packed to 16 bits, are
// exactly the A fragment of a k16 slice: P and dS go from accumulators to the
// next mma's A operand without touching shared memory.
//
// ldmatrix.x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i; register
// i receives matrix i, lane holding (row g, cols 2t, 2t+1) (.trans: the
// transposed matrix, i.e. (rows 2t, 2t+1, col g) of the stored one).
//   A from a row-major store X[m][k]:        lane row m0 + (l&7) + 8*((l>>3)&1), col k0 + 8*(l>>4)
//   A from a transposed store X[k][m]:       .trans, row k0 + (l&7) + 8*(l>>4), col m0 + 8*((l>>3)&1)
//   B (two n8 tiles) from X[n][k] (k contig): row n0 + (l&7) + 8*(l>>4), col k0 + 8*((l>>3)&1)
//   B (two n8 tiles) from X[k][n] (n contig): .trans, row k0 + (l&7) + 8*((l>>3)&1), col n0 + 8*(l>>4)
//   For B, registers 0, 1 are (b0, b1) of tile n0 and registers 2, 3 of tile n0 + 8.
//
// stmatrix.x4 (sm_90) is its inverse: register i of every lane goes to 8x8 matrix i, lane
// holding (row g, cols 2t, 2t+1), whose row r lies at the address lane 8i + r gives.
//
// Shared-memory tiles are row-major with a pitch of (cols + 8) elements: one
// extra 16-byte chunk per row, so the 8 row addresses of an ldmatrix fall in
// 8 different 4-bank groups (no bank conflicts) and every row start stays
// 16-byte aligned for cp.async.
#pragma once

#include <cstdint>
#include <type_traits>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention.h"

namespace day50 {
namespace flash {

template <typename T> struct MmaName;
template <> struct MmaName<__half> { static constexpr bool kBf16 = false; };
template <> struct MmaName<__nv_bfloat16> { static constexpr bool kBf16 = true; };

// d (16x8 fp32) += a (16x16) * b (16x8)
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (MmaName<T>::kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3]));
}

// 16-byte global -> shared copy; when !pred the 16 bytes are zero-filled and
// nothing is read (src must still be a valid address: pass the tensor base).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
  const int n = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
// 4-byte variant (row statistics).
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool pred) {
  const int n = pred ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// A tile's element mask, compiled only where it is needed: f(std::true_type{}) for a tile that
// crosses a bound (causal diagonal, window, sequence end), f(std::false_type{}) for one that
// does not, so f tests the elements under `if constexpr`. A warp-uniform branch picks the path
// per tile. A run-time `if (need_mask)` around the per-element test instead became selects
// that every tile paid for (about five instructions a score; docs/hopper.md).
template <typename F>
__device__ __forceinline__ void with_mask(bool need_mask, F&& f) {
  if (need_mask)
    f(std::true_type{});
  else
    f(std::false_type{});
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// tanh(x) = 1 - 2 / (exp(2x) + 1) on the special-function unit: ex2 and rcp (two operations;
// +-1 at the ends, where exp overflows to inf or underflows to 0). Its absolute error is a few
// 1e-7, which the softmax of softcap * tanh(.) needs: tanh.approx.f32 is one operation but
// 2^-11 relative (0.02 on a score at softcap 50).
__device__ __forceinline__ float tanh_fast(float x) {
  return 1.f - __fdividef(2.f, fast_exp2(x * 2.8853900817779268f) + 1.f);  // 2 log2(e)
}

template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// The masking fields as the version 1 kernels read them (a launcher's copy of FusedParams): an
// unbounded side becomes a bound no index reaches, and for dense attention the bottom-right
// shift is folded into the bounds. The kernels then test plain parameters against the
// diagonal (shifted per sequence only for packed sequences) and hold no registers for them.
constexpr int64_t kNoBound = int64_t(1) << 62;
inline FusedParams kernel_masking(const FusedParams& p) {
  FusedParams k = p;
  const bool dense = p.cu_seqlens_q == nullptr;
  const int64_t off = dense && p.bottom_right ? p.Nk - p.Nq : 0;
  k.window_right = p.window_right >= 0 ? p.window_right + off : kNoBound;
  k.window_left = p.window_left >= 0 ? p.window_left - off : kNoBound;
  if (dense) k.bottom_right = false;
  return k;
}

// Load a (kRows x kD) tile of a (rows x d) matrix (row stride `ld`, unit column
// stride) into shared memory with pitch kD + 8, zero-filling rows >= rows and
// columns >= d. d is a multiple of 8, ld and the base 16-byte aligned.
template <typename T, int kRows, int kD, int kThreads>
__device__ __forceinline__ void load_tile_async(T* sm, const T* g, int64_t ld, int64_t row0, int64_t rows,
                                                int64_t d, const T* any_valid) {
  constexpr int kChunksPerRow = kD / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "tile chunks must divide evenly among threads");
#pragma unroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int c = threadIdx.x + i * kThreads;
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    const bool ok = (row0 + r < rows) && (col < d);
    const T* src = ok ? g + (row0 + r) * ld + col : any_valid;
    cp_async_16(smem_addr(sm + r * (kD + 8) + col), src, ok);
  }
}

}  // namespace flash
}  // namespace day50
