// se_fused.cu: the whole SE block, forward and backward, in three kernels each.
//
// Forward (per sample n; x: [C, L], L = H * W; w1: [S, C], w2: [C, S]):
//   p  = (1 / L) sum_l x[:, l]          squeeze            [C]
//   z1 = w1 p + b1,   a = act(z1)        fc1 + act          [S]
//   z2 = w2 a + b2,   s = gate(z2)       fc2 + gate         [C]
//   out[c, l] = x[c, l] * s[c]           excitation
// Backward, from g = dL/dout (each line says which forward term it comes from):
//   ds[c]   = sum_l g[c, l] x[c, l]      out = x * s, summed over the broadcast l
//   dz2     = ds * gate'(z2)             Sigmoid': s (1 - s); Hardsigmoid': 1/6 on (-3, 3)
//   da      = w2^T dz2,   dw2 += dz2 a^T,   db2 += dz2        fc2
//   dz1     = da * act'(z1)              ReLU', SiLU', Hardswish' (se_act.cuh, torch's kinks)
//   dp      = w1^T dz1,   dw1 += dz1 p^T,   db1 += dz1        fc1
//   dx[c, l] = g[c, l] s[c] + dp[c] / L  x reaches out twice: directly (times s) and through p
// (dw*, db* are summed over the batch.)
//
// Bytes: the forward must read x twice (once to pool, once to scale: s depends on
// all of x) and write out once: 3 passes. The backward reads g and x (ds and,
// recomputed in the same pass, p) and then reads g and writes dx: 4 passes. So
// 7 passes for forward + backward, and the MLP in between is a few kFLOP per
// sample. Pooling in the backward pass costs no bytes, so the fused block saves nothing
// but x and the weights for backward; the spread MLP also keeps the MLP's per-sample
// values (not bytes but launches: its fc1 and fc2 are two kernels of latency).
//
// Kernels (kThreads = 256 threads per block; the spread products kGemvThreads = 512):
//   forward:  1. reduce (se_reduce.cu, sum x)               -> part  [N, splits, C]
//             2. mlp_forward_kernel, one block per sample    -> s     [N, C]
//             3. channel_ew_kernel<Scale>                    -> out
//   backward: 1. reduce (sum x and sum g * x in one pass)    -> part_x, part_gx
//             2. mlp_backward_kernel, one block per sample   -> s, coef = dp / L, and
//                                                             p, a, dz1, dz2 for the weights
//             3. channel_ew_kernel<Dx> (dx = g * s + coef) whose extra blocks compute
//                dw1, db1, dw2, db2 as sums over n in order (no atomics anywhere)
// mlp_*_kernel assumptions: one block per sample; dynamic shared memory
// (C + S) floats forward, 3 (C + S) backward (fused_mlp_smem_bytes); dots over C
// are one warp per output (kc::warp_reduce_sum), dots over S one thread per output.
// The squeeze activation is a template parameter (with_act), the gate a runtime
// field of the arguments (it runs once per (n, c), outside the inner loops).
//
// Versions (the `version` argument; se_plan.cpp lets version N use families 1..N,
// version 0, the default, all of them):
//   1  the fused block (the kernels above). Its launch features, which every version
//      takes: the elementwise pass walks memory backwards, so it starts on the part of
//      x (or g) the reduction read last, still in L2, and stores with .cs (evict-first)
//      so the output does not push that data out; programmatic dependent launch
//      (sm_90+): kernels 2 and 3 are launched while their predecessor drains, and wait
//      in griddepcontrol.wait.
//   2  + the MLP spread over the GPU where the weights are large (2 S C >= 65536, se_plan.cpp):
//       one block per sample reads all of w1 and w2 on one SM, so many channels over
//       a small image (EfficientNet's last stages: C = 1152, S = 48) left the MLP
//       bound by one SM's L2 bandwidth, N times over. Instead each of fc1, fc2 (and
//       in the backward the two transposed products) is one gemv_kernel launch over
//       (tile of kTileN samples, chunk of outputs) blocks: the weights of a chunk are
//       read once per tile of samples, and the grid fills the GPU at any N.
//       Forward 4 kernels, backward 6; below the threshold version 2 is version 1. At
//       N <= kWgTile the backward's last product (w1^T dz1) also runs the weight-gradient
//       tiles, in blocks after its own (gemv_wgrad_blocks), and the Dx pass is elementwise only.
//       The saved state: a training forward (se_block_train, from the autograd) keeps
//       p, s, z2 [N, C] and z1, a [N, S] (a few KB), and the backward skips fc1 and fc2:
//       reduction, DaState (dz2 formed in its staging from the partials of sum g x and
//       the kept z2, s), Coef, Dx: 4 kernels instead of 6.
//       The parameters as they are: the products read them in their own dtype, before
//       their wait (they are no kernel's output, so under PDL the reads overlap the predecessor's
//       tail): fc1 asks its rows of w1 (and a slice of w2, for fc2) into L2, fc2 stages its tile of
//       w2; with the saved state, Coef stages columns of w1 [S, C] (each input's run of outputs is
//       contiguous there) and DaState columns of w2 [C, S] where its rows are whole 16-byte pieces
//       and N <= 32 (kWtMaxTiles). So the forward reduction has no widening blocks and the backward
//       reduction transposes w2 only where DaState does not stage it (H100: those extra
//       blocks cost the reductions 1-4 us at the spread rows). Widening is exact and every sum keeps
//       its order, so these products give the widened copies' values.
//   3  (se_cluster.cu) + one thread-block cluster per sample where the plan takes the
//       shape (up to 16 samples, sm_90); elsewhere version 3 is version 2. A forward in
//       the cluster kernel keeps no state; its backward recomputes.
//
// (The spread MLP's products: se_spread.cu.)
#include "se_act.cuh"
#include "se_kernels.cuh"
#include "se_spread.cuh"

