// hopper_bwd.cu: the fused backward's main kernel for Hopper (sm_90a): TMA + wgmma +
// warp specialization. Version 2 of the fused backward (flash_bwd.cuh, mma.sync, is
// version 1). It replaces only the main kernel: flash_bwd.cu's pre-kernel (D = rowsum(dO * O)
// - grad_lse, dq_accum = 0) and dQ conversion run around it as for version 1.
//
// CTA: one block of kBlockN = 128 keys of one (batch, head); 3 warpgroups (one consumer: below).
//   warpgroup 0, the producer: one thread loads K and V once, then Q and dO tiles of
//     kBlockM = 64 queries into a ring of kStages stages ("full" barriers completed by
//     the copy engine, "empty" barriers by the consumers); warp 1 stages each tile's lse
//     and D in shared memory beside them (off the consumers' critical path: read from
//     global memory there, their latency stalled every tile); the rest of it exits (packed
//     sequences: warp 3 zeroes the rows past a sequence's end, below).
//   warpgroups 1 and 2, the consumers: 64 keys each; their dK and dV (64 x d, fp32) stay
//     in registers for the whole kernel. Per query tile, five wgmma products:
//       S^T  = K Q^T        (64 keys x 64 queries; A = K, B = Q, both K-major in shared memory)
//       dP^T = V dO^T       (likewise)
//       P^T  = exp2(S^T scale log2(e) - lse log2(e)), causal mask;
//       dS^T = P^T (scale dP^T - scale D): the softmax scale of dQ and dK folded in (one FMA)
//       dV  += P^T dO       (A = P^T from registers: the accumulator layout is the A layout;
//                            B = dO, MN-major: its rows are the product's K dimension)
//       dK  += dS^T Q       (A = dS^T from registers, B = Q MN-major)
//       dQ   = dS K         (M = queries: A = dS read back from shared memory, where the
//                            warpgroups stored dS^T, so A is MN-major; B = K MN-major)
//     The two consumer warpgroups split dQ's columns (d / 2 each, over all 128 keys:
//     both halves of dS^T are needed, one named barrier), so every dQ element is added
//     once per key block. dQ goes to a shared-memory tile (fp32, 128-byte swizzled:
//     conflict-free stores) and the consumers move on.
//     dQ by turns (Layout::kTurns: d = 64 and 128, dense attention): consumer it % 2
//     computes all of tile it's dQ (m64n64 products over the 128 keys, one a 64 columns: dS is
//     read from shared memory once, not once per half), waiting for the other's dS^T half; the
//     other passes it on (bar.arrive) as soon as it is stored, before its own dV and dK
//     products land, and goes to its next tile.
//   warp 2 of warpgroup 0, the dQ writer: one thread adds each finished dQ tile to the
//     fp32 dq_accum with the copy engine's reduce-add (cp.reduce.async.bulk.tensor: the L2
//     does the adds, whole 128-byte lines), two tiles in flight. It replaced float2
//     atomics issued by the consumers themselves: those stalled them and their L2
//     traffic (8 scattered 32-byte sectors an instruction) was the limit at d = 64.
//     Deterministic: it also waits for the key blocks' turn (below), off the consumers' path,
//     and warp 3 writes every other tile (one tile's adds land while the next one's are made).
// Shared memory (d = 128): K, V 32 KB each, 2 stages of Q and dO (16 KB each), two dS^T
//   buffers (16 KB each: one is written while the other may still be read), two dQ tiles
//   (32 KB each) = 224 KB.
// One consumer (Layout::kOne; windows, softcaps and packed sequences at d = 64, not
//   deterministic): 64 keys and one consumer warpgroup that computes all of dQ's columns (no
//   barrier between consumers), 256 threads and 98 KB, two CTAs an SM: one CTA's softmax,
//   first loads and epilogue run under the other's products. Dense attention keeps two
//   consumers: per key it loads Q and dO and adds dQ half as often, and on its long key
//   blocks that L2 traffic costs more than the overlap gains.
// Tails: tensor maps zero-fill rows past Nq / Nk; queries past Nq get lse = +inf (P = 0),
//   keys past Nk have K = V = 0 rows (no contribution to dQ) and are not stored.
// Causal (top-left): a key block starts at the query tile holding its first key.
// Sliding window (kLocal: hopper_common::Band, query i sees keys i - wl .. i + wr): a key
//   block reads only the query tiles whose rows see one of its keys, k0 - wr .. k0 + 127 + wl;
//   tiles crossing either edge are masked. Rows that see no key have lse = +inf (P = 0).
// Softcap (kSoftcap, on the kLocal variant, whose bounds also express causal and full
//   attention): t = tanh(S^T scale / softcap), P^T = exp2(t softcap log2(e) - lse log2(e)), and
//   dS^T takes the factor 1 - t^2 (folded into P^T once P^T is packed for dV's product).
// Grid: one dimension in hopper_common::Order: heads in chunks whose Q and dO fit in half
// the L2 (and at least four waves of CTAs), and inside a chunk key block 0 (causal: the
// longest) of every head first.
// Grouped-query attention: a CTA runs heads_per_cta q heads of a group (fused_backward_plan:
// the whole group where that still leaves two waves of CTAs), one after the other into the
// same dK, dV registers (deterministic: tile by tile, each tile's heads in turn), reading its kv
// head's K, V once.
// dK, dV: the whole group (multi-head attention: its one head), staged as T in the K, V
// buffers and stored by the copy engine. A group split over CTAs: their fp32 dK, dV are
// staged in shared memory (the K, V, Q, dO buffers, free once both consumers are done) and
// added by the copy engine into one (2, B, Hk, Nk, d) accumulator that flash_bwd.cu
// converts; deterministic: fp32 partials per split that its reduce kernel sums over each
// group in a fixed order.
// Packed sequences (kVarlen, on the kLocal variant, as the forward's): a CTA reads its
// sequence's offsets, the maps span all packed rows, and the sequence's bottom-right diagonal
// is folded into its Band. Rows past a sequence's end are the next sequence's: warp 3 zeroes
// them in the tiles of K, V (dQ = dS K, dP^T = V dO^T), Q and dO (dK += dS^T Q, dV += P^T dO)
// once the copy engine has landed them (an inf or NaN there times P = 0 or dS = 0 would be NaN),
// its queries there get lse = +inf and its keys there are masked, and the dQ and grouped-query
// accumulator rows there are staged as zeros, so the reduce-adds into the next sequence's rows
// add zeros; multi-head dK, dV of a sequence's last key block are stored row by row.
// Head dims: the kernels for d = 64 and 128 run every multiple of 8 up to 128 (d <= 64 in the
// first, the rest in the second), the d = 256 kernel those above: the copy engine zero-fills
// the columns past d, which add nothing to S, dP or dQ, and stores or adds only the columns
// below d (the boxes that start past d are not issued).
// d = 256 (Layout::kSplit): 64 x 256 fp32 of dK and dV would take a consumer's 240 registers,
// so a CTA takes 64 keys and both consumers hold all of them, each 128 columns of dK, dV.
// Consumer w computes S^T and dP^T for its 32 queries of the tile (64 keys x 32, m64n32),
// stores its halves of P^T and dS^T to shared memory (two buffers each, by tile parity), and
// after one named barrier adds dV += P^T dO and dK += dS^T Q for its columns (A from shared
// memory) and computes dQ = dS K for its columns, 64 at a time, each staged in its own buffer
// for the writer. Shared memory: K, V 32 KB each, two Q stages and one dO stage (32 KB
// each), P^T and dS^T 2 x 8 KB each, dQ 2 x 16 KB = 224 KB.
#include "attention.h"

#include <cmath>

#include "flash_common.cuh"
#include "hopper_common.cuh"
#include "kc/bulk_copy.cuh"
#include "kc/check.cuh"
#include "kc/launch.cuh"
#include "kc/tma.cuh"
#include "kc/types.h"
#include "kc/wgmma.cuh"

