// The tuning knobs of day26's CUDA launchers (plain C++: the binding, built
// without CUDA too, owns the table).
#pragma once

#include <cstdint>

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
  kKnobL2Prefetch,       // 4 forward: row after next prefetched into L2 (0, 1; 0 refused for split rows)
  kKnobGrid,             // 4, 5, 6: at most this many blocks in the persistent grids (> 0)
  kKnobRingStages,       // 5, 6 backward: ring stages (2..6; the plan's: 3)
  kKnobCluster,          // 6: CTAs per row (1, 2 or 4, shares over 4096 columns; set, the forward splits 16-bit rows too)
  kNumKnobs
};
int* ln_knobs();  // kNumKnobs ints, defined in binding.cpp
inline int ln_knob(LnKnob k) { return ln_knobs()[k]; }

// Knob values that reach no compiled kernel; the CUDA glue (layernorm_cuda.cpp)
// refuses them with an error before a plan is made, whatever the version:
// - cluster = 2 or 4 where a row's share would be at most kClusterMinShare
//   columns: the split kernels are compiled only for the shares version 6's own
//   plan makes (rows over 8192 columns, at most 8192 a CTA: each share over 4096);
// - l2_prefetch = 0 for a forward row that may be split (fp32 over 8192 columns,
//   or any row while cluster is 2 or 4): the split forward is compiled with the
//   L2 prefetch only (which is off only where no copy engine exists, before sm_90).
constexpr int64_t kClusterMinShare = 4096;
inline bool ln_cluster_knob_refused(int64_t cols) {
  const int c = ln_knob(kKnobCluster);
  return (c == 2 || c == 4) && cols / c <= kClusterMinShare;
}
inline bool ln_l2_prefetch_knob_refused(int64_t cols, bool fp32) {
  const int c = ln_knob(kKnobCluster);
  return ln_knob(kKnobL2Prefetch) == 0 && ((fp32 && cols > 8192) || c == 2 || c == 4);
}

}  // namespace day26
