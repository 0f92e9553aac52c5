// Fused backward main kernel for __nv_bfloat16, head dims up to 128 (see flash_bwd.cuh).
// Tiling variants (FusedParams::variant, the private knob ops.bwd_variant; see README "version log"):
//   0 (default): 8 warps (128 keys per block), 64-query tiles   -- fastest measured
//   1          : 4 warps (64 keys per block), 32-query tiles   -- the first version
//   2          : 8 warps, 32-query tiles
// Grouped-query attention (H > Hk) always runs the default tiling (launch_bwd_dkdv_gqa).
#include "flash_bwd.cuh"

namespace day50 {
namespace flash {

template <> cudaError_t launch_bwd_dkdv<__nv_bfloat16, 128>(const FusedParams& p, cudaStream_t stream) {
  if (p.H != p.Hk) return launch_bwd_dkdv_gqa<__nv_bfloat16, 128>(p, stream);  // grouped-query attention
  switch (p.variant) {
    case 1: return launch_bwd_dkdv_cfg<__nv_bfloat16, 128, 4, 32>(p, stream);
    case 2: return launch_bwd_dkdv_cfg<__nv_bfloat16, 128, 8, 32>(p, stream);
    default: return launch_bwd_dkdv_cfg<__nv_bfloat16, 128, 8, 64>(p, stream);
  }
}

}  // namespace flash
}  // namespace day50
