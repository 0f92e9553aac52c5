// hopper_fwd.cu: fused attention forward for Hopper (sm_90a): TMA + wgmma + warp
// specialization. Version 2 of the fused forward (flash_fwd.cu, mma.sync, is version 1;
// naive.cu the step-by-step one). Same contract as flash_fwd.cu: O (contiguous) and lse.
//
// CTA: 1 + C warpgroups, one tile of 64 C query rows of one (batch, head). C = 3 consumers at
//   d = 64 (a K, V tile feeds three, and their exponentials, as many as at d = 128 for half
//   the products, hide behind two others' products), else C = 2 (128 rows: above d = 64 the
//   registers of O and S allow no third).
//   warpgroup 0, the producer: one thread issues every copy. Q once, then K and V
//     tiles (kBlockN = 128 keys, 64 above d = 128) into a ring of kStages shared-memory stages, each
//     stage guarded by "full" barriers (the copy engine completes them) and an "empty"
//     barrier (all consumer threads arrive when done reading; with two stages, above
//     d = 128, one each for K and V: K's half is refilled once S = Q K^T is done, while
//     P V still reads V, so the next K lands a product earlier). Its other
//     threads exit at once (packed sequences: warp 1 first zeroes V's rows past the
//     sequence's end); it gives most of its registers to the consumers.
//   warpgroups 1 .. C, the consumers: 64 query rows each. Per key tile:
//     S = Q K^T        wgmma, A = Q and B = K both from shared memory (K-major)
//     online softmax   in registers, fp32: the row max of the raw scores, then
//                      exp2(x * scale * log2(e) - max * scale * log2(e)), one FFMA + EX2 each
//     O += P V         wgmma, A = P from registers (the S accumulators packed to 16 bits
//                      are already in the A-operand layout), B = V from shared memory
//                      (MN-major: V's rows are the product's K dimension)
//   Overlap inside a warpgroup: the next tile's Q K^T is issued before the current P V,
//   and the softmax of the next tile runs while P V is still on the tensor cores.
//   Overlap between them ("pingpong"): they take turns issuing their products, in a ring,
//   so one's softmax runs under the others' matrix work. A consumer whose rows all lie
//   past Nq (the last tile's) takes its turns and releases its stages but issues nothing;
//   so does each consumer on the steps none of its rows sees a key of (causal, a 192-row
//   tile's first 64 rows on the diagonal's last key tile; a window's edges).
// Shared memory: tiles are stored as 128-byte-wide "panels" (64 columns of d each),
//   128-byte swizzled as TMA writes them and wgmma reads them (kc/tma.cuh, kc/wgmma.cuh);
//   d = 96 uses two panels, the second half filled with zeros by the copy engine.
//   d = 128: Q 32 KB + 3 stages x (K 32 KB + V 32 KB) = 224 KB. Above d = 128 (up to 256: four
//   panels, a d between multiples of 64 zero-filled as d = 96 is) a K, V tile holds 64 keys, and
//   two stages: Q 64 KB + 2 x (K 32 KB + V 32 KB) = 192 KB; O's 256 columns are two 128-wide
//   products (wgmma's N), each over its two panels of V, into its half of O's accumulators.
// Tails: query tiles are aligned to Nq's end (tile t holds rows Nq - (t + 1) M .. Nq - t M),
//   so a partial tile is the first one, which causal attention makes the shortest; its rows
//   below 0 (and the tensor maps' rows beyond Nk, columns beyond d) arrive as zeros (the
//   copy engine fills what lies outside a tensor) and are not stored; keys >= Nk are masked.
// Causal (top-left aligned): a query tile reads key tiles up to its last row, the
//   diagonal one first (so only the first steps need masking).
// Sliding window (kLocal: hopper_common::Band, query i sees keys i - wl .. i + wr): a tile
//   reads only the key tiles its rows' windows reach, right edge first, so the cost grows as
//   N x window; the tiles crossing either edge are masked. A row that sees no key stores O = 0
//   and lse = +inf (attention.h); a CTA none of whose rows sees a key loads nothing.
// Softcap (kSoftcap, on the kLocal variant, whose bounds also express causal and full
//   attention): each raw score x becomes t = tanh(x scale / softcap) (flash::tanh_fast) before
//   the mask and the max, and scale_log2 is softcap log2(e), so the exponentials and lse are
//   those of softcap t. Two more special-function operations a score than without.
// Grid: one dimension, (query tile, B * H) in hopper_common::Order: heads in chunks whose
//   K and V fit in half the L2 (read from DRAM about once per head), and inside a chunk
//   the last query tile of every head first: causal, the longest go first and the short
//   ones fill the last wave.
// Grouped-query attention: q head h reads kv head h / (H / Hk) through the map's head
//   coordinate; the heads of a group are neighbours in a chunk and share K, V in L2.
// Packed sequences (kVarlen, on the kLocal variant): a CTA reads its sequence's offsets and
//   the maps span all packed rows, so a tile reaches into the neighbours' rows: query rows
//   before the sequence (not stored) and keys past its end (masked; their V rows zeroed in
//   shared memory, as P = 0 times an inf would be NaN).
// Falls back to version 1 (hopper_forward_applies): scale <= 0 (the max is taken on raw
//   scores), more than 2^31 - 1 CTAs, a layout the copy engine refuses, a mask it does not
//   express (hopper_masking).
#include "attention.h"

