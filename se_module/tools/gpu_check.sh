#!/bin/bash
# GPU check of se_module for issue 20 (run through the `run` tool from the repo root copy):
#   bash se_module/tools/gpu_check.sh probe   # build, full test.py, bench --only effnet --quick, probe_v4 (+ kernels)
#   bash se_module/tools/gpu_check.sh bench   # build, full test.py, bench --only effnet (the table)
# Logs under $OUT; a short summary is printed last.
set -o pipefail
MODE=${1:-probe}
OUT=${OUT:-/tmp/se_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
date -u | tee -a "$OUT/device.txt"
t0=$(date +%s)
(cd common && timeout 120 python3 -m pip install -q --no-build-isolation --no-deps .) > "$OUT/build.log" 2>&1 &&
(cd se_module && timeout 240 python3 -m pip install -q --no-build-isolation --no-deps .) >> "$OUT/build.log" 2>&1
build_rc=$?
t1=$(date +%s)
echo "build rc=$build_rc ($((t1 - t0)) s)"
[ $build_rc -ne 0 ] && { tail -40 "$OUT/build.log"; exit 1; }
XDIST=""
python3 -c "import xdist" 2>/dev/null && XDIST="-n 4"
(cd se_module && timeout 100 python3 -m pytest test.py -q -x $XDIST -p no:cacheprovider 2>&1 | tail -25 > "$OUT/test.log")
test_rc=$?
t2=$(date +%s)
echo "tests rc=$test_rc ($((t2 - t1)) s)"
cd se_module
if [ "$MODE" = probe ]; then
  timeout 120 python3 bench.py --only effnet --quick --out "$OUT/bench_quick" > "$OUT/bench_quick.log" 2>&1
  echo "bench quick rc=$?"
  timeout 200 python3 tools/probe_v4.py --out "$OUT/probe.json" > "$OUT/probe.log" 2>&1
  echo "probe rc=$?"
  t3=$(date +%s)
  echo "=== probe kernels"; grep -A14 -- "^--- kernels" "$OUT/probe.log" | cut -c1-150 | grep -v "^-*$" | head -80
  echo "=== probe rows"; grep "^model=" "$OUT/probe.log" | sed 's/model=//'
  echo "=== bench quick"; grep -A20 "issue 20 bars" "$OUT/bench_quick.log"
else
  timeout 150 python3 bench.py --only effnet --out "$OUT/effnet" > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"
  t3=$(date +%s)
  tail -5 "$OUT/bench.log" | head -2
  echo "=== table (fused_gpu / eager_gpu, eager/fused_gpu)"
  python3 - "$OUT/effnet.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    l2 = r["l2_floor%"]
    print(f"{r['model']} {r['config']:9s} {r['pass']:7s} {r['shape']:24s} {r['fused_gpu_us']:8.1f} {r['eager_gpu_us']:8.1f} "
          f"{r['eager/fused_gpu']:5.2f}x host {r['eager/fused']:5.2f}x L2% {l2 if l2 is None else round(l2, 1)}")
for s in d["summary"]:
    print(s)
PY
fi
echo "=== tests"; tail -4 "$OUT/test.log"
echo "total $(( $(date +%s) - t0 )) s"
