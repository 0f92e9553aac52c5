// se_spread.cu: version 2's spread MLP, the products of the fused block's MLP over
// the whole GPU where the weights are large (the plan's Path::Spread; se_fused.cu's
// header says why and what runs when).
//
// The spread MLP's products, out[n, o] = epilogue(sum_i W(o, i) in[n, i]), W = w [O, I] row-major:
//   rows of length C (fc1, and w2^T dz2): gemv_kernel. kGemvThreads = 2 kThreads threads;
//     grid (output chunks of kWarps, sample tiles of kTileN); dynamic shared memory
//     kTileN * I floats (the tile's inputs); outputs of samples past N are computed on
//     zeros and not stored. Two warps per output o, each half of the row, lanes over i
//     (coalesced; 16-byte loads where I % 4 == 0 and w is aligned), 8 loads per lane in
//     flight, then a warp sum each; the first half's lane b adds the second's (shared
//     memory) and finishes sample b.
//   rows of length S <= kNarrowMaxI (fc2, and w1^T dz1): gemv_narrow_kernel. Grid
//     (chunks of kNarrowO outputs, tiles of kNarrowN samples); both tiles staged in
//     shared memory; kGemvThreads threads, lane = output, each warp kNarrowPerWarp (2) of the samples.
// The backward's transposed products read w2^T and w1^T, written as fp32 copies by
// extra blocks of the backward's first kernel (ParamCast), so every product reads rows
// (with the saved state: only where DaState / Coef do not stage columns themselves, w_t).
// (Latency is what matters at these sizes: a product of 128 x 1152 x 48 is a few
// MFLOP; each kernel stages its operands in one or two batched passes of loads.
// H100, ncu: fc2 at (128, 1152, 7, 7) took 30 us as a warp per 48-long
// row, and fc1 at (32, 2688, 12, 12) 34 us while its staging waited on one load per
// (element, split).)
#include <type_traits>

#include "kc/bulk_copy.cuh"
#include "kc/launch.cuh"
#include "se_act.cuh"
#include "se_kernels.cuh"
#include "se_spread.cuh"