#include <cmath>

#include "flash_common.cuh"
#include "hopper_common.cuh"
#include "kc/bulk_copy.cuh"
#include "kc/check.cuh"
#include "kc/device.h"
#include "kc/launch.cuh"
#include "kc/tma.cuh"
#include "kc/types.h"
#include "kc/wgmma.cuh"

namespace day50 {
namespace hopper {
namespace {

// kC consumer warpgroups (64 query rows each); the register split within the launch's
// allocation (setmaxnreg moves registers, never adds): two consumers, 384 threads x 168 = 24 x 128
// for the producer + 240 x 256; three, 512 x 128 = 32 x 128 + 160 x 384 (with 24 the packed-sequence
// variant's producer spilled).
__host__ __device__ constexpr int producer_regs(int kC) { return kC == 3 ? 32 : 24; }
__host__ __device__ constexpr int consumer_regs(int kC) {
  return (65536 - 128 * producer_regs(kC)) / (128 * kC) / 8 * 8;
}
constexpr int kTurnBar = 1;  // named barriers 1 .. C: the consumers' turns (pingpong)
// named barriers C + 1 .. 2 C: a consumer's O is in shared memory (its own 128 threads)
constexpr float kLn2 = 0.6931471805599453f;
using hopper_common::kLog2e;

struct Args {
  CUtensorMap q, k, v;  // (d, N, heads, batch) maps, boxes of 64 x kBlockM / Layout::kBlockN
  CUtensorMap o;        // out (q's layout; attention_cuda.cpp), boxes of 64 x 64: a consumer's rows
  void* o_ptr;          // out again, for the rows the map cannot store (the epilogue)
  int64_t o_sb, o_sh, o_sr;
  float* lse;
  hopper_common::Order order;
  int H, group, Nq, Nk, d;
  float scale_log2;  // softmax scale * log2(e); kSoftcap: softcap * log2(e)
  hopper_common::Band w;  // kLocal: the window
  float cap_in;           // kSoftcap: scale / softcap
  // kVarlen: the sequences' offsets, lse's head stride (total_q), the window as given
  const int* cu_q;
  const int* cu_k;
  int64_t lse_sh;
  hopper_common::SeqWindow sw;
};

// Byte offsets inside the (1024-byte aligned) dynamic shared memory: Q, then kStages
// stages of K and of V (3 stages: d = 128 fills 225 KB of the 227 KB a block may have;
// above d = 128, tiles of 64 keys and 2 stages: 193 KB).
template <int kD, int kC>
struct Layout {
  static constexpr int kBlockN = kD > 128 ? 64 : 128;      // keys per K, V tile
  static constexpr int kPanels = (kD + 63) / 64;           // 128-byte column panels
  static constexpr int kQPanel = 64 * kC * 128, kKVPanel = kBlockN * 128;
  static constexpr int kQBytes = kPanels * kQPanel, kKVBytes = kPanels * kKVPanel;
  static constexpr int kStages = kD > 128 ? 2 : 3;
  static constexpr int kQ = 0, kK = kQBytes, kV = kK + kStages * kKVBytes, kBars = kV + kStages * kKVBytes;
  // K's own empty barriers with two stages only: with three, split ones bought nothing and
  // the windowed rows read 5% slower (H100, one call)
  static constexpr bool kSplitEmpty = kStages == 2;
  // q_full, k_full[], v_full[], v_empty[], k_empty[] (kSplitEmpty), v_edge
  static constexpr int kNumBars = 2 + (kSplitEmpty ? 4 : 3) * kStages;
  static constexpr int kBytes = kBars + 8 * kNumBars + 1024;  // + slack to align the base
};

template <typename T, int kD, int kConsumers, bool kCausal, bool kLocal, bool kSoftcap, bool kVarlen>
__global__ void __launch_bounds__(128 * (1 + kConsumers), 1) hopper_fwd_kernel(const __grid_constant__ Args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Layout<kD, kConsumers>;
  constexpr int kBlockM = 64 * kConsumers, kBlockN = L::kBlockN;
  constexpr int kStages = L::kStages;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* sm = kc::smem_align<1024>(smem_raw);
  uint64_t* bars = reinterpret_cast<uint64_t*>(sm + L::kBars);
  uint64_t* q_full = bars;
  uint64_t* k_full = bars + 1;
  uint64_t* v_full = bars + 1 + kStages;
  uint64_t* v_empty = bars + 1 + 2 * kStages;  // the stage read (P V done); kSplitEmpty: V's half
  uint64_t* k_empty = L::kSplitEmpty ? bars + 1 + 3 * kStages : v_empty;  // K's half read (S done)
  uint64_t* v_edge = bars + L::kNumBars - 1;  // kVarlen: V's tile across the sequence's end has landed

  // Launch order (hopper_common::Order): heads in chunks whose K, V fit in L2, the last
  // (longest causal) query tile of every head of a chunk first.
  int step, bh;
  hopper_common::order_of(blockIdx.x, a.order, step, bh);
  const int b = bh / a.H, h = bh % a.H, hk = h / a.group;
  // Packed sequences (kVarlen): sequence b (hopper_common::Seq); the maps span all rows (batch
  // coordinate mb = 0); bounds and the diagonal are the sequence's.
  hopper_common::Seq sq;
  if constexpr (kVarlen) sq = hopper_common::seq_of(a.cu_q, a.cu_k, a.sw, b);
  const int qs = sq.qs, ks = sq.ks, mb = kVarlen ? 0 : b;
  // the sequence's lengths (read where used: dense kernels keep reading the parameters there)
  auto nq = [&] { return kVarlen ? sq.nq : a.Nq; };
  auto nk = [&] { return kVarlen ? sq.nk : a.Nk; };
  const hopper_common::Band& w = kVarlen ? sq.band : a.w;
  const int q0 = nq() - (step + 1) * kBlockM;  // may be negative for the last step (Tails above)
  if (kVarlen && q0 + kBlockM <= 0) return;  // the grid covers the longest sequence: past this one's rows
  // the keys its rows see: [kbeg, kend), in key tiles jb .. jb + n_blocks - 1
  int kbeg = 0, kend = nk();
  if constexpr (kCausal) kend = min(nk(), q0 + kBlockM);
  if constexpr (kLocal) {
    kbeg = max(0, max(q0, 0) - w.wl);
    kend = min(nk(), q0 + kBlockM + w.wr);
  }
  const int jb = kbeg / kBlockN;
  const int n_blocks = !kLocal       ? (kend + kBlockN - 1) / kBlockN
                       : kend > kbeg ? (kend + kBlockN - 1) / kBlockN - jb
                                     : 0;  // a window none of its rows sees into
  const int wg = kc::warpgroup_index();

  if (threadIdx.x == 0) {
    kc::mbar_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      kc::mbar_init(&k_full[s], 1);
      kc::mbar_init(&v_full[s], 1);
      kc::mbar_init(&v_empty[s], kConsumers * 128);
      if (L::kSplitEmpty) kc::mbar_init(&k_empty[s], kConsumers * 128);
    }
    kc::mbar_init(v_edge, 1);
    kc::mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {  // ------------------------------------------------------------ producer
    kc::warpgroup_reg_dealloc<producer_regs(kConsumers)>();
    // Packed sequences: the first key tile (the last of the keys read) may hold the next
    // sequence's rows past this one's end. K's there are masked (a select), V's would meet
    // P = 0 in O += P V: warp 1 zeroes them (hopper_common::zero_rows) between the copy engine
    // (v_edge) and the consumers (v_full).
    const int last_rows = nk() - (jb + n_blocks - 1) * kBlockN;  // keys of the first tile in the sequence
    const bool edge = kVarlen && n_blocks > 0 && last_rows < kBlockN;
    if (edge && threadIdx.x >= 32 && threadIdx.x < 64) {  // warp 1: after the copy engine, before the consumers
      kc::mbar_wait(v_edge, 0);
      hopper_common::zero_rows(kc::smem_u32(sm + L::kV), L::kPanels, L::kKVPanel, last_rows, kBlockN, threadIdx.x - 32);
      if (threadIdx.x == 32) kc::mbar_arrive(&v_full[0]);
    }
    if (threadIdx.x == 0 && (!kLocal || n_blocks > 0)) {
      kc::tma_prefetch_map(&a.q);
      kc::tma_prefetch_map(&a.k);
      kc::tma_prefetch_map(&a.v);
      kc::mbar_arrive_expect_tx(q_full, L::kQBytes);
      for (int p = 0; p < L::kPanels; ++p)
        kc::tma_load_4d(sm + L::kQ + p * L::kQPanel, &a.q, q_full, p * 64, qs + q0, h, mb);
      for (int it = 0; it < n_blocks; ++it) {
        const int j = jb + n_blocks - 1 - it, s = it % kStages;
        const unsigned ph = ((it / kStages) - 1) & 1;
        if (it >= kStages) kc::mbar_wait(&k_empty[s], ph);  // without kSplitEmpty: the stage
        kc::mbar_arrive_expect_tx(&k_full[s], L::kKVBytes);
        for (int p = 0; p < L::kPanels; ++p)
          kc::tma_load_4d(sm + L::kK + s * L::kKVBytes + p * L::kKVPanel, &a.k, &k_full[s], p * 64, ks + j * kBlockN,
                          hk, mb);
        uint64_t* vb = edge && it == 0 ? v_edge : &v_full[s];
        if (L::kSplitEmpty && it >= kStages) kc::mbar_wait(&v_empty[s], ph);
        kc::mbar_arrive_expect_tx(vb, L::kKVBytes);
        for (int p = 0; p < L::kPanels; ++p)
          kc::tma_load_4d(sm + L::kV + s * L::kKVBytes + p * L::kKVPanel, &a.v, vb, p * 64, ks + j * kBlockN, hk, mb);
      }
    }
    return;
  }

  // ------------------------------------------------------------------------ consumers
  kc::warpgroup_reg_alloc<consumer_regs(kConsumers)>();
  using Qk = kc::WgmmaOp<T, kBlockN>;
  constexpr int kPvN = kD > 128 ? 128 : kD, kPvParts = kD / kPvN;  // O = P V in products of N <= 128 columns
  using Pv = kc::WgmmaOp<T, kPvN>;
  const int cw = wg - 1, tid = threadIdx.x - 128 * wg, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int row0 = q0 + cw * 64 + warp * 16 + g;  // this thread's rows: row0 and row0 + 8
  const bool idle = q0 + cw * 64 + 64 <= 0;        // every row below 0: turns, no products
  // Descriptors of the operands at k-step 0, stage 0; later steps add byte offsets / 16.
  const uint64_t dq = kc::gmma_desc_sw128(sm + L::kQ + cw * 64 * 128, 16, 1024);
  const uint64_t dk = kc::gmma_desc_sw128(sm + L::kK, 16, 1024);
  const uint64_t dv = kc::gmma_desc_sw128(sm + L::kV, L::kKVPanel, 1024);

  float o[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
  float s[kBlockN / 2];
  uint32_t pa[kBlockN / 16][4];
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, corr[2];

  auto issue_qk = [&](int it) {
    const int st = it % kStages;
    kc::mbar_wait(&k_full[st], (it / kStages) & 1);
    kc::fence_operands(s);
    kc::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      Qk::template ss<0, 0>(s, dq + ((kk / 4) * L::kQPanel + (kk % 4) * 32) / 16,
                            dk + (st * L::kKVBytes + (kk / 4) * L::kKVPanel + (kk % 4) * 32) / 16, kk > 0);
    kc::wgmma_commit();
  };
  auto issue_pv = [&](int it) {
    const int st = it % kStages;
    kc::mbar_wait(&v_full[st], (it / kStages) & 1);
    kc::fence_operands(o);
    kc::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
#pragma unroll
      for (int h = 0; h < kPvParts; ++h)  // columns h kPvN .. (h + 1) kPvN: their panels of V, their part of O
        Pv::template rs<1>(*reinterpret_cast<float(*)[kPvN / 2]>(o + h * (kPvN / 2)), pa[kk],
                           dv + (st * L::kKVBytes + h * (kPvN / 64) * L::kKVPanel + kk * 16 * 128) / 16, 1);
    kc::wgmma_commit();
  };
  // Scores of step `it` (in s) -> unnormalised probabilities (in s), running max and
  // sum updated; corr = the factor O must be multiplied by. The element mask is compiled
  // only into the steps that need it (flash::with_mask): the first ones (the tile holding
  // Nk's end, the diagonal: both come first).
  auto tile_k0 = [&](int it) { return (jb + n_blocks - 1 - it) * kBlockN; };
  auto needs_mask = [&](int it) {
    const int k0 = tile_k0(it), r0 = q0 + cw * 64;  // this warpgroup's rows r0 .. r0 + 63
    return k0 + kBlockN > nk() || (kCausal && k0 + kBlockN - 1 > r0) ||
           (kLocal && (k0 + kBlockN - 1 > r0 + w.wr || k0 < r0 + 63 - w.wl));
  };
  auto softmax = [&](auto masked, int it) {
    constexpr bool kMask = decltype(masked)::value;
    const int k0 = tile_k0(it);
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int c = 0; c < kBlockN / 8; ++c) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[4 * c + e];  // raw q.k: the max commutes with the (positive) scale
        if constexpr (kSoftcap) x = flash::tanh_fast(x * a.cap_in);  // and with tanh
        if constexpr (kMask) {
          const int col = k0 + 8 * c + 2 * t + (e & 1), row = row0 + 8 * (e >> 1);
          if (col >= nk() || (kCausal && col > row) || (kLocal && (col > row + w.wr || col < row - w.wl)))
            x = -INFINITY;
        }
        s[4 * c + e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      // exp(scale (x - max)) = exp2(x scale_log2 - max scale_log2): one FFMA per score
      const float base = mx[r] == -INFINITY ? 0.f : mx[r] * a.scale_log2;  // a row with no key yet stays at 0
      corr[r] = flash::fast_exp2(m[r] * a.scale_log2 - base);
      m[r] = mx[r];
      l[r] *= corr[r];
      mx[r] = base;
    }
#pragma unroll
    for (int c = 0; c < kBlockN / 8; ++c) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pexp = flash::fast_exp2(fmaf(s[4 * c + e], a.scale_log2, -mx[e >> 1]));
        s[4 * c + e] = pexp;
        l[e >> 1] += pexp;
      }
    }
  };
  auto softmax_step = [&](int it) {
    flash::with_mask(needs_mask(it), [&](auto masked) { softmax(masked, it); });
  };
  auto pack_p = [&]() {
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) pa[kk][i] = flash::pack2<T>(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
  };
  auto rescale_o = [&]() {
#pragma unroll
    for (int c = 0; c < kD / 8; ++c) {
      o[4 * c + 0] *= corr[0];
      o[4 * c + 1] *= corr[0];
      o[4 * c + 2] *= corr[1];
      o[4 * c + 3] *= corr[1];
    }
  };
  auto release_k = [&](int it) {
    if constexpr (L::kSplitEmpty) kc::mbar_arrive(&k_empty[it % kStages]);
  };
  auto release_v = [&](int it) { kc::mbar_arrive(&v_empty[it % kStages]); };

