// se_geometry.h: the shapes of the SE kernels that their plan (se_plan.cpp) must know to
// size grids, shared memory and workspaces: block sizes, tiles, shared-memory layouts.
// These are facts of the kernels, not tuning: the plan's thresholds live in se_plan.cpp.
// Plain C++ (no CUDA, no torch), so the plan compiles in a CPU-only build and its tests
// run there; the kernels include it too, so both sides read one definition.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kc/types.h"

#if defined(__CUDACC__)
#define SE_HD __host__ __device__
#else
#define SE_HD
#endif

namespace se {

enum class Layout : int { NCHW = 0, NHWC = 1 };

struct Dims {
  int64_t n, c, l;  // batch, channels, H * W
  Layout layout;
};

// How the HW reduction is cut: `splits` pieces of `chunk` elements of L each
// (chunk a multiple of 16 bytes' worth of elements, the last piece shorter).
struct ReducePlan {
  int splits;
  int64_t chunk;
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
SE_HD inline int64_t pad4(int64_t n) { return (n + 3) & ~int64_t(3); }
SE_HD inline int64_t pad16(int64_t bytes) { return (bytes + 15) & ~int64_t(15); }
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ------------------------------------------------------------------ reductions, elementwise pass
constexpr int kThreads = 256;  // every kernel's block but the spread products' and the cluster's
// elements of a 16-byte vector
inline int max_vec(kc::DType dt) { return dt == kc::DType::F32 ? 4 : 8; }
// NCHW rows up to this long are reduced by one warp per (row, split); longer
// rows by a whole block per (row, split).
constexpr int64_t kWarpTeamMaxL = 4096;
inline int nchw_team(const Dims& d) { return d.l > kWarpTeamMaxL ? kThreads : 32; }
// NHWC tiling: vector columns per tile and number of tiles. At most kNhwcMaxTc
// vector columns per tile (balanced across the tiles), so that a block always
// walks several rows at once: with a whole row per tile (up to 256 vector columns),
// many channels over a small image left one row per block step and few blocks.
constexpr int kNhwcMaxTc = 32;
inline void nhwc_tiles(int64_t c, int vec, int* tc, int* col_tiles) {
  const int64_t cv = ceil_div(c, vec);
  *col_tiles = int(ceil_div(cv, kNhwcMaxTc));
  *tc = int(ceil_div(cv, *col_tiles));
}
// Units of 16 bytes (or one element) a thread of the parameter-widening blocks copies
// (se_kernels.cuh and se_reduce.cu, ParamCast): as few blocks as give every thread one batch.
constexpr int kCastUnroll = 2;
// The weight gradients' tiles: kWgTile x kWgTile outputs a block, kWgTile samples a step.
constexpr int kWgTile = 32;

// ------------------------------------------------------------------ the per-sample MLP
// floats of shared memory the staged parameters take (each piece padded to 16 bytes)
SE_HD inline int64_t staged_floats(int64_t c, int64_t s) { return 2 * pad4(s * c) + pad4(s) + pad4(c); }
// Dynamic shared memory the one-block-per-sample MLP kernels need without the staged
// parameters (bytes): (C + S) floats forward, 3 (C + S) backward.
inline size_t fused_mlp_smem_bytes(int64_t C, int64_t S, bool backward) {
  return size_t(backward ? 3 : 1) * size_t(C + S) * sizeof(float);
}

// ------------------------------------------------------------------ the spread MLP's products
constexpr int kTileN = 4;              // samples per gemv_kernel block: each weight read once per tile
constexpr int kWarps = kThreads / 32;  // outputs per gemv_kernel block (and warps of the other kernels)
constexpr int kGemvThreads = 2 * kThreads;  // two warps an output, each half of the row
// gemv_narrow_kernel: a block is kNarrowO outputs x kNarrowN samples, rows of at most kNarrowMaxI
constexpr int kNarrowO = 32;
constexpr int kNarrowN = 32;
constexpr int64_t kNarrowMaxI = 256;  // shared memory 2 * 32 * 257 floats at most
SE_HD inline int64_t narrow_stride(int64_t i_dim) { return i_dim | 1; }
// Row stride (floats) of gemv_kernel's staged weight rows under w_t: 16-byte aligned rows, and
// rows 4 banks apart where I is a multiple of 32 (the staging's stores of one input i to the
// block's rows then fall in distinct banks)
SE_HD inline int64_t wt_stride(int64_t i_dim) { return pad4(i_dim) + 4; }
inline size_t gemv_narrow_smem(int64_t i_dim) {
  return size_t(kNarrowN * i_dim + kNarrowO * narrow_stride(i_dim)) * sizeof(float);
}
inline size_t gemv_smem(int64_t i_dim) { return size_t(kTileN) * size_t(i_dim) * sizeof(float); }
// ... and under w_t, with the block's weight rows staged after the inputs
inline size_t gemv_wt_smem(int64_t i_dim) {
  return gemv_smem(i_dim) + size_t(kWarps) * size_t(wt_stride(i_dim)) * sizeof(float);
}

// ------------------------------------------------------------------ the cluster kernel
constexpr int kMaxCluster = 16;  // CTAs a sample (above 8: a non-portable cluster size, which sm_90 allows)
constexpr int kClusterMaxThreads = 1024;
// Byte offsets of the cluster kernel's shared-memory pieces (the same on host and device).
struct ClusterSmem {
  int64_t xs, gs, vec, svec, red, total;
};
SE_HD inline ClusterSmem cluster_smem(int64_t cmax, int64_t l, int64_t s, int elem, bool backward, int threads) {
  ClusterSmem m{};
  const int64_t slab = pad16(cmax * l * elem);
  m.xs = 0;
  m.gs = slab;
  m.vec = backward ? 2 * slab : slab;
  m.svec = m.vec + 4 * pad16(cmax * 4);  // p, ds, s, dz2 / coef: [cc] each
  m.red = m.svec + 5 * pad16(s * 4);     // zp, dap, z1, a, dz1: [S] each
  m.total = m.red + 2 * int64_t(threads) * 4;  // group sums (NHWC pooling)
  return m;
}

}  // namespace se