namespace se {

namespace {

using dev::act_f;
using dev::act_grad;
using dev::gate_bwd;
using dev::gate_f;

// (kTileN, kWarps, kGemvThreads and the shared-memory sizes: se_geometry.h.)
// gemv_kernel's threads are two warps an output, each half of the row. (H100, ncu: with
// a warp an output in 256 threads its blocks issued one instruction per ~5.8 cycles a warp, 8
// warps an SM, 72 blocks at N = 32: issue-bound latency chains; twice the warps over the same work.)
// ... in at most 96 registers a thread (48K of an SM's 64K), so that a block of the next kernel of
// the chain (launched early under PDL) fits beside one of these: with 128 (the whole register file)
// the next product's blocks waited for these to exit where both grids cover most SMs
// ((32, 2688, 12, 12): fc2 7 us slower).
constexpr int kGemvMaxRegs = 96;

// The weight-gradient blocks of a Coef launch: true where this block was one of them.
// Coef is the backward's last product, and dz1, p, dz2, a are final once it may start,
// so the weight gradients run beside it instead of holding the Dx pass's slots.
// H100, block timestamps ((32, 1632, 12, 12) bf16): 306 weight-gradient
// blocks first in the Dx pass held 58% of its slots for ~7 us, 4 of them waiting for
// Coef; the pass ended 10.6 us after Coef for 15 MB read from L2 and 15 MB written.
template <Epi EPI>
__device__ __forceinline__ bool gemv_wgrad_blocks(const GemvArgs& g) {
  if constexpr (EPI != Epi::Coef) {
    return false;
  } else {
    if (int(blockIdx.x) < g.chunks) return false;
    if (blockIdx.y == 0) {
      extern __shared__ float4 sm4[];
      dev::grid_dependency_wait();
      dev::launch_dependents();
      dev::wgrad_tile_pair(g.wg, int64_t(blockIdx.x) - g.chunks, reinterpret_cast<float*>(sm4));
    }
    return true;
  }
}

template <Act ACT, Epi EPI, typename TW>
__device__ __forceinline__ void gemv_epilogue(const GemvArgs& g, int64_t n, int64_t o, float v) {
  const int64_t k = n * g.o_dim + o;
  [[maybe_unused]] const TW* bias = static_cast<const TW*>(g.bias);
  if constexpr (EPI == Epi::Fc1) {
    const float z = v + kc::to_float(bias[o]);
    g.out[k] = act_f<ACT>(z);
    if (g.out2 != nullptr) g.out2[k] = z;
  } else if constexpr (EPI == Epi::Fc2Fwd) {
    const float z2 = v + kc::to_float(bias[o]);
    g.out[k] = gate_f(g.gate, z2);
    if (g.out2 != nullptr) g.out2[k] = z2;
  } else if constexpr (EPI == Epi::Fc2Bwd) {
    const float z2 = v + kc::to_float(bias[o]);
    const float s = gate_f(g.gate, z2);
    float gs = 0.f;
    for (int sp = 0; sp < g.splits; ++sp) gs += g.aux[(n * g.splits + sp) * g.o_dim + o];
    g.out[k] = s;
    g.out2[k] = gate_bwd(g.gate, z2, s, gs);
  } else if constexpr (EPI == Epi::Da || EPI == Epi::DaState) {
    g.out[k] = v * act_grad<ACT>(g.aux[k]);
  } else {
    g.out[k] = v * g.out_scale;
  }
}

// 4 read-only weights in one load (ld.global.nc: 16 bytes fp32, 8 bytes 16-bit)
template <typename TW>
__device__ __forceinline__ kc::Vec<TW, 4> ldg_vec4(const kc::Vec<TW, 4>* p) {
  kc::Vec<TW, 4> v;
  if constexpr (sizeof(TW) == 4) {
    const float4 r = __ldg(reinterpret_cast<const float4*>(p));
    memcpy(&v, &r, 16);
  } else {
    const uint2 r = __ldg(reinterpret_cast<const uint2*>(p));
    memcpy(&v, &r, 8);
  }
  return v;
}

// gemv_kernel under w_t: the block's kWarps outputs o0.. as rows of w_s ([kWarps, wt_stride(I)],
// fp32), from w given as [I, O] in its own dtype (w and O * sizeof(TW) multiples of 16 bytes).
// Each input i's kWarps outputs are contiguous there: one 16-byte load (kWarps 16-bit values) or
// two (fp32); the last chunk of outputs (fewer than kWarps) by single elements, rows past O zeros.
template <typename TW>
__device__ __forceinline__ void stage_wt(const GemvArgs& g, float* w_s, int64_t o0) {
  const int I = int(g.i_dim);
  const int64_t O = g.o_dim;
  const int ws = int(wt_stride(I));
  const TW* w = static_cast<const TW*>(g.w);
  const int rows = int(min(int64_t(kWarps), O - o0));
  if (rows == kWarps) {
    constexpr int VU = 16 / int(sizeof(TW));  // elements a piece
    constexpr int PIECES = kWarps / VU;       // pieces an input i
    static_assert(kWarps % VU == 0, "an input's outputs are whole 16-byte pieces");
    dev::batched_loop<8>(
        threadIdx.x, int64_t(I) * PIECES, kGemvThreads,
        [&](int64_t e) {
          const int i = int(e) / PIECES, q = int(e) % PIECES;
          return __ldg(reinterpret_cast<const uint4*>(w + int64_t(i) * O + o0 + q * VU));
        },
        [&](int64_t e, const uint4& r) {
          const int i = int(e) / PIECES, q = int(e) % PIECES;
          kc::Vec<TW, VU> v;
          memcpy(&v, &r, 16);
          float f[VU];
          kc::vec_to_float(v, f);
#pragma unroll
          for (int k = 0; k < VU; ++k) w_s[(q * VU + k) * ws + i] = f[k];
        });
  } else {
    dev::batched_loop<8>(
        threadIdx.x, int64_t(I) * kWarps, kGemvThreads,
        [&](int64_t e) {
          const int i = int(e) / kWarps, r = int(e) % kWarps;
          return r < rows ? kc::to_float(__ldg(w + int64_t(i) * O + o0 + r)) : 0.f;
        },
        [&](int64_t e, float v) { w_s[(int(e) % kWarps) * ws + int(e) / kWarps] = v; });
  }
}

template <Act ACT, Epi EPI, bool V4, typename TW, bool kWT>
__global__ void __maxnreg__(kGemvMaxRegs) gemv_kernel(GemvArgs g) {  // kGemvThreads threads
  if (gemv_wgrad_blocks<EPI>(g)) return;
  extern __shared__ float4 sm4[];
  float* in_s = reinterpret_cast<float*>(sm4);  // [kTileN, I]
  __shared__ float half_sum[kWarps][kTileN];     // the second halves' sums
  const int64_t n0 = int64_t(blockIdx.y) * kTileN;
  const int nb = int(min(int64_t(kTileN), g.n - n0));
  const int64_t I = g.i_dim, O = g.o_dim;
  const TW* wt = static_cast<const TW*>(g.w);
  float* w_s = in_s + kTileN * I;  // kWT: [kWarps, wt_stride(I)]
  if constexpr (kWT) {
    if (g.w_early) stage_wt<TW>(g, w_s, int64_t(blockIdx.x) * kWarps);  // while the predecessor drains
  } else if (g.w_early && threadIdx.x % 32 == 0 && threadIdx.x < 96) {
    // asked into L2 while the predecessor drains, so that the reads below (and fc2's) find
    // them there, not in DRAM: the block's rows of w (contiguous) and their biases, and a slice
    // of the next product's weights
    const int64_t o0 = int64_t(blockIdx.x) * kWarps, rows = min(int64_t(kWarps), O - o0);
    if (threadIdx.x == 0 && rows > 0) kc::bulk_prefetch_l2_range(wt + o0 * I, size_t(rows * I) * sizeof(TW));
    if (threadIdx.x == 32 && rows > 0 && g.bias != nullptr) {
      kc::bulk_prefetch_l2_range(static_cast<const TW*>(g.bias) + o0, size_t(rows) * sizeof(TW));
    }
    if (threadIdx.x == 64 && g.next_w != nullptr) {
      const int64_t blocks = int64_t(gridDim.x) * gridDim.y, k = int64_t(blockIdx.y) * gridDim.x + blockIdx.x;
      const int64_t slice = (g.next_bytes + blocks - 1) / blocks, at = k * slice;
      if (at < g.next_bytes) {
        kc::bulk_prefetch_l2_range(static_cast<const char*>(g.next_w) + at, size_t(min(slice, g.next_bytes - at)));
      }
    }
  }
  dev::grid_dependency_wait();
  dev::launch_dependents();
  if constexpr (kWT) {
    if (!g.w_early) stage_wt<TW>(g, w_s, int64_t(blockIdx.x) * kWarps);
  }
  // Fc1's input is the sum of the reduction's splits. The thread's loads run over
  // (index k, split sp) pairs, sp fastest, 8 pairs in flight (each 4 loads: the
  // tile's samples), and each element is summed as x0 + x1 + x2 ... in order, in
  // registers, then scaled and stored. (A loop over the splits inside each load
  // waited on every load in turn: one L2 latency per (element, split), 20-30 us at
  // C = 1152-2688; one pass per split still made 18 passes at N = 1, where the
  // reduction splits L 18 ways. Divisions by I or splits per element are avoided or
  // done by multiply-high: 64-bit ones cost more than the loads.)
  // DaState (Da from the forward's saved values) stages the partials of sum g x the
  // same way, loads z2 and s of each element with its last split (4 pairs in flight then:
  // three float4 each, within kGemvMaxRegs; loaded after the sum, they cost one L2 latency
  // per element), and finishes each element as dz2 = gate_bwd(z2, s, sum).
  // Index math in 32 bits from per-sample row pointers (H100, ncu, fc1 at
  // (32, 1632, 12, 12), 256 threads then: the staging was ~1.4k of a warp's ~2k instructions
  // with 64-bit indices per (element, split, sample); 32-bit ones took 10% of the kernel's
  // instructions off, and 11.0 -> 9.5-10.0 us).
  static_assert(kTileN == 4, "the staging moves 4 samples (a float4) per index");
  constexpr bool kGate = EPI == Epi::DaState;
  const int splits = EPI == Epi::Fc1 || kGate ? g.splits : 1;
  const int I32 = int(I);  // splits * I < 2^31: I is at most a row of shared memory (gemv_smem)
  const float* in_b[kTileN];  // the tile's rows; samples past N read sample n0's, and are zeroed
  const float *z_b[kTileN], *s_b[kTileN];
#pragma unroll
  for (int b = 0; b < kTileN; ++b) {
    const int64_t n = n0 + (b < nb ? b : 0);
    in_b[b] = g.in + n * splits * I;
    if constexpr (kGate) {
      z_b[b] = g.gate_z + n * I;
      s_b[b] = g.gate_s + n * I;
    }
  }
  const int own = int(threadIdx.x) < I32 ? (I32 - 1 - int(threadIdx.x)) / kGemvThreads + 1 : 0;  // indices of this thread
  struct Loaded {
    float4 v, z, s;  // z, s: DaState only
  };
  float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
  dev::batched_loop<kGate ? 4 : 8>(
      0, own * splits, 1,
      [&](int64_t f) {
        const int k = int(g.div_splits.div(uint32_t(f))), sp = int(f) - k * splits;
        const int i = int(threadIdx.x) + k * kGemvThreads, at = sp * I32 + i;
        const bool last = sp == splits - 1;
        Loaded l;
        float *vb = &l.v.x, *zb = &l.z.x, *sb = &l.s.x;
#pragma unroll
        for (int b = 0; b < kTileN; ++b) {
          vb[b] = in_b[b][at];
          if constexpr (kGate) {
            zb[b] = last ? z_b[b][i] : 0.f;
            sb[b] = last ? s_b[b][i] : 0.f;
          }
        }
        return l;
      },
      [&](int64_t f, const Loaded& l) {
        const int k = int(g.div_splits.div(uint32_t(f))), sp = int(f) - k * splits;
        const int i = int(threadIdx.x) + k * kGemvThreads;
        const float *vb = &l.v.x, *zb = &l.z.x, *sb = &l.s.x;
        float* ab = &sum.x;
#pragma unroll
        for (int b = 0; b < kTileN; ++b) ab[b] = sp > 0 ? ab[b] + vb[b] : vb[b];
        if (sp == splits - 1) {
#pragma unroll
          for (int b = 0; b < kTileN; ++b) {
            float t = 0.f;
            if (b < nb) {
              t = ab[b];
              if constexpr (EPI == Epi::Fc1) t *= g.in_scale;
              if constexpr (kGate) t = gate_bwd(g.gate, zb[b], sb[b], t);
              if (g.stage_out != nullptr && blockIdx.x == 0) g.stage_out[(n0 + b) * I + i] = t;
            }
            in_s[b * I32 + i] = t;
          }
        }
      });
  __syncthreads();
  // Output o = chunk * kWarps + (warp % kWarps); warps kWarps.. take the second half of its row.
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, slot = warp % kWarps, half = warp / kWarps;
  const int64_t o = int64_t(blockIdx.x) * kWarps + slot;
  const bool live = o < O;  // warp-uniform
  float acc[kTileN];
#pragma unroll
  for (int b = 0; b < kTileN; ++b) acc[b] = 0.f;
  if (live) {
    if constexpr (kWT && V4) {  // I % 4 == 0: the row staged in shared memory, as in_s, 16-byte aligned
      const float4* w4 = reinterpret_cast<const float4*>(w_s + slot * wt_stride(I));
      const float4* in4 = reinterpret_cast<const float4*>(in_s);
      const int64_t I4 = I / 4, mid = (I4 + 1) / 2;
      for (int64_t i = half * mid + lane; i < (half ? I4 : mid); i += 32) {
        const float4 wv = w4[i];
#pragma unroll
        for (int b = 0; b < kTileN; ++b) {
          const float4 xv = in4[b * I4 + i];
          acc[b] += wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
        }
      }
    } else if constexpr (kWT) {
      const float* w = w_s + slot * wt_stride(I);
      const int64_t mid = (I + 1) / 2;
      for (int64_t i = half * mid + lane; i < (half ? I : mid); i += 32) {
        const float wv = w[i];
#pragma unroll
        for (int b = 0; b < kTileN; ++b) acc[b] += wv * in_s[b * I + i];
      }
    } else if constexpr (V4) {  // I % 4 == 0: rows of w (4-element aligned) and of in_s (16-byte) aligned
      // 4 weights a load whatever TW (8 bytes for 16-bit ones), so the lanes' shares and the
      // order of the sums are fp32's: 16-bit parameters give their fp32 values' results bitwise
      using WV = kc::Vec<TW, 4>;
      const WV* w4 = reinterpret_cast<const WV*>(wt + o * I);
      const float4* in4 = reinterpret_cast<const float4*>(in_s);
      const int64_t I4 = I / 4, mid = (I4 + 1) / 2;
      dev::batched_loop<8>(half * mid + lane, half ? I4 : mid, 32, [&](int64_t i) { return ldg_vec4(w4 + i); },
                           [&](int64_t i, const WV& wr) {
                             float wv[4];
                             kc::vec_to_float(wr, wv);
#pragma unroll
                             for (int b = 0; b < kTileN; ++b) {
                               const float4 xv = in4[b * I4 + i];
                               acc[b] += wv[0] * xv.x + wv[1] * xv.y + wv[2] * xv.z + wv[3] * xv.w;
                             }
                           });
    } else {
      const TW* w = wt + o * I;
      const int64_t mid = (I + 1) / 2;
      dev::batched_loop<8>(half * mid + lane, half ? I : mid, 32, [&](int64_t i) { return kc::to_float(__ldg(w + i)); },
                           [&](int64_t i, float wv) {
#pragma unroll
                             for (int b = 0; b < kTileN; ++b) acc[b] += wv * in_s[b * I + i];
                           });
    }
  }
  float mine = 0.f;  // lane b keeps sample b's sum (every lane gets every sum from the butterfly)
#pragma unroll
  for (int b = 0; b < kTileN; ++b) {
    const float v = kc::warp_reduce_sum<32>(acc[b]);  // every lane active: the warp is whole
    if (lane == b) mine = v;
  }
  if (half == 1 && lane < kTileN) half_sum[slot][lane] = mine;
  __syncthreads();
  if (half == 0 && live && lane < nb) gemv_epilogue<ACT, EPI, TW>(g, n0 + lane, o, mine + half_sum[slot][lane]);
}

// Short rows (I = S: fc2 and the backward's w1^T product, O = C outputs). gemv_kernel's
// warp per output would leave most lanes idle on an S-long row and stage the same few
// inputs in thousands of blocks. Here a block is a tile of kNarrowO outputs x kNarrowN
// samples: it stages both tiles (inputs [kNarrowN, I], weights [kNarrowO, I], one
// batched pass), then lane = output and warp = kNarrowPerWarp samples (kGemvThreads
// threads: 16 warps of 2), so every thread adds 2 dots of length I from shared memory (weight rows
// padded to an odd stride: the lanes' rows fall in distinct banks; the inputs are
// read by every lane at once, a broadcast), and the epilogue's stores and reads
// are coalesced over outputs. Each dot is added i = 0, 1, ... by one thread: a fixed
// order (run-to-run identical), not gemv_kernel's (lanes, then a warp sum).
constexpr int kNarrowPerWarp = kNarrowN / (kGemvThreads / 32);  // samples a warp (16 warps, as gemv_kernel)

template <Act ACT, Epi EPI, typename TW>
__global__ void __launch_bounds__(kGemvThreads) gemv_narrow_kernel(GemvArgs g) {
  if (gemv_wgrad_blocks<EPI>(g)) return;
  extern __shared__ float4 sm4[];
  const int I = int(g.i_dim);
  const int ws = int(narrow_stride(I));
  float* in_s = reinterpret_cast<float*>(sm4);  // [kNarrowN, I]
  float* w_s = in_s + kNarrowN * I;             // [kNarrowO, ws]
  const int64_t o0 = int64_t(blockIdx.x) * kNarrowO, n0 = int64_t(blockIdx.y) * kNarrowN;
  const int n_in = kNarrowN * I;
  const int64_t valid_in = min(int64_t(kNarrowN), g.n - n0) * I;   // inputs past N stage as zeros
  const int64_t valid_w = min(int64_t(kNarrowO), g.o_dim - o0) * I;  // so do rows past O
  const TW* w = static_cast<const TW*>(g.w) + (g.w_t ? o0 : o0 * I);
  const int rows = int(min(int64_t(kNarrowO), g.o_dim - o0));
  // staged elements e: the inputs (e < n_in), then the weight tile: its rows one after another,
  // or under w_t (w given as [I, O]) input by input, each a contiguous run of the tile's outputs
  auto load = [&](int64_t e) {
    if (e < n_in) return e < valid_in ? g.in[n0 * I + e] : 0.f;
    const int f = int(e - n_in);
    if (g.w_t) {
      const int i = f / kNarrowO, r = f % kNarrowO;
      return r < rows ? kc::to_float(__ldg(w + int64_t(i) * g.o_dim + r)) : 0.f;
    }
    return f < valid_w ? kc::to_float(__ldg(w + f)) : 0.f;
  };
  auto store = [&](int64_t e, float v) {
    if (e < n_in) {
      in_s[e] = v;
    } else if (g.w_t) {
      const int f = int(e - n_in);
      w_s[(f % kNarrowO) * ws + f / kNarrowO] = v;
    } else {
      const int f = int(e - n_in), r = int(g.div_i.div(uint32_t(f)));
      w_s[r * ws + (f - r * I)] = v;
    }
  };
  if (g.w_early) {  // the weight tile, the caller's parameters, staged while the predecessor drains
    if (threadIdx.x == 0 && g.bias != nullptr && o0 < g.o_dim) {  // and the tile's biases asked into L2
      kc::bulk_prefetch_l2_range(static_cast<const TW*>(g.bias) + o0,
                                 size_t(min(int64_t(kNarrowO), g.o_dim - o0)) * sizeof(TW));
    }
    dev::batched_loop<8>(n_in + threadIdx.x, n_in + kNarrowO * I, kGemvThreads, load, store);
    dev::grid_dependency_wait();
    dev::launch_dependents();
    dev::batched_loop<8>(threadIdx.x, n_in, kGemvThreads, load, store);
  } else {
    dev::grid_dependency_wait();
    dev::launch_dependents();
    dev::batched_loop<8>(threadIdx.x, n_in + kNarrowO * I, kGemvThreads, load, store);
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const float* wr = w_s + lane * ws;
  const float* xr = in_s + warp * kNarrowPerWarp * I;
  float acc[kNarrowPerWarp];
#pragma unroll
  for (int b = 0; b < kNarrowPerWarp; ++b) acc[b] = 0.f;
  for (int i = 0; i < I; ++i) {
    const float wv = wr[i];
#pragma unroll
    for (int b = 0; b < kNarrowPerWarp; ++b) acc[b] += wv * xr[b * I + i];
  }
  const int64_t o = o0 + lane;
  if (o >= g.o_dim) return;
#pragma unroll
  for (int b = 0; b < kNarrowPerWarp; ++b) {
    const int64_t n = n0 + warp * kNarrowPerWarp + b;
    if (n < g.n) gemv_epilogue<ACT, EPI, TW>(g, n, o, acc[b]);
  }
}

// A launch's dynamic shared memory with room for its weight-gradient blocks, if any
size_t with_wgrad_smem(const GemvArgs& g, size_t smem) {
  return g.wg_pairs > 0 && smem < dev::kWgPairSmem ? dev::kWgPairSmem : smem;
}

template <Act ACT, Epi EPI, typename TW>
cudaError_t launch_gemv(const GemvArgs& g, const LaunchOpts& o, cudaStream_t stream) {
  constexpr bool kMaybeNarrow = EPI != Epi::Fc1 && EPI != Epi::Da && EPI != Epi::DaState;  // rows of length S
  if constexpr (kMaybeNarrow) {
    if (g.i_dim <= kNarrowMaxI) {
      const size_t smem = with_wgrad_smem(g, gemv_narrow_smem(g.i_dim));
      auto kernel = gemv_narrow_kernel<ACT, EPI, TW>;
      KC_CUDA_TRY(kc::allow_dynamic_smem(kernel, smem));
      GemvArgs a = g;
      a.chunks = int(dev::ceil_div(g.o_dim, kNarrowO));
      const int64_t gx = int64_t(a.chunks) + a.wg_pairs;
      KC_CUDA_TRY(dev::check_grid(gx));
      return dev::launch(kernel, dim3(unsigned(gx), unsigned(dev::ceil_div(g.n, kNarrowN))), dim3(kGemvThreads),
                         smem, stream, o.pdl, a);
    }
  }
  auto pick = [&]() -> void (*)(GemvArgs) {
    const bool i4 = g.i_dim % 4 == 0;
    if constexpr (EPI == Epi::DaState && !std::is_same_v<TW, float>) {  // 16-bit weights: w_t only
      return i4 ? gemv_kernel<ACT, EPI, true, TW, true> : gemv_kernel<ACT, EPI, false, TW, true>;
    } else {
      if constexpr (EPI == Epi::DaState) {
        if (g.w_t) return i4 ? gemv_kernel<ACT, EPI, true, TW, true> : gemv_kernel<ACT, EPI, false, TW, true>;
      }
      const bool v4 = i4 && kc::is_aligned(g.w, 4 * sizeof(TW));
      return v4 ? gemv_kernel<ACT, EPI, true, TW, false> : gemv_kernel<ACT, EPI, false, TW, false>;
    }
  };
  auto kernel = pick();
  const size_t smem = with_wgrad_smem(g, g.w_t ? gemv_wt_smem(g.i_dim) : gemv_smem(g.i_dim));
  KC_CUDA_TRY(kc::allow_dynamic_smem(kernel, smem));
  const int64_t tiles = dev::ceil_div(g.n, kTileN);
  GemvArgs a = g;
  a.chunks = int(dev::ceil_div(g.o_dim, kWarps));
  const int64_t gx = int64_t(a.chunks) + a.wg_pairs;
  KC_CUDA_TRY(dev::check_grid(gx));
  return dev::launch(kernel, dim3(unsigned(gx), unsigned(tiles)), dim3(kGemvThreads), smem, stream, o.pdl, a);
}

// Only the epilogues that apply act or act' are instantiated per activation;
// the others (Fc2Fwd, Fc2Bwd, Coef) once. Only the products that read the parameters (Fc1, Fc2Fwd, and DaState and
// Coef under w_t) read weights of the parameters' own dtype (g.w_dt); the others fp32.
}  // namespace

template <Epi EPI>
cudaError_t launch_gemv_act(Act act, const GemvArgs& g, const LaunchOpts& o, cudaStream_t stream) {
  constexpr bool kRaw = EPI == Epi::Fc1 || EPI == Epi::Fc2Fwd || EPI == Epi::DaState || EPI == Epi::Coef;
  if (!kRaw && g.w_dt != kc::DType::F32) return cudaErrorInvalidValue;
  if ((EPI == Epi::DaState || EPI == Epi::Coef) && g.w_dt != kc::DType::F32 && !g.w_t) return cudaErrorInvalidValue;
  auto typed = [&](auto act_tag) {
    constexpr Act A = decltype(act_tag)::value;
    if constexpr (kRaw) {
      return KC_DTYPE_SWITCH(g.w_dt, TW, [&] { return launch_gemv<A, EPI, TW>(g, o, stream); });
    } else {
      return launch_gemv<A, EPI, float>(g, o, stream);
    }
  };
  if constexpr (EPI == Epi::Fc1 || EPI == Epi::Da || EPI == Epi::DaState) {
    return with_act(act, typed);
  } else {
    return typed(ActTag<Act::ReLU>{});
  }
}

template cudaError_t launch_gemv_act<Epi::Fc1>(Act, const GemvArgs&, const LaunchOpts&, cudaStream_t);
template cudaError_t launch_gemv_act<Epi::Fc2Fwd>(Act, const GemvArgs&, const LaunchOpts&, cudaStream_t);
template cudaError_t launch_gemv_act<Epi::Fc2Bwd>(Act, const GemvArgs&, const LaunchOpts&, cudaStream_t);
template cudaError_t launch_gemv_act<Epi::Da>(Act, const GemvArgs&, const LaunchOpts&, cudaStream_t);
template cudaError_t launch_gemv_act<Epi::Coef>(Act, const GemvArgs&, const LaunchOpts&, cudaStream_t);
template cudaError_t launch_gemv_act<Epi::DaState>(Act, const GemvArgs&, const LaunchOpts&, cudaStream_t);

}  // namespace se
