// hopper_common.cuh: what the Hopper (version 2) forward and backward share.
//
// Every tile they copy is a box of 64 columns (128 bytes: one swizzle row) x `box_rows` rows
// of one (batch, head) of a View4, so one 4-D tensor map (d, N, heads, batch) per input
// covers any strides the fused layout check admits; rows past N and columns past d come
// back as zeros. 128-byte swizzle: the layout kc/wgmma.cuh's descriptors read.
#pragma once

#include <algorithm>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention.h"
#include "kc/device.h"
#include "kc/tma.cuh"

namespace day50 {
namespace hopper_common {

constexpr float kLog2e = 1.4426950408889634f;

template <typename T>
cudaError_t make_map(CUtensorMap* map, const View4& x, int64_t batch, int64_t heads, int64_t n, int64_t d,
                     int box_rows) {
  const uint64_t es = sizeof(T);
  const uint64_t dims[4] = {uint64_t(d), uint64_t(n), uint64_t(heads), uint64_t(batch)};
  const uint64_t strides[3] = {uint64_t(x.sr) * es, uint64_t(x.sh) * es, uint64_t(x.sb) * es};
  const uint32_t box[4] = {64, uint32_t(box_rows), 1, 1};
  const CUtensorMapDataType dt =
      std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return kc::make_tensor_map(map, dt, 4, x.ptr, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

// A window as the kernels test it (attention.h: query i sees key j when i - wl <= j <= i + wr,
// top-left aligned): an unbounded side, or one past every index, becomes Nq (left) or Nk
// (right), which masks nothing, so that index sums stay small (hopper_forward_applies asks
// Nq + Nk <= 2^30 of the kLocal variants). `local`: a bound other than plain causal's is set
// (the kernels' kLocal variants, which a softcap also runs on; plain causal keeps kCausal).
struct Band {
  int wl = 0, wr = 0;
};
inline bool local(const FusedParams& p) { return p.window_left >= 0 || p.window_right > 0; }
inline Band band(const FusedParams& p) {
  Band w;
  w.wl = int(p.window_left < 0 || p.window_left > p.Nq ? p.Nq : p.window_left);
  w.wr = int(p.window_right < 0 || p.window_right > p.Nk ? p.Nk : p.window_right);
  return w;
}

// Packed sequences (attention_varlen): each sequence's lengths and offsets come from
// cu_seqlens in the kernel (seq_of), so the kernels get the window as given (-1: unbounded; a
// bound past every index, Nq + Nk, clamped to it) and each sequence shifts it by its
// bottom-right diagonal (query i's diagonal key is i + nk - nq) into that sequence's Band.
struct SeqWindow {
  int wl = -1, wr = -1;
};
inline SeqWindow seq_window(const FusedParams& p) {
  const int64_t wmax = p.Nq + p.Nk;
  SeqWindow w;
  w.wl = p.window_left < 0 ? -1 : int(p.window_left < wmax ? p.window_left : wmax);
  w.wr = p.window_right < 0 ? -1 : int(p.window_right < wmax ? p.window_right : wmax);
  return w;
}
#ifdef __CUDACC__
// A CTA's sequence b (attention.h: seq_span) in 32 bits: rows qs .. qs + nq - 1 of q, ks .. ks +
// nk - 1 of k and v, and its Band.
struct Seq {
  int qs = 0, ks = 0, nq = 0, nk = 0;
  Band band;
};
__device__ __forceinline__ Seq seq_of(const int* cu_q, const int* cu_k, const SeqWindow& w, int b) {
  const SeqSpan sp = seq_span(cu_q, cu_k, b);
  Seq s;
  s.qs = int(sp.q0);
  s.ks = int(sp.k0);
  s.nq = int(sp.nq);
  s.nk = int(sp.nk);
  const int off = s.nk - s.nq;  // query i's diagonal key: i + off
  s.band.wl = w.wl < 0 ? s.nq + s.nk : w.wl - off;
  s.band.wr = w.wr < 0 ? s.nq + s.nk : w.wr + off;
  return s;
}
// Packed sequences: a tile the copy engine loads across a sequence's end holds the next
// sequence's rows there, and the products multiply them by P = 0 or dS = 0, which is NaN for an
// inf or a NaN (one sequence's non-finite value would reach the others). The 32 lanes of a warp
// zero rows r0 .. rows - 1 of each of the tile's `panels` 128-byte-wide panels (`panel_bytes`
// apart; the 128-byte swizzle moves 16-byte chunks within a row, so rows stay whole), then
// order the zeros before the tensor cores' and the copy engine's accesses (the async proxy) and
// before lane 0's arrival that hands the tile on.
// `tile`: the shared-memory address (kc::smem_u32).
__device__ __forceinline__ void zero_rows(uint32_t tile, int panels, int panel_bytes, int r0, int rows, int lane) {
  for (int p = 0; p < panels; ++p)
    for (uint32_t at = tile + p * panel_bytes + r0 * 128 + lane * 16; at < tile + p * panel_bytes + rows * 128;
         at += 32 * 16)
      asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(at), "r"(0u) : "memory");
  kc::fence_async_shared();
  __syncwarp();
}
#endif
// A packed (total, heads, d) tensor as the maps see it: one batch of `total` rows (its batch
// stride, past the last row, is never used).
inline View4 packed_rows(View4 x, int64_t total) {
  x.sb = x.sr * total;
  return x;
}

// An fp32 buffer the backward adds into with the copy engine (dq_accum, the grouped-query
// dK, dV accumulator): contiguous (batch, heads, n, d), or with `layout`'s strides (a float32
// dq itself: FusedParams::dq_direct), boxes of 32 columns (128 bytes) x box_rows rows,
// 128-byte swizzled as the shared tiles it adds from.
inline cudaError_t make_accum_map(CUtensorMap* map, float* ptr, int64_t batch, int64_t heads, int64_t n, int64_t d,
                                  int box_rows, const View4* layout = nullptr) {
  const uint64_t dims[4] = {uint64_t(d), uint64_t(n), uint64_t(heads), uint64_t(batch)};
  const uint64_t strides[3] = {uint64_t(layout ? layout->sr : d) * 4, uint64_t(layout ? layout->sh : n * d) * 4,
                               uint64_t(layout ? layout->sb : heads * n * d) * 4};
  const uint32_t box[4] = {32, uint32_t(box_rows), 1, 1};
  return kc::make_tensor_map(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, ptr, dims, strides, box,
                             CU_TENSOR_MAP_SWIZZLE_128B);
}

// Launch order of a grid of `steps` tiles x `bh` (batch, head) pairs, flattened into
// blockIdx.x. Heads go in chunks whose re-read bytes (`reread_bytes_per_head`: the
// forward's K, V, the backward's Q, dO and dQ sums) fit in the L2's `1 / l2_share` together,
// as few chunks as that allows, the heads spread evenly over them (the first `big` chunks hold
// one head more than the others: 64 heads in chunks of 7, 7, 7, 7, 6, .., not nine of 7 and a
// last of one, whose longest tiles would start in the previous chunk's tail);
// inside a chunk, step 0 of every head first, then step 1, ...: with causal masking step 0 is
// each head's longest tile (the kernels number their tiles so), so the longest tiles start
// first and the short ones fill the last wave. Every tile of step s of a head launches before
// any of step s + 1 of that head (the deterministic backward's ordered adds rely on it). A chunk
// holds at least min_ctas_per_sm CTAs an SM where asked: a chunk of fewer waves ends on its
// short tiles while the next one's long tiles start behind them; where an even spread would
// leave chunks under that floor, the chunks hold ceil(bh / chunks) heads or the floor, and the
// last one what is left.
struct Order {
  int steps = 1, bh = 1, chunk = 1, big = 0;  // `big` chunks of chunk + 1 heads, then chunks of `chunk`
  void one_head_a_chunk() {
    chunk = 1;
    big = 0;
  }
};

inline Order make_order(int64_t steps, int64_t bh, int64_t reread_bytes_per_head, int min_ctas_per_sm = 0,
                        int l2_share = 2) {
  const int l2_read = kc::l2_bytes(), l2 = l2_read > 0 ? l2_read : 50 << 20;  // an H100's, where unknown
  Order o;
  o.steps = int(steps);
  o.bh = int(bh);
  if (bh <= 0) return o;  // no heads, no grid
  int64_t fit = reread_bytes_per_head > 0 ? int64_t(l2 / l2_share) / reread_bytes_per_head : bh;
  const int64_t floor_heads = (int64_t(min_ctas_per_sm) * kc::num_sms() + steps - 1) / steps;
  fit = std::max<int64_t>(std::max(fit, floor_heads), 1);
  const int64_t n = (bh + fit - 1) / fit, small = bh / n;
  if (small >= floor_heads) {
    o.chunk = int(small);
    o.big = int(bh - small * n);
  } else {
    const int64_t even = (bh + n - 1) / n;
    o.chunk = int(std::min(even >= floor_heads ? even : fit, bh));  // the last chunk holds the rest
  }
  return o;
}

__device__ __forceinline__ void order_of(int linear, const Order& o, int& step, int& bh) {
  const int big_ctas = o.big * (o.chunk + 1) * o.steps;
  const bool in_big = linear < big_ctas;
  const int size = in_big ? o.chunk + 1 : o.chunk, per_chunk = size * o.steps;
  const int rel = in_big ? linear : linear - big_ctas;
  const int c = rel / per_chunk, r = rel - c * per_chunk;
  const int h0 = (in_big ? 0 : o.big * (o.chunk + 1)) + c * size;
  const int heads = min(size, o.bh - h0);
  step = r / heads;
  bh = h0 + (r - step * heads);
}

}  // namespace hopper_common
}  // namespace day50
