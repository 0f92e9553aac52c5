#!/usr/bin/env bash
# Device call for day26 kernel work: build, probe table, ncu of chosen kernels.
#   bash day26_layernorm_backward/tools/gpu_probe.sh [probe args] ; NCU="bwd 16384 4096 bfloat16 2" optional
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export MAX_JOBS=16 PYTHONUNBUFFERED=1
t0=$(date +%s)
(cd "$ROOT/common" && python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/build.log" 2>&1) || { tail -30 "$OUT/build.log"; exit 1; }
(cd "$ROOT/day26_layernorm_backward" && python3 -m pip install -q --no-build-isolation --no-deps . >>"$OUT/build.log" 2>&1) || { tail -50 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
cd "$ROOT/day26_layernorm_backward"
if [[ -n ${TESTS:-} ]]; then
  timeout 300 python3 -m pytest test.py -q -x -k "$TESTS" -p no:cacheprovider 2>&1 | tail -15
fi
if [[ -n ${NCU:-} ]]; then
  timeout 200 ncu --clock-control none -k "regex:${NCU_K:-ln_bwd}" -c ${NCU_C:-2} --print-details all --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    python3 tools/one_call.py $NCU > "$OUT/ncu.txt" 2>&1
  grep -E "ln_|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Waves Per|Stall|Warp Cycles Per Issued|L2 Hit|Grid Size|Block Size" "$OUT/ncu.txt" | head -80
fi
timeout 300 python3 tools/probe_bwd.py "$@" 2>&1 | tee "$OUT/probe.txt"