namespace day50 {
namespace hopper_bwd {
namespace {

constexpr int kBlockM = 64, kStages = 2;  // the key block: Layout::kBlockN
constexpr int kProducerRegs = 24;
constexpr int kDsBar = 1;  // named barrier 1: the consumers' dS^T is in shared memory
constexpr int kTurnBar = 2;  // Layout::kTurns: 2 + tile parity, the tile's owner waits for both dS^T halves
using hopper_common::kLog2e;

struct Args {
  CUtensorMap q, k, v, dout;  // (d, N, heads, batch) maps
  const float* lse;           // (B, H, Nq), natural log
  const float* dsum;          // (B, H, Nq): rowsum(dO * O) - grad_lse
  CUtensorMap dq_accum;       // (d, Nq, H, B) fp32, zeroed by the pre-kernel; boxes of 32 x kBlockM
  CUtensorMap dk, dv;         // (d, Nk, Hk, B) maps of dk, dv (stored here unless `split`), boxes of 64 x kBlockN
  // A CTA runs hpc q heads of a group (heads_per_cta; 1 under multi-head attention), one
  // after the other into the same dK, dV registers. `split` (hpc < group): the group's G / hpc
  // CTAs of a key block sum theirs. Default: in the fp32 accumulator (d, Nk, Hk, 2 B) (dK's
  // batches, then dV's) the copy engine adds into. Deterministic: fp32 partials (flash_bwd.cu's layout).
  CUtensorMap dkv_accum;
  float* dkv_partial;
  int hpc;
  bool split;
  int* dq_sem;                // deterministic: per (q head, query tile) the key blocks added so far
  bool rotate;                // deterministic, full attention: key blocks start on tiles of their own (kernel)
  hopper_common::Order order;
  int B, H, group, Nq, Nk;
  float scale, scale_log2;     // scale_log2: scale * log2(e); kSoftcap: softcap * log2(e)
  hopper_common::Band w;      // kLocal: the window
  float cap_in;               // kSoftcap: scale / softcap
  int d;                      // the head dim (<= kD: the columns past it are zeros)
  // kVarlen: the sequences' offsets, the window as given, lse's and D's head stride (total_q),
  // the key rows (total_k), and dk, dv for the direct stores of a sequence's last key block
  const int* cu_q;
  const int* cu_k;
  hopper_common::SeqWindow sw;
  int64_t row_sh;
  int total_k;
  void* dk_ptr;
  void* dv_ptr;
  int64_t dk_sh, dk_sr;
};

template <int kD, bool kOneConsumer = false, bool kDqTurns = false>
struct Layout {
  // kD = 256 (kSplit): 64-key blocks; both consumers hold all 64 keys, each half of dK's and
  // dV's columns (64 x 256 fp32 of each would not fit one warpgroup's registers). One dO stage
  // (Q keeps two), P^T exchanged through shared memory, dQ staged 64 columns a consumer at a time.
  static constexpr bool kSplit = kD > 128;
  // kOne (d = 64, where LayoutOf says; the file's header says why): 64-key blocks, one consumer
  // warpgroup that computes all of dQ's columns, two CTAs an SM.
  static constexpr bool kOne = kOneConsumer;
  static_assert(!kOne || kD == 64, "one consumer holds 64 keys x d of dK and dV: d = 64");
  static constexpr int kConsumers = kOne ? 1 : 2, kThreads = 128 * (1 + kConsumers), kCtasPerSm = kOne ? 2 : 1;
  // 24 registers for the producer, the rest of the CTA's allocation at launch for the consumers
  // (two consumers: 128 x 24 + 256 x 240 = 64512 <= 384 x 168; kOne: 128 x 24 + 128 x 232 =
  // 256 x 128). setmaxnreg only moves registers within that allocation: asking for more waits forever.
  static constexpr int kConsumerRegs = kOne ? 232 : 240;
  static constexpr int kBlockN = kSplit || kOne ? 64 : 128, kDoStages = kSplit ? 1 : kStages;
  static constexpr int kAccCols = kSplit ? 128 : kD;  // dK, dV columns a consumer holds
  // kTurns (two consumers, where LayoutOf says): a tile's dQ (all d columns, over the block's
  // 128 keys) is computed by one consumer, tile it by consumer it % 2, into buffer it % 2
  static constexpr bool kTurns = kDqTurns;
  static_assert(!kTurns || (kD <= 128 && !kOne), "dQ by turns: d = 64 or 128, two consumers");
  static constexpr int kDqWriters = kSplit || kTurns ? 1 : kConsumers;  // consumers storing a tile's dQ
  static constexpr int kPanels = kD / 64;
  static constexpr int kKVPanel = kBlockN * 128, kQPanel = kBlockM * 128;
  static constexpr int kKVBytes = kPanels * kKVPanel, kQBytes = kPanels * kQPanel;
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;  // dS^T: keys x 64 queries, one 128-byte panel
  static constexpr int kDqBox = kBlockM * 128;              // dQ: 64 queries x 32 fp32 columns, swizzled
  // a dQ staging buffer: a tile's d columns (two, the consumers' halves side by side); kSplit:
  // one per consumer, 64 of its columns
  static constexpr int kDqBytes = kSplit ? 2 * kDqBox : (kD / 32) * kDqBox;
  static constexpr int kK = 0, kV = kKVBytes, kQ = 2 * kKVBytes, kDo = kQ + kStages * kQBytes,
                       kDs = kDo + kDoStages * kQBytes, kP = kDs + 2 * kDsBytes,
                       kDq = kP + (kSplit ? 2 * kDsBytes : 0), kRows = kDq + 2 * kDqBytes,
                       kBars = kRows + kStages * 2 * kBlockM * 4;  // rows: per stage lse2, D (64 floats each)
  // kv_full, q_full[], do_full[], empty[], dq_full[2], dq_empty[2]; kSplit: do_empty[]; edge[2]
  static constexpr int kNumBars = 1 + 3 * kStages + 4 + (kSplit ? kDoStages : 0) + 2;
  static constexpr int kBytes = kBars + 8 * kNumBars + 1024;
};
// The one-consumer layout runs where a key block's query tiles are few: windows and packed
// sequences (the kLocal variants) at d = 64, not deterministic (its ordered dQ adds would
// wait on twice as many key blocks). dQ by turns: the other variants at d = 64 and 128
// (deterministic too, since its two writers: with one, a tile's turn waited behind the previous
// tile's adds, and one consumer's whole-tile dQ came later into that chain).
template <int kD, bool kLocal, bool kDeterministic>
using LayoutOf = Layout<kD, kD == 64 && kLocal && !kDeterministic, kD <= 128 && !kLocal>;

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// A consumer's fp32 accumulator fragment (kGroups groups of 8 columns; rows 16 warp + g and
// + 8 of its 64) stored to shared tiles of 64-row x 32-column boxes, 128-byte
// swizzled as the copy engine reads them: `row` is this thread's unswizzled address in the
// first box (row 16 warp + g, column 2 t). Element (row, column) lies in box column / 32,
// 16-byte chunk (column % 32) / 4 XOR row % 8: the swizzle is address bits 4-6 XOR bits 7-9,
// and bits 7-9 are g (boxes 1024-aligned). The XOR is applied to each address, not folded
// into per-store constants that the compiler would keep in registers (d = 128 spilled so).
// A store's half-warp (rows g = 0..3 or 4..7, two chunks each) would cover only four of a row's
// eight chunks, two stores to each: kSpread, odd rows store group c ^ 2 where even rows store c,
// so the eight chunks differ (two shared-memory wavefronts a store, not four).
// kClip (packed sequences): the thread's rows are rows r_idx and r_idx + 8 of a tile whose
// rows from r_end on are the next sequence's; they are stored as zeros.
template <int kGroups, bool kClip = false, bool kSpread = true>
__device__ __forceinline__ void store_swizzled_f32(uint32_t row, int g, const float* acc, int r_idx = 0,
                                                   int r_end = 0) {
  static_assert(kGroups % 4 == 0, "groups come in boxes of four");
  const bool odd = kSpread && (g & 1);
  const uint32_t swz = (g << 4) ^ (uint32_t(odd) << 6);  // column group c ^ 2 on odd rows
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool keep = !kClip || r_idx + 8 * r < r_end;
#pragma unroll
    for (int c = 0; c < kGroups; ++c) {
      const int e = 4 * c + 2 * r, o = 4 * (c ^ 2) + 2 * r;
      const float x0 = odd ? acc[o] : acc[e], x1 = odd ? acc[o + 1] : acc[e + 1];
      const uint32_t at = (row + (c / 4) * (kBlockM * 128) + r * 8 * 128 + 32 * (c % 4)) ^ swz;
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at), "f"(keep ? x0 : 0.f), "f"(keep ? x1 : 0.f));
    }
  }
}

// dQ = dS K of a tile over the block's keys, a wgmma a 16-key step: A = dS, read MN-major from
// dS^T's buffer buf; B = K's columns from byte k_off of d_k's panels (MN-major). Its own group:
// the caller fences, commits and waits.
template <class Op, class L, int N>
__device__ __forceinline__ void dq_product(float (&dq)[N], uint64_t d_ds, uint64_t d_k, int buf, int k_off) {
#pragma unroll
  for (int kk = 0; kk < L::kBlockN / 16; ++kk)
    Op::template ss<1, 1>(dq, d_ds + (buf * L::kDsBytes + kk * 2048) / 16, d_k + (k_off + kk * 2048) / 16, kk > 0);
}

