// The private knobs of day50's fused kernels (plain C++: the binding, built without
// CUDA too, owns them). Library code reads no environment variables.
#pragma once

namespace day50 {

// The fused forward's version (FusedParams::fwd_version: 0 auto, 1 mma.sync, 2 Hopper) and
// the fused backward main kernel's (FusedParams::bwd_version), read at each launch. Set only
// inside the scoped, documented day50_attention.kernel_versions() (ops.py; the binding's
// private _set_fwd_version / _set_bwd_version), which restores the previous value on exit.
int& fused_fwd_version();
int& fused_bwd_version();

}  // namespace day50
