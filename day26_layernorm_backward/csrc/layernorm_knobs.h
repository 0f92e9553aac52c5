// The tuning knobs of day26's CUDA launchers (plain C++: the binding, built
// without CUDA too, owns the table).
#pragma once

namespace day26 {

// Tuning knobs for experiments (tests and tools/ only): overrides of the
// plans' own choices, kept in one process-wide table that only the extension's
// private function _set_knob writes (binding.cpp, day26_layernorm.ops.knobs).
// -1 means "the plan's choice"; the library reads no environment variables.
// The kernel family is chosen by the version (layernorm_versions.h), not by a
// knob. Knobs whose experiments lost were deleted (docs/log.md names the commit
// where each lived: ept, prefetch, force, the forward ring, smem_acc).
enum LnKnob : int {
  kKnobTargetIters = 0,  // 2, 3 (block path): vector accesses per thread aimed at (1, 2, 4, 8)
  kKnobL2Prefetch,       // 4, 6 forward: row after next prefetched into L2 (0, 1)
  kKnobGrid,             // 4, 5, 6: at most this many blocks in the persistent grids (> 0)
  kKnobRingStages,       // 5, 6 backward: ring stages (2..6; the plan's: 3)
  kKnobCluster,          // 6: CTAs per row (1, 2 or 4; set, the forward splits 16-bit rows too)
  kNumKnobs
};
int* ln_knobs();  // kNumKnobs ints, defined in binding.cpp
inline int ln_knob(LnKnob k) { return ln_knobs()[k]; }

}  // namespace day26
