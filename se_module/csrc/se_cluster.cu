// se_cluster.cu: version 3, the SE block of one sample in one thread-block cluster.
//
// Why. Versions 1 and 2 read x twice in the forward (pool, then scale) and g and x
// twice in the backward, in 3 to 6 launches with the MLP in between. Where a
// sample is small (EfficientNet's 7x7 to 24x24 stages) the launches, the MLP's
// latency and the second pass cost more than the bytes. Here the K CTAs of a
// cluster (sm_90) own one sample: CTA r keeps its share of the channels,
// [c0, c1), in shared memory, so x comes from DRAM once and out is written once
// (2 passes forward instead of 3, one launch), and the backward reads g and x
// once and writes dx (3 passes instead of 4, two launches).
//
// Forward, one launch; per CTA (share of cc = c1 - c0 channels):
//   1. stage the share of x in shared memory (16-byte loads, 8 in flight per
//      thread);
//   2. p[c] = (1 / L) sum_l x[c, l] for its channels;
//   3. fc1's partial over the share: zp[j] = sum_{c in share} w1[j, c] p[c]
//      (kParts threads per j, each adding every kParts-th channel, all its
//      weight loads in flight; then a shuffle sum). The weights are read from
//      global memory (L2) where they are used. (A first version staged slices of
//      them in shared memory through a per-element dtype switch, at 2 CTAs per
//      SM: issue-bound, 21 us for one cluster at (1, 1152, 7, 7) on an H100,
//      ncu; without the staging, with typed loads and 4 CTAs per SM, the forward
//      at (128, 1152, 7, 7) bf16 went from 106 to 51 us.)
//   4. cluster barrier; z1[j] = sum_r zp_r[j] + b1[j], the K partials read from
//      each CTA's shared memory in rank order (every CTA gets the same bits),
//      a = act(z1);
//   5. fc2 for the share: s[c] = gate(w2[c, :] . a + b2[c]) (a thread per c);
//   6. out[c, l] = x[c, l] s[c] from shared memory (16-byte stores, evict-first).
// Backward, two launches: the cluster kernel stages x and g, computes p and
//   ds[c] = sum_l g x, recomputes z1, a, s as above, then dz2 = gate'(z2) ds,
//   fc2's transposed partial dap[j] = sum_{c in share} w2[c, j] dz2[c], a second
//   cluster exchange for da, dz1 = da act'(z1), dp[c] = w1[:, c] . dz1 and
//   dx[c, l] = g[c, l] s[c] + dp[c] / L from shared memory. It stores p, dz2
//   (its channels) and a, dz1 (rank 0) per sample; wgrad_tile_kernel then sums
//   dw1 = dz1^T p, dw2 = dz2^T a, db1, db2 over the batch: 32 x 32 output tiles,
//   the batch staged 32 samples at a time, n ascending (deterministic).
// Every sum has a fixed order (same inputs: bitwise the same outputs), but not
// versions 1 and 2's order: results agree with theirs to rounding.
//
// Assumptions (the plan checks them, se_plan.cpp cluster_fit, else the other paths
// run): sm_90; x, out (g, dx) 16-byte aligned; NCHW: C * L * sizeof(T) a multiple of
// 16, shares made of units of `unit` channels with unit * L * sizeof(T) a multiple of
// 16; NHWC: C a multiple of VEC, units of VEC channels; N <= kClusterMaxN, and backward
// C * S >= kClusterBwdMinCS (where it measured faster than the other paths);
// K <= 16 and K <= the number of units; the parameters in fp32 or in
// x's dtype; the share and the vectors within `smem` bytes. Blocks of 1024, 512
// or 256 threads (the plan's: as many as one wave of the grid allows), grid (K, N),
// cluster (K, 1, 1): blockIdx.x is the rank.
#include <algorithm>
#include <type_traits>

#include "se_act.cuh"
#include "se_kernels.cuh"

#include "kc/cluster.cuh"
#include "kc/launch.cuh"

