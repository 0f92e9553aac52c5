#!/usr/bin/env bash
# One call on the GPU machine for window / softcap / packed sequences (issue 40 items 4-5):
# build common and day50 only, run the tests of those features (test_varlen.py through test.py)
# and the dense fused tests whose kernels they touch, then bench.py --llm.
#
#   bash day50_attention_backward/tools/gpu_llm.sh [ROOT]     (ROOT: the repo, default this one)
#
# KC_LLM_K="expr" replaces the features' -k expression, KC_LLM_TESTS="-k expr" the regression
# subset; KC_LLM_BENCH=0 skips the bench rows.
# Logs go to $OUT (set by the device tool) when it is set.
set -uo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
ROOT=$(cd "$ROOT" && pwd)
OUT=${OUT:-$ROOT/build/out}
mkdir -p "$OUT"
export MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
(cd "$ROOT/common" && python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/build-common.log" 2>&1) \
  || { tail -30 "$OUT/build-common.log"; exit 1; }
(cd "$ROOT/day50_attention_backward" && python3 -m pip install -q --no-build-isolation --no-deps . \
  >"$OUT/build-day50.log" 2>&1) || { grep -m20 -B2 -A8 "error" "$OUT/build-day50.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
cd "$ROOT/day50_attention_backward"
t0=$(date +%s)
timeout 150 python3 -m pytest test.py -q -rf -n 8 -p no:cacheprovider -k "${KC_LLM_K:-varlen or window or softcap}" \
  >"$OUT/test_llm_features.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/test_llm_features.log" | cut -c1-300 | head -40
echo "tests (varlen/window/softcap): $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
timeout 120 python3 -m pytest test.py -q -rf -x -n 8 -p no:cacheprovider \
  ${KC_LLM_TESTS:--k "fused_forward_versions or fused_backward_versions"} >"$OUT/test_fused_regression.log" 2>&1
grep -E "^(FAILED|ERROR|E  )|passed|failed" "$OUT/test_fused_regression.log" | cut -c1-300 | head -20
echo "tests (dense fused regression): $(( $(date +%s) - t0 )) s"
[[ ${KC_LLM_BENCH:-1} == 1 ]] || exit 0
timeout 170 python3 bench.py --llm --quick --out "$OUT/day50" 2>&1 | grep -v Warning | tail -25
