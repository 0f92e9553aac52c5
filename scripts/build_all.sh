#!/usr/bin/env bash
# Build, install and test every package of the repo (or one), then print a summary.
#
#   scripts/build_all.sh                 # common, then every day
#   scripts/build_all.sh day26_layernorm_backward   # common + that one package
#   scripts/build_all.sh --jit [PKG]     # no install: each test.py JIT-builds its sources
#   scripts/build_all.sh --bench [PKG]   # also run each bench.py (GPU only)
#
# A package is any top-level folder with a setup.py and a test.py; `common` goes
# first because every day builds against it. Installs are offline
# (--no-build-isolation --no-deps). Where nvcc exists but torch has no CUDA (CI),
# every csrc/*.cu is also compiled with nvcc for sm_90 and sm_80, and the CUDA
# glue is syntax-checked, as a compile check. Logs: build/logs/ (or $KC_LOG_DIR).
# Exits non-zero if any build, check or test failed.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1   # progress lines as they happen, also through tee/pipes
MODE=install; BENCH=0; ONLY=()
for a in "$@"; do
  case "$a" in
    --jit) MODE=jit ;;
    --bench) BENCH=1 ;;
    -h|--help) sed -n 2,14p "$0"; exit 0 ;;
    -*) echo "unknown option $a" >&2; exit 2 ;;
    *) ONLY+=("${a%/}") ;;
  esac
done
LOGS=${KC_LOG_DIR:-$ROOT/build/logs}
mkdir -p "$LOGS"

pkgs=(common)
for d in */; do
  d=${d%/}
  [[ $d == common || $d == build || $d == scripts ]] && continue
  [[ -f $d/setup.py && -f $d/test.py ]] && pkgs+=("$d")
