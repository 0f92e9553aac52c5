// The kernel versions of day26 and their fallback rules, in one place (plain
// C++: the CPU build's checks include it too).
//
// A version names one kernel family (1 the seed's algorithm, then each step
// that bought something); 0 (auto, the default) is not a kernel but a plan:
// the family per shape from the table in layernorm_bwd_plan.cu (backward) and
// layernorm_fwd_plan.cu's fwd_plan (forward). The README shows both tables with the
// measurements behind them.
//
//   0  auto         the plan's choice (the default; written once: binding.cpp's schema)
//   1  seed         one block per row, the row read from global memory per pass
//                   (rows over 8192 columns: kept in shared memory where they fit)
//   2  registers    the row in registers, one read; persistent grid (backward)
//   3  cp.async     2's math on a cp.async pipeline of rows in shared memory
//   4  row slots    several independent row teams per block, dγ/dβ sums in registers
//   5  ring         4 on a shared-memory ring of rows filled by the copy engine
//                   (sm_90+; backward only: the forward has no version 5 kernel)
//   6  cluster      the row split across a thread-block cluster (sm_90+): the
//                   ring backward, 4's forward
//
// Fallbacks: a version that cannot run a shape runs the next one of its chain
// (the plan records the family that ran):
//   6 -> 5 -> 4 -> 2 -> 1   (6 and 5: sm_90+, 16-byte vectors, a ring / cluster that
//                            fits; 4: a row of at most 512 threads x 4 vectors)
//   3 -> 2 -> 1             (3: block path, two stages that fit; the backward's:
//                            16-byte vectors too)
//   2 -> 1                  (2: rows of at most 16384 elements, 8192 without 16-byte vectors)
//   forward: 5 runs 4; 6 -> 4 -> 2 -> 1
// Auto's chain is the table's entry, then 4 where the table allows it, 2, 1.
#pragma once

#include <cstdint>

namespace day26 {

enum LnFamily : int {
  kAuto = 0,
  kSeed = 1,
  kRegisters = 2,
  kCpAsync = 3,
  kRowSlots = 4,
  kRing = 5,
  kClusterSplit = 6,
};
constexpr int kMinVersion = kAuto;
constexpr int kMaxVersion = kClusterSplit;

inline bool ln_version_ok(int64_t v) { return v >= kMinVersion && v <= kMaxVersion; }

// The next family to try when `family` cannot run a shape (0: none left).
inline int ln_fallback(int family, bool forward) {
  switch (family) {
    case kClusterSplit: return forward ? kRowSlots : kRing;
    case kRing: return kRowSlots;
    case kRowSlots: return kRegisters;
    case kCpAsync: return kRegisters;
    case kRegisters: return kSeed;
    default: return 0;
  }
}

inline const char* ln_family_name(int family) {
  switch (family) {
    case kSeed: return "seed";
    case kRegisters: return "registers";
    case kCpAsync: return "cp.async";
    case kRowSlots: return "row slots";
    case kRing: return "ring";
    case kClusterSplit: return "cluster";
    default: return "auto";
  }
}

}  // namespace day26
