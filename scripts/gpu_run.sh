#!/usr/bin/env bash
# One call on the GPU machine: build, test, (sanitize), (benchmark) packages,
# logs packed under $OUT, a short table printed last.
#
#   bash scripts/gpu_run.sh [--sanitize] [--no-bench] [--bench-args "..."] PKG [PKG...]
#
# $OUT (set by the device tool) receives logs.tgz (every log) and each package's
# bench results (<pkg>.md table, .json, .png); at most 8 files come back.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/build/out}
mkdir -p "$OUT"
SAN=0; BENCH=1; BARGS=""; PKGS=()
while (($#)); do
  case "$1" in
    --sanitize) SAN=1 ;;
    --no-bench) BENCH=0 ;;
    --bench-args) BARGS=$2; shift ;;
    *) PKGS+=("$1") ;;
  esac
  shift
done
export KC_LOG_DIR=/tmp/kc_logs MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1
mkdir -p "$KC_LOG_DIR"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$KC_LOG_DIR/gpu.txt"
python3 -c 'import torch,sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
# Every step has a time limit (seconds, overridable), so a hang still leaves
# logs to pack and a table to print.
T_TEST=${KC_TEST_TIMEOUT:-360}; T_SAN=${KC_SAN_TIMEOUT:-300}; T_BENCH=${KC_BENCH_TIMEOUT:-300}
status=0
# Build every package at once first (each build is mostly one long nvcc job, so
# they overlap well on the GPU machine's cores); build_all's installs below then
# reuse the in-tree ninja objects and only run the tests.
if [[ ${KC_PREBUILD:-1} == 1 ]]; then
  (cd common && python3 -m pip install -q --no-build-isolation --no-deps . >"$KC_LOG_DIR/prebuild-common.log" 2>&1)
  t0=$(date +%s)
  for p in "${PKGS[@]}"; do
    [[ $p == common ]] && continue
    (cd "$p" && python3 -m pip install --no-build-isolation --no-deps -v . >"$KC_LOG_DIR/prebuild-$p.log" 2>&1 \
      || echo "prebuild $p FAILED (log prebuild-$p.log)") &
  done
  wait
  echo "prebuild: $(( $(date +%s) - t0 )) s for ${PKGS[*]}"
fi
timeout "$T_TEST" bash scripts/build_all.sh "${PKGS[@]}" 2>&1 | tee "$KC_LOG_DIR/build_all.log"
[[ ${PIPESTATUS[0]} == 0 ]] || { status=1; echo "build_all failed or passed its ${T_TEST}s limit"; }
if [[ $SAN == 1 ]]; then
  for p in "${PKGS[@]}"; do
    timeout "$T_SAN" bash scripts/sanitize.sh "$p" 2>&1 | tee -a "$KC_LOG_DIR/sanitize.log"
    [[ ${PIPESTATUS[0]} == 0 ]] || { status=1; echo "sanitize $p failed or passed its ${T_SAN}s limit"; }
  done
fi
if [[ $BENCH == 1 ]]; then
  for p in "${PKGS[@]}"; do
    [[ -f $p/bench.py ]] || continue
    echo "== bench $p"
    (cd "$p" && timeout "$T_BENCH" python3 bench.py --out "$OUT/$p" $BARGS 2>&1 | tee "$KC_LOG_DIR/$p.bench.log") || status=1
  done
fi
tar -C "$KC_LOG_DIR" -czf "$OUT/logs.tgz" . 2>/dev/null
echo
echo "== results"
grep -A20 "== summary" "$KC_LOG_DIR/build_all.log" | grep -v "== summary"
[[ $SAN == 1 ]] && grep -E "== compute|rc=" "$KC_LOG_DIR/sanitize.log"
if [[ $BENCH == 1 ]]; then for p in "${PKGS[@]}"; do [[ -f $OUT/$p.md ]] && cat "$OUT/$p.md"; done; fi
exit $status
