// The private tuning knob of day50's fused backward (plain C++: the binding, built
// without CUDA too, owns it). Library code reads no environment variables: the
// tiling variant of the fused backward (0 = the default tiling; see flash_bwd_*.cu
// and the README's version log) is set only through the extension's private
// _set_bwd_variant (day50_attention.ops.bwd_variant(), for bench.py --variants).
#pragma once

namespace day50 {

int& fused_bwd_variant();  // defined in binding.cpp
// The fused forward's version (FusedParams::fwd_version: 0 auto, 1 mma.sync, 2 Hopper) and
// the fused backward main kernel's (FusedParams::bwd_version), read at each launch. Set only
// inside the scoped, documented day50_attention.kernel_versions() (ops.py; the binding's
// private _set_fwd_version / _set_bwd_version), which restores the previous value on exit.
int& fused_fwd_version();
int& fused_bwd_version();

}  // namespace day50