namespace se {

namespace {

// (The cluster's shape limits and shared-memory layout: se_geometry.h; where the kernel
// runs, and in which shape: se_plan.cpp, cluster_fit.)
constexpr int kParts = 8;  // threads per output of the products over the share's channels

struct ClusterArgs {
  const void* x;   // [N, C, L] or [N, L, C]
  const void* g;   // backward: grad, x's layout
  void* out;       // forward: out; backward: dx
  const void *w1, *b1, *w2, *b2;
  kc::DType wdt;
  int64_t c, l, s;
  int unit;        // channels per share unit
  int64_t units;   // ceil(C / unit)
  int cmax;        // most channels of a share
  float inv_l;
  Act act;
  Gate gate;
  float *p_out, *dz2_out, *a_out, *dz1_out;  // backward: [N, C], [N, C], [N, S], [N, S]
};

// Copy the share of one tensor into shared memory: 16-byte vectors, 8 in flight. Its
// layout there: NCHW [cc][L] (one flat range of x), NHWC [L][cc] (cc contiguous
// channels of every position).
template <typename T, Layout LAY>
__device__ __forceinline__ void stage_slab(const T* src, T* dst, int64_t n, int64_t c0, int64_t cc,
                                          const ClusterArgs& a, const dev::FastDiv& div_vc) {
  constexpr int VEC = kc::max_vec_elems<T>();
  const float4* s4;
  if constexpr (LAY == Layout::NCHW) {
    s4 = reinterpret_cast<const float4*>(src + (n * a.c + c0) * a.l);
    const int64_t nv = cc * a.l / VEC;
    float4* d4 = reinterpret_cast<float4*>(dst);
    dev::batched_loop<8>(threadIdx.x, nv, blockDim.x, [&](int64_t i) { return __ldcs(s4 + i); },
                         [&](int64_t i, float4 v) { d4[i] = v; });
  } else {
    const int64_t vc = cc / VEC;  // vectors per position
    const T* base = src + n * a.l * a.c + c0;
    dev::batched_loop<8>(
        threadIdx.x, a.l * vc, blockDim.x,
        [&](int64_t i) {
          const int64_t l = div_vc.div(uint32_t(i)), v = i - l * vc;
          return __ldcs(reinterpret_cast<const float4*>(base + l * a.c + v * VEC));
        },
        [&](int64_t i, float4 v) { reinterpret_cast<float4*>(dst)[i] = v; });  // [l][cc]: vector i is at i * VEC
  }
}

// out[j] = sum_{cl < cc} w(j, cl) v[cl] for j < S: kParts threads per j (part q adds
// cl = q, q + kParts, ..., its loads batched 16 deep), then a shuffle sum over the
// parts in a fixed order; part 0 stores. blockDim.x / kParts outputs per round.
template <typename W>
__device__ __forceinline__ void share_product(W w, const float* v, int64_t cc, int64_t S, float* out) {
  const int q = threadIdx.x % kParts;
  for (int64_t j0 = 0; j0 < S; j0 += blockDim.x / kParts) {
    const int64_t j = j0 + threadIdx.x / kParts;
    float d = 0.f;
    if (j < S)
      dev::batched_loop<16>(q, cc, kParts, [&](int64_t cl) { return w(j, cl); },
                            [&](int64_t cl, float wv) { d += wv * v[cl]; });
#pragma unroll
    for (int off = kParts / 2; off > 0; off /= 2) d += __shfl_xor_sync(0xffffffffu, d, off);
    if (q == 0 && j < S) out[j] = d;
  }
}

// p[cl] = inv_l sum_l x, and with g, ds[cl] = sum_l g x, for cl < cc. NCHW: a
// warp per channel, lanes over l; NHWC: G = blockDim.x / cc groups of threads
// per channel, each adding every G-th position, then the groups in order.
template <typename T, Layout LAY, bool kGrad>
__device__ __forceinline__ void pool_share(const T* xs, const T* gs, int64_t cc, int64_t L, float inv_l, float* p,
                                           float* ds, float* red) {
  if constexpr (LAY == Layout::NCHW) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int64_t cl = warp; cl < cc; cl += blockDim.x / 32) {
      float sx = 0.f, sg = 0.f;
      for (int64_t l = lane; l < L; l += 32) {
        const float xv = kc::to_float(xs[cl * L + l]);
        sx += xv;
        if constexpr (kGrad) sg += kc::to_float(gs[cl * L + l]) * xv;
      }
      sx = kc::warp_reduce_sum<32>(sx);
      if constexpr (kGrad) sg = kc::warp_reduce_sum<32>(sg);
      if (lane == 0) {
        p[cl] = sx * inv_l;
        if constexpr (kGrad) ds[cl] = sg;
      }
    }
  } else {
    const int64_t nt = blockDim.x, groups = cc < nt ? nt / cc : 1;
    for (int64_t t = threadIdx.x; t < groups * cc; t += nt) {
      const int64_t cl = t % cc, gi = t / cc;
      float sx = 0.f, sg = 0.f;
      for (int64_t l = gi; l < L; l += groups) {
        const float xv = kc::to_float(xs[l * cc + cl]);
        sx += xv;
        if constexpr (kGrad) sg += kc::to_float(gs[l * cc + cl]) * xv;
      }
      if (groups == 1) {
        p[cl] = sx * inv_l;
        if constexpr (kGrad) ds[cl] = sg;
      } else {
        red[gi * cc + cl] = sx;
        if constexpr (kGrad) red[nt + gi * cc + cl] = sg;
      }
    }
    if (groups > 1) {
      __syncthreads();
      for (int64_t cl = threadIdx.x; cl < cc; cl += nt) {
        float sx = 0.f, sg = 0.f;
        for (int64_t gi = 0; gi < groups; ++gi) {
          sx += red[gi * cc + cl];
          if constexpr (kGrad) sg += red[nt + gi * cc + cl];
        }
        p[cl] = sx * inv_l;
        if constexpr (kGrad) ds[cl] = sg;
      }
    }
  }
}

