#!/usr/bin/env bash
# Before / after of a day50 change in one device call, on the same GPU, from the repo root:
#   bash day50_attention_backward/tools/gpu_ab.sh BASE [BENCH ARGS...]
# BASE: a folder holding the base revision's day50_attention_backward/, exported beforehand
# into a folder the repo ignores and handed to the device call with `carry`, e.g.
#   mkdir -p .ab && git archive HEAD~1 day50_attention_backward | tar -x -C .ab   (then carry .ab)
# Builds common (the working tree's) and both day50 wheels at once, runs the working tree's
# CUDA tests with the new wheel (AB_K: another -k expression), then bench.py (default:
# --cudnn --quick) with each wheel installed in turn, base first, and prints both tables
# last. OUT (default /tmp/day50_ab) keeps the logs and tables. Both runs use the working
# tree's bench.py and Python layer (bench.py puts its folder first on the path; only the
# compiled day50_attention_C differs): an A/B for changes to the kernels and their C++ glue,
# not to ops.py.
set -uo pipefail
base=${1:?usage: gpu_ab.sh BASE [BENCH ARGS...]}
shift
args=("$@")
[[ ${#args[@]} -gt 0 ]] || args=(--cudnn --quick)
out=${OUT:-/tmp/day50_ab}
mkdir -p "$out" /tmp/ab_wheels/base /tmp/ab_wheels/new
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
root=$(pwd)
base=$(cd "$base" && pwd) || exit 1
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%FT%TZ)"
t0=$(date +%s)
(cd common && python3 -m pip install -q --no-build-isolation --no-deps . >"$out/build_common.log" 2>&1) || exit 1
for side in base new; do
  src=$([[ $side == base ]] && echo "$base/day50_attention_backward" || echo "$root/day50_attention_backward")
  (cd "$src" && rm -f /tmp/ab_wheels/$side/*.whl &&
   python3 -m pip wheel -q --no-build-isolation --no-deps -w /tmp/ab_wheels/$side . >"$out/build_$side.log" 2>&1 ||
   echo "BUILD FAILED: $side (log $out/build_$side.log)") &
done
wait
echo "== built in $(( $(date +%s) - t0 )) s"
install() { python3 -m pip install -q --no-deps --force-reinstall /tmp/ab_wheels/$1/*.whl; }
cd day50_attention_backward || exit 1
install new || exit 1
t=$(date +%s)
# every CUDA test: ids naming cuda (device-parametrised, test_cuda_*) or fused (test_fused_*, the
# version-pinned ones). A -k term such as "backward" matches every test here: pytest matches the
# folder's name (day50_attention_backward) too.
timeout "${AB_TEST_S:-300}" python3 -m pytest test.py -q -n 12 -p no:cacheprovider \
  -k "${AB_K:-cuda or fused}" >"$out/test.log" 2>&1
echo "== tests (new) rc=$? in $(( $(date +%s) - t )) s: $(tail -1 "$out/test.log")"
grep -E "^FAILED" "$out/test.log" | head -10
for side in base new; do
  install $side || exit 1
  timeout "${AB_BENCH_S:-150}" python3 bench.py "${args[@]}" --out "$out/$side" >"$out/bench_$side.log" 2>&1
  echo "== bench ($side) rc=$?"
done
for side in base new; do
  for f in "$out/${side}"_*.md; do
    [[ -e $f ]] || continue
    echo "== $side: $(basename "$f")"
    grep -E "^(- |\|)" "$f" | cut -c1-170
  done
done
