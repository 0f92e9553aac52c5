// LayerNorm backward: the plan (which kernel family runs, its launch shape and
// workspace: LnBwdPlan, layernorm.h), computed once per call, and the launch of
// a plan. Families and fallbacks: layernorm_versions.h; each family's kernels,
// planner and launcher: layernorm_bwd_v1.cu .. layernorm_bwd_ring.cu.
#include "layernorm_bwd_common.cuh"

#include "kc/check.cuh"
#include "kc/vec.cuh"

namespace day26 {
namespace {

// 16 bytes' worth of elements when dy, x, dx and the weight all allow it (and
// D is a multiple of it), else 1.
int bwd_vec(const LnBackwardArgs& a) {
  const size_t elem = elem_size(a.dt), welem = elem_size(a.wdt);
  const int V = int(16 / elem);
  const bool ok = a.cols % V == 0 && kc::is_aligned(a.x, elem * V) && kc::is_aligned(a.dy, elem * V) &&
                  (!a.dx || kc::is_aligned(a.dx, elem * V)) && (!a.weight || kc::is_aligned(a.weight, welem * V));
  return ok ? V : 1;
}

// ---------------------------------------------------------------- the table
// Version 0 (auto): the families to try for a shape, best first; the plan
// appends 2 and 1. Keyed on the device (sm_90+ for the ring and clusters), the
// dtype, D and the vector width; the launch shape within a family (slots,
// grid, stages) then comes from its planner (occupancy: rows, SM count).
// Measurements (H200, README "The plan"):
//  - the ring (5): 16-bit rows of 1024 columns and more; fp32 rows shorter than
//    1024 or longer than 4096 (runs 17-19); fp32 1024-4096: row slots (4).
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
    const bool ring = elem == 2 ? share >= 1024 : (share < 1024 || share > 4096);
    if (ring && csize > 1) out[n++] = kClusterSplit;
    else if (ring && a.cols <= kRingCtaCols) out[n++] = kRing;
  }
  if (elem == 4 || a.cols <= 4096) out[n++] = kRowSlots;
  return n;
}

bool plan_family(const LnBackwardArgs& a, int family, LnBwdPlan& p) {
  switch (family) {
    case kSeed: p.grid = a.rows; p.threads = 256; return true;
    case kRegisters: return bwd_plan_v2(a, p);
    case kCpAsync: return bwd_plan_v3(a, p);
    case kRowSlots: return bwd_plan_v4(a, p);
    case kRing: return bwd_plan_ring(a, p);
    case kClusterSplit: return p.cluster > 1 && bwd_plan_ring(a, p);
  }
  return false;
}

}  // namespace

LnDevice ln_device() {
  static LnDevice cache[64];
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) dev = 0;
  if (cache[dev].cc == 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    cache[dev].sms = num_sms();
    cache[dev].cc = 10 * major + minor;
  }
  return cache[dev];
}

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
    default: return bwd_launch_v1(a, stream);
  }
  return p.finalize ? bwd_launch_finalize(a, p, stream) : cudaSuccess;
}

}  // namespace day26
