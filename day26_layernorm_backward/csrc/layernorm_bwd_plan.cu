// LayerNorm backward: the plan (which kernel family runs, its launch shape and
// workspace: LnBwdPlan, layernorm.h), computed once per call, the launch of a
// plan, and the finalize that versions 2-6 end with (below the plan: one file
// with the plan, so that the build compiles the headers once for both; issue 19).
// Families and fallbacks: layernorm_versions.h; each family's kernels, planner
// and launcher: layernorm_bwd_v1.cu .. layernorm_bwd_ring.cu.
#include <algorithm>

#include "layernorm_bwd_common.cuh"

#include "kc/check.cuh"
#include "kc/convert.cuh"
#include "kc/launch.cuh"
#include "kc/vec.cuh"

namespace day26 {
namespace {

// 16 bytes' worth of elements when dy, x, dx and the weight all allow it (and
// D is a multiple of it), else 1.
int bwd_vec(const LnBackwardArgs& a) {
  const size_t elem = elem_size(a.dt), welem = elem_size(a.wdt);
  const int V = int(16 / elem);
  const bool ok = a.cols % V == 0 && kc::is_aligned(a.x, elem * V) && kc::is_aligned(a.dy, elem * V) &&
                  (!a.dx || kc::is_aligned(a.dx, elem * V)) && (!a.weight || kc::is_aligned(a.weight, welem * V)) &&
                  (!a.dsum || kc::is_aligned(a.dsum, elem * V));
  return ok ? V : 1;
}

// ---------------------------------------------------------------- the table
// Version 0 (auto): the families to try for a shape, best first; the plan
// appends 2 and 1. Keyed on the device (sm_90+ for the ring and clusters), the
// dtype, D and the vector width; the launch shape within a family (slots,
// grid, stages) then comes from its planner (occupancy: rows, SM count).
// Measurements (H200, README "The plan"):
//  - the ring (5): 16-bit rows of 1024 columns and more, fp32 rows of every length
//    (fp32 1024-4096 ran row slots (4) until the ring's depth was chosen per dtype,
//    kRingStages in layernorm_bwd_ring.cu: H200, 4096x4096 61.8 -> 53.3 us with five
//    stages, 16384x3072 166.5 -> 150.6 with three).
//  - rows over 8192 columns: split across a cluster (6) of 2 or 4 CTAs, at most
//    8192 columns a CTA (ring_cluster: 8192 split into 2 x 4096 measured slower,
//    16384 into 4 no faster than into 2); if that cannot run, 4 (fp32) or 2
//    (16-bit), not 5 (version 5 holds at most 8192 columns: bwd_plan_ring).
//  - 16-bit rows over 4096 columns that get no ring: 2 (v2 measured faster than
//    row slots there: README's log).
int auto_families(const LnBackwardArgs& a, int vec, const LnDevice& dev, int (&out)[4]) {
  const size_t elem = elem_size(a.dt);
  const int V = int(16 / elem);
  int n = 0;
  if (vec == V && dev.sm90()) {
    const int csize = ring_cluster(a.cols, V);
    const int64_t share = a.cols / csize;
    const bool ring = elem == 4 || share >= 1024;
    if (ring && csize > 1) out[n++] = kClusterSplit;
    else if (ring && a.cols <= kRingCtaCols) out[n++] = kRing;
  }
  if (elem == 4 || a.cols <= 4096) out[n++] = kRowSlots;
  return n;
}

bool plan_family(const LnBackwardArgs& a, int family, LnBwdPlan& p) {
  switch (family) {
    case kSeed: return bwd_plan_v1(a, p);
    case kRegisters: return bwd_plan_v2(a, p);
    case kCpAsync: return bwd_plan_v3(a, p);
    case kRowSlots: return bwd_plan_v4(a, p);
    case kRing: return bwd_plan_ring(a, p);
    case kClusterSplit: return p.cluster > 1 && bwd_plan_ring(a, p);
  }
  return false;
}

}  // namespace

LnDevice ln_device() { return LnDevice{kc::num_sms(), kc::compute_capability()}; }

LnBwdPlan ln_backward_plan(const LnBackwardArgs& a, int version, const LnDevice& dev) {
  LnBwdPlan base;
  base.version = version;
  base.partials = a.dweight || a.dbias;
  base.vec = bwd_vec(a);
  // the families to try, in order: auto's table, or the version's chain
  int chain[8];
  int n = 0;
  if (version >= kSeed && version <= kMaxVersion) {
    for (int f = version; f != 0; f = ln_fallback(f, /*forward=*/false)) chain[n++] = f;
  } else {
    int first[4];
    const int k = auto_families(a, base.vec, dev, first);
    for (int i = 0; i < k; ++i) chain[n++] = first[i];
    chain[n++] = kRegisters;
    chain[n++] = kSeed;
  }
  // version 6's CTAs per row (ring_cluster: at most 8192 columns a CTA; knob cluster)
  const int cluster = base.vec == int(16 / elem_size(a.dt)) ? ring_cluster(a.cols, base.vec) : 1;
  for (int i = 0; i < n; ++i) {
    LnBwdPlan p = base;
    p.family = chain[i];
    if (p.family == kClusterSplit) p.cluster = cluster;
    if (a.dsum && a.dx) p.dsum = bwd_fuses_dsum(p.family, p.partials, p.vec, a.dt) ? 1 : 2;
    if (!plan_family(a, p.family, p)) continue;
    if (p.partials && p.family != kSeed) {
      p.workspace_floats = p.partial_rows * 2 * a.cols;
      p.finalize = a.cols <= kFinNarrowMaxD ? 1 : 2;
    }
    return p;
  }
  return base;  // not reached: version 1 runs every shape
}

cudaError_t ln_backward(const LnBackwardArgs& a, const LnBwdPlan& p, cudaStream_t stream) {
  if (a.rows == 0 && !p.partials) return cudaSuccess;
  switch (p.family) {
    case kRegisters: KC_CUDA_TRY(bwd_launch_v2(a, p, stream)); break;
    case kCpAsync: KC_CUDA_TRY(bwd_launch_v3(a, p, stream)); break;
    case kRowSlots: KC_CUDA_TRY(bwd_launch_v4(a, p, stream)); break;
    case kRing:
    case kClusterSplit: KC_CUDA_TRY(bwd_launch_ring(a, p, stream)); break;
    default: KC_CUDA_TRY(bwd_launch_v1(a, p, stream)); break;
  }
  if (p.finalize) KC_CUDA_TRY(bwd_launch_finalize(a, p, stream));
  // add_norm where the family's kernel does not add dsum itself
  return p.dsum == 2 ? ln_add(a.dx, a.dsum, a.dx, a.rows * a.cols, a.dt, stream) : cudaSuccess;
}

// ------------------------------------------------------------- the finalize
// The finalize of versions 2-6. The main kernels write one fp32 partial row of
// (dweight, dbias) per block (or cluster; RMSNorm's without the dbias half, which
// the finalize reads only where dbias is asked for); these kernels sum the partial rows
// per column in a fixed order, so the same inputs give bitwise the same
// dweight/dbias. Launched with programmatic dependent launch where the
// GPU has it (sm_90+): its launch overlaps the main kernel's tail (the main
// kernels call kc::launch_dependents() early; the finalize waits for their
// completion with kc::grid_dependency_wait()).
namespace {

// Sum G partial rows per column in a fixed order (the finalize kernel's body):
// chunks of 32 columns go to the blocks in turn; in a block, blockDim.x / 32 slices each add every
// (blockDim.x / 32)-th partial row of its column (four loads in flight), then
// slice 0 adds the slices' sums in slice order. red: 2 * blockDim.x floats of
// shared memory. Same G, D and block size: the same order, bitwise the same sums.
template <typename TW>
__device__ __forceinline__ void finalize_columns(const float* __restrict__ partial, int64_t G, int64_t D,
                                                 TW* __restrict__ dw, TW* __restrict__ db, float* red) {
  const int nsl = blockDim.x >> 5;
  const int cx = threadIdx.x & 31, sy = threadIdx.x >> 5;
  for (int64_t chunk = blockIdx.x; chunk * 32 < D; chunk += gridDim.x) {
    const int64_t c = chunk * 32 + cx;
    float aw = 0.f, ab = 0.f;
    if (c < D) {
      int64_t g = sy;
      for (; g + 3 * nsl < G; g += 4 * nsl) {
        float vw[4], vb[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          vw[k] = partial[((g + k * nsl) * 2) * D + c];
          if (db) vb[k] = partial[((g + k * nsl) * 2 + 1) * D + c];
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) aw += vw[k], ab += vb[k];
      }
      for (; g < G; g += nsl) {
        aw += partial[(g * 2) * D + c];
        if (db) ab += partial[(g * 2 + 1) * D + c];
      }
    }
    red[sy * 32 + cx] = aw;
    red[(nsl + sy) * 32 + cx] = ab;
    __syncthreads();
    if (sy == 0 && c < D) {
      float tw = 0.f, tb = 0.f;
      for (int k = 0; k < nsl; ++k) {
        tw += red[k * 32 + cx];
        tb += red[(nsl + k) * 32 + cx];
      }
      if (dw) dw[c] = kc::from_float<TW>(tw);
      if (db) db[c] = kc::from_float<TW>(tb);
    }
    __syncthreads();  // red is reused by the next chunk
  }
}

// The finalize kernel: blocks of 1024 threads (32 slices), one chunk each.
template <typename TW>
__global__ void ln_bwd_finalize(const float* __restrict__ partial, int64_t G, int64_t D, TW* __restrict__ dw,
                                TW* __restrict__ db) {
  __shared__ float red[2 * 1024];
  kc::grid_dependency_wait();  // launched with PDL: the partials are complete and visible after this
  finalize_columns<TW>(partial, G, D, dw, db, red);
}

// The finalize kernel for rows of up to kFinNarrowMaxD columns, where the wide
// kernel's chunks of 32 columns leave most SMs idle (D = 768: 24 blocks on 132
// SMs). It sums the same partials ([G][2][D] fp32: dy * xhat, dy) per column in
// a fixed order. A block of kFinThreads = 256 threads owns kFinCols = 8 columns
// (one 32-byte sector of a partial row; D = 768: 96 blocks): thread t adds rows
// s, s + 32, s + 64, ... (s = t / 8, one of 32 slices) of column t % 8, loading
// kFinRows rows before adding; the slices are then added by a shuffle tree
// inside each warp (4 slices a warp) and by one thread per output in warp order.
// The order depends on G and D only: same inputs, bitwise the same sums.
// H200 (README, runs 65-66): it ends 2.1 / 1.7 us after the main kernel at
// 4096x768 bf16 / fp32, the wide kernel 2.8 / 2.9 us; at 8192 columns 4.7
// against 3.4 (so wide rows keep the wide kernel), at 1024 both 3.0. Other
// shapes measured later ended later (16 rows a batch, 4 columns a block, 16-byte
// loads: docs/log.md, commit 9476239).
constexpr int kFinThreads = 256, kFinCols = 8, kFinRows = 8;  // kFinNarrowMaxD: layernorm_bwd_common.cuh
template <typename TW>
__global__ void __launch_bounds__(kFinThreads)
ln_bwd_finalize_narrow(const float* __restrict__ partial, int64_t G, int64_t D, TW* __restrict__ dw,
                       TW* __restrict__ db) {
  constexpr int kSlices = kFinThreads / kFinCols, kWarps = kFinThreads / 32;
  __shared__ float red[kWarps][2 * kFinCols];
  kc::grid_dependency_wait();  // launched with PDL: the partials are complete and visible after this
  const int cx = threadIdx.x % kFinCols, s = threadIdx.x / kFinCols;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t chunk = blockIdx.x; chunk * kFinCols < D; chunk += gridDim.x) {
    const int64_t c = chunk * kFinCols + cx;
    float aw = 0.f, ab = 0.f;
    if (c < D) {
      // kFinRows rows a batch (one batch when G <= kFinRows * kSlices): a missing row is
      // read at the slice's last row (valid memory; a branch around the load kept the
      // compiler from issuing the loads together) and added as 0
      const int64_t step = int64_t(kSlices) * 2 * D;  // from a slice's row to its next
      const float* p = partial + int64_t(s) * 2 * D + c;
      for (int64_t g = s; g < G; g += kFinRows * kSlices, p += kFinRows * step) {
        const int left = int(std::min<int64_t>((G - g + kSlices - 1) / kSlices, kFinRows));
        float vw[kFinRows], vb[kFinRows];
        const float* q = p;
#pragma unroll
        for (int k = 0; k < kFinRows; ++k) {
          vw[k] = q[0];
          vb[k] = db ? q[D] : 0.f;
          if (k + 1 < left) q += step;
        }
#pragma unroll
        for (int k = 0; k < kFinRows; ++k) aw += k < left ? vw[k] : 0.f, ab += k < left ? vb[k] : 0.f;
      }
    }
    // the warp's 4 slices of each column (lanes cx, cx + 8, cx + 16, cx + 24)
#pragma unroll
    for (int off = kFinCols; off < 32; off <<= 1) {
      aw += __shfl_xor_sync(0xffffffffu, aw, off);
      ab += __shfl_xor_sync(0xffffffffu, ab, off);
    }
    if (lane < kFinCols) {
      red[warp][lane] = aw;
      red[warp][kFinCols + lane] = ab;
    }
    __syncthreads();
    if (threadIdx.x < 2 * kFinCols) {
      const int q = threadIdx.x;  // q < 8: dweight of column q; else dbias of column q - 8
      const int64_t cq = chunk * kFinCols + (q % kFinCols);
      float t = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) t += red[w][q];
      if (cq < D) {
        TW* out = q < kFinCols ? dw : db;
        if (out) out[cq] = kc::from_float<TW>(t);
      }
    }
    __syncthreads();  // red is reused by the next chunk
  }
}

template <typename TW>
cudaError_t launch_finalize(const LnBackwardArgs& a, int64_t G, bool narrow, cudaStream_t stream) {
  const float* partial = a.workspace;
  TW* dw = static_cast<TW*>(a.dweight);
  TW* db = static_cast<TW*>(a.dbias);
  if (narrow)
    return kc::launch(ln_bwd_finalize_narrow<TW>, dim3(unsigned((a.cols + kFinCols - 1) / kFinCols)),
                      dim3(kFinThreads), 0, stream, kc::sm90_or_newer(), partial, G, a.cols, dw, db);
  return kc::launch(ln_bwd_finalize<TW>, dim3(unsigned((a.cols + 31) / 32)), dim3(1024), 0, stream,
                    kc::sm90_or_newer(), partial, G, a.cols, dw, db);
}

}  // namespace

cudaError_t bwd_launch_finalize(const LnBackwardArgs& a, const LnBwdPlan& p, cudaStream_t stream) {
  const bool narrow = p.finalize == 1;
  return ln_typed(a.dt, a.wdt, [&](auto, auto tw) {
    return launch_finalize<decltype(tw)>(a, p.partial_rows, narrow, stream);
  });
}

}  // namespace day26
