// se_spread.cuh: the spread MLP's products (version 2, se_spread.cu) as the fused
// block's host code (se_fused.cu) calls them: what each product computes (Epi), its
// arguments (GemvArgs) and its launcher, instantiated once per product in se_spread.cu.
#pragma once

#include "se_act.cuh"
#include "se_kernels.cuh"

namespace se {

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

// One product's launch (gemv_kernel or gemv_narrow_kernel, as its row length says).
template <Epi EPI>
cudaError_t launch_gemv_act(Act act, const GemvArgs& g, const LaunchOpts& o, cudaStream_t stream);

// w and bias fp32 (w_dt): where the forward's products read the parameters themselves,
// the caller sets w, bias, w_dt and w_early after.
inline GemvArgs gemv_args(const Dims& d, const float* in, const float* w, const float* bias, int64_t i_dim, int64_t o_dim,
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

}  // namespace se
