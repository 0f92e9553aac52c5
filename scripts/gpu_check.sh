#!/usr/bin/env bash
# One device call for this round's open issues: build common and the days the steps
# need (in parallel), then the steps named, one after another (test suites sharing the
# GPU from separate processes time-slice it and crawl), each with its own time limit;
# logs under $OUT, a short summary printed last.
#
#   bash scripts/gpu_check.sh STEP [STEP...]
#     se-test     se_module's test.py (4 xdist workers)
#     se-effnet   se_module bench.py --only effnet (the default version, version 2 and eager side by side)
#     se-models   se_module bench.py --models --model-rounds 3 (EfficientNet-B0/B4 steps)
#     se-probe5   se_module tools/probe_cluster.py (version 2 against 3 over batch sizes: the cluster plan's data)
#     se-probe4   se_module tools/probe_spread.py (version 1 / 2 / eager at every EfficientNet SE shape, kernels profiled)
#     se-ncu      se_module tools/kernel_times.py under ncu: per-kernel GPU time of versions 2 and 3 at
#                 SE_NCU ("N C H W S", default the B4 batch-1 row; SE_NCU_FWD=1: forward only) in fp32 /
#                 bf16, NCHW / channels_last, then ncu's sections for the cluster kernel (version 3) in bf16 channels_last
#     se-kt       per-kernel GPU time (ncu, caches NOT flushed between kernels, so L2 residency counts)
#                 of one bf16 channels_last forward + backward at each shape of SE_KT ("N C H W S;..."),
#                 versions SE_KT_V (default "2 3"); every kernel of the step, torch's included
#     se-tl       se_module tools/timeline.py, bf16 channels_last fwd+bwd, kernel by kernel, at SE_TL
#                 ("N C H W S;...", default the four spread L2-resident rows), versions SE_TL_V (default
#                 "2 0"), SE_TL_ROUNDS rounds (default 2); SE_TL_FP32P=1: also with fp32 parameters
#     fin         day26 tools/probe_fin.py at 8192x768 (issue 16: the finalize after the main kernel;
#                 FIN_KNOBS: its --knobs passes, e.g. plan,grid=132,plan)
#     ln-test     day26 test.py (4 xdist workers; LN_K: a -k expression)
#     ln-bench    day26 bench.py (issue 19's bars)
#     ln-san      day26 under compute-sanitizer (scripts/sanitize.sh; LN_SAN_K: its -k expression)
#     se-san      se_module under compute-sanitizer (SE_SAN_K likewise; KC_SAN_TOOLS=racecheck: one tool)
#     at-test     day50 test.py and the files it imports (AT_K: a -k expression)
#     at-cudnn    day50 bench.py --cudnn (against SDPA cuDNN, GPU time; AT_QUICK=1: model shapes only)
#     at-models   day50 bench.py --models --model-rounds 3 (GPT-2 small, Llama dense and packed steps)
#     at-san      day50 under compute-sanitizer (AT_SAN_K; default: the Hopper backward's bf16 version
#                 tests, the deterministic and the pre-kernel layout tests, 31 under KC_SANITIZE; those
#                 CUDA-only tests have no "cuda" in their ids, so sanitize.sh's default misses them)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/build/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
LOG=$OUT/summary.txt
: >"$LOG"
say() { echo "$*" | tee -a "$LOG"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) $(date -u +%FT%TZ)"
t0=$(date +%s)
(cd common && python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/build.log" 2>&1)
# BUILD: the packages to build ("se ln at"; default: those the steps use)
if [[ -z ${BUILD:-} ]]; then
  BUILD=""
  for step in "$@"; do
    case $step in se-*) BUILD+=" se" ;; ln-*|fin) BUILD+=" ln" ;; at-*) BUILD+=" at" ;; esac
  done
  BUILD=$(echo $BUILD | tr ' ' '\n' | sort -u | tr '\n' ' ')
fi
for pkg in $BUILD; do
  case $pkg in
    se) (cd se_module && python3 -m pip install -q --no-build-isolation --no-deps . >>"$OUT/build_se.log" 2>&1) & ;;
    ln) (cd day26_layernorm_backward && python3 -m pip install -q --no-build-isolation --no-deps . >>"$OUT/build_ln.log" 2>&1) & ;;
    at) (cd day50_attention_backward && python3 -m pip install -q --no-build-isolation --no-deps . >>"$OUT/build_at.log" 2>&1) & ;;
  esac