// kDeterministic: the key blocks of one q head add their dQ tiles in key-block order.
// Block n's dQ writer waits until the counter of the query tile reads n - f, adds, waits for
// its adds to land, and sets n - f + 1, where f is the first key block that reaches the tile:
// the blocks that do are f, f + 1, .. (the window's band is convex), 0 unless a window has a
// left edge (causal: block n starts at query tile 2n; every block before it reaches the
// tiles it does). The blocks it waits for come earlier in launch order
// (hopper_common::Order launches a head's key block n - 1 before its block n), so they are
// running or done: no deadlock. Full attention (a.rotate): each block starts on a tile of its
// own and the order differs by tile (the kernel says which); a head's blocks launch together and
// fit on the GPU at once, so every one it waits for runs.
// The consumers run on while the writer waits (two dQ tiles in flight). Same inputs,
// same order of fp32 adds: bitwise equal dq.
template <typename T, int kD, bool kCausal, bool kLocal, bool kSoftcap, bool kDeterministic, bool kVarlen>
__global__ void __launch_bounds__(LayoutOf<kD, kLocal, kDeterministic>::kThreads,
                                  LayoutOf<kD, kLocal, kDeterministic>::kCtasPerSm)
    hopper_bwd_kernel(const __grid_constant__ Args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = LayoutOf<kD, kLocal, kDeterministic>;
  constexpr int kBlockN = L::kBlockN, kConsumers = L::kConsumers;
  extern __shared__ unsigned char smem_raw[];
  // Typed as shared memory (kc::smem_align): the dS^T stores and the lse and D loads compile to
  // STS and LDS. Through a generic pointer they were ST and LD on 64-bit addresses, and each tile
  // waited on the generic loads' latency. d = 256 (kSplit) keeps the generic pointer: with the
  // shared one ptxas serialized its wgmma products (C7520) in the causal, window and packed variants.
  unsigned char* sm = L::kSplit ? reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                                                   ~uintptr_t(1023))
                                : kc::smem_align<1024>(smem_raw);
  uint64_t* bars = reinterpret_cast<uint64_t*>(sm + L::kBars);
  uint64_t* kv_full = bars;
  uint64_t* q_full = bars + 1;
  uint64_t* do_full = bars + 1 + kStages;
  uint64_t* empty = bars + 1 + 2 * kStages;
  uint64_t* dq_full = bars + 1 + 3 * kStages;   // both consumers' dQ of a tile is in shared memory
  uint64_t* dq_empty = dq_full + 2;             // the writer has read it
  // dO's stage is free (kSplit: its own barriers, as dO has one stage; else Q's empty[])
  uint64_t* do_empty = L::kSplit ? dq_empty + 2 : empty;
  // kVarlen: a tile across the sequence's end has landed (0: K, V; 1: Q, dO), for warp 3 to zero
  // the next sequence's rows before the consumers see it
  uint64_t* edge = bars + L::kNumBars - 2;

  int kb, u;  // key block, (batch, hpc q heads from h0): the launch order (hopper_common::Order)
  hopper_common::order_of(blockIdx.x, a.order, kb, u);
  const int units = a.H / a.hpc, b = u / units, h0 = (u % units) * a.hpc, hk = h0 / a.group;
  const int k0 = kb * kBlockN;
  // Packed sequences (kVarlen): sequence b (hopper_common::Seq); the maps span all rows (batch
  // coordinate mb = 0); bounds and the diagonal are the sequence's.
  hopper_common::Seq sq;
  if constexpr (kVarlen) {
    sq = hopper_common::seq_of(a.cu_q, a.cu_k, a.sw, b);
    if (k0 >= sq.nk) return;  // the grid covers the longest sequence: past this one's keys
  }
  const int qs = sq.qs, ks = sq.ks, mb = kVarlen ? 0 : b;
  auto nk = [&] { return kVarlen ? sq.nk : a.Nk; };
  const hopper_common::Band& band = kVarlen ? sq.band : a.w;
  const int n_qt_all = (a.Nq + kBlockM - 1) / kBlockM;  // the semaphores' stride
  const int n_qt = kVarlen ? (sq.nq + kBlockM - 1) / kBlockM : n_qt_all;
  // The query tiles that see a key of the block: j_first .. j_end - 1 (causal: from the one
  // holding key k0; a window: rows k0 - wr .. k0 + kBlockN - 1 + wl)
  int j_first = kCausal ? k0 / kBlockM : 0, j_end = n_qt;
  if constexpr (kLocal) {
    j_first = max(0, k0 - band.wr) / kBlockM;
    j_end = min(n_qt, (k0 + kBlockN - 1 + band.wl) / kBlockM + 1);
  }
  const int n_it = j_end > j_first ? j_end - j_first : 0;
  // The steps: the hpc heads one after the other, each over its n_it query tiles.
  // Deterministic: the last tile first, so that every key block starts on a tile all blocks
  // share and the ordered adds pipeline from the first step (in ascending order a causal
  // block n would wait for block 0 to reach tile 2n); and tile by tile, the hpc heads of each
  // in turn, so that block n reaches each (head, tile) a step after block n - 1 did (head by
  // head, a causal block n, shorter than n - 1, would reach the next head first and wait
  // there, every head). Each loop walks the steps' (head, tile) along (Step: begin(), then
  // next()): a division a step to find them cost the multi-head kernel 2-5%.
  // Deterministic full attention (a.rotate, where a head's key blocks all fit on the GPU at
  // once): every block reaches every tile, and walking them in the same order makes block n
  // wait n steps for the blocks before it on its first tile.
  // So block n starts on tile s_n = floor(n T / nb) (T tiles, nb key blocks) and walks up,
  // wrapping: on each tile the blocks add in the order they reach it (the writer, below),
  // each s_n+1 - s_n steps after the one before it, none waiting in step.
  const int n_steps = a.hpc * n_it;
  const int n_kb = (a.Nk + kBlockN - 1) / kBlockN;
  constexpr bool kFull = kDeterministic && !kCausal && !kLocal;
  const bool rotate = kFull && a.rotate;
  const int start = rotate ? int(unsigned(kb) * n_qt / n_kb) : 0;  // < 2^32: nb <= 66, T < 2^26 (launch)
  const int first_tile = rotate ? start : kDeterministic ? j_end - 1 : j_first, last_tile = j_end - 1;
  struct Step {
    int h, j;  // q head, query tile
  };
  const int h_last = h0 + a.hpc - 1;
  auto begin = [&] { return Step{h0, first_tile}; };
  auto next = [&](Step& st) {
    if constexpr (kDeterministic) {
      if (st.h != h_last) {
        ++st.h;
      } else {
        st.h -= a.hpc - 1;
        if (!rotate) {
          --st.j;
        } else if (++st.j == n_qt) {
          st.j = 0;
        }
      }
    } else if (st.j == last_tile) {
      st.j = first_tile;
      ++st.h;
    } else {
      ++st.j;
    }
  };
  const int wg = threadIdx.x / 128;
  // Packed sequences (header): the tiles that reach past the sequence's end, whose rows there
  // warp 3 zeroes. The key block, and the edge query tile: the last one, where the sequence's
  // length is no multiple of 64 and the block's tiles reach it (its step it_edge: counted from
  // j_first, or from j_end - 1 downwards; packed sequences run one head a CTA, n_steps = n_it).
  const bool kv_edge = kVarlen && k0 + kBlockN > nk();
  const int it_edge = kVarlen && sq.nq % kBlockM != 0 && j_end == n_qt && n_it > 0
                          ? (kDeterministic ? 0 : n_it - 1)
                          : -1;

  if (threadIdx.x == 0) {
    kc::mbar_init(kv_full, 1);
    for (int s = 0; s < kStages; ++s) {
      kc::mbar_init(&q_full[s], 1 + 32);  // the copy thread + the 32 lanes that stage lse and D
      kc::mbar_init(&do_full[s], 1);
      kc::mbar_init(&empty[s], kConsumers * 128);
    }
    for (int i = 0; i < 2; ++i) {
      kc::mbar_init(&dq_full[i], L::kDqWriters * 128);  // kSplit: consumer i's buffer; kTurns: consumer i's
      kc::mbar_init(&dq_empty[i], 1);
    }
    if constexpr (L::kSplit)
      for (int s = 0; s < L::kDoStages; ++s) kc::mbar_init(&do_empty[s], kConsumers * 128);
    kc::mbar_init(&edge[0], 1);
    kc::mbar_init(&edge[1], 1);
    kc::mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {  // ------------------------------------------------------------ producer
    kc::warpgroup_reg_dealloc<kProducerRegs>();
    if (threadIdx.x >= 32 && threadIdx.x < 64) {
      // warp 1: each query tile's lse (in log2 units; +inf past Nq, so P = 0 there: packed
      // sequences read the next sequence's Q and dO there) and D into shared memory, so the
      // consumers find them there with Q (q_full counts these lanes)
      const int lane = threadIdx.x - 32;
      const int nq = kVarlen ? sq.nq : a.Nq;
      float* rows0 = reinterpret_cast<float*>(sm + L::kRows);
      Step st = begin();
      for (int it = 0; it < n_steps; ++it, next(st)) {
        const int q = st.j * kBlockM + lane, s = it % kStages;
        // the head's rows: (B, H, Nq) or (H, total_q)
        const int64_t row0 = kVarlen ? st.h * a.row_sh + qs : (int64_t(b) * a.H + st.h) * a.Nq;
        const float* lse = a.lse + row0;
        const float* dsum = a.dsum + row0;
        if (it >= kStages) kc::mbar_wait(&empty[s], ((it / kStages) - 1) & 1);
        float* rows = rows0 + s * 2 * kBlockM;
#pragma unroll
        for (int i = 0; i < kBlockM; i += 32) {
          rows[lane + i] = q + i < nq ? lse[q + i] * kLog2e : INFINITY;
          rows[kBlockM + lane + i] = q + i < nq ? dsum[q + i] * a.scale : 0.f;  // scale D: dS^T's scale
        }
        kc::mbar_arrive(&q_full[s]);
      }
    }
    if (kVarlen && threadIdx.x >= 96) {
      // warp 3, packed sequences: the rows past the sequence's end in the key block's K and V
      // (then kv_full's arrival) and in the edge query tile's Q and dO (then do_full's and the
      // copy thread's share of q_full's), once the copy engine has landed them (edge[])
      const int lane = threadIdx.x - 96;
      if (kv_edge) {
        kc::mbar_wait(&edge[0], 0);
        hopper_common::zero_rows(kc::smem_u32(sm + L::kK), L::kPanels, L::kKVPanel, nk() - k0, kBlockN, lane);
        hopper_common::zero_rows(kc::smem_u32(sm + L::kV), L::kPanels, L::kKVPanel, nk() - k0, kBlockN, lane);
        if (lane == 0) kc::mbar_arrive(kv_full);
      }
      if (it_edge >= 0) {
        // the edge tile: the last (j_end - 1, at step it_edge)
        const int s = it_edge % kStages, sd = it_edge % L::kDoStages, r0 = sq.nq - (j_end - 1) * kBlockM;
        kc::mbar_wait(&edge[1], 0);
        hopper_common::zero_rows(kc::smem_u32(sm + L::kQ + s * L::kQBytes), L::kPanels, L::kQPanel, r0, kBlockM, lane);
        hopper_common::zero_rows(kc::smem_u32(sm + L::kDo + sd * L::kQBytes), L::kPanels, L::kQPanel, r0, kBlockM,
                                 lane);
        if (lane == 0) {
          kc::mbar_arrive(&do_full[sd]);
          kc::mbar_arrive(&q_full[s]);
        }
      }
    }
    // warp 2: the dQ writer. Deterministic (not kSplit): warps 2 and 3 take the tiles of buffers 0
    // and 1, so that one tile's wait for its adds to land (before the next key block's turn) runs
    // beside the next tile's turn and adds (warp 3 after its packed-sequence rows: step 0's)
    constexpr bool kTwoWriters = kDeterministic && !L::kSplit;
    if (threadIdx.x == 64 || (kTwoWriters && threadIdx.x == 96)) {
      const int writer = threadIdx.x == 64 ? 0 : 1;
      Step st = begin();
      for (int it = 0; it < n_steps; ++it, next(st)) {
        if (kTwoWriters && (it & 1) != writer) continue;
        int* sem = nullptr;
        int turn = kb;  // the key blocks before this one that reach the tile (above)
        // hand-off i of the tile: kSplit, consumer i % 2's next 64 columns (buffer i % 2,
        // columns 128 (i % 2) + 64 (i / 2)); else both consumers' d columns, buffer it % 2
        constexpr int kHandoffs = L::kSplit ? 4 : 1;
#pragma unroll 1
        for (int i = 0; i < kHandoffs; ++i) {
          const int buf = L::kSplit ? i % 2 : it & 1, use = L::kSplit ? 2 * it + i / 2 : it >> 1;
          kc::mbar_wait(&dq_full[buf], use & 1);
          if (kDeterministic && i == 0) {
            sem = a.dq_sem + (int64_t(b) * a.H + st.h) * n_qt_all + st.j;
            if constexpr (kLocal) turn = kb - max(0, st.j * kBlockM - band.wl) / kBlockN;
            if (rotate) {  // the blocks reach tile j in the order m1, m1 - 1, .., 0, nb - 1, .., m1 + 1,
              // m1 the last block starting at or before it (s_m <= j)
              const int m1 = int((unsigned(st.j + 1) * n_kb + n_qt - 1) / n_qt) - 1;
              turn = m1 >= kb ? m1 - kb : m1 - kb + n_kb;
            }
            while (load_acquire(sem) != turn) {
            }
          }
          const int col0 = L::kSplit ? 128 * (i % 2) + 64 * (i / 2) : 0;
#pragma unroll
          for (int j = 0; j < L::kDqBytes / L::kDqBox; ++j)
            if (col0 + 32 * j < a.d)
              kc::tma_reduce_add_4d(&a.dq_accum, sm + L::kDq + buf * L::kDqBytes + j * L::kDqBox, col0 + 32 * j,
                                    qs + st.j * kBlockM, st.h, mb);
          kc::bulk_commit();
          if (kDeterministic && i == kHandoffs - 1) {  // the adds landed, then the next key block's turn
            kc::bulk_wait<0>();
            asm volatile("fence.proxy.async.global;\n" ::: "memory");
            __threadfence();
            store_release(sem, turn + 1);
          } else {
            kc::bulk_wait_read<0>();
          }
          kc::mbar_arrive(&dq_empty[buf]);
        }
      }
    }
    if (threadIdx.x == 0) {
      uint64_t* kvb = kv_edge ? &edge[0] : kv_full;
      kc::mbar_arrive_expect_tx(kvb, 2 * L::kKVBytes);
      for (int p = 0; p < L::kPanels; ++p) {
        kc::tma_load_4d(sm + L::kK + p * L::kKVPanel, &a.k, kvb, p * 64, ks + k0, hk, mb);
        kc::tma_load_4d(sm + L::kV + p * L::kKVPanel, &a.v, kvb, p * 64, ks + k0, hk, mb);
      }
      Step st = begin();
      for (int it = 0; it < n_steps; ++it, next(st)) {
        const int q0 = st.j * kBlockM, h = st.h, s = it % kStages, sd = it % L::kDoStages;
        const bool qe = it == it_edge;
        if (it >= kStages) kc::mbar_wait(&empty[s], ((it / kStages) - 1) & 1);
        // the edge tile: both loads complete edge[1], and warp 3 arrives on q_full, do_full
        uint64_t* qb = qe ? &edge[1] : &q_full[s];
        uint64_t* dob = qe ? &edge[1] : &do_full[sd];
        kc::mbar_arrive_expect_tx(qb, qe ? 2 * L::kQBytes : L::kQBytes);
        for (int p = 0; p < L::kPanels; ++p)
          kc::tma_load_4d(sm + L::kQ + s * L::kQBytes + p * L::kQPanel, &a.q, qb, p * 64, qs + q0, h, mb);
        if (L::kSplit && it >= L::kDoStages) kc::mbar_wait(&do_empty[sd], ((it / L::kDoStages) - 1) & 1);
        if (!qe) kc::mbar_arrive_expect_tx(&do_full[sd], L::kQBytes);
        for (int p = 0; p < L::kPanels; ++p)
          kc::tma_load_4d(sm + L::kDo + sd * L::kQBytes + p * L::kQPanel, &a.dout, dob, p * 64, qs + q0, h, mb);
      }
    }
    return;
  }

  // ------------------------------------------------------------------------ consumers
  kc::warpgroup_reg_alloc<L::kConsumerRegs>();
  const int w = wg - 1, tid = threadIdx.x - 128 * wg, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  // this thread's keys: key_local and + 8 (within the block); its dK, dV columns from col0
  const int key_local = (L::kSplit ? 0 : 64 * w) + 16 * warp + g, col0 = L::kSplit ? 128 * w : 0;
  float dk[L::kAccCols / 2], dv[L::kAccCols / 2];
#pragma unroll
  for (int i = 0; i < L::kAccCols / 2; ++i) dk[i] = dv[i] = 0.f;

  if constexpr (L::kSplit) {
    // kD = 256: consumer w takes the tile's queries 32 w .. 32 w + 31 for S^T and dP^T (all
    // 64 keys x its 32 queries), stores its halves of P^T and dS^T (T, rows = keys, as dS^T
    // below) and, once both halves are in shared memory, adds its columns 128 w .. of dV and
    // dK (A = P^T, dS^T from shared memory, K-major) and computes its 128 columns of dQ in two
    // 64-column products, each staged in its buffer for the writer.
    using S32 = kc::WgmmaOp<T, 32>;
    using Acc = kc::WgmmaOp<T, 128>;
    using Dq = kc::WgmmaOp<T, 64>;
    const int qw = 32 * w;  // this consumer's first query of the tile
    const uint64_t d_k = kc::gmma_desc_sw128(sm + L::kK, 16, 1024);              // A of S^T (K-major)
    const uint64_t d_v = kc::gmma_desc_sw128(sm + L::kV, 16, 1024);              // A of dP^T
    const uint64_t d_q = kc::gmma_desc_sw128(sm + L::kQ + qw * 128, 16, 1024);   // B of S^T: its 32 queries
    const uint64_t d_do = kc::gmma_desc_sw128(sm + L::kDo + qw * 128, 16, 1024); // B of dP^T
    const uint64_t d_pt = kc::gmma_desc_sw128(sm + L::kP, 16, 1024);             // A of dV (K-major)
    const uint64_t d_dst = kc::gmma_desc_sw128(sm + L::kDs, 16, 1024);           // A of dK (K-major)
    const uint64_t d_ds = kc::gmma_desc_sw128(sm + L::kDs, L::kDsBytes, 1024);   // A of dQ (MN-major)
    const uint64_t d_q_mn = kc::gmma_desc_sw128(sm + L::kQ + 2 * w * L::kQPanel, L::kQPanel, 1024);    // B of dK
    const uint64_t d_do_mn = kc::gmma_desc_sw128(sm + L::kDo + 2 * w * L::kQPanel, L::kQPanel, 1024);  // B of dV
    const uint64_t d_k_mn = kc::gmma_desc_sw128(sm + L::kK + 2 * w * L::kKVPanel, L::kKVPanel, 1024);  // B of dQ
    kc::mbar_wait(kv_full, 0);
    Step st = begin();
#pragma unroll 1
    for (int it = 0; it < n_steps; ++it, next(st)) {
      const int s = it % kStages, sd = it % L::kDoStages, q0 = st.j * kBlockM, buf = it & 1;
      const float* rows = reinterpret_cast<const float*>(sm + L::kRows) + s * 2 * kBlockM;  // lse2, D of the tile
      float sacc[16], dpacc[16];
      // K's and V's descriptors, loop-invariant: redefined each tile, so that their 32 k-step
      // values are not hoisted into registers
      uint64_t dk_desc = d_k, dv_desc = d_v;
      asm volatile("" : "+l"(dk_desc), "+l"(dv_desc));
      kc::mbar_wait(&q_full[s], (it / kStages) & 1);
      // S^T = K Q^T or dP^T = V dO^T for this consumer's 32 queries: one wgmma group over d
      auto scores = [&](float(&acc)[16], uint64_t a, uint64_t b, int stage) {
#pragma unroll
        for (int kk = 0; kk < kD / 16; ++kk) {
          const int off = (kk / 4) * L::kKVPanel + (kk % 4) * 32;
          S32::template ss<0, 0>(acc, a + off / 16,
                                 b + (stage * L::kQBytes + (kk / 4) * L::kQPanel + (kk % 4) * 32) / 16, kk > 0);
        }
        kc::wgmma_commit();
      };
      kc::fence_operands(sacc);
      kc::wgmma_fence();
      scores(sacc, dk_desc, d_q, s);
      kc::mbar_wait(&do_full[sd], (it / L::kDoStages) & 1);
      kc::fence_operands(dpacc);
      scores(dpacc, dv_desc, d_do, sd);
      float lse2[8], dsum[8];  // of this thread's query columns qw + 8 c + 2 t + e
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float2 x = *reinterpret_cast<const float2*>(rows + qw + 8 * c + 2 * t);
        lse2[2 * c] = x.x;
        lse2[2 * c + 1] = x.y;
      }
      kc::wgmma_wait<1>();
      kc::fence_operands(sacc);
      const bool crosses = (kCausal && q0 < k0 + kBlockN) ||
                           (kLocal && (k0 + kBlockN - 1 > q0 + band.wr || k0 < q0 + kBlockM - 1 - band.wl)) ||
                           (kVarlen && k0 + kBlockN > nk());
      // P^T as T to shared memory (A of dV); sacc keeps P^T (kSoftcap: P^T (1 - t^2), dS^T's part)
      // row = key (128-byte rows of 64 queries), 16-byte chunk 4 w + c swizzled with key % 8, by
      // stmatrix: pack[kk] holds the 8x8 tiles i = 2 (c % 2) + r of chunks c = 2 kk, 2 kk + 1,
      // and lane 8 i + j gives row j of tile i (key 16 warp + 8 (i % 2) + j, chunk
      // (4 w + 2 kk + i / 2) ^ j: the lane's kk = 0 address with bit 5 XOR kk), from a base
      // computed each tile (as dq_row)
      const int mi = lane / 8, mj = lane % 8;
      uint32_t pt_lane = kc::smem_u32(sm + L::kP + buf * L::kDsBytes) + (16 * warp + 8 * (mi & 1) + mj) * 128 +
                         (((4 * w + (mi >> 1)) ^ mj) << 4);
      asm volatile("" : "+r"(pt_lane));
      uint32_t pack[2][4];
      flash::with_mask(crosses, [&](auto masked) {
#pragma unroll
        for (int c = 0; c < 4; ++c)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            float pe[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float x = sacc[4 * c + 2 * r + e];
              if constexpr (kSoftcap) x = flash::tanh_fast(x * a.cap_in);
              float pv = flash::fast_exp2(fmaf(x, a.scale_log2, -lse2[2 * c + e]));
              if constexpr (decltype(masked)::value) {
                const int key = k0 + key_local + 8 * r, q = q0 + qw + 8 * c + 2 * t + e;
                if ((kCausal && key > q) || (kLocal && (key > q + band.wr || key < q - band.wl)) ||
                    (kVarlen && key >= nk()))
                  pv = 0.f;
              }
              pe[e] = pv;
              if constexpr (kSoftcap) pv *= 1.f - x * x;  // d(softcap t) / d(scale q.k) = 1 - t^2
              sacc[4 * c + 2 * r + e] = pv;
            }
            pack[c / 2][(c % 2) * 2 + r] = flash::pack2<T>(pe[0], pe[1]);
          }
      });
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) flash::stmatrix_x4(pt_lane ^ (kk << 5), pack[kk]);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float2 x = *reinterpret_cast<const float2*>(rows + kBlockM + qw + 8 * c + 2 * t);
        dsum[2 * c] = x.x;
        dsum[2 * c + 1] = x.y;
      }
      // dS^T = P^T (scale dP^T - scale D), to shared memory (A of dK and dQ)
      kc::wgmma_wait<0>();
      kc::fence_operands(dpacc);
