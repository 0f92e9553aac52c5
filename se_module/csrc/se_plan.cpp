// se_plan.cpp: the plan of a fused SE call (se_plan.h) and every threshold behind it.
//
// One function per direction, each called once per call by the glue (se_cuda.cpp):
//   1. the path: the cluster kernel where its share of a sample fits and the batch is
//      small (cluster_fit), else the spread MLP where the weights are large
//      (spread_fits), else one MLP block per sample;
//   2. the parameters: staged in the MLP block's shared memory where they fit; read in
//      their own dtype by the spread products, or widened / transposed into fp32 copies
//      by extra blocks of the reduction (CastPlan);
//   3. the HW reduction's splits (plan_reduce), leaving room for those extra blocks;
//   4. the saved state (forward keeps, backward reads), where the weight gradients run;
//   5. the workspace, in the order the launchers carve it.
// The thresholds, each with the measurement behind it, are the constants below.
#include "se_plan.h"

#include <algorithm>
#include <atomic>

namespace se {

namespace {

std::atomic<int64_t> g_plans{0};

// ------------------------------------------------------------------ thresholds

// Below this many weight floats (2 S C) one block per sample reads them fast enough,
// and its single MLP launch is cheaper than the spread MLP's two (forward) or four
// (backward) (H100 probe, EfficientNet shapes: the block ahead at 2SC = 19200 and
// 37632, the spread MLP at 76800 and up).
constexpr int64_t kSpreadMinWeights = 65536;

// Where the cluster kernel runs (GPU time of the cluster kernel against the block /
// spread kernels at EfficientNet's small-image SE shapes, N = 1 .. 32, fp32 NCHW and bf16 CL):
// - H100, CTAs of 256 threads: forward, N <= 16: 1.02-1.78x at 62 of 72 (shape, N,
//   dtype) rows, the rest 0.95-1.0x; at N = 32 0.72-1.15x, at N = 128 (bench.py --only
//   effnet) 0.7-0.95x: each CTA's phases run one after another, which 4 CTAs per SM do not
//   hide, where the other kernels each fill the GPU; backward, N <= 16 and C * S >= 16384
//   (the MLP, not the bytes, is most of the other path's time): 1.05-1.51x but fp32
//   (16, 960, 12, 12) 0.98x; below that C * S, 0.75-1.2x.
// - CTAs of 1024 / 512 threads where every cluster of the grid is resident at once
//   (cluster_fit), fc2 split over several threads a channel, the weights prefetched into
//   L2 (H100 / H200): N <= 16, 90 rows: forward 0.92-1.92x / 0.94-1.98x (under 0.99x at
//   8 / 6 rows, 0.92-0.98x: fp32 at C = 240 or 336, and (16, 2688, 12, 12) fp32 at 0.99x),
//   forward + backward 0.92-1.44x / 0.93-1.49x; N = 32 .. 128, 54 rows: forward
//   0.94-1.27x / 0.96-1.31x, forward + backward 0.92-1.09x / 0.93-1.10x. bf16
//   (1, 2688, 12, 12) forward 35.3 / 34.9 us (spread) against 20.7 / 19.9 (CTAs of 256
//   threads: 37 us in ncu on the H100, 8 warps an SM stalled on each phase in turn).
// - After the channels_last reduction and the weight gradients got faster: at the two
//   N = 128 EfficientNet rows whose clusters fit at once, bf16 channels_last forward +
//   backward ran 0.95 / 0.97x the spread path's speed on the H100 and 0.96 / 0.98x on
//   the H200, the forward 0.97 / 1.01x on both; the cluster forward followed by the
//   other backward at (128, 672, 7, 7) (C * S = 18816) was no faster: 71.5 us against
//   71.4 (H100). So the cluster kernel runs at N <= kClusterMaxN only. (bf16 CL
//   (32, 960, 12, 12), forward 1.03x on the H100, 1.01x on the H200, goes to the spread
//   path with it.)
constexpr int64_t kClusterMaxN = 16;
constexpr int64_t kClusterBwdMinCS = 16384;
// Shared memory a CTA may take: four CTAs of kThreads (and their 1 KB reserve each)
// share an SM's 228 KB, so the CTAs' phases (loads, the MLP's latency, stores) overlap.
// CTAs of 512 or 1024 threads admit the same shares: their budget grows only by their
// larger group-sum area (cluster_smem's `red`, 8 bytes a thread). The 2x / 4x that two
// or one of them an SM could take admitted shares of up to 224 KB, and those ran slower
// than the other paths (H100, bench.py --only effnet, batch 1: bf16 CL (1, 32, 112, 112)
// 35.5 against 15.0 us in 4 CTAs of 200 KB; (1, 144, 56, 56) 22.4 against 15.7 and
// (1, 192, 48, 48) 20.1 against 16.2 in 16 CTAs of 100 / 73 KB; only fp32
// (1, 2688, 12, 12), 97 KB, was faster: 21.3 against 24.0).
constexpr size_t kClusterSmemBudget = 56 * 1024;

// The channels_last reduction's wave: kColsPlanBlocks blocks an SM (half the resident
// ones), so fewer splits whose partials the MLP's staging adds. With the cp.async
// pipeline each thread keeps 12 rows in flight, and half as many blocks still stream at
// the same rate. (H100, timeline, bf16 CL fwd+bwd, 4 -> 2 an SM: (32, 1632, 12, 12)
// 64.7 -> 63.1/63.4 us, (32, 960, 12, 12) 47.2 -> 43.8/44.2, (128, 480, 14, 14) 79.3 ->
// 73.9/74.0, (32, 336, 24, 24) 45.0 -> 43.5, (128, 672, 7, 7) 55.5 -> 54.5/54.6,
// (128, 240, 14, 14) 41.8 -> 41.6/41.7; one block an SM measured the same within 1 us.)
constexpr int kColsPlanBlocks = 2;

// DaState stages w2's columns itself (da_direct) only where at most this many sample
// tiles repeat it. H100, timeline, bf16 CL fwd+bwd against the transposed copies:
// (32, 2688, 12, 12) -3 us and (32, 960, 12, 12) even at 8 tiles; (128, 1152, 7, 7),
// 32 tiles, +1.6 us (DaState 8.9 -> 10.0). (Rows of 16-bit w2 whose length is not a
// multiple of 16 bytes, S = 68: two loads a piece, DaState 6.0 -> 10.2 us at
// (32, 1632, 12, 12): the copies there too.)
constexpr int64_t kWtMaxTiles = 8;

// The spread backward's weight gradients run in blocks of Coef's grid (the last
// product: dz1, p, dz2, a are final once it may start) where a tile's samples are one
// chunk (N <= kWgTile); at larger N their chunks take longer than Coef and they stay
// in the Dx pass. H100, block timestamps ((32, 1632, 12, 12) bf16): 306 weight-gradient
// blocks first in the Dx pass held 58% of its slots for ~7 us, 4 of them waiting for
// Coef; the pass ended 10.6 us after Coef for 15 MB read from L2 and 15 MB written.
constexpr int64_t kWgradBesideMaxN = kWgTile;

// ------------------------------------------------------------------ versions

// The versions: kernel families, each kept because it teaches a step (README, "Versions").
// Version N lets the plan use the families up to N; 0 (auto, the default) all of them.
//   1  the fused block: reduce -> one MLP block per sample -> scale (se_fused.cu)
//   2  + the spread MLP where the weights are large (se_spread.cu), with the saved state
//   3  + one thread-block cluster per sample where it pays (se_cluster.cu)
// The launch features every family takes are not versions: the elementwise pass walks
// memory backwards and stores evict-first, and the kernels launch under PDL on sm_90+.
constexpr int64_t kLastVersion = 3;

struct Features {
  bool reverse, streaming, pdl, spread, cluster;
};

Features features(int64_t version, int cc_major) {
  Features f{};
  f.reverse = true;
  f.streaming = true;
  f.pdl = cc_major >= 9;
  f.spread = version == 0 || version >= 2;
  f.cluster = (version == 0 || version >= 3) && cc_major >= 9;
  return f;
}

// ------------------------------------------------------------------ the pieces

// The cluster kernel's shape where it runs for this call; false where it does not.
// ptrs: every tensor it reads or writes with 16-byte vectors.
bool cluster_fit(const PlanInputs& in, bool backward, const void* const* ptrs, int nptrs, ClusterPlan* plan) {
  const Dims& d = in.d;
  const int64_t S = in.S;
  if (d.n < 1 || d.c < 1 || d.l < 1) return false;
  if (d.n > kClusterMaxN || (backward && d.c * S < kClusterBwdMinCS)) return false;
  if (in.wdt != kc::DType::F32 && in.wdt != in.dt) return false;  // instantiated for fp32 parameters or x's dtype
  for (int i = 0; i < nptrs; ++i)
    if (!aligned16(ptrs[i])) return false;
  const int elem = kc::dtype_size(in.dt);
  const int vec = 16 / elem;
  ClusterPlan p{};
  if (d.layout == Layout::NCHW) {
    if ((d.c * d.l * elem) % 16 != 0) return false;
    int64_t unit = 1;
    while ((unit * d.l * elem) % 16 != 0) ++unit;  // at most 16 / elem
    p.unit = int(unit);
  } else {
    if (d.c % vec != 0) return false;
    p.unit = vec;
  }
  p.units = ceil_div(d.c, p.unit);
  auto smem_of = [&](int k, int threads) {
    const int64_t cmax = std::min<int64_t>(ceil_div(p.units, k) * p.unit, d.c);
    return cluster_smem(cmax, d.l, S, elem, backward, threads).total;
  };
  auto capacity = [&](int threads, int k, size_t smem) {
    return in.capacity != nullptr ? in.capacity(in.dt, in.wdt, d.layout, backward, threads, k, smem) : 0;
  };
  // Threads a CTA: 1024 or 512 (one or two CTAs an SM: the kernel is held to 64
  // registers a thread) where the whole grid fits on the GPU at once, so a small batch
  // has 4x or 2x the warps to hide each phase's latency; else kThreads, four CTAs an SM.
  // For each: the fewest CTAs a sample (k) whose share fits, then more while the grid
  // stays within one wave (1024, 512) or under two CTAs an SM (kThreads).
  const int sms = in.dev.sms;
  for (int threads = kClusterMaxThreads; threads >= kThreads; threads /= 2) {
    const int64_t budget = std::min<int64_t>(int64_t(kClusterSmemBudget) + 8 * int64_t(threads - kThreads),
                                             int64_t(in.dev.smem_optin));
    const int64_t slots = int64_t(kClusterMaxThreads / threads) * sms;
    int k = 0;
    for (int kk = 1; kk <= kMaxCluster && kk <= p.units; kk *= 2)
      if (smem_of(kk, threads) <= budget) {
        k = kk;
        break;
      }
    if (k == 0) continue;
    if (threads == kThreads) {
      while (2 * k <= kMaxCluster && 2 * k <= p.units && d.n * k < 2 * int64_t(sms)) k *= 2;
    } else {
      // every cluster resident at once: N clusters of k CTAs within the occupancy query's count
      auto fits_wave = [&](int kk) {
        if (d.n * kk > slots) return false;
        return capacity(threads, kk, size_t(budget)) >= d.n;
      };
      if (!fits_wave(k)) continue;
      while (2 * k <= kMaxCluster && 2 * k <= p.units && fits_wave(2 * k)) k *= 2;
    }
    p.k = k;
    p.threads = threads;
    p.cmax = int(std::min<int64_t>(ceil_div(p.units, k) * p.unit, d.c));
    p.smem = size_t(smem_of(k, threads));
    *plan = p;
    return true;
  }
  return false;
}

// Whether the spread MLP runs for this shape (and fits: the largest input row staged,
// the grid's sample tiles).
bool spread_fits(const PlanInputs& in) {
  const Dims& d = in.d;
  const int64_t S = in.S;
  if (2 * S * d.c < kSpreadMinWeights) return false;
  if (ceil_div(d.n, kTileN) > 65535) return false;  // grid.y
  if (ceil_div(d.n, kNarrowN) > 65535) return false;
  return gemv_smem(d.c > S ? d.c : S) <= size_t(in.dev.smem_optin) &&
         gemv_narrow_smem(S < kNarrowMaxI ? S : kNarrowMaxI) <= size_t(in.dev.smem_optin);
}

// The one-block-per-sample MLP's shared memory, with the parameters staged where they fit.
void plan_staging(const PlanInputs& in, SePlan* p) {
  const size_t smem = fused_mlp_smem_bytes(in.d.c, in.S, p->backward);
  const size_t with = smem + size_t(staged_floats(in.d.c, in.S)) * sizeof(float);
  p->staged = with <= size_t(in.dev.smem_optin);
  p->mlp_smem = p->staged ? with : smem;
}

// The extra blocks that copy the parameters (c.widen, c.transpose_*): per tensor, units
// of 16 bytes where its address and length allow, else single elements; as few blocks as
// give each thread kCastUnroll units. (The copies' destinations are in the workspace, a
// fresh allocation carved in 16-byte pieces: aligned.)
void plan_cast(const PlanInputs& in, CastPlan* c) {
  const int64_t len[4] = {in.S * in.d.c, in.S, in.d.c * in.S, in.d.c};
  const void* src[4] = {in.w1, in.b1, in.w2, in.b2};
  const int vper = 16 / kc::dtype_size(in.wdt);
  int64_t total = 0;
  for (int t = 0; t < 4; ++t) {
    const bool used = c->widen || (t == 0 && c->transpose_w1) || (t == 2 && c->transpose_w2);
    const bool vec = aligned16(src[t]) && len[t] % vper == 0;
    c->per[t] = vec ? vper : 1;
    c->units[t] = used ? len[t] / c->per[t] : 0;
    total += c->units[t];
  }
  c->blocks = total > 0 ? int(ceil_div(total, int64_t(kThreads) * kCastUnroll)) : 0;
}

// floats of the fp32 copies at the start of the workspace (each piece 16-byte aligned)
int64_t cast_floats(const PlanInputs& in, const CastPlan& c) {
  const int64_t sc = pad4(in.S * in.d.c);
  return (c.widen ? staged_floats(in.d.c, in.S) : 0) + (c.transpose_w1 ? sc : 0) + (c.transpose_w2 ? sc : 0);
}

SePlan start(const PlanInputs& in, bool backward, Features* f) {
  g_plans.fetch_add(1, std::memory_order_relaxed);
  *f = features(in.version, in.dev.cc_major);
  SePlan p;
  p.backward = backward;
  p.launch.num_sms = in.dev.sms;
  p.launch.reverse = f->reverse;
  p.launch.streaming = f->streaming;
  p.launch.pdl = f->pdl;
  return p;
}

}  // namespace

bool valid_fused_version(int64_t version) { return version >= 0 && version <= kLastVersion; }

bool may_keep_state(int64_t version) { return version != 1; }

int64_t plan_count() { return g_plans.load(std::memory_order_relaxed); }

ReducePlan plan_reduce(const Dims& d, kc::DType dt, int num_sms, int extra_blocks) {
  const int vec = max_vec(dt);
  const int64_t sms = num_sms > 0 ? num_sms : 1;
  int64_t max_splits, want;
  if (d.layout == Layout::NCHW) {
    // Aim for two full waves of threads (2048 resident threads per SM), but give
    // each lane at least 4 vectors of work per split.
    const int64_t target = sms * 2048 * 2;
    const int team = nchw_team(d);
    max_splits = ceil_div(d.l, int64_t(team) * vec * 4);
    want = ceil_div(target, d.n * d.c * team);
  } else {
    // kColsPlanBlocks of reduce_cols_kernel's blocks an SM beside the kernel's
    // extra_blocks (the parameter-widening ones), each thread with at least 4 rows
    // where L allows; where N * tiles fill that already, one split: each block walks
    // the sample's whole L.
    int tc, tiles;
    nhwc_tiles(d.c, vec, &tc, &tiles);
    const int rows_par = kThreads / tc;
    max_splits = ceil_div(d.l, int64_t(rows_par) * 4);
    want = (sms * kColsPlanBlocks - extra_blocks) / (d.n * tiles);
  }
  int64_t splits = want < max_splits ? want : max_splits;
  if (splits > 1024) splits = 1024;
  if (splits < 1) splits = 1;
  int64_t chunk = ceil_div(d.l, splits);
  if (d.layout == Layout::NCHW) chunk = ceil_div(chunk, vec) * vec;  // split starts stay 16-byte aligned
  return ReducePlan{int(ceil_div(d.l, chunk)), chunk};
}

SePlan plan_forward(const PlanInputs& in) {
  Features f;
  SePlan p = start(in, /*backward=*/false, &f);
  const Dims& d = in.d;
  const void* ptrs[2] = {in.x, in.out};
  if (f.cluster && cluster_fit(in, false, ptrs, 2, &p.cluster)) {
    p.path = Path::Cluster;  // no workspace, no saved state
    return p;
  }
  p.path = f.spread && spread_fits(in) ? Path::Spread : Path::Block;
  const bool spread = p.path == Path::Spread;
  p.keep_state = in.state && spread;
  plan_staging(in, &p);
  // fp32 copies where a reader needs them: the MLP block unless it stages them from
  // their own dtype (the spread forward's products read the parameters themselves)
  p.cast.widen = in.wdt != kc::DType::F32 && !spread && !p.staged;
  plan_cast(in, &p.cast);
  p.reduce = plan_reduce(d, in.dt, in.dev.sms, p.cast.blocks);
  // the copies, the reduction's partials [N, splits, C], s [N, C], a [N, S]
  p.workspace = cast_floats(in, p.cast) + d.n * p.reduce.splits * d.c + d.n * d.c + d.n * in.S;
  return p;
}

SePlan plan_backward(const PlanInputs& in) {
  Features f;
  SePlan p = start(in, /*backward=*/true, &f);
  const Dims& d = in.d;
  const int64_t S = in.S;
  const void* ptrs[3] = {in.g, in.x, in.out};
  if (f.cluster && cluster_fit(in, true, ptrs, 3, &p.cluster)) {
    p.path = Path::Cluster;
    p.workspace = 2 * d.n * d.c + 2 * d.n * S;  // p, dz2 [N, C]; a, dz1 [N, S]
    return p;
  }
  p.path = f.spread && spread_fits(in) ? Path::Spread : Path::Block;
  const bool spread = p.path == Path::Spread;
  // The forward kept the state where it ran the spread MLP (see plan_forward): not
  // where it ran the cluster kernel, which it did with x and its fresh output.
  if (in.state && spread) {
    const void* fwd_ptrs[2] = {in.x, in.x};
    ClusterPlan unused;
    p.use_state = !(f.cluster && cluster_fit(in, false, fwd_ptrs, 2, &unused));
  }
  plan_staging(in, &p);
  // With the saved values, Coef reads w1 itself (each input's run of the tile's outputs is
  // contiguous in w1 [S, C]: coalesced), staged while the reduction drains, and so does
  // DaState w2 where its staging is cheap (whole 16-byte pieces of each row of w2 [C, S],
  // at most kWtMaxTiles sample tiles each staging them again); otherwise they read fp32
  // transposed copies that the reduction's extra blocks write.
  p.coef_direct = p.use_state && S <= kNarrowMaxI;
  p.da_direct = p.coef_direct && gemv_wt_smem(d.c) <= size_t(in.dev.smem_optin) && aligned16(in.w2) &&
                (S * kc::dtype_size(in.wdt)) % 16 == 0 && ceil_div(d.n, kTileN) <= kWtMaxTiles;
  p.cast.transpose_w1 = spread && !p.coef_direct;
  p.cast.transpose_w2 = spread && !p.da_direct;
  // with the saved values the spread products read only the transposed copies (those not direct)
  p.cast.widen = in.wdt != kc::DType::F32 && (spread ? !p.use_state : !p.staged);
  plan_cast(in, &p.cast);
  p.reduce = plan_reduce(d, in.dt, in.dev.sms, p.cast.blocks);
  p.wgrad_beside = spread && d.n <= kWgradBesideMaxN;
  // the copies, part_x and part_gx [N, splits, C], s, coef, p, dz2 [N, C], a, dz1, z1 [N, S]
  p.workspace = cast_floats(in, p.cast) + 2 * d.n * p.reduce.splits * d.c + 4 * d.n * d.c + 3 * d.n * S;
  return p;
}

}  // namespace se