// out[c, l] = f(c, l) for the share, from shared memory, 16-byte evict-first stores.
// f(k-th element of the vector, its channel in the share, its value in xs/gs) -> float.
template <typename T, Layout LAY, typename F>
__device__ __forceinline__ void write_share(T* dst, const T* src_s, int64_t n, int64_t c0, int64_t cc,
                                           const ClusterArgs& a, const dev::FastDiv& div_vc,
                                           const dev::FastDiv& div_l, F f) {
  constexpr int VEC = kc::max_vec_elems<T>();
  const int64_t nv = cc * a.l / VEC;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    const kc::Vec<T, VEC> v = reinterpret_cast<const kc::Vec<T, VEC>*>(src_s)[i];
    float o[VEC];
    T* at;
    if constexpr (LAY == Layout::NCHW) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) o[k] = f(int64_t(div_l.div(uint32_t(i * VEC + k))), kc::to_float(v.v[k]));
      at = dst + (n * a.c + c0) * a.l + i * VEC;
    } else {
      const int64_t vc = cc / VEC;
      const int64_t l = div_vc.div(uint32_t(i)), cv = (i - l * vc) * VEC;
#pragma unroll
      for (int k = 0; k < VEC; ++k) o[k] = f(cv + k, kc::to_float(v.v[k]));
      at = dst + (n * a.l + l) * a.c + c0 + cv;
    }
    dev::store_f<VEC>(at, o, /*streaming=*/true);
  }
}

// The sum over the cluster's K CTAs of the float at `local`'s place in each one's shared
// memory, in rank order; all K loads issued before the first add (a loop over the peers
// that added each load as it came waited on every one in turn).
__device__ __forceinline__ float sum_peers(const float* local, unsigned K) {
  float v[kMaxCluster];
#pragma unroll
  for (unsigned r = 0; r < kMaxCluster; ++r) v[r] = r < K ? kc::ld_cluster(kc::map_rank(local, r)) : 0.f;
  float z = 0.f;
#pragma unroll
  for (unsigned r = 0; r < kMaxCluster; ++r)
    if (r < K) z += v[r];
  return z;
}

// The share's weights, w1[:, c0 : c0 + cc] (S rows of cc) and w2[c0 : c0 + cc, :] (cc * S
// contiguous), asked into L2 by the copy engine: a hint that nothing waits for, so the
// products' first loads hit L2 rather than DRAM. Each range is rounded out to 16 bytes
// (the copy's unit), which stays inside the 16-byte chunks, so the pages, its bytes are in.
template <typename TW>
__device__ __forceinline__ void prefetch_weights(const ClusterArgs& a, int64_t c0, int64_t cc) {
  auto range = [](const TW* p, int64_t elems) { kc::bulk_prefetch_l2_range(p, size_t(elems) * sizeof(TW)); };
  const TW* w1 = static_cast<const TW*>(a.w1);
  const TW* w2 = static_cast<const TW*>(a.w2);
  for (int64_t j = threadIdx.x; j < a.s; j += blockDim.x) range(w1 + j * a.c + c0, cc);
  if (threadIdx.x == blockDim.x - 1) range(w2 + c0 * a.s, cc * a.s);
}