#pragma unroll
      for (int c = 0; c < 4; ++c)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float d0 = sacc[4 * c + 2 * r] * fmaf(dpacc[4 * c + 2 * r], a.scale, -dsum[2 * c]);
          const float d1 = sacc[4 * c + 2 * r + 1] * fmaf(dpacc[4 * c + 2 * r + 1], a.scale, -dsum[2 * c + 1]);
          pack[c / 2][(c % 2) * 2 + r] = flash::pack2<T>(d0, d1);
        }
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) flash::stmatrix_x4((pt_lane - uint32_t(L::kP - L::kDs)) ^ (kk << 5), pack[kk]);
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      kc::named_barrier_sync(kDsBar, 128 * kConsumers);  // both halves of P^T and dS^T are in shared memory
      // dV += P^T dO, dK += dS^T Q (its 128 columns), dQ = dS K (its columns, two halves: the
      // second issued once the first is stored, as dV, dK and both halves of dQ in registers at
      // once spilled)
      float dq[32];
      kc::fence_operands(dv);
      kc::fence_operands(dk);
      kc::fence_operands(dq);
      kc::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk)
        Acc::template ss<0, 1>(dv, d_pt + (buf * L::kDsBytes + kk * 32) / 16,
                               d_do_mn + (sd * L::kQBytes + kk * 2048) / 16, 1);
      kc::wgmma_commit();
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk)
        Acc::template ss<0, 1>(dk, d_dst + (buf * L::kDsBytes + kk * 32) / 16,
                               d_q_mn + (s * L::kQBytes + kk * 2048) / 16, 1);
      kc::wgmma_commit();
      // this thread's first address in its dQ buffer, computed each tile: loop-invariant, its 16
      // swizzled store addresses would be hoisted into registers (the consumers spilled)
      uint32_t dq_row = kc::smem_u32(sm + L::kDq + w * L::kDqBytes) + (16 * warp + g) * 128 + 8 * t;
      asm volatile("" : "+r"(dq_row));
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        if (half > 0) {
          kc::fence_operands(dq);
          kc::wgmma_fence();
        }
        dq_product<Dq, L>(dq, d_ds, d_k_mn, buf, half * L::kKVPanel);
        kc::wgmma_commit();
        if (half == 0) {
          kc::wgmma_wait<2>();
          kc::mbar_arrive(&do_empty[sd]);  // dO of this stage is no longer read
          kc::wgmma_wait<1>();
          kc::mbar_arrive(&empty[s]);  // nor Q
        }
        kc::wgmma_wait<0>();
        kc::fence_operands(dq);
        // to this consumer's buffer once the writer has read the last (a fresh barrier's parity 1 passes)
        kc::mbar_wait(&dq_empty[w], (2 * it + half + 1) & 1);
        // spread stores: the default kernel 6% faster at causal N 4096, the deterministic one (one
        // writer) 6% slower, not profiled; it keeps the conflicting order
        store_swizzled_f32<8, kVarlen, !kDeterministic>(dq_row, g, dq, 16 * warp + g, sq.nq - q0);
        kc::fence_async_shared();
        kc::mbar_arrive(&dq_full[w]);
      }
      kc::fence_operands(dk);
      kc::fence_operands(dv);
    }
  } else {
    using Sq = kc::WgmmaOp<T, kBlockM>;  // 64 x 64 score tiles
    using Acc = kc::WgmmaOp<T, kD>;      // dK, dV: 64 keys x d
    constexpr bool kTurns = L::kTurns;
    // kTurns: which consumer owns a tile's dQ, from w as the compiler sees it uniform over the
    // warp (kc::warpgroup_index): from threadIdx.x the branch around dQ's product is a divergent
    // path to ptxas, and it serialized every wgmma (C7520)
    const int w_uniform = kTurns ? kc::warpgroup_index() - 1 : w;
    // this warpgroup's columns of dQ (kOne: all; kTurns: all, 64 at a time)
    using Dq = kc::WgmmaOp<T, kTurns ? 64 : kD / kConsumers>;
    // Descriptors at k-step 0 (stage 0, dS buffer 0); steps add byte offsets / 16.
    const uint64_t d_k = kc::gmma_desc_sw128(sm + L::kK + w * 64 * 128, 16, 1024);    // A of S^T (K-major)
    const uint64_t d_v = kc::gmma_desc_sw128(sm + L::kV + w * 64 * 128, 16, 1024);    // A of dP^T
    const uint64_t d_q = kc::gmma_desc_sw128(sm + L::kQ, 16, 1024);                    // B of S^T (K-major)
    const uint64_t d_do = kc::gmma_desc_sw128(sm + L::kDo, 16, 1024);                  // B of dP^T
    const uint64_t d_q_mn = kc::gmma_desc_sw128(sm + L::kQ, L::kQPanel, 1024);         // B of dK (MN-major)
    const uint64_t d_do_mn = kc::gmma_desc_sw128(sm + L::kDo, L::kQPanel, 1024);       // B of dV (MN-major)
    const uint64_t d_ds = kc::gmma_desc_sw128(sm + L::kDs, L::kDsBytes, 1024);  // A of dQ (MN-major)
    // B of dQ (MN-major): K's columns w d/2 .. : the next panel (d = 128), or 64 bytes into
    // the 128-byte rows (d = 64; the swizzle is a function of the address, so a start inside
    // a row reads the same layout, as the K-major k-steps' 32-byte starts do)
    const int dq_col0 = kTurns ? 0 : w * kD / kConsumers;
    const uint64_t d_k_mn =
        kc::gmma_desc_sw128(sm + L::kK + (dq_col0 / 64) * L::kKVPanel + (dq_col0 % 64) * 2, L::kKVPanel, 1024);

    float sacc[kBlockM / 2], dpacc[kBlockM / 2];
    // S^T and dP^T of step it: two wgmma groups
    auto issue_sdp = [&](int it) {
      const int s = it % kStages, par = (it / kStages) & 1;
      kc::mbar_wait(&q_full[s], par);
      auto scores = [&](float(&acc)[kBlockM / 2], uint64_t a, uint64_t b) {
#pragma unroll
        for (int kk = 0; kk < kD / 16; ++kk) {
          const int off = (kk % 4) * 32;
          Sq::template ss<0, 0>(acc, a + ((kk / 4) * L::kKVPanel + off) / 16,
                                b + (s * L::kQBytes + (kk / 4) * L::kQPanel + off) / 16, kk > 0);
        }
        kc::wgmma_commit();
      };
      kc::fence_operands(sacc);
      kc::wgmma_fence();
      scores(sacc, d_k, d_q);
      kc::mbar_wait(&do_full[s], par);
      kc::fence_operands(dpacc);
      scores(dpacc, d_v, d_do);
    };

    // A tile's dQ goes to the writer (dq_full) once its shared-memory stores are visible to the
    // copy engine: the fence waits for them. At d = 64 that wait stalled every tile, so there the
    // hand-off comes in the next tile, once its S^T is done (2% at the GPT-2 and small-Llama
    // shapes); at d = 128 with dQ by turns 1% (the owner's next tile), with halves no gain; the
    // deterministic chain runs slower with a later writer (there a tile's owner hands it off).
    constexpr bool kLateHandoff = !kDeterministic && (kD == 64 || kTurns);
    // whether tile i's dQ is this consumer's to compute whole and hand off (kTurns), else its half
    auto owns = [&](int i) { return !kTurns || w_uniform == (i & 1); };
    auto hand_off = [&](int i) {
      kc::fence_async_shared();
      kc::mbar_arrive(&dq_full[i & 1]);
    };
    kc::mbar_wait(kv_full, 0);
    Step st = begin();
    for (int it = 0; it < n_steps; ++it, next(st)) {
      const int s = it % kStages, q0 = st.j * kBlockM, buf = it & 1;  // buf: dS^T's and dQ's buffer
      const float* rows = reinterpret_cast<const float*>(sm + L::kRows) + s * 2 * kBlockM;  // lse2, D of the tile
      issue_sdp(it);
      // lse of this thread's 16 query columns 8 c + 2 t + e, loaded while S^T is computed
      // (loaded after the wait, their latency stalled every tile).
      float lse2[16];
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const float2 x = *reinterpret_cast<const float2*>(rows + 8 * c + 2 * t);
        lse2[2 * c] = x.x;
        lse2[2 * c + 1] = x.y;
      }

      // P^T = exp2(S^T scale log2(e) - lse log2(e)), 0 above the causal diagonal or outside the window
      kc::wgmma_wait<1>();
      kc::fence_operands(sacc);
      if constexpr (kLateHandoff)
        if (it > 0 && owns(it - 1)) hand_off(it - 1);
      // the mask on a tile crossing the diagonal or a window's edge only (flash::with_mask), and
      // packed sequences' last key block (the keys past the sequence are the next one's)
      const bool crosses = (kCausal && q0 < k0 + kBlockN) ||
                           (kLocal && (k0 + kBlockN - 1 > q0 + band.wr || k0 < q0 + kBlockM - 1 - band.wl)) ||
                           (kVarlen && k0 + kBlockN > nk());
      // P^T as T, the A operand of dV's product (the accumulator layout is the A layout). kSoftcap:
      // packed here, and sacc keeps P^T (1 - t^2), the part of dS^T that needs t (no registers
      // held for t until dS^T's step: d = 128 spilled so).
      uint32_t pa[kBlockM / 16][4];
      flash::with_mask(crosses, [&](auto masked) {
#pragma unroll
        for (int c = 0; c < kBlockM / 8; ++c) {
          [[maybe_unused]] float p_lo = 0.f;  // kSoftcap: the pair's first P^T, until packed
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float x = sacc[4 * c + e];
            if constexpr (kSoftcap) x = flash::tanh_fast(x * a.cap_in);
            float pv = flash::fast_exp2(fmaf(x, a.scale_log2, -lse2[2 * c + (e & 1)]));
            if constexpr (decltype(masked)::value) {
              const int key = k0 + key_local + 8 * (e >> 1), q = q0 + 8 * c + 2 * t + (e & 1);
              if ((kCausal && key > q) || (kLocal && (key > q + band.wr || key < q - band.wl)) ||
                  (kVarlen && key >= nk()))
                pv = 0.f;
            }
            if constexpr (kSoftcap) {  // d(softcap t) / d(scale q.k) = 1 - t^2
              if (e & 1)
                pa[c / 2][(c % 2) * 2 + (e >> 1)] = flash::pack2<T>(p_lo, pv);
              else
                p_lo = pv;
              pv *= 1.f - x * x;
            }
            sacc[4 * c + e] = pv;
          }
        }
      });
      if constexpr (!kSoftcap)
