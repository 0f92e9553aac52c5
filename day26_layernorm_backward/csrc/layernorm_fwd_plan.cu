// LayerNorm forward: the plan (which kernel family runs and its launch shape:
// FwdPlan, layernorm_fwd_common.cuh), computed once per call, and its launch.
// Families and fallbacks: layernorm_versions.h; each family's kernels and
// launcher: layernorm_fwd_v1.cu .. layernorm_fwd_v4.cu (4 and 6).
#include "layernorm_fwd_common.cuh"

#include "kc/check.cuh"
#include "kc/vec.cuh"

namespace day26 {
namespace {

// Version 0 (auto), the forward's table (H200 measurements, README "The plan"):
// - fp32 rows longer than 8192 on sm_90+ (16-byte vectors): split across a
//   cluster (6), the next row prefetched: 85% of the floor at 4096 x 16384
//   against v3's 80% (probe run 42); else 3 for rows over 8192 (v3 measured
//   faster than v2 there), 2 below (v4 with the next row prefetched was 1-3%
//   faster than v2 at 1024 and 8192 columns in probe runs 37-38 but 3-8% slower
//   in bench run 39: no consistent gain).
// - 16-bit rows: 4 (row slots, the next row prefetched); split across a cluster
//   they measured much slower (one 512-thread slot per SM waits for every row's
//   exchange: 110 against 77 us), so not split unless knob cluster is set, or
//   the row is longer than 4 holds (over 16384 columns: 512 threads of 4
//   vectors), where version 2 cannot hold it either and version 1 ran it: H200,
//   4096 x 32768 bf16 687 us against torch's 238.5.
// Where a thread holds 4 vectors (one slot per SM), 4 and 6 also prefetch the row
// after next into L2 (4096 x 16384: bf16 77.0 -> 73.5 us, fp32 148.2 -> 139.8,
// probe run 49; knob l2_prefetch = 0 turns it off).
// - Rows without 16-byte vectors (D not a multiple of 16 bytes, or a misaligned
//   view): rows up to 2048 columns keep 4 (16-bit, where it runs them) and 2's
//   run-time loop; longer rows run 3 on their covering granules where a stage is at most
//   kV3GranuleRowMax (two blocks an SM): H200, forward, against 2's loop: 4096 x 8191
//   bf16 126.0 -> 102.4 us, fp32 140.7 -> 126.5, 32768 x 4095 bf16 511.5 -> 427.9;
//   against version 1's long rows 4096 x 16383 bf16 276.3 -> 198.8. At one block an SM
//   (fp32 4096 x 16383: 272.1 -> 354.1, bf16 4096 x 32767: 583.7 -> 629.8) and at 769
//   bf16 or 1025 fp32 columns (6-12%) it was slower, so those keep 1 and 2.
constexpr size_t kV3GranuleRowMax = 52 * 1024;
template <typename T, typename TW>
int fwd_auto_families(const LnForwardArgs& a, bool vec_ok, const LnDevice& dev, int (&out)[4]) {
  int n = 0;
  const bool too_long_for_slots = sizeof(T) == 2 && !v4_config(a.cols, kc::max_vec_elems<T>()).ok;
  if (vec_ok && dev.sm90() && (sizeof(T) == 4 || too_long_for_slots || ring_cluster_forced()))
    out[n++] = kClusterSplit;
  const bool granules = !vec_ok && a.cols > 2048 && v3_row_bytes(a.cols, sizeof(T), true) <= kV3GranuleRowMax;
  if (sizeof(T) == 2) out[n++] = kRowSlots;
  if (granules || (vec_ok && sizeof(T) == 4 && a.cols > 8192)) out[n++] = kCpAsync;
  out[n++] = kRegisters;
  out[n++] = kSeed;
  return n;
}

// Whether family f can run the shape; if so, its launch shape into p.
template <typename T, typename TW>
bool fwd_plan_family(const LnForwardArgs& a, int f, const LnDevice& dev, FwdPlan& p) {
  constexpr int V = kc::max_vec_elems<T>();
  const bool vec_ok = p.vec == V;
  switch (f) {
    case kSeed: return fwd_plan_v1(a, p);
    case kRegisters: p.c2 = v2_config(a.cols, p.vec); return p.c2.ok;
    case kCpAsync: {
      p.stages = pipe_stages(v3_row_bytes(a.cols, sizeof(T), !vec_ok));
      if (!vec_ok) {  // the granules: version 2's run-time loop's block shape, any length
        p.c2 = v2_config(a.cols > 8192 ? 8192 : a.cols, 1);
        return !p.c2.warp && p.stages >= 2;
      }
      const V2Config c = v2_config(a.cols, p.vec);
      if (!c.ok || c.warp || p.stages < 2) return false;
      p.c2 = v3_config(a.cols, V);
      return true;
    }
    case kRowSlots:
    case kClusterSplit: return fwd_plan_v4(a, f == kClusterSplit, dev, p);
  }
  return false;  // 5: no forward ring (layernorm_versions.h)
}

// add_norm's arguments once ln_add has written the sum: the plain norm of it.
LnForwardArgs sum_args(const LnForwardArgs& a) {
  LnForwardArgs b = a;
  b.x = a.sum;
  b.residual = nullptr;
  b.sum = nullptr;
  return b;
}

// add_norm (a.residual): the family the table picks takes the residual where
// fwd_fuses_add allows (add); if the family that can run does not, the plan is
// the plain norm's of the sum, after ln_add (add_first).
template <typename T, typename TW>
FwdPlan fwd_plan(const LnForwardArgs& a, int version, const LnDevice& dev) {
  constexpr int V = kc::max_vec_elems<T>();
  FwdPlan base;
  const bool vec_ok = kc::can_vectorize<T, V>(a.x, a.cols) && kc::can_vectorize<T, V>(a.y, a.cols) &&
                      (!a.weight || kc::is_aligned(a.weight, sizeof(TW) * V)) &&
                      (!a.bias || kc::is_aligned(a.bias, sizeof(TW) * V)) &&
                      (!a.residual ||
                       (kc::can_vectorize<T, V>(a.residual, a.cols) && kc::can_vectorize<T, V>(a.sum, a.cols)));
  base.vec = vec_ok ? V : 1;
  int chain[8], n = 0;
  if (version >= kSeed && version <= kMaxVersion) {
    for (int f = version; f != 0; f = ln_fallback(f, /*forward=*/true)) chain[n++] = f;
  } else {
    int first[4];
    const int k = fwd_auto_families<T, TW>(a, vec_ok, dev, first);
    for (int i = 0; i < k; ++i) chain[n++] = first[i];
  }
  for (int i = 0; i < n; ++i) {
    FwdPlan p = base;
    p.family = chain[i];
    p.add = a.residual && fwd_fuses_add<T>(p.family, p.vec);
    if (fwd_plan_family<T, TW>(a, p.family, dev, p)) {
      if (a.residual && !p.add) break;
      return p;
    }
  }
  if (a.residual) {
    FwdPlan p = fwd_plan<T, TW>(sum_args(a), version, dev);
    p.add_first = true;
    return p;
  }
  return base;  // not reached: every chain ends in version 1, which runs every shape
}

cudaError_t fwd_launch(const LnForwardArgs& a, const FwdPlan& p, cudaStream_t stream) {
  switch (p.family) {
    case kRegisters: return fwd_launch_v2(a, p, stream);
    case kCpAsync: return fwd_launch_v3(a, p, stream);
    case kRowSlots:
    case kClusterSplit: return fwd_launch_v4(a, p, stream);
  }
  return fwd_launch_v1(a, p, stream);
}

}  // namespace

LnFwdPlanInfo ln_forward_plan(const LnForwardArgs& a, int version, const LnDevice& dev) {
  LnFwdPlanInfo i;
  ln_typed(a.dt, a.wdt, [&](auto t, auto tw) {
    const FwdPlan p = fwd_plan<decltype(t), decltype(tw)>(a, version, dev);
    i.family = p.family;
    i.vec = p.vec;
    i.cluster = p.cluster;
    i.l2pf = p.l2pf;
    i.add = p.add;
    i.add_first = p.add_first;
    i.pack = p.pack;
    switch (p.family) {
      case kRegisters:
      case kCpAsync:
        i.iters = p.c2.iters, i.tpr = p.c2.tpr, i.warp = p.c2.warp, i.threads = p.c2.threads, i.stages = p.stages;
        break;
      case kRowSlots:
      case kClusterSplit:
        i.iters = p.c4.iters, i.tpr = p.c4.tpr, i.slots = p.p4.slots, i.threads = p.p4.threads;
        i.grid = p.p4.grid;
        break;
      default:
        i.threads = v1_threads(a.cols);
        i.smem = int64_t(p.smem);
    }
    return 0;
  });
  return i;
}

cudaError_t ln_forward(const LnForwardArgs& a, int version, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  const LnDevice dev = ln_device();
  return ln_typed(a.dt, a.wdt, [&](auto t, auto tw) {
    using T = decltype(t);
    using TW = decltype(tw);
    const FwdPlan p = fwd_plan<T, TW>(a, version, dev);
    if (!p.add_first) return fwd_launch(a, p, stream);
    KC_CUDA_TRY(ln_add(a.x, a.residual, a.sum, a.rows * a.cols, a.dt, stream));
    return fwd_launch(sum_args(a), p, stream);
  });
}

}  // namespace day26
