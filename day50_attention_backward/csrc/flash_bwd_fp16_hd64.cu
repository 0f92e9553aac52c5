// Fused backward main kernel for __half, head dims up to 64 (see flash_bwd.cuh).
// Tiling variants (FusedParams::variant): v0 (4 warps, kBr 64), v1 (8 warps, kBr 64), v2 (8 warps, kBr 32).
#include "flash_bwd.cuh"

namespace day50 {
namespace flash {

template <> cudaError_t launch_bwd_dkdv<__half, 64>(const FusedParams& p, cudaStream_t stream) {
  switch (p.variant) {
    case 1: return launch_bwd_dkdv_cfg<__half, 64, 8, 64>(p, stream);
    case 2: return launch_bwd_dkdv_cfg<__half, 64, 8, 32>(p, stream);
    default: return launch_bwd_dkdv_cfg<__half, 64, 4, 64>(p, stream);
  }
}

}  // namespace flash
}  // namespace day50
