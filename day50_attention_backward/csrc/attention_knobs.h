// The private tuning knob of day50's fused backward (plain C++: the binding, built
// without CUDA too, owns it). Library code reads no environment variables: the
// tiling variant of the fused backward (0 = the default tiling; see flash_bwd_*.cu
// and the README's version log) is set only through the extension's private
// _set_bwd_variant (day50_attention.ops.bwd_variant(), for bench.py --variants).
#pragma once

namespace day50 {

int& fused_bwd_variant();  // defined in binding.cpp
// The fused forward's version (FusedParams::fwd_version: 0 auto, 1 mma.sync, 2 Hopper),
// set only through the extension's private _set_fwd_version (day50_attention.ops.fwd_version(),
// for bench.py's version ladder and the tests that pin a version).
int& fused_fwd_version();
// The fused backward main kernel's version (FusedParams::bwd_version), likewise through
// _set_bwd_version (day50_attention.ops.bwd_version()).
int& fused_bwd_version();

}  // namespace day50