#include "kc/launch.cuh"

namespace se {

namespace {

using dev::act_f;
using dev::act_grad;
using dev::gate_bwd;
using dev::gate_f;

struct MlpArgs {
  const float* part_x;   // [N, splits, C]
  const float* part_gx;  // [N, splits, C] (backward)
  int splits;
  int64_t c, s;
  float inv_l;
  Gate gate;        // the scale activation
  const float *w1, *b1, *w2, *b2;
  float* s_out;     // [N, C]
  float* coef_out;  // [N, C] (backward) dp / L
  float* p_out;     // [N, C] (backward)
  float* dz2_out;   // [N, C] (backward)
  float* a_out;     // [N, S] (backward)
  float* dz1_out;   // [N, S] (backward)
  bool staged;      // copy the parameters to shared memory first (when they fit), from src
  bool params_late; // unstaged: w1..b2 are written by the preceding kernel (widened 16-bit parameters)
  SeParams src;     // the parameters in their own dtype (what the staging reads)
};

// n elements of src (dtype dt) widened to fp32 at dst (16-byte aligned); 16-byte
// loads where src and n allow, 32 elements of a thread in flight.
template <typename T>
__device__ __forceinline__ void copy_to_smem(float* dst, const T* src, int64_t n) {
  constexpr int V = 16 / sizeof(T);
  if (kc::is_aligned(src, 16) && n % V == 0) {
    float4* d4 = reinterpret_cast<float4*>(dst);
    dev::batched_loop<32 / V>(
        threadIdx.x, n / V, kThreads, [&](int64_t i) { return kc::load_vec<V>(src + i * V); },
        [&](int64_t i, const kc::Vec<T, V>& v) {
          float f[V];
          kc::vec_to_float(v, f);
#pragma unroll
          for (int k = 0; k < V; k += 4) d4[i * (V / 4) + k / 4] = make_float4(f[k], f[k + 1], f[k + 2], f[k + 3]);
        });
  } else {
    dev::batched_loop<8>(threadIdx.x, n, kThreads, [&](int64_t i) { return kc::to_float(src[i]); },
                         [&](int64_t i, float v) { dst[i] = v; });
  }
}
__device__ __forceinline__ void copy_to_smem(float* dst, const void* src, kc::DType dt, int64_t n) {
  KC_DTYPE_SWITCH(dt, T, [&] { copy_to_smem(dst, static_cast<const T*>(src), n); });
}

struct Weights {
  const float *w1, *b1, *w2, *b2;
  float* work;  // first free float of shared memory
};

// The weights, copied to shared memory when m.staged (the copies are visible
// after the caller's next __syncthreads), else m's global pointers. The staging
// reads the parameters themselves, in their own dtype, which no kernel of the
// chain writes, so it runs before grid_dependency_wait: under PDL it overlaps the
// reduction still draining. Unstaged 16-bit parameters are read as the fp32 copies
// the reduction's extra blocks write (m.params_late): then it waits first.
// (H100: staging the fp32 copies after the wait added ~5 us to each MLP
// kernel at (32, 672, 24, 24) bf16, 150 KB a block.)
__device__ __forceinline__ Weights stage_weights(const MlpArgs& m, float* sm) {
  if (!m.staged) {
    if (m.params_late) dev::grid_dependency_wait();
    return Weights{m.w1, m.b1, m.w2, m.b2, sm};
  }
  float* w1 = sm;
  float* w2 = w1 + pad4(m.s * m.c);
  float* b1 = w2 + pad4(m.s * m.c);
  float* b2 = b1 + pad4(m.s);
  copy_to_smem(w1, m.src.w1, m.src.dt, m.s * m.c);
  copy_to_smem(w2, m.src.w2, m.src.dt, m.s * m.c);
  copy_to_smem(b1, m.src.b1, m.src.dt, m.s);
  copy_to_smem(b2, m.src.b2, m.src.dt, m.c);
  return Weights{w1, b1, w2, b2, b2 + pad4(m.c)};
}

// p[c] = inv_l * sum of the splits; then a[j] = act(w1[j, :] . p + b1[j]) by
// one warp per j. Leaves p and a (and z1 when asked) in shared memory.
template <Act ACT>
__device__ __forceinline__ void mlp_squeeze(const MlpArgs& m, const Weights& wt, int64_t n, float* p, float* a,
                                            float* z1, float* gs) {
  for (int64_t c = threadIdx.x; c < m.c; c += kThreads) {
    float acc = 0.f, accg = 0.f;
#pragma unroll 4
    for (int sp = 0; sp < m.splits; ++sp) {
      acc += m.part_x[(n * m.splits + sp) * m.c + c];
      if (gs != nullptr) accg += m.part_gx[(n * m.splits + sp) * m.c + c];
    }
    p[c] = acc * m.inv_l;
    if (gs != nullptr) gs[c] = accg;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  for (int64_t j = warp; j < m.s; j += kThreads / 32) {
    const float* w = wt.w1 + j * m.c;
    float d = 0.f;
    dev::batched_loop<8>(lane, m.c, 32, [&](int64_t c) { return w[c]; }, [&](int64_t c, float wv) { d += wv * p[c]; });
    d = kc::warp_reduce_sum<32>(d) + wt.b1[j];
    if (lane == 0) {
      a[j] = act_f<ACT>(d);
      if (z1 != nullptr) z1[j] = d;
    }
  }
  __syncthreads();
}

template <Act ACT>
__global__ void __launch_bounds__(kThreads) mlp_forward_kernel(MlpArgs m) {
  extern __shared__ float4 sm4[];
  const Weights wt = stage_weights(m, reinterpret_cast<float*>(sm4));
  float* p = wt.work;         // [C]
  float* a = wt.work + m.c;   // [S]
  dev::grid_dependency_wait();
  dev::launch_dependents();
  const int64_t n = blockIdx.x;
  mlp_squeeze<ACT>(m, wt, n, p, a, nullptr, nullptr);
  for (int64_t c = threadIdx.x; c < m.c; c += kThreads) {
    const float* w = wt.w2 + c * m.s;
    float z = 0.f;
    for (int64_t j = 0; j < m.s; ++j) z += w[j] * a[j];
    m.s_out[n * m.c + c] = gate_f(m.gate, z + wt.b2[c]);
  }
}

template <Act ACT>
__global__ void __launch_bounds__(kThreads) mlp_backward_kernel(MlpArgs m) {
  extern __shared__ float4 sm4[];
  const Weights wt = stage_weights(m, reinterpret_cast<float*>(sm4));
  float* p = wt.work;         // [C]
  float* gs = p + m.c;        // [C]  ds = sum_l g x
  float* dz2 = gs + m.c;      // [C]
  float* z1 = dz2 + m.c;      // [S]
  float* a = z1 + m.s;        // [S]
  float* dz1 = a + m.s;       // [S]
  dev::grid_dependency_wait();
  dev::launch_dependents();
  const int64_t n = blockIdx.x;
  mlp_squeeze<ACT>(m, wt, n, p, a, z1, gs);
  for (int64_t c = threadIdx.x; c < m.c; c += kThreads) {
    const float* w = wt.w2 + c * m.s;
    float z = 0.f;
    for (int64_t j = 0; j < m.s; ++j) z += w[j] * a[j];
    const float z2 = z + wt.b2[c];
    const float s = gate_f(m.gate, z2);
    const float d = gate_bwd(m.gate, z2, s, gs[c]);
    dz2[c] = d;
    m.s_out[n * m.c + c] = s;
    m.dz2_out[n * m.c + c] = d;
    m.p_out[n * m.c + c] = p[c];
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  for (int64_t j = warp; j < m.s; j += kThreads / 32) {
    float d = 0.f;
    dev::batched_loop<8>(lane, m.c, 32, [&](int64_t c) { return wt.w2[c * m.s + j]; },
                         [&](int64_t c, float wv) { d += wv * dz2[c]; });
    d = kc::warp_reduce_sum<32>(d);
    if (lane == 0) {
      const float g1 = d * act_grad<ACT>(z1[j]);
      dz1[j] = g1;
      m.dz1_out[n * m.s + j] = g1;
      m.a_out[n * m.s + j] = a[j];
    }
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < m.c; c += kThreads) {
    float d = 0.f;
    for (int64_t j = 0; j < m.s; ++j) d += wt.w1[j * m.c + c] * dz1[j];
    m.coef_out[n * m.c + c] = d * m.inv_l;
  }
}

MlpArgs mlp_args(const float* part_x, int splits, const Dims& d, int64_t S, Gate gate, const float* w1,
                 const float* b1, const float* w2, const float* b2, float* s_out) {
  MlpArgs m{};
  m.gate = gate;
  m.part_x = part_x;
  m.splits = splits;
  m.c = d.c;
  m.s = S;
  m.inv_l = 1.f / float(d.l);
  m.w1 = w1;
  m.b1 = b1;
  m.w2 = w2;
  m.b2 = b2;
  m.s_out = s_out;
  return m;
}

template <typename K>
cudaError_t launch_mlp(K kernel, const Dims& d, size_t smem, const MlpArgs& m, const LaunchOpts& o,
                       cudaStream_t stream) {
  KC_CUDA_TRY(kc::allow_dynamic_smem(kernel, smem));
  KC_CUDA_TRY(dev::check_grid(d.n));
  return dev::launch(kernel, dim3(unsigned(d.n)), dim3(kThreads), smem, stream, o.pdl, m);
}


}  // namespace

// The forward's values that the backward reads instead of recomputing them (fp32):
// p [N, C], s [N, C], z2 [N, C], z1 [N, S], a [N, S] (the glue allocates [N, 3 C + 2 S]).
namespace {
struct SavedState {
  float *p, *s, *z2, *z1, *a;
};
SavedState saved_state(float* st, const Dims& d, int64_t S) {
  const int64_t nc = d.n * d.c, ns = d.n * S;
  return SavedState{st, st + nc, st + 2 * nc, st + 3 * nc, st + 3 * nc + ns};
}

// The parameters as fp32 pointers: w's own, or (16-bit, c.widen) their copies at the
// start of ws, written by the reduction kernel's extra blocks that *cast describes; with
// c.transpose_w1 / c.transpose_w2, also fp32 copies of w1^T [C, S] / w2^T [S, C] written
// by those blocks. Carves ws in the plan's order (se_plan.cpp, cast_floats) and advances
// it past the copies. (Without widening, 16-bit parameters are read in their own dtype
// by their readers: then the pointers are unused.)
struct Fp32Params {
  const float *w1, *b1, *w2, *b2;
  const float *w1t, *w2t;  // with transpose_w1 / transpose_w2 only
};
Fp32Params fp32_params(const SeParams& w, const Dims& d, int64_t S, const CastPlan& c, float*& ws,
                       dev::ParamCast* cast) {
  *cast = dev::ParamCast{};
  const int64_t len[4] = {S * d.c, S, d.c * S, d.c};
  const int64_t cols[4] = {d.c, S, S, d.c};
  const void* src[4] = {w.w1, w.b1, w.w2, w.b2};
  Fp32Params f{};
  const float** fp[4] = {&f.w1, &f.b1, &f.w2, &f.b2};
  for (int t = 0; t < 4; ++t) {
    cast->src[t] = src[t];
    cast->len[t] = len[t];
    cast->cols[t] = cols[t];
    cast->units[t] = c.units[t];
    cast->per[t] = c.per[t];
    if (c.widen) {
      cast->dst[t] = ws;
      ws += pad4(len[t]);
    }
    *fp[t] = c.widen ? cast->dst[t] : w.dt == kc::DType::F32 ? static_cast<const float*>(src[t]) : nullptr;
  }
  if (c.transpose_w1) {
    cast->dst_t[0] = ws;
    ws += pad4(len[0]);
    f.w1t = cast->dst_t[0];
  }
  if (c.transpose_w2) {
    cast->dst_t[2] = ws;
    ws += pad4(len[2]);
    f.w2t = cast->dst_t[2];
  }
  cast->dt = w.dt;
  cast->blocks = c.blocks;
  return f;
}
}  // namespace

cudaError_t se_forward(const void* x, kc::DType dt, Dims d, int64_t S, Act act, Gate gate, const SeParams& w,
                       void* out, float* ws, float* state, const SePlan& plan, cudaStream_t stream) {
  if (d.n == 0) return cudaSuccess;
  if (plan.backward || plan.path == Path::Cluster) return cudaErrorInvalidValue;
  const LaunchOpts& o = plan.launch;
  const bool spread = plan.path == Path::Spread;
  const bool keep = state != nullptr && plan.keep_state;
  dev::ParamCast cast;
  const Fp32Params f = fp32_params(w, d, S, plan.cast, ws, &cast);
  const ReducePlan& p = plan.reduce;
  float* part = ws;
  float* s = ws + d.n * p.splits * d.c;
  KC_CUDA_TRY(
      (dev::launch_reduce<true, false, false>(x, nullptr, nullptr, nullptr, dt, d, p, part, nullptr, stream, &cast)));
  if (spread) {
    float* a = s + d.n * d.c;
    GemvArgs f1 = gemv_args(d, part, f.w1, f.b1, d.c, S, a);  // a = act(w1 p + b1)
    f1.splits = p.splits;
    f1.div_splits = dev::FastDiv(uint32_t(p.splits));
    f1.in_scale = 1.f / float(d.l);
    GemvArgs f2 = gemv_args(d, a, f.w2, f.b2, S, d.c, s, gate);  // s = gate(w2 a + b2)
    if (keep) {  // p, z1, a, z2 and s kept for the backward
      const SavedState st = saved_state(state, d, S);
      f1.out = a = st.a;
      f2.in = a;
      f1.out2 = st.z1;
      f1.stage_out = st.p;
      f2.out = s = st.s;
      f2.out2 = st.z2;
    }
    // fc1 and fc2 read the parameters themselves, in their own dtype, before their wait
    f1.w = w.w1;
    f1.bias = w.b1;
    f2.w = w.w2;
    f2.bias = w.b2;
    f1.w_dt = f2.w_dt = w.dt;
    f1.w_early = f2.w_early = true;
    f1.next_w = w.w2;
    f1.next_bytes = d.c * S * kc::dtype_size(w.dt);
    KC_CUDA_TRY((launch_gemv_act<Epi::Fc1>(act, f1, o, stream)));
    KC_CUDA_TRY((launch_gemv_act<Epi::Fc2Fwd>(act, f2, o, stream)));
    return dev::launch_ew<dev::Ew::Scale>(x, s, nullptr, 1.f, out, dt, d, o.reverse, o.streaming, o.pdl, o.num_sms,
                                          nullptr, stream);
  }
  MlpArgs m = mlp_args(part, p.splits, d, S, gate, f.w1, f.b1, f.w2, f.b2, s);
  m.staged = plan.staged;
  m.src = w;
  m.params_late = cast.blocks > 0;
  KC_CUDA_TRY(with_act(act, [&](auto tag) {
    return launch_mlp(mlp_forward_kernel<decltype(tag)::value>, d, plan.mlp_smem, m, o, stream);
  }));
  return dev::launch_ew<dev::Ew::Scale>(x, s, nullptr, 1.f, out, dt, d, o.reverse, o.streaming, o.pdl, o.num_sms,
                                        nullptr, stream);
}

cudaError_t se_backward(const void* grad, const void* x, kc::DType dt, Dims d, int64_t S, Act act, Gate gate,
                        const SeParams& w, void* dx, const SeParamGrads& dw, float* ws, const float* state,
                        const SePlan& plan, cudaStream_t stream) {
  if (d.n == 0) return cudaSuccess;  // the glue zero-fills the weight gradients
  if (!plan.backward || plan.path == Path::Cluster) return cudaErrorInvalidValue;
  const LaunchOpts& o = plan.launch;
  const bool spread = plan.path == Path::Spread;
  const bool use = state != nullptr && plan.use_state;  // then spread too
  dev::ParamCast cast;
  const Fp32Params f = fp32_params(w, d, S, plan.cast, ws, &cast);
  const ReducePlan& p = plan.reduce;
  const int64_t np = d.n * p.splits * d.c, nc = d.n * d.c;
  float* part_x = ws;
  float* part_gx = part_x + np;
  float* s = part_gx + np;
  float* coef = s + nc;
  float* pool = coef + nc;
  float* dz2 = pool + nc;
  float* a = dz2 + nc;
  float* dz1 = a + d.n * S;
  float* z1 = dz1 + d.n * S;
  const SavedState st = use ? saved_state(const_cast<float*>(state), d, S) : SavedState{};
  if (use) {  // p, a, s from the forward
    s = st.s;
    pool = st.p;
    a = st.a;
  }
  const dev::WgradTileArgs wg = dev::wgrad_args(dz1, pool, dz2, a, dw.dw1, dw.db1, dw.dw2, dw.db2, d.n, d.c, S, w.dt);
  // the weight gradients beside Coef (plan.wgrad_beside), else in the Dx pass
  const bool beside = plan.wgrad_beside;
  // one pass over (x, grad): sum x and sum grad * x per (n, c)
  KC_CUDA_TRY(
      (dev::launch_reduce<true, true, false>(x, grad, nullptr, nullptr, dt, d, p, part_x, part_gx, stream, &cast)));
  if (spread) {
    GemvArgs da = gemv_args(d, dz2, f.w2t, nullptr, d.c, S, dz1, gate);  // dz1 = (w2^T dz2) act'(z1); w2^T is [S, C] = [O, I]
    if (use) {  // z1, z2, s from the forward; DaState's staging forms dz2 from the partials of sum g x
      da.in = part_gx;
      da.splits = p.splits;
      da.div_splits = dev::FastDiv(uint32_t(p.splits));
      da.gate_z = st.z2;
      da.gate_s = st.s;
      da.stage_out = dz2;
      da.aux = st.z1;
    } else {
      GemvArgs f1 = gemv_args(d, part_x, f.w1, f.b1, d.c, S, a);  // p, z1, a
      f1.splits = p.splits;
      f1.div_splits = dev::FastDiv(uint32_t(p.splits));
      f1.in_scale = 1.f / float(d.l);
      f1.out2 = z1;
      f1.stage_out = pool;
      KC_CUDA_TRY((launch_gemv_act<Epi::Fc1>(act, f1, o, stream)));
      GemvArgs f2 = gemv_args(d, a, f.w2, f.b2, S, d.c, s, gate);  // s, dz2 = (sum g x) gate'(z2)
      f2.out2 = dz2;
      f2.aux = part_gx;
      f2.splits = p.splits;
      KC_CUDA_TRY((launch_gemv_act<Epi::Fc2Bwd>(act, f2, o, stream)));
      da.aux = z1;
    }
    GemvArgs cf = gemv_args(d, dz1, f.w1t, nullptr, S, d.c, coef);  // coef = (w1^T dz1) / L; w1^T is [C, S] = [O, I]
    cf.out_scale = 1.f / float(d.l);
    if (plan.da_direct) {  // w2 [C, S] = [I, O] of DaState
      da.w = w.w2;
      da.w_dt = w.dt;
      da.w_t = da.w_early = true;
    }
    if (plan.coef_direct) {  // w1 [S, C] = [I, O] of Coef
      cf.w = w.w1;
      cf.w_dt = w.dt;
      cf.w_t = cf.w_early = true;
    }
    KC_CUDA_TRY(use ? launch_gemv_act<Epi::DaState>(act, da, o, stream) : launch_gemv_act<Epi::Da>(act, da, o, stream));
    if (beside) {
      cf.wg = wg;
      cf.wg_pairs = int(dev::ceil_div(dev::wgrad_blocks(wg), int64_t(2)));
    }
    KC_CUDA_TRY((launch_gemv_act<Epi::Coef>(act, cf, o, stream)));
  } else {
    MlpArgs m = mlp_args(part_x, p.splits, d, S, gate, f.w1, f.b1, f.w2, f.b2, s);
    m.staged = plan.staged;
    m.src = w;
    m.params_late = cast.blocks > 0;
    m.part_gx = part_gx;
    m.coef_out = coef;
    m.p_out = pool;
    m.dz2_out = dz2;
    m.a_out = a;
    m.dz1_out = dz1;
    KC_CUDA_TRY(with_act(act, [&](auto tag) {
      return launch_mlp(mlp_backward_kernel<decltype(tag)::value>, d, plan.mlp_smem, m, o, stream);
    }));
  }
  return dev::launch_ew<dev::Ew::Dx>(grad, s, coef, 1.f, dx, dt, d, o.reverse, o.streaming, o.pdl, o.num_sms,
                                     beside ? nullptr : &wg, stream);
}

}  // namespace se
