// The tuning knobs of day26's CUDA launchers (plain C++: the binding, built
// without CUDA too, owns the table).
#pragma once

namespace day26 {

// Tuning knobs for experiments (tests and tools/ only): overrides of the
// launchers' own choices, kept in one process-wide table that only the
// extension's private functions _set_knob writes (binding.cpp,
// day26_layernorm.ops.knobs). -1 means "the library's choice"; the library reads
// no environment variables. What each knob selects: layernorm_common.cuh.
enum LnKnob : int {
  kKnobTargetIters = 0,  // v2/v3 block path: vector accesses per thread (1, 2, 4, 8)
  kKnobEpt,              // v4: elements per thread aimed at (4, 8, 16, 32)
  kKnobPrefetch,         // v4: next row prefetched into registers (0, 1)
  kKnobL2Prefetch,       // v4 forward: row after next prefetched into L2 (0, 1)
  kKnobForce,            // version 4: v4's kernels wherever they can run (1)
  kKnobGrid,             // v4: at most this many blocks in the persistent grids (> 0)
  kKnobRing,             // v4: 0 no ring, 1 ring with the planned stages, 2.. that many stages
  kKnobCluster,          // rows split across a cluster of 1, 2 or 4 CTAs
  kNumKnobs
};
int* ln_knobs();  // kNumKnobs ints, defined in binding.cpp
inline int ln_knob(LnKnob k) { return ln_knobs()[k]; }

}  // namespace day26