// The rank's share: channels [c0, c0 + cc).
__device__ __forceinline__ void share_of(const ClusterArgs& a, int64_t& c0, int64_t& cc) {
  const int64_t k = gridDim.x, r = blockIdx.x;
  const int64_t u0 = r * a.units / k, u1 = (r + 1) * a.units / k;
  c0 = u0 * a.unit;
  const int64_t c1 = u1 * a.unit < a.c ? u1 * a.unit : a.c;
  cc = c1 - c0;
}

template <typename T, typename TW, Layout LAY, bool kBwd>
__global__ void __launch_bounds__(kClusterMaxThreads, 1) se_cluster_kernel(ClusterArgs a) {
  extern __shared__ float4 sm4[];
  char* smem = reinterpret_cast<char*>(sm4);
  const int nt = blockDim.x;
  const ClusterSmem m = cluster_smem(a.cmax, a.l, a.s, int(sizeof(T)), kBwd, nt);
  T* xs = reinterpret_cast<T*>(smem + m.xs);
  T* gs = reinterpret_cast<T*>(smem + m.gs);
  float* p = reinterpret_cast<float*>(smem + m.vec);
  float* ds = p + pad16(a.cmax * 4) / 4;
  float* sv = ds + pad16(a.cmax * 4) / 4;
  float* dz = sv + pad16(a.cmax * 4) / 4;  // dz2, then coef = dp / L
  float* zp = reinterpret_cast<float*>(smem + m.svec);
  const int64_t sp = pad16(a.s * 4) / 4;
  float* dap = zp + sp;
  float* z1 = dap + sp;
  float* av = z1 + sp;
  float* dz1 = av + sp;
  float* red = reinterpret_cast<float*>(smem + m.red);

  constexpr int VEC = kc::max_vec_elems<T>();
  const int64_t n = blockIdx.y, S = a.s, C = a.c;
  const unsigned rank = kc::cluster_rank(), K = kc::cluster_size_x();
  int64_t c0, cc;
  share_of(a, c0, cc);
  const dev::FastDiv div_vc{uint32_t(LAY == Layout::NHWC ? cc / VEC : 1)};
  const dev::FastDiv div_l{uint32_t(a.l)};
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  // 0. the share's weights (w1[:, share], w2[share, :]) on their way to L2 while x is staged
  prefetch_weights<TW>(a, c0, cc);
  // 1. the share (and g's)
  stage_slab<T, LAY>(static_cast<const T*>(a.x), xs, n, c0, cc, a, div_vc);
  if constexpr (kBwd) stage_slab<T, LAY>(static_cast<const T*>(a.g), gs, n, c0, cc, a, div_vc);
  // the weights from global memory (L2): w1 at (j, c0 + cl), w2 at (c0 + cl, j)
  const TW* w1 = static_cast<const TW*>(a.w1);
  const TW* w2 = static_cast<const TW*>(a.w2);
  auto w1v = [&](int64_t j, int64_t cl) { return kc::to_float(w1[j * C + c0 + cl]); };
  auto w2v = [&](int64_t cl, int64_t j) { return kc::to_float(w2[(c0 + cl) * S + j]); };
  __syncthreads();

  // 2. pool
  pool_share<T, LAY, kBwd>(xs, gs, cc, a.l, a.inv_l, p, ds, red);
  __syncthreads();

  // 3. fc1's partial over the share
  share_product(w1v, p, cc, S, zp);
  // 4. the cluster's partials, in rank order
  kc::cluster_sync();
  for (int64_t j = threadIdx.x; j < S; j += nt) {
    const float z = sum_peers(zp + j, K) + kc::to_float(static_cast<const TW*>(a.b1)[j]);
    z1[j] = z;
    av[j] = dev::act_rt(a.act, z);
  }
  if constexpr (!kBwd) kc::cluster_arrive();  // done reading the peers' zp (waited for before exit)
  __syncthreads();

  // 5. fc2 for the share: kParts threads per channel (each reads every kParts-th
  // element of the channel's row of w2: a warp's loads cover 4 rows, 16 bytes each
  // in bf16), then the gate, a thread per channel
  share_product([&](int64_t cl, int64_t j) { return w2v(cl, j); }, av, S, cc, sv);
  __syncthreads();
  for (int64_t cl = threadIdx.x; cl < cc; cl += nt) {
    const float z2 = sv[cl] + kc::to_float(static_cast<const TW*>(a.b2)[c0 + cl]);
    const float s = dev::gate_f(a.gate, z2);
    sv[cl] = s;
    if constexpr (kBwd) {
      const float d = dev::gate_bwd(a.gate, z2, s, ds[cl]);
      dz[cl] = d;
      a.p_out[n * C + c0 + cl] = p[cl];
      a.dz2_out[n * C + c0 + cl] = d;
    }
  }
  __syncthreads();

  if constexpr (!kBwd) {
    // 6. out = x s
    write_share<T, LAY>(static_cast<T*>(a.out), xs, n, c0, cc, a, div_vc, div_l,
                        [&](int64_t cl, float xv) { return xv * sv[cl]; });
    kc::cluster_wait();  // no CTA leaves while a peer may still read its zp
  } else {
    // fc2's transposed partial: dap[j] = sum_{cl} w2[c0 + cl, j] dz2[cl]
    share_product([&](int64_t j, int64_t cl) { return w2v(cl, j); }, dz, cc, S, dap);
    kc::cluster_sync();  // the dap partials are visible, and every peer has read zp
    for (int64_t j = threadIdx.x; j < S; j += nt) {
      const float g1 = sum_peers(dap + j, K) * dev::act_grad_rt(a.act, z1[j]);
      dz1[j] = g1;
      if (rank == 0) {
        a.a_out[n * S + j] = av[j];
        a.dz1_out[n * S + j] = g1;
      }
    }
    kc::cluster_arrive();  // done reading the peers' dap
    __syncthreads();
    // dp / L for the share (a thread per channel); dz2 is no longer read: coef replaces it
    for (int64_t cl = threadIdx.x; cl < cc; cl += nt) {
      float d = 0.f;
      dev::batched_loop<16>(0, S, 1, [&](int64_t j) { return w1v(j, cl); },
                            [&](int64_t j, float wv) { d += wv * dz1[j]; });
      dz[cl] = d * a.inv_l;
    }
    __syncthreads();
    kc::launch_dependents();  // wgrad_tile_kernel (PDL) waits for this grid's completion
    // dx = g s + dp / L
    write_share<T, LAY>(static_cast<T*>(a.out), gs, n, c0, cc, a, div_vc, div_l,
                        [&](int64_t cl, float gv) { return gv * sv[cl] + dz[cl]; });
    kc::cluster_wait();
  }
}