#pragma unroll
        for (int kk = 0; kk < kBlockM / 16; ++kk)
#pragma unroll
          for (int i = 0; i < 4; ++i) pa[kk][i] = flash::pack2<T>(sacc[8 * kk + 2 * i], sacc[8 * kk + 2 * i + 1]);
      float dsum[16];  // D of the same columns
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const float2 x = *reinterpret_cast<const float2*>(rows + kBlockM + 8 * c + 2 * t);
        dsum[2 * c] = x.x;
        dsum[2 * c + 1] = x.y;
      }
      // dV += P^T dO
      kc::fence_operands(dv);
      kc::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk)
        Acc::template rs<1>(dv, pa[kk], d_do_mn + (s * L::kQBytes + kk * 2048) / 16, 1);
      kc::wgmma_commit();

      // dS^T = P^T (scale dP^T - scale D), to registers (A of dK) and to shared memory (A of dQ)
      kc::wgmma_wait<1>();
      kc::fence_operands(dpacc);
      uint32_t dsa[kBlockM / 16][4];
#pragma unroll
      for (int c = 0; c < kBlockM / 8; ++c)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float d0 = sacc[4 * c + 2 * r] * fmaf(dpacc[4 * c + 2 * r], a.scale, -dsum[2 * c]);
          const float d1 = sacc[4 * c + 2 * r + 1] * fmaf(dpacc[4 * c + 2 * r + 1], a.scale, -dsum[2 * c + 1]);
          dsa[c / 2][(c % 2) * 2 + r] = flash::pack2<T>(d0, d1);
        }
      // to shared memory by stmatrix, row = key (128-byte rows of 64 queries), 16-byte chunk c
      // swizzled with key % 8: dsa[kk] holds the 8x8 tiles i = 2 (c % 2) + r of chunks c = 2 kk,
      // 2 kk + 1, and lane 8 i + j gives row j of tile i (key key_local - g + 8 (i % 2) + j,
      // chunk (2 kk + i / 2) ^ j: the lane's kk = 0 address with bits 5-6 XOR kk)
      const int mi = lane / 8, mj = lane % 8;
      const uint32_t ds_lane = kc::smem_u32(sm + L::kDs + buf * L::kDsBytes) +
                               (key_local - g + 8 * (mi & 1) + mj) * 128 + (((mi >> 1) ^ mj) << 4);
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) flash::stmatrix_x4(ds_lane ^ (kk << 5), dsa[kk]);
      // dK += dS^T Q
      kc::fence_operands(dk);
      kc::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk)
        Acc::template rs<1>(dk, dsa[kk], d_q_mn + (s * L::kQBytes + kk * 2048) / 16, 1);
      kc::wgmma_commit();

      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      if constexpr (kTurns) {
        // The tile's owner (consumer it % 2) computes all of dQ = dS K once both halves of dS^T
        // are in shared memory; the other passes its half on before its own dV and dK products
        // land (the owner needs none of them) and goes to the next tile. Two barriers by tile
        // parity: one barrier would let the other consumer's arrival of the next tile count in
        // this one.
        const bool own = owns(it);
        kc::named_barrier_arrive_if(kTurnBar + buf, 128 * kConsumers, !own);
        kc::wgmma_wait<0>();
        kc::fence_operands(dk);
        kc::fence_operands(dv);
        kc::mbar_arrive(&empty[s]);  // Q and dO of this stage are no longer read
        kc::named_barrier_sync_if(kTurnBar + buf, 128 * kConsumers, own);
        if (own) {
          // kD / 64 products of 64 columns, one after the other (d = 128: no registers for both)
#pragma unroll
          for (int panel = 0; panel < kD / 64; ++panel) {
            float dq[32];
            kc::fence_operands(dq);
            kc::wgmma_fence();
            dq_product<Dq, L>(dq, d_ds, d_k_mn, buf, panel * L::kKVPanel);
            kc::wgmma_commit();
            kc::wgmma_wait<0>();
            kc::fence_operands(dq);
            // to the owner's buffer, once the writer has read what it held two tiles ago
            if (panel == 0 && it >= 2) kc::mbar_wait(&dq_empty[buf], ((it >> 1) - 1) & 1);
            const uint32_t dq_row = kc::smem_u32(sm + L::kDq + buf * L::kDqBytes) + panel * 2 * L::kDqBox +
                                    (16 * warp + g) * 128 + 8 * t;
            store_swizzled_f32<8, kVarlen>(dq_row, g, dq, 16 * warp + g, sq.nq - q0);
          }
          if constexpr (!kLateHandoff) hand_off(it);  // deterministic
        }  // else handed off in the owner's next tile
      } else {
        // dQ = dS K (this warpgroup's columns), once both consumers' dS^T is in shared memory
        kc::named_barrier_sync(kDsBar, 128 * kConsumers);
        float dq[kD / (2 * kConsumers)];
        kc::fence_operands(dq);
        kc::wgmma_fence();
        dq_product<Dq, L>(dq, d_ds, d_k_mn, buf, 0);
        kc::wgmma_commit();
        kc::wgmma_wait<0>();
        kc::fence_operands(dq);
        kc::fence_operands(dk);
        kc::fence_operands(dv);
        kc::mbar_arrive(&empty[s]);  // Q and dO of this stage are no longer read

        // dQ (this consumer's d / 2 columns; kOne: all d) to this iteration's shared tile, free
        // once the writer has read what it held two tiles ago; then the writer's turn (hand_off).
        if (it >= 2) kc::mbar_wait(&dq_empty[buf], ((it >> 1) - 1) & 1);
        const uint32_t dq_row =
            kc::smem_u32(sm + L::kDq + buf * L::kDqBytes) + (dq_col0 / 32) * L::kDqBox + (16 * warp + g) * 128 + 8 * t;
        store_swizzled_f32<kD / (8 * kConsumers), kVarlen>(dq_row, g, dq, 16 * warp + g, sq.nq - q0);
        if constexpr (!kLateHandoff) hand_off(it);
      }
    }
    if constexpr (kLateHandoff)
      if (n_steps > 0 && owns(n_steps - 1)) hand_off(n_steps - 1);
  }

  // dK (dS^T carried the softmax scale) and dV, rows < Nk.
  if (!kDeterministic && a.split) {
    // A group split over CTAs: the group's G / hpc CTAs of this key block add their fp32
    // dK, dV into the (2, B, Hk, Nk, d) accumulator by the copy engine, in whatever order they
    // come (as dQ's adds); flash_bwd.cu then converts it. Both consumers stage their tiles in
    // shared memory (the K, V, Q, dO buffers: every product is done once both are past the
    // barrier), swizzled as dQ's, then one thread adds them.
    constexpr int kTile = (L::kAccCols / 32) * L::kDqBox;  // a consumer's dK or dV: 64 keys x kAccCols fp32
    kc::named_barrier_sync(kDsBar, 128 * kConsumers);
    const uint32_t tiles = kc::smem_u32(sm) + (16 * warp + g) * 128 + 8 * t;  // tile (matrix * 2 + w)
    store_swizzled_f32<L::kAccCols / 8, kVarlen>(tiles + w * kTile, g, dk, key_local, nk() - k0);
    store_swizzled_f32<L::kAccCols / 8, kVarlen>(tiles + (kConsumers + w) * kTile, g, dv, key_local, nk() - k0);
    kc::fence_async_shared();
    kc::named_barrier_sync(kDsBar, 128 * kConsumers);
    if (threadIdx.x == 128) {
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int ww = 0; ww < kConsumers; ++ww)
#pragma unroll
          for (int j = 0; j < L::kAccCols / 32; ++j) {
            // consumer ww's tile: its 64 keys (kSplit: its 128 columns)
            const int col = (L::kSplit ? 128 * ww : 0) + 32 * j, row = ks + k0 + (L::kSplit ? 0 : 64 * ww);
            if (col < a.d)
              kc::tma_reduce_add_4d(&a.dkv_accum, sm + (m * kConsumers + ww) * kTile + j * L::kDqBox, col, row, hk,
                                    kVarlen ? m : m * a.B + b);
          }
      kc::bulk_commit();
      kc::bulk_wait_read<0>();  // shared memory read before the CTA exits (the adds land on their own)
    }
    return;
  }
  if (kVarlen && !a.split && k0 + kBlockN > nk()) {
    // Packed sequences, the whole group, the sequence's last key block: its rows past the sequence
    // are the next one's, so each thread stores its own rows below the end (a tile store of the
    // whole block would write the next sequence's rows)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = k0 + key_local + 8 * r;
      if (key >= nk()) continue;
      const int64_t at = int64_t(ks + key) * a.dk_sr + hk * a.dk_sh;
#pragma unroll
      for (int c = 0; c < L::kAccCols / 8; ++c) {
        const int col = col0 + 8 * c + 2 * t;
        if (col >= a.d) continue;
        *reinterpret_cast<uint32_t*>(static_cast<T*>(a.dk_ptr) + at + col) =
            flash::pack2<T>(dk[4 * c + 2 * r], dk[4 * c + 2 * r + 1]);
        *reinterpret_cast<uint32_t*>(static_cast<T*>(a.dv_ptr) + at + col) =
            flash::pack2<T>(dv[4 * c + 2 * r], dv[4 * c + 2 * r + 1]);
      }
    }
    return;
  }
  if (!a.split) {
    // The whole group (multi-head attention: its one head): dK and dV as T into the K and V buffers, in the
    // layout the copy engine loaded K and V in (rows = keys, 128-byte swizzled panels of 64
    // columns; each thread's 4-byte pairs spread over all banks, as dS^T's), then one thread
    // stores both through the dk, dv maps (rows past Nk are not written). Written by every
    // thread straight to global memory instead, 16 bytes a row a warp instruction, these
    // stores stalled the CTA's end for about a tile's time at N = 1024.
    kc::named_barrier_sync(kDsBar, 128 * kConsumers);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = key_local + 8 * r;
#pragma unroll
      for (int c = 0; c < L::kAccCols / 8; ++c) {
        const int cg = col0 / 8 + c;  // the 8-column group
        const int at = (cg / 8) * L::kKVPanel + row * 128 + (((cg % 8) ^ g) << 4) + 4 * t;
        *reinterpret_cast<uint32_t*>(sm + L::kK + at) =
            flash::pack2<T>(dk[4 * c + 2 * r], dk[4 * c + 2 * r + 1]);
        *reinterpret_cast<uint32_t*>(sm + L::kV + at) = flash::pack2<T>(dv[4 * c + 2 * r], dv[4 * c + 2 * r + 1]);
      }
    }
    kc::fence_async_shared();
    kc::named_barrier_sync(kDsBar, 128 * kConsumers);
    if (threadIdx.x == 128) {
#pragma unroll
      for (int p = 0; p < L::kPanels; ++p) {
        kc::tma_store_4d(&a.dk, sm + L::kK + p * L::kKVPanel, p * 64, ks + k0, hk, mb);
        kc::tma_store_4d(&a.dv, sm + L::kV + p * L::kKVPanel, p * 64, ks + k0, hk, mb);
      }
      kc::bulk_commit();
      kc::bulk_wait_read<0>();
    }
    return;
  }
  // A split group, deterministic: fp32 partials of this CTA's heads (split (h0 % group) / hpc of
  // kv head b * Hk + hk), which flash_bwd.cu's bwd_convert_kernel sums over the group in a fixed
  // order. Packed sequences: one batch of total_k key rows.
  const int64_t nkd = int64_t(kVarlen ? a.total_k : a.Nk) * a.d;
  const int splits = a.group / a.hpc;
  const int64_t part = (int64_t(mb) * (a.H / a.group) + hk) * splits + (h0 % a.group) / a.hpc;  // (kv head, split)
  // dV's partials follow dK's (B H / hpc Nk d floats)
  const int64_t v_off = int64_t(kVarlen ? units : a.order.bh) * nkd;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = k0 + key_local + 8 * r;
    if (key >= nk()) continue;