  // Pingpong: the consumer warpgroups take turns issuing their products, in a ring (named
  // barriers kTurnBar + cw, each between a warpgroup and the one before it), so one's
  // softmax runs while the others' products occupy the tensor cores. Each warpgroup takes
  // n_blocks + 1 turns; warpgroup 0 goes first (the last one hands it its first turn), and
  // the last one leaves out its final hand-over so that every arrival is waited for.
  auto wait_turn = [&] { kc::named_barrier_sync(kTurnBar + cw, 256); };
  auto pass_turn = [&] { kc::named_barrier_arrive(kTurnBar + (cw + 1) % kConsumers, 256); };
  if (kLocal && n_blocks == 0) {  // no row of the tile sees a key, nothing was loaded: O = 0 below
    if (idle) return;
  } else {
    if (cw == kConsumers - 1) pass_turn();
    if (idle) {  // the same turns and the same waits for the stages it releases, no products
      for (int it = 0; it <= n_blocks; ++it) {
        wait_turn();
        if (it > 0) kc::mbar_wait(&v_full[(it - 1) % kStages], ((it - 1) / kStages) & 1);
        if (it < n_blocks || cw != kConsumers - 1) pass_turn();
        if (it > 0) {
          release_k(it - 1);
          release_v(it - 1);
        }
      }
      return;
    }
    // The steps this warpgroup's rows reach, first .. last: the tile's steps cover all its
    // warpgroups' rows, so a warpgroup's first steps (keys past its last row's diagonal or
    // right edge) and, with a window, its last ones (keys before its first row's left edge)
    // may hold no key it sees. There it takes its turn and releases the stage, no products.
    int first = 0, last = n_blocks - 1;
    if constexpr (kCausal || kLocal) {
      const int top = jb + n_blocks - 1;  // the key tile of step 0
      const int r_lo = max(q0 + cw * 64, 0), r_hi = q0 + cw * 64 + 63;
      const int k_hi = min(nk() - 1, kCausal ? r_hi : r_hi + w.wr);
      first = min(max(top - k_hi / kBlockN, 0), n_blocks - 1);
      if constexpr (kLocal) last = max(min(top - max(r_lo - w.wl, 0) / kBlockN, n_blocks - 1), first);
    }
    // turn `turn` (0 .. n_blocks) hands on, except the last one's last (every arrival waited for)
    auto pass_turn_of = [&](int turn) {
      if (turn < n_blocks || cw != kConsumers - 1) pass_turn();
    };
    auto skip_step = [&](int it, int turn) {
      wait_turn();
      pass_turn_of(turn);
      kc::mbar_wait(&k_full[it % kStages], (it / kStages) & 1);
      kc::mbar_wait(&v_full[it % kStages], (it / kStages) & 1);
      release_k(it);
      release_v(it);
    };
    for (int it = 0; it < first; ++it) skip_step(it, it);
    kc::mbar_wait(q_full, 0);
    wait_turn();
    issue_qk(first);
    pass_turn();
    kc::wgmma_wait<0>();
    kc::fence_operands(s);
    release_k(first);
    softmax_step(first);
    pack_p();
    for (int it = first + 1; it <= last; ++it) {
      wait_turn();
      issue_qk(it);       // S of the next tile ...
      issue_pv(it - 1);   // ... and O += P V of this one, both in flight
      pass_turn();
      kc::wgmma_wait<1>();
      kc::fence_operands(s);
      release_k(it);      // S done: K's half of the stage may be refilled
      softmax_step(it);   // runs while P V (and the other warpgroup's products) are on the tensor cores
      kc::wgmma_wait<0>();
      kc::fence_operands(o);
      release_v(it - 1);
      rescale_o();
      pack_p();
    }
    wait_turn();
    issue_pv(last);
    pass_turn_of(last + 1);
    kc::wgmma_wait<0>();
    kc::fence_operands(o);
    release_v(last);
    for (int it = last + 1; it < n_blocks; ++it) skip_step(it, it + 1);
  }

