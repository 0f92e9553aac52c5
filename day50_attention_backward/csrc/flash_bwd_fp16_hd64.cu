// Fused backward main kernel for __half, head dims up to 64 (see flash_bwd.cuh): one
// translation unit per (dtype, head dim) so that the heavy kernels compile in parallel.
// One tiling, 8 warps (128 keys per block) and 64-query tiles, for multi-head and
// grouped-query attention alike (the README's version log has the tilings it beat).
#include "flash_bwd.cuh"

namespace day50 {
namespace flash {

template <> cudaError_t launch_bwd_dkdv<__half, 64>(const FusedParams& p, cudaStream_t stream) {
  if (p.H != p.Hk) return launch_bwd_dkdv_cfg<__half, 64, kBwdWarps, kBwdBr, true>(p, stream);
  return launch_bwd_dkdv_cfg<__half, 64, kBwdWarps, kBwdBr, false>(p, stream);
}

}  // namespace flash
}  // namespace day50