#pragma unroll
    for (int c = 0; c < L::kAccCols / 8; ++c) {
      const int col = col0 + 8 * c + 2 * t;
      if (col >= a.d) continue;
      float* pk = a.dkv_partial + part * nkd + int64_t(ks + key) * a.d + col;
      *reinterpret_cast<float2*>(pk) = make_float2(dk[4 * c + 2 * r], dk[4 * c + 2 * r + 1]);
      *reinterpret_cast<float2*>(pk + v_off) = make_float2(dv[4 * c + 2 * r], dv[4 * c + 2 * r + 1]);
    }
  }
#else
  __trap();
#endif
}

template <typename T, int kD, bool kCausal, bool kLocal, bool kSoftcap, bool kDet, bool kVarlen = false>
cudaError_t launch(const FusedParams& p, cudaStream_t stream) {
  using L = LayoutOf<kD, kLocal, kDet>;
  constexpr int kBlockN = L::kBlockN;
  Args a;
  // Packed sequences: maps over all rows, one "batch"
  const int64_t mq = kVarlen ? p.total_q : p.Nq, mk = kVarlen ? p.total_k : p.Nk, mB = kVarlen ? 1 : p.B;
  auto rows = [&](const View4& x, int64_t n) { return kVarlen ? hopper_common::packed_rows(x, n) : x; };
  if (hopper_common::make_map<T>(&a.q, rows(p.q, mq), mB, p.H, mq, p.d, kBlockM) != cudaSuccess ||
      hopper_common::make_map<T>(&a.dout, rows(p.dout, mq), mB, p.H, mq, p.d, kBlockM) != cudaSuccess ||
      hopper_common::make_map<T>(&a.k, rows(p.k, mk), mB, p.Hk, mk, p.d, kBlockN) != cudaSuccess ||
      hopper_common::make_map<T>(&a.v, rows(p.v, mk), mB, p.Hk, mk, p.d, kBlockN) != cudaSuccess)
    return cudaErrorNotSupported;  // e.g. a zero stride: the caller runs version 1
  a.lse = p.lse;
  a.dsum = p.dsum;
  // dq_accum: the workspace, or a float32 dq itself in its own layout (dq_direct: dense, zeroed by
  // the pre-kernel)
  const View4 dq_layout = rows(View4{p.dq_accum, p.dq_sb, p.dq_sh, p.dq_sr, 1}, mq);
  if (p.d > kD || hopper_common::make_accum_map(&a.dq_accum, p.dq_accum, mB, p.H, mq, p.d, kBlockM,
                                                p.dq_direct ? &dq_layout : nullptr) != cudaSuccess)
    return cudaErrorNotSupported;
  // heads_per_cta (fused_backward_plan): q heads a CTA runs, a divisor of the group (1 where
  // packed sequences run here); fewer than the group: the workspace its splits sum in
  const int64_t group = p.H / p.Hk, hpc = p.H == p.Hk ? 1 : p.heads_per_cta;
  if (hpc < 1 || group % hpc != 0 || (kVarlen && hpc != 1)) return cudaErrorInvalidValue;
  a.hpc = int(hpc);
  a.split = hpc < group;
  const View4 dk{p.dk, p.dk_sb, p.dk_sh, p.dk_sr, 1}, dv{p.dv, p.dk_sb, p.dk_sh, p.dk_sr, 1};
  if (!a.split && (hopper_common::make_map<T>(&a.dk, rows(dk, mk), mB, p.Hk, mk, p.d, kBlockN) != cudaSuccess ||
                   hopper_common::make_map<T>(&a.dv, rows(dv, mk), mB, p.Hk, mk, p.d, kBlockN) != cudaSuccess))
    return cudaErrorNotSupported;
  a.dkv_partial = p.dkv_partial;
  if (a.split && p.dkv_partial == nullptr) return cudaErrorInvalidValue;  // the plan says
  // the accumulator: the workspace's first 2 * B * Hk * Nk * d floats (the pre-kernel zeroed them),
  // dK's batches then dV's; boxes of 64 keys (a consumer's). Packed sequences: (2, Hk, total_k, d).
  if (a.split && !kDet &&
      hopper_common::make_accum_map(&a.dkv_accum, p.dkv_partial, 2 * mB, p.Hk, mk, p.d, 64) != cudaSuccess)
    return cudaErrorNotSupported;
  a.group = int(group);
  a.B = int(mB);
  a.H = int(p.H);
  a.Nq = int(p.Nq);
  a.Nk = int(p.Nk);
  a.scale = p.scale;
  a.scale_log2 = (kSoftcap ? p.softcap : p.scale) * kLog2e;
  a.dq_sem = p.dq_sem;
  a.w = hopper_common::band(p);
  a.cap_in = kSoftcap ? p.scale / p.softcap : 0.f;
  a.d = int(p.d);
  a.cu_q = p.cu_seqlens_q;
  a.cu_k = p.cu_seqlens_k;
  a.sw = hopper_common::seq_window(p);
  a.row_sh = p.row_sh;
  a.total_k = int(p.total_k);
  a.dk_ptr = p.dk;
  a.dv_ptr = p.dv;
  a.dk_sh = p.dk_sh;
  a.dk_sr = p.dk_sr;
  if (kDet && p.dq_sem == nullptr) return cudaErrorInvalidValue;
  auto kernel = hopper_bwd_kernel<T, kD, kCausal, kLocal, kSoftcap, kDet, kVarlen>;
  KC_CUDA_TRY(kc::allow_dynamic_smem(kernel, L::kBytes));
  const int64_t n_kt = (p.Nk + kBlockN - 1) / kBlockN;
  // Chunks of heads whose re-read bytes fit in a quarter of the L2: each key block of a CTA's
  // heads reads their Q and dO and adds into their fp32 dQ sums, all of the rows in full
  // attention, half of them on average under causal masking. Where key blocks differ in length
  // (causal, windows, packed sequences), chunks of at least four waves; in full attention every
  // block is as long as the others, and smaller chunks keep more of the L2 for each.
  const int64_t units = p.B * p.H / hpc;
  const bool even = !p.causal && !hopper_common::local(p) && p.cu_seqlens_q == nullptr;
  const int64_t reread = (2 * int64_t(sizeof(T)) + 4) * hpc * p.Nq * kD / (even ? 1 : 2);
  a.order = hopper_common::make_order(n_kt, units, reread, even ? 0 : 4 * L::kCtasPerSm, 4);
  // Deterministic full attention: the key blocks of a head wait on each other in both
  // directions (the kernel's rotate), so they launch together (one head a chunk) and run
  // only where a head's blocks fill at most half the GPU (room beside other streams' kernels);
  // elsewhere block n waits only for blocks launched before it.
  a.rotate = kDet && even && 2 * n_kt <= int64_t(kc::num_sms()) * L::kCtasPerSm;
  if (a.rotate) a.order.one_head_a_chunk();
  kernel<<<unsigned(n_kt * units), L::kThreads, L::kBytes, stream>>>(a);
  return cudaGetLastError();
}

