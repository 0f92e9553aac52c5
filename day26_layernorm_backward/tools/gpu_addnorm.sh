#!/usr/bin/env bash
# One device call for add_norm and the per-family forward: build common and day26,
# run the tests LN_K selects (unset: add_norm and RMSNorm; empty: all), then the add_norm
# bench (LN_BENCH_ARGS; unset: --quick). Logs under $OUT; a short summary last.
#
#   bash tools/gpu_addnorm.sh            (from day26_layernorm_backward/, or anywhere)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
(cd ../common && python3 -m pip install -q --no-build-isolation --no-deps .) >"$OUT/build.log" 2>&1
if ! python3 -m pip install -q --no-build-isolation --no-deps . >>"$OUT/build.log" 2>&1; then
  grep -E "error|Error" "$OUT/build.log" | head -40
  exit 1
fi
build_s=$(( $(date +%s) - t0 ))
XD=""; python3 -c "import xdist" 2>/dev/null && XD="-n 8"
timeout "${LN_TEST_S:-200}" python3 -m pytest test.py -q $XD --maxfail=20 -p no:cacheprovider \
  -k "${LN_K-add_norm or rms}" >"$OUT/test.log" 2>&1
test_rc=$?
timeout "${LN_BENCH_S:-120}" python3 bench.py --add-norm ${LN_BENCH_ARGS---quick} --out "$OUT/day26" >"$OUT/bench.log" 2>&1
bench_rc=$?
grep -E "^FAILED|^E  " "$OUT/test.log" | head -40
tail -5 "$OUT/bench.log"
echo "== build ${build_s} s; test rc=$test_rc: $(tail -1 "$OUT/test.log"); bench rc=$bench_rc"
cat "$OUT/day26_add_norm.md" 2>/dev/null
