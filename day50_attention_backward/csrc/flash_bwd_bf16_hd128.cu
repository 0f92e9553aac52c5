// Fused backward main kernel for __nv_bfloat16, head dims up to 128 (see flash_bwd.cuh).
// Tiling variants (FusedParams::variant): v0 (4 warps, kBr 32), v1 (8 warps, kBr 32), v2 (8 warps, kBr 64).
#include "flash_bwd.cuh"

namespace day50 {
namespace flash {

template <> cudaError_t launch_bwd_dkdv<__nv_bfloat16, 128>(const FusedParams& p, cudaStream_t stream) {
  switch (p.variant) {
    case 1: return launch_bwd_dkdv_cfg<__nv_bfloat16, 128, 8, 32>(p, stream);
    case 2: return launch_bwd_dkdv_cfg<__nv_bfloat16, 128, 8, 64>(p, stream);
    default: return launch_bwd_dkdv_cfg<__nv_bfloat16, 128, 4, 32>(p, stream);
  }
}

}  // namespace flash
}  // namespace day50