done
wait
imports=""
for pkg in $BUILD; do
  mod=$(case $pkg in se) echo se_module ;; ln) echo day26_layernorm ;; at) echo day50_attention ;; esac)
  imports+=" $pkg $(python3 -c "import $mod" 2>&1 | tail -1 || true)"
done
say "build ($BUILD) $(( $(date +%s) - t0 )) s:$imports"
# xdist workers: 12 of the machine's 16 cores (day26 and day50 need 4-6 minutes each that way)
XD=""; python3 -c "import xdist" 2>/dev/null && XD="-n 12"
for step in "$@"; do
  t=$(date +%s)
  case $step in
    se-test) (cd se_module && timeout 240 python3 -m pytest test.py -q $XD -p no:cacheprovider ${SE_K:+-k "$SE_K"} >"$OUT/se_test.log" 2>&1)
             say "se-test rc=$?: $(tail -1 "$OUT/se_test.log")"; grep -E "^FAILED|Error" "$OUT/se_test.log" | head -8 | tee -a "$LOG" ;;
    se-effnet) (cd se_module && timeout 200 python3 bench.py --only effnet --out "$OUT/effnet" >"$OUT/effnet.log" 2>&1)
               say "se-effnet rc=$?"; grep -A6 "issue 20 bars" "$OUT/effnet.log" | tee -a "$LOG" ;;
    se-models) (cd se_module && timeout 300 python3 bench.py --models --model-rounds 3 --out "$OUT/se_models" >"$OUT/se_models.log" 2>&1)
               say "se-models rc=$?"; tail -12 "$OUT/se_models.log" | tee -a "$LOG" ;;
    se-probe5) (cd se_module && timeout 200 python3 tools/probe_cluster.py --out "$OUT/probe5.json" >"$OUT/probe5.log" 2>&1)
               say "se-probe5 rc=$?" ;;
    se-probe4) (cd se_module && timeout 200 python3 tools/probe_spread.py --out "$OUT/probe4.json" >"$OUT/probe4.log" 2>&1)
               say "se-probe4 rc=$?"; grep "^model=" "$OUT/probe4.log" | sed 's/model=//' | tee -a "$LOG" ;;
    se-ncu) SHP=${SE_NCU:-1 2688 12 12 112}; FW=${SE_NCU_FWD:+--forward}
            KS='regex:se_cluster|gemv|reduce_|mlp_|channel_ew|wgrad'
            (cd se_module
             for cfg in "bf16 --cl" "fp32" "bf16" "fp32 --cl"; do
               echo "== $SHP --dtype $cfg $FW"
               timeout 100 ncu --metrics gpu__time_duration.sum --cache-control all -k "$KS" \
                 python3 tools/kernel_times.py $SHP --dtype $cfg --versions 2 3 $FW 2>&1 |
                 grep -E "\)x\(|version|duration|==ERR" | sed -E 's/\(unnamed>::ClusterArgs\)|, Context.*//; s/^ +//'
             done
             echo "== sections, version 3, bf16 channels_last"
             timeout 150 ncu --set full --import-source no --cache-control all -k regex:se_cluster -c 1 -o /tmp/se_v3 \
               python3 tools/kernel_times.py $SHP --dtype bf16 --cl --versions 3 $FW >/dev/null 2>&1
             ncu -i /tmp/se_v3.ncu-rep --page details --section SpeedOfLight --section WarpStateStats --section LaunchStats
             ncu -i /tmp/se_v3.ncu-rep --page source --csv --print-source sass | gzip >"$OUT/se_v3_sass.csv.gz"
            ) >"$OUT/se_ncu.log" 2>&1
            say "se-ncu rc=$?"; grep -E "^==|version|duration|\)x\(" "$OUT/se_ncu.log" | head -60 | tee -a "$LOG" ;;
    fin) (cd day26_layernorm_backward && timeout 120 python3 tools/probe_fin.py --cases 8192x768:bfloat16,8192x768:float32 --knobs "${FIN_KNOBS:-plan}" >"$OUT/fin.log" 2>&1)
         say "fin rc=$?"; cat "$OUT/fin.log" | tee -a "$LOG" ;;
    ln-test) (cd day26_layernorm_backward && timeout 420 python3 -m pytest test.py -q $XD -p no:cacheprovider ${LN_K:+-k "$LN_K"} >"$OUT/ln_test.log" 2>&1)
             say "ln-test rc=$?: $(tail -1 "$OUT/ln_test.log")"; grep -E "^FAILED" "$OUT/ln_test.log" | head -8 | tee -a "$LOG" ;;
    ln-bench) (cd day26_layernorm_backward && timeout 300 python3 bench.py --out "$OUT/ln_bench" >"$OUT/ln_bench.log" 2>&1)
              say "ln-bench rc=$?"; grep -B2 -A8 -i "issue 19" "$OUT/ln_bench.log" | tail -12 | tee -a "$LOG" ;;
    ln-san) timeout 300 bash scripts/sanitize.sh day26_layernorm_backward ${LN_SAN_K:+"$LN_SAN_K"} >"$OUT/ln_san.log" 2>&1
            say "ln-san rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|rc=" "$OUT/ln_san.log" | tail -8 | tee -a "$LOG" ;;
    se-san) timeout 300 bash scripts/sanitize.sh se_module ${SE_SAN_K:+"$SE_SAN_K"} >"$OUT/se_san.log" 2>&1
            say "se-san rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|rc=" "$OUT/se_san.log" | tail -8 | tee -a "$LOG" ;;
    se-kt) (cd se_module
            IFS=';' read -ra KTS <<<"${SE_KT:-128 1152 7 7 48}"
            for shp in "${KTS[@]}"; do
              echo "== $shp"
              timeout 120 ncu --metrics gpu__time_duration.sum --cache-control none \
                python3 tools/kernel_times.py $shp --dtype bf16 --cl --versions ${SE_KT_V:-2 3} 2>&1 |
                grep -E "\)x\(|version|duration|==ERR" |
                sed -E 's/, Context.*//; s/^ +//; s/gpu__time_duration.sum +//'
            done) >"$OUT/se_kt.log" 2>&1
           say "se-kt rc=$?"; awk '/^==/{print; p=0} /call 1/{p=0} /call 2/{p=1} p' "$OUT/se_kt.log" | cut -c1-140 | tee -a "$LOG" ;;
    se-tl) TL=${SE_TL:-32 960 12 12 40;32 1632 12 12 68;32 2688 12 12 112;128 1152 7 7 48}
           (cd se_module
            for r in $(seq "${SE_TL_ROUNDS:-2}"); do
              echo "== round $r"
              timeout 150 python3 tools/timeline.py --versions ${SE_TL_V:-2 0} --shapes "$TL"
              if [[ -n ${SE_TL_FP32P:-} ]]; then
                timeout 150 python3 tools/timeline.py --versions ${SE_TL_V:-2 0} --shapes "$TL" --fp32-params
              fi
            done) >"$OUT/se_tl.log" 2>&1
           say "se-tl rc=$?"; grep -E "^== " "$OUT/se_tl.log" | sed -E 's/^== //; s/, last kernel ends.*//' | tee -a "$LOG" ;;
    at-test) (cd day50_attention_backward && timeout 480 python3 -m pytest test.py -q $XD -p no:cacheprovider ${AT_K:+-k "$AT_K"} >"$OUT/at_test.log" 2>&1)
             say "at-test rc=$?: $(tail -1 "$OUT/at_test.log")"; grep -E "^FAILED" "$OUT/at_test.log" | head -8 | tee -a "$LOG" ;;
    at-cudnn) (cd day50_attention_backward && timeout 200 python3 bench.py --cudnn ${AT_QUICK:+--quick} --out "$OUT/at" >"$OUT/at_cudnn.log" 2>&1)
              say "at-cudnn rc=$?"; grep -E "^- " "$OUT/at_cudnn.md" 2>/dev/null | tee -a "$LOG"
              grep -E "^\| +(GPT|small|Llama|8B)" "$OUT/at_cudnn.md" 2>/dev/null | cut -d'|' -f2,5,9,12 | tee -a "$LOG" ;;
    at-models) (cd day50_attention_backward && timeout 200 python3 bench.py --models --model-rounds 3 --out "$OUT/at" >"$OUT/at_models.log" 2>&1)
               say "at-models rc=$?"; grep -E "^\| +(gpt2|llama)" "$OUT/at_models.md" 2>/dev/null | cut -d'|' -f2,3,6,7 | tee -a "$LOG" ;;
    at-san) timeout 300 bash scripts/sanitize.sh day50_attention_backward \
              "${AT_SAN_K:-(fused_backward_versions and bf16) or (deterministic_backward and cuda) or preprocess_out_layouts}" >"$OUT/at_san.log" 2>&1
            say "at-san rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|rc=" "$OUT/at_san.log" | tail -8 | tee -a "$LOG" ;;
    *) say "unknown step $step" ;;
  esac
  say "  ($step: $(( $(date +%s) - t )) s)"
done
say "total $(( $(date +%s) - t0 )) s"