  // epilogue: O / l as T into this warpgroup's rows of Q (no longer read), in Q's layout
  // (128-byte swizzled panels: each thread's 4-byte pairs spread over all banks), then one
  // thread stores them through the map of out (columns past d are not written). Stored by
  // every thread straight to global memory instead (16 bytes a row a warp instruction), they
  // stalled the CTA's end. The copy engine takes no store box that starts below row 0 (an
  // illegal instruction): a warpgroup whose rows straddle 0 (a head's first tile, at most
  // one a head) stores its rows >= 0 directly. lse = (m + log2 l) ln 2, rows >= 0 (+inf: no key).
  const bool straddles = q0 + cw * 64 < 0;
  unsigned char* my_q = sm + L::kQ + cw * 64 * 128;
  T* O = static_cast<T*>(a.o_ptr) + b * a.o_sb + h * a.o_sh + qs * a.o_sr;  // varlen: o_sb = 0
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const bool none = kLocal && l[r] == 0.f;  // the row saw no key: O = 0, lse = +inf
    const float inv = none ? 0.f : 1.f / l[r];
    const int row = warp * 16 + g + 8 * r;  // within the warpgroup's 64
    if (straddles) {
      if (row0 + 8 * r >= 0)
#pragma unroll
        for (int c = 0; c < kD / 8; ++c)
          if (8 * c + 2 * t < a.d)
            *reinterpret_cast<uint32_t*>(O + (row0 + 8 * r) * a.o_sr + 8 * c + 2 * t) =
                flash::pack2<T>(o[4 * c + 2 * r] * inv, o[4 * c + 2 * r + 1] * inv);
    } else {
#pragma unroll
      for (int c = 0; c < kD / 8; ++c)
        *reinterpret_cast<uint32_t*>(my_q + (c / 8) * L::kQPanel + row * 128 + (((c % 8) ^ g) << 4) + 4 * t) =
            flash::pack2<T>(o[4 * c + 2 * r] * inv, o[4 * c + 2 * r + 1] * inv);
    }
    if (t == 0 && row0 + 8 * r >= 0)
      a.lse[(kVarlen ? h * a.lse_sh + qs : int64_t(bh) * a.Nq) + row0 + 8 * r] =  // (B, H, Nq) or (H, total_q)
          none ? INFINITY : (m[r] * a.scale_log2 + __log2f(l[r])) * kLn2;
  }
  if (straddles) return;
  kc::fence_async_shared();
  kc::named_barrier_sync(kTurnBar + kConsumers + cw, 128);
  if (tid == 0) {
#pragma unroll
    for (int p = 0; p < L::kPanels; ++p)
      kc::tma_store_4d(&a.o, my_q + p * L::kQPanel, p * 64, qs + q0 + cw * 64, h, mb);
    kc::bulk_commit();
    kc::bulk_wait_read<0>();
  }
#else
  __trap();
#endif
}