// The weight gradients after the cluster pass (dev::wgrad_tile_block), launched
// with PDL: the cluster kernel triggers them before its dx stores.
__global__ void __launch_bounds__(kThreads) wgrad_tile_kernel(dev::WgradTileArgs w) {
  kc::grid_dependency_wait();
  dev::wgrad_tile_block(w, blockIdx.x);
}

// The attributes a launch (or an occupancy query) of the cluster kernel with clusters
// of k CTAs and smem bytes of dynamic shared memory needs.
template <typename T, typename TW, Layout LAY, bool kBwd>
cudaError_t set_cluster_attributes(int k, size_t smem) {
  const void* fn = reinterpret_cast<const void*>(se_cluster_kernel<T, TW, LAY, kBwd>);
  if (k > 8) KC_CUDA_TRY(kc::allow_nonportable_cluster(fn));
  KC_CUDA_TRY(kc::allow_dynamic_smem(fn, smem));
  return cudaSuccess;
}

template <typename T, typename TW, Layout LAY, bool kBwd>
cudaError_t launch_cluster_kernel(const ClusterArgs& a, const ClusterPlan& p, int64_t n, cudaStream_t stream) {
  auto kernel = se_cluster_kernel<T, TW, LAY, kBwd>;
  KC_CUDA_TRY((set_cluster_attributes<T, TW, LAY, kBwd>(p.k, p.smem)));
  return kc::launch_cluster(kernel, dim3(unsigned(p.k), unsigned(n)), dim3(unsigned(p.threads)), p.smem, stream,
                            unsigned(p.k), a);
}

