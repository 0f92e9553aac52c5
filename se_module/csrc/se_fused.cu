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
//   forward:  1. reduce (se_kernels.cuh, sum x)             -> part  [N, splits, C]
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
#include "se_act.cuh"
#include "se_kernels.cuh"

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
  if (smem > 48 * 1024) {
    KC_CUDA_TRY(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  }
  KC_CUDA_TRY(dev::check_grid(d.n));
  return dev::launch(kernel, dim3(unsigned(d.n)), dim3(kThreads), smem, stream, o.pdl, m);
}


// ------------------------------------------------------------------ version 2: the spread MLP
// (kTileN, kWarps, kGemvThreads and the shared-memory sizes: se_geometry.h.)
// gemv_kernel's threads are two warps an output, each half of the row. (H100, ncu: with
// a warp an output in 256 threads its blocks issued one instruction per ~5.8 cycles a warp, 8
// warps an SM, 72 blocks at N = 32: issue-bound latency chains; twice the warps over the same work.)
// ... in at most 96 registers a thread (48K of an SM's 64K), so that a block of the next kernel of
// the chain (launched early under PDL) fits beside one of these: with 128 (the whole register file)
// the next product's blocks waited for these to exit where both grids cover most SMs
// ((32, 2688, 12, 12): fc2 7 us slower).
constexpr int kGemvMaxRegs = 96;

enum class Epi : int { Fc1 = 0, Fc2Fwd = 1, Fc2Bwd = 2, Da = 3, Coef = 4, DaState = 5 };

struct GemvArgs {
  const float* in;     // [N, I]; Fc1: the reduction's partials [N, splits, I], summed and scaled here
  int splits;
  float in_scale;      // Fc1: 1 / L
  const void* w;       // [O, I] (Da: w2^T, Coef: w1^T), of the kernel's weight type TW (fp32 but for
                       // Fc1 and Fc2Fwd, which read the parameters in their own dtype)
  const void* bias;    // [O] (Fc1, Fc2*), TW
  bool w_early;        // w and bias are the caller's parameters, which no kernel of the chain writes
                       // (Fc1, Fc2Fwd): read before the wait, so under PDL the read overlaps the predecessor
  kc::DType w_dt;      // TW (the launcher's dispatch)
  // Fc1 under w_early: the next product's weights (fc2's w2, next_bytes of them), which fc1's blocks
  // ask into L2, a slice each, while the reduction drains (may be null)
  const void* next_w;
  int64_t next_bytes;
  // w_t (DaState and Coef with the saved state): w is given as [I, O], the parameter itself (w2 [C, S] for DaState,
  // w1 [S, C] for Coef), not as a transposed copy; the kernels stage the block's outputs' columns
  // of it, transposed, in shared memory (gemv_kernel: w and its rows 16-byte aligned)
  bool w_t;
  int64_t n, i_dim, o_dim;
  float* out;          // [N, O]: Fc1 a, Fc2* s, Da dz1, Coef dp / L
  float* out2;         // Fc1: z1 [N, S], Fc2Fwd: z2 [N, C] (may be null); Fc2Bwd: dz2 [N, C]
  const float* aux;    // Fc2Bwd: partials of sum g x [N, splits, C]; Da: z1 [N, S]
  // DaState (Da from the forward's saved values): in = the partials of sum g x
  // [N, splits, C], and the staging forms dz2 = gate_bwd(z2, s, sum) with these two
  const float *gate_z, *gate_s;  // [N, C]: z2 and s
  float* stage_out;    // the staged input as finished (Fc1: p, DaState: dz2) [N, I], written by the
                       // first output chunk's blocks (may be null)
  float out_scale;     // Coef: 1 / L
  Gate gate;           // Fc2*: the scale activation
  dev::FastDiv div_i;       // by I (gemv_narrow_kernel's staging)
  dev::FastDiv div_splits;  // by splits (1 but for Fc1; gemv_kernel's staging)
  // Coef: the weight gradients in blocks after the product's own (blockIdx.x >= chunks, y = 0;
  // dev::wgrad_tile_pair), where wg_pairs > 0
  dev::WgradTileArgs wg;
  int chunks;               // the product's own blocks in x
  int wg_pairs;
};

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
      if (smem > 48 * 1024) {
        KC_CUDA_TRY(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      }
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
  if (smem > 48 * 1024) {
    KC_CUDA_TRY(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  }
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

// w and bias fp32 (w_dt): where the forward's products read the parameters themselves,
// the caller sets w, bias, w_dt and w_early after.
GemvArgs gemv_args(const Dims& d, const float* in, const float* w, const float* bias, int64_t i_dim, int64_t o_dim,
                   float* out, Gate gate = Gate::Sigmoid) {
  GemvArgs g{};
  g.gate = gate;
  g.in = in;
  g.splits = 1;
  g.in_scale = 1.f;
  g.w = w;
  g.bias = bias;
  g.w_dt = kc::DType::F32;
  g.n = d.n;
  g.i_dim = i_dim;
  g.div_i = dev::FastDiv(uint32_t(i_dim));
  g.o_dim = o_dim;
  g.out = out;
  g.out_scale = 1.f;
  return g;
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