template <typename T, int kD, int kC, bool kCausal, bool kLocal, bool kSoftcap, bool kVarlen>
cudaError_t launch(const FusedParams& p, cudaStream_t stream) {
  Args a;
  constexpr int kBlockM = 64 * kC, kBlockN = Layout<kD, kC>::kBlockN;
  // Packed sequences: maps over all rows, one "batch"
  const int64_t mq = kVarlen ? p.total_q : p.Nq, mk = kVarlen ? p.total_k : p.Nk, mB = kVarlen ? 1 : p.B;
  auto rows = [&](const View4& x, int64_t n) { return kVarlen ? hopper_common::packed_rows(x, n) : x; };
  const View4 o{p.o, p.o_sb, p.o_sh, p.o_sr, 1};
  if (hopper_common::make_map<T>(&a.q, rows(p.q, mq), mB, p.H, mq, p.d, kBlockM) != cudaSuccess ||
      hopper_common::make_map<T>(&a.k, rows(p.k, mk), mB, p.Hk, mk, p.d, kBlockN) != cudaSuccess ||
      hopper_common::make_map<T>(&a.v, rows(p.v, mk), mB, p.Hk, mk, p.d, kBlockN) != cudaSuccess)
    return cudaErrorNotSupported;  // e.g. a zero stride: the caller runs version 1
  if (hopper_common::make_map<T>(&a.o, rows(o, mq), mB, p.H, mq, p.d, 64) != cudaSuccess)
    return cudaErrorNotSupported;
  a.o_ptr = p.o;
  a.o_sb = p.o_sb;
  a.o_sh = p.o_sh;
  a.o_sr = p.o_sr;
  a.lse = p.lse;
  a.H = int(p.H);
  a.group = int(p.H / p.Hk);
  a.Nq = int(p.Nq);
  a.Nk = int(p.Nk);
  a.d = int(p.d);
  a.scale_log2 = (kSoftcap ? p.softcap : p.scale) * kLog2e;
  a.w = hopper_common::band(p);
  a.cap_in = kSoftcap ? p.scale / p.softcap : 0.f;
  a.cu_q = p.cu_seqlens_q;
  a.cu_k = p.cu_seqlens_k;
  a.lse_sh = p.row_sh;
  a.sw = hopper_common::seq_window(p);
  auto kernel = hopper_fwd_kernel<T, kD, kC, kCausal, kLocal, kSoftcap, kVarlen>;
  KC_CUDA_TRY(kc::allow_dynamic_smem(kernel, Layout<kD, kC>::kBytes));
  const int64_t n_qt = (p.Nq + kBlockM - 1) / kBlockM;
  // K and V of a kv head, shared by its group of q heads
  a.order = hopper_common::make_order(n_qt, p.B * p.H, 2 * p.Nk * kD * int64_t(sizeof(T)) / (p.H / p.Hk));
  kernel<<<unsigned(n_qt * p.B * p.H), 128 * (1 + kC), Layout<kD, kC>::kBytes, stream>>>(a);
  return cudaGetLastError();
}