// How many clusters of k CTAs of `threads` threads (and up to `smem` bytes each) fit on
// the device at once: CUDA's occupancy query (a cluster's CTAs share one GPC), kept per
// (device, kernel, threads, k, smem) by kc::max_active_clusters_cached.
template <typename T, typename TW, Layout LAY, bool kBwd>
int cluster_capacity_of(int threads, int k, size_t smem) {
  return kc::max_active_clusters_cached(se_cluster_kernel<T, TW, LAY, kBwd>, threads, smem, unsigned(k),
                                        [&] { return set_cluster_attributes<T, TW, LAY, kBwd>(k, smem); });
}

ClusterArgs cluster_args(const Dims& d, int64_t S, Act act, Gate gate, const SeParams& w, const ClusterPlan& p) {
  ClusterArgs a{};
  a.w1 = w.w1, a.b1 = w.b1, a.w2 = w.w2, a.b2 = w.b2;
  a.wdt = w.dt;
  a.c = d.c, a.l = d.l, a.s = S;
  a.unit = p.unit;
  a.units = p.units;
  a.cmax = p.cmax;
  a.inv_l = 1.f / float(d.l);
  a.act = act;
  a.gate = gate;
  return a;
}

// The parameters come in fp32 or in x's dtype (the plan, cluster_fit, checks it).
template <bool kBwd>
cudaError_t dispatch_cluster(const ClusterArgs& a, kc::DType dt, const Dims& d, const ClusterPlan& p,
                             cudaStream_t stream) {
  return KC_DTYPE_SWITCH(dt, T, [&]() -> cudaError_t {
    return KC_BOOL_SWITCH(a.wdt == kc::DType::F32, kF32, [&]() -> cudaError_t {
      using TW = std::conditional_t<kF32, float, T>;
      return d.layout == Layout::NCHW ? launch_cluster_kernel<T, TW, Layout::NCHW, kBwd>(a, p, d.n, stream)
                                      : launch_cluster_kernel<T, TW, Layout::NHWC, kBwd>(a, p, d.n, stream);
    });
  });
}

}  // namespace

int cluster_capacity(kc::DType dt, kc::DType wdt, Layout lay, bool backward, int threads, int k, size_t smem) {
  return KC_DTYPE_SWITCH(dt, T, [&]() -> int {
    return KC_BOOL_SWITCH(wdt == kc::DType::F32, kF32, [&]() -> int {
      using TW = std::conditional_t<kF32, float, T>;
      return KC_BOOL_SWITCH(backward, kBwd, [&]() -> int {
        return lay == Layout::NCHW ? cluster_capacity_of<T, TW, Layout::NCHW, kBwd>(threads, k, smem)
                                   : cluster_capacity_of<T, TW, Layout::NHWC, kBwd>(threads, k, smem);
      });
    });
  });
}

cudaError_t cluster_forward(const void* x, kc::DType dt, const Dims& d, int64_t S, Act act, Gate gate,
                            const SeParams& w, void* out, const ClusterPlan& p, cudaStream_t stream) {
  ClusterArgs a = cluster_args(d, S, act, gate, w, p);
  a.x = x;
  a.out = out;
  return dispatch_cluster<false>(a, dt, d, p, stream);
}

cudaError_t cluster_backward(const void* grad, const void* x, kc::DType dt, const Dims& d, int64_t S, Act act,
                             Gate gate, const SeParams& w, void* dx, const SeParamGrads& dw, float* ws,
                             const ClusterPlan& p, cudaStream_t stream) {
  ClusterArgs a = cluster_args(d, S, act, gate, w, p);
  a.x = x;
  a.g = grad;
  a.out = dx;
  a.p_out = ws;
  a.dz2_out = ws + d.n * d.c;
  a.a_out = ws + 2 * d.n * d.c;
  a.dz1_out = a.a_out + d.n * S;
  KC_CUDA_TRY(dispatch_cluster<true>(a, dt, d, p, stream));
  const dev::WgradTileArgs wg = dev::wgrad_args(a.dz1_out, a.p_out, a.dz2_out, a.a_out, dw.dw1, dw.db1, dw.dw2,
                                                dw.db2, d.n, d.c, S, w.dt);
  const int64_t blocks = dev::wgrad_blocks(wg);
  KC_CUDA_TRY(dev::check_grid(blocks));
  return kc::launch(wgrad_tile_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, kc::sm90_or_newer(), wg);
}

}  // namespace se
