#!/usr/bin/env bash
# Device call for day26 kernel work: build, CUDA tests, ncu of chosen kernels, probe
# table (tools/probe_bwd.py); logs under $OUT. With BASE (a directory holding
# day26_layernorm_backward/ and common/, e.g. from `git archive`), that build too
# (installed apart, under /tmp/A), and the probe alternates base and this build,
# ROUNDS rounds: an A/B inside one call. ONLY_H200=1 stops at once on another GPU.
#   [BASE=../exp_base] [ROUNDS=2] [TESTS="cuda and ring"] [ONLY_H200=1] \
#   [NCU="bwd 16384 4096 bfloat16 2"] bash day26_layernorm_backward/tools/gpu_probe.sh [probe args]
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu"; python3 -c 'import torch; print("torch", torch.__version__)'
if [[ ${ONLY_H200:-0} == 1 && $gpu != *H200* ]]; then echo "not an H200: stopping"; exit 3; fi
BASE=${BASE:-}
t0=$(date +%s)
(cd "$ROOT/common" && python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/build.log" 2>&1) || { tail -30 "$OUT/build.log"; exit 1; }
if [[ -n $BASE ]]; then  # both builds at once, half the jobs each
  export MAX_JOBS=$(( MAX_JOBS / 2 ))
  rm -rf /tmp/A
  (cd "$BASE/day26_layernorm_backward" && python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/A . >"$OUT/build_base.log" 2>&1) &
  base_pid=$!
fi
(cd "$ROOT/day26_layernorm_backward" && python3 -m pip install -q --no-build-isolation --no-deps . >>"$OUT/build.log" 2>&1) || { tail -50 "$OUT/build.log"; exit 1; }
if [[ -n $BASE ]]; then wait $base_pid || { tail -50 "$OUT/build_base.log"; exit 1; }; fi
echo "build $(( $(date +%s) - t0 )) s"
cd "$ROOT/day26_layernorm_backward"
if [[ -n ${TESTS:-} ]]; then
  t1=$(date +%s)
  timeout ${T_TEST:-300} python3 -m pytest test.py -q -x -n ${NPROC:-8} -k "$TESTS" -p no:cacheprovider >"$OUT/tests.log" 2>&1
  echo "tests rc $? in $(( $(date +%s) - t1 )) s: $(tail -1 "$OUT/tests.log")"
  grep -E "^(FAILED|ERROR)|Error" "$OUT/tests.log" | head -10
fi
if [[ -n ${NCU:-} ]]; then
  timeout 200 ncu --clock-control none -k "regex:${NCU_K:-ln_bwd}" -c ${NCU_C:-2} --print-details all --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    python3 tools/one_call.py $NCU > "$OUT/ncu.txt" 2>&1
  grep -E "ln_|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Waves Per|Stall|Warp Cycles Per Issued|L2 Hit|Grid Size|Block Size" "$OUT/ncu.txt" | head -80
fi
for r in $(seq 1 ${ROUNDS:-1}); do
  if [[ -n $BASE ]]; then
    echo "== round $r: base"
    PYTHONPATH=/tmp/A timeout 300 python3 tools/probe_bwd.py "$@" 2>&1 | tee -a "$OUT/probe_base.txt"
  fi
  echo "== round $r: this build"
  timeout 300 python3 tools/probe_bwd.py "$@" 2>&1 | tee -a "$OUT/probe.txt"
done