template <typename T, bool kCausal, bool kLocal, bool kSoftcap, bool kVarlen = false>
cudaError_t dispatch(const FusedParams& p, cudaStream_t stream) {
  // d = 64: three consumers (160 registers each), with a softcap two (three spilled 128 bytes)
  if (p.d <= 64) return launch<T, 64, kSoftcap ? 2 : 3, kCausal, kLocal, kSoftcap, kVarlen>(p, stream);
  if (p.d <= 96) return launch<T, 96, 2, kCausal, kLocal, kSoftcap, kVarlen>(p, stream);
  if (p.d <= 128) return launch<T, 128, 2, kCausal, kLocal, kSoftcap, kVarlen>(p, stream);
  return launch<T, 256, 2, kCausal, kLocal, kSoftcap, kVarlen>(p, stream);
}

// A window (other than plain causal's) runs the kLocal variant, whose bounds cover causal and
// full attention too: a softcap runs there whatever the mask (one variant, not three), and
// packed sequences (their diagonal is each sequence's bottom-right one).
template <typename T>
cudaError_t dispatch(const FusedParams& p, cudaStream_t stream) {
  if (p.cu_seqlens_q != nullptr)
    return p.softcap > 0 ? dispatch<T, false, true, true, true>(p, stream)
                         : dispatch<T, false, true, false, true>(p, stream);
  if (p.softcap > 0) return dispatch<T, false, true, true>(p, stream);
  if (hopper_common::local(p)) return dispatch<T, false, true, false>(p, stream);
  return p.causal ? dispatch<T, true, false, false>(p, stream) : dispatch<T, false, false, false>(p, stream);
}