// A window (other than plain causal's) runs the kLocal variant, whose bounds cover causal and
// full attention too: a softcap runs there whatever the mask, and packed sequences (their
// diagonal is each sequence's bottom-right one).
template <typename T, int kD, bool kDet>
cudaError_t dispatch(const FusedParams& p, cudaStream_t stream) {
  if (p.cu_seqlens_q != nullptr)
    return p.softcap > 0 ? launch<T, kD, false, true, true, kDet, true>(p, stream)
                         : launch<T, kD, false, true, false, kDet, true>(p, stream);
  if (p.softcap > 0) return launch<T, kD, false, true, true, kDet>(p, stream);
  if (hopper_common::local(p)) return launch<T, kD, false, true, false, kDet>(p, stream);
  return p.causal ? launch<T, kD, true, false, false, kDet>(p, stream)
                  : launch<T, kD, false, false, false, kDet>(p, stream);
}

template <typename T, bool kDet>
cudaError_t dispatch(const FusedParams& p, cudaStream_t stream) {
  return p.d <= 64    ? dispatch<T, 64, kDet>(p, stream)
         : p.d <= 128 ? dispatch<T, 128, kDet>(p, stream)
                      : dispatch<T, 256, kDet>(p, stream);
}

template <typename T>
cudaError_t dispatch(const FusedParams& p, cudaStream_t stream) {
  return p.deterministic ? dispatch<T, true>(p, stream) : dispatch<T, false>(p, stream);
}

}  // namespace
}  // namespace hopper_bwd

bool hopper_backward_applies(const FusedParams& p) {
  return p.d <= 256 && (p.Nk + 63) / 64 * p.B * p.H <= INT32_MAX &&
         p.Nk <= (int64_t(1) << 30) && p.Nq < (int64_t(1) << 31) && hopper_forward_applies(p);
}

int64_t hopper_bwd_query_tiles(int64_t Nq) { return (Nq + hopper_bwd::kBlockM - 1) / hopper_bwd::kBlockM; }

cudaError_t hopper_attention_backward_main(const FusedParams& p, cudaStream_t stream) {
  if (!hopper_backward_applies(p)) return cudaErrorNotSupported;
  switch (p.dtype) {
    case kc::DType::F16: return hopper_bwd::dispatch<__half>(p, stream);
    case kc::DType::BF16: return hopper_bwd::dispatch<__nv_bfloat16>(p, stream);
    default: return cudaErrorNotSupported;
  }
}

}  // namespace day50