done
if ((${#ONLY[@]})); then
  for o in "${ONLY[@]}"; do
    [[ -f $o/setup.py ]] || { echo "no package '$o' (known: ${pkgs[*]})" >&2; exit 2; }
  done
  pkgs=(common "${ONLY[@]/common/}")
  pkgs=($(printf '%s\n' "${pkgs[@]}" | awk 'NF && !seen[$0]++'))
fi

# "CUDA build" as kernel_common.build.cuda_build_enabled decides it; KC_FORCE_CPU=1 (CI's
# newest-torch job, whose PyPI torch is a CUDA build) makes it a CPU build + compile check.
has_cuda_torch=$($PY -c 'import torch; print(int(torch.version.cuda is not None))')
[[ ${KC_FORCE_CPU:-0} == 1 ]] && has_cuda_torch=0
torch_version=$($PY -c 'import torch; print(torch.__version__)')
has_nvcc=$(command -v nvcc >/dev/null && echo 1 || echo 0)
echo "== build_all: ${#pkgs[@]} package(s): ${pkgs[*]}  (mode=$MODE, torch $torch_version, cuda build=$has_cuda_torch, nvcc=$has_nvcc, logs=$LOGS)"

declare -A R_BUILD R_TIME R_PASS R_FAIL R_SKIP R_CHECK R_BENCH
failed=0
for p in "${pkgs[@]}"; do
  echo "-- [$p]"
  t0=$(date +%s)
  R_BUILD[$p]=ok; R_CHECK[$p]=-; R_BENCH[$p]=-
  if [[ $MODE == install || $p == common ]]; then
    echo "   pip install (log: $LOGS/$p.build.log)"
    if ! (cd "$p" && $PY -m pip install --no-build-isolation --no-deps -v . >"$LOGS/$p.build.log" 2>&1); then
      R_BUILD[$p]=FAILED; failed=1
      tail -30 "$LOGS/$p.build.log"
    fi
  else
    R_BUILD[$p]=jit
  fi
  cu_roots=()
  for src in "$p"/csrc "$p"/*/csrc; do
    compgen -G "$src/*.cu" >/dev/null && cu_roots+=("$(dirname "$src")")
  done
  if [[ $has_cuda_torch == 0 && $has_nvcc == 1 && ${#cu_roots[@]} -gt 0 ]]; then
    R_CHECK[$p]=ok
    for r in "${cu_roots[@]}"; do
      $PY -m kernel_common.build check-cuda "$r" 2>&1 | tee -a "$LOGS/$p.nvcc.log" | sed -u 's/^/ /'
      [[ ${PIPESTATUS[0]} == 0 ]] || { R_CHECK[$p]=FAILED; failed=1; }
    done
  fi
  R_TIME[$p]=$(( $(date +%s) - t0 ))
  jflag=(); [[ $MODE == jit ]] && jflag=(--jit)
  # With pytest-xdist present (the GPU image has it), run tests in 4 workers:
  # faster, and a test that crashes its process is reported instead of ending the run.
  # Each worker gets a share of the cores for its CPU threads (all-core OpenMP in
  # four workers oversubscribes the machine).
  if $PY -c "import xdist" 2>/dev/null; then
    jflag+=(-n 4)
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / 4 > 0 ? $(nproc) / 4 : 1 ))}
  fi
  junit="$LOGS/$p.junit.xml"; rm -f "$junit"
  echo "   python test.py ${jflag[*]} (log: $LOGS/$p.test.log)"
  (cd "$p" && $PY test.py "${jflag[@]}" -v --tb=short -rfs --junitxml="$junit" 2>&1) | tee "$LOGS/$p.test.log" | grep -E '(passed|failed|error|no tests ran)' | tail -1 | sed 's/^/   /'
  rc=${PIPESTATUS[0]}
  read -r n_t n_f n_e n_s < <($PY - "$junit" <<'PYEOF'
import sys, xml.etree.ElementTree as ET
try:
    r = ET.parse(sys.argv[1]).getroot()
    s = r if r.tag == "testsuite" else r.find("testsuite")
    print(s.get("tests"), s.get("failures"), s.get("errors"), s.get("skipped"))
except Exception:
    print(0, 0, 0, 0)  # no report: the run died before pytest wrote it (rc says so)
PYEOF
)
  R_PASS[$p]=$((n_t - n_f - n_e - n_s)); ((R_PASS[$p] < 0)) && R_PASS[$p]=0
  R_FAIL[$p]=$((n_f + n_e)); R_SKIP[$p]=$n_s
  if [[ $rc != 0 || ${R_PASS[$p]} == 0 ]]; then failed=1; [[ ${R_FAIL[$p]} == 0 ]] && R_FAIL[$p]="rc=$rc"; fi
  if [[ $BENCH == 1 && -f $p/bench.py ]]; then
    if (cd "$p" && $PY bench.py --out "$LOGS/$p" 2>&1 | tee "$LOGS/$p.bench.log"); then R_BENCH[$p]=ok; else R_BENCH[$p]=FAILED; failed=1; fi
  fi
done

echo
echo "== summary (torch $torch_version, $PY)"
printf '%-28s %-7s %7s %-9s %7s %7s %7s %-6s\n' package build 'time(s)' nvcc passed failed skipped bench
for p in "${pkgs[@]}"; do
  printf '%-28s %-7s %7s %-9s %7s %7s %7s %-6s\n' "$p" "${R_BUILD[$p]}" "${R_TIME[$p]}" "${R_CHECK[$p]}" \
    "${R_PASS[$p]}" "${R_FAIL[$p]}" "${R_SKIP[$p]}" "${R_BENCH[$p]}"
done
tp=0; tf=0; ts=0
for p in "${pkgs[@]}"; do
  tp=$((tp + ${R_PASS[$p]:-0})); ts=$((ts + ${R_SKIP[$p]:-0}))
  [[ ${R_FAIL[$p]} =~ ^[0-9]+$ ]] && tf=$((tf + R_FAIL[$p])) || tf=$((tf + 1))
done
if [[ $failed != 0 ]]; then echo "build_all: FAILED"; echo "build_all: $tp passed, $tf failed, $ts skipped"; exit 1; fi
echo "build_all: all passed"
echo "build_all: $tp passed, $tf failed, $ts skipped"