// Compute capability 9.0 exactly (the sm_90a code runs nowhere else), per device, once.
bool device_is_sm90() { return kc::compute_capability() == 90; }

}  // namespace
}  // namespace hopper

bool hopper_forward_applies(const FusedParams& p) {
#if defined(KC_HAS_SM90A)
  return (p.dtype == kc::DType::F16 || p.dtype == kc::DType::BF16) && p.d > 0 && p.d % 8 == 0 &&
         p.d <= kHopperFwdMaxHeadDim && p.Nq < (int64_t(1) << 31) && p.Nk < (int64_t(1) << 31) &&
         (p.Nq + 127) / 128 * p.B * p.H <= INT32_MAX && p.scale > 0.f && hopper_masking(p) &&
         (!(hopper_common::local(p) || p.softcap > 0 || p.cu_seqlens_q != nullptr) ||
          p.Nq + p.Nk <= (int64_t(1) << 30)) &&
         (p.cu_seqlens_q == nullptr || (p.total_q < INT32_MAX && p.total_k < INT32_MAX)) &&
         hopper::device_is_sm90();
#else
  (void)p;
  return false;  // this build has no sm_90a code
#endif
}

cudaError_t hopper_attention_forward(const FusedParams& p, cudaStream_t stream) {
  if (!hopper_forward_applies(p)) return cudaErrorNotSupported;
  switch (p.dtype) {
    case kc::DType::F16: return hopper::dispatch<__half>(p, stream);
    case kc::DType::BF16: return hopper::dispatch<__nv_bfloat16>(p, stream);
    default: return cudaErrorNotSupported;
  }
}

}  // namespace day50
