// Fused backward main kernel for __nv_bfloat16, head dims over 128 up to 256 (see flash_bwd.cuh):
// two CTAs per key block, each with dK, dV and dQ of 128 of the columns; 8 warps (128
// keys per block) and 32-query tiles, so that K, V, Q and dO of 256 columns fit shared memory.
#include "flash_bwd.cuh"

namespace day50 {
namespace flash {

template <> cudaError_t launch_bwd_dkdv<__nv_bfloat16, 256>(const FusedParams& p, cudaStream_t stream) {
  if (p.H != p.Hk) return launch_bwd_dkdv_cfg<__nv_bfloat16, 256, kBwdWarps, kWideBr, true, kWideCols>(p, stream);
  return launch_bwd_dkdv_cfg<__nv_bfloat16, 256, kBwdWarps, kWideBr, false, kWideCols>(p, stream);
}

}  // namespace flash
}  // namespace day50
