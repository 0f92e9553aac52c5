#!/usr/bin/env bash
# Device call for an A/B of day26 kernels: builds this checkout's day26 and a base
# copy (a directory holding day26_layernorm_backward/ and common/, e.g. from
# `git archive`), runs a test subset on this build, then tools/probe_bwd.py
# alternately on base and this build, ROUNDS rounds. Logs under $OUT.
#   BASE=../exp_base TESTS="cuda and ring" ROUNDS=2 ONLY_H200=1 \
#     bash day26_layernorm_backward/tools/ab_probe.sh [probe_bwd args]
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export MAX_JOBS=8 PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu"; python3 -c 'import torch; print("torch", torch.__version__)'
if [[ ${ONLY_H200:-0} == 1 && $gpu != *H200* ]]; then echo "not an H200: stopping"; exit 3; fi
t0=$(date +%s)
(cd "$ROOT/common" && python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/build.log" 2>&1) || { tail -30 "$OUT/build.log"; exit 1; }
BASE=${BASE:-}
if [[ -n $BASE ]]; then
  rm -rf /tmp/A
  (cd "$BASE/day26_layernorm_backward" && python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/A . >"$OUT/build_base.log" 2>&1) &
fi
(cd "$ROOT/day26_layernorm_backward" && python3 -m pip install -q --no-build-isolation --no-deps . >>"$OUT/build.log" 2>&1) || { tail -50 "$OUT/build.log"; exit 1; }
wait
echo "build $(( $(date +%s) - t0 )) s"
cd "$ROOT/day26_layernorm_backward"
if [[ -n ${TESTS:-} ]]; then
  t1=$(date +%s)
  timeout ${T_TEST:-300} python3 -m pytest test.py -q -x -n ${NPROC:-8} -k "$TESTS" -p no:cacheprovider >"$OUT/tests.log" 2>&1
  echo "tests rc $? in $(( $(date +%s) - t1 )) s: $(tail -1 "$OUT/tests.log")"
  grep -E "^(FAILED|ERROR)|Error" "$OUT/tests.log" | head -10
fi
for r in $(seq 1 ${ROUNDS:-2}); do
  if [[ -n $BASE ]]; then
    echo "== round $r: base"; PYTHONPATH=/tmp/A timeout 300 python3 tools/probe_bwd.py "$@" 2>&1 | tee -a "$OUT/probe_base.txt" | sed -n '/^backward/,$p;/^forward/,/^$/p'
  fi
  echo "== round $r: new"; timeout 300 python3 tools/probe_bwd.py "$@" 2>&1 | tee -a "$OUT/probe_new.txt" | sed -n '/^backward/,$p;/^forward/,/^$/p'
done
