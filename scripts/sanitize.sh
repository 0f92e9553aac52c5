#!/usr/bin/env bash
# Run one package's CUDA tests under compute-sanitizer (memcheck, then racecheck).
#
#   scripts/sanitize.sh PACKAGE [pytest -k expression; default: the CUDA tests but torch.compile ones]
#
# The package must be installed (scripts/build_all.sh PACKAGE). KC_SANITIZE=1 is
# exported so a test.py can shrink its sizes (the tools slow kernels 10-100x).
# Prints each tool's ERROR SUMMARY; exits non-zero if any tool reports an error.
# KC_SAN_TOOLS="racecheck" runs a subset of the tools (default: memcheck racecheck).
# KC_SAN_ARGS: more compute-sanitizer options, e.g. "--kernel-name-exclude kns=nvjet" (leave
# cuBLAS's kernels, which the tests' references launch, out of racecheck).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PKG=${1:?usage: scripts/sanitize.sh PACKAGE [-k expr]}
EXPR=${2:-cuda and not compile and not past_2_31}
PY=${PYTHON:-python3}
LOGS=${KC_LOG_DIR:-$ROOT/build/logs}
mkdir -p "$LOGS"
command -v compute-sanitizer >/dev/null || { echo "compute-sanitizer not found" >&2; exit 2; }
export KC_SANITIZE=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1
status=0
for tool in ${KC_SAN_TOOLS:-memcheck racecheck}; do
  log="$LOGS/$PKG.sanitize-$tool.log"
  echo "== compute-sanitizer --tool $tool: $PKG (-k '$EXPR'), log $log"
  (cd "$ROOT/$PKG" && compute-sanitizer --tool "$tool" --target-processes all --error-exitcode 99 ${KC_SAN_ARGS:-} \
      $PY -m pytest test.py -q --tb=short -k "$EXPR" -p no:cacheprovider) >"$log" 2>&1
  rc=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1)
  echo "   rc=$rc ${summary:-no summary line}; $(grep -E '[0-9]+ (passed|failed)' "$log" | tail -1)"
  if [[ $rc != 0 ]]; then status=1; grep -m 20 -E "=========" "$log" | head -20; fi
done
exit $status
