#!/usr/bin/env bash
# day50 as LLM training uses it, on a GPU machine, from the repo root:
#   bash day50_attention_backward/tools/gpu_models.sh [OUT_DIR]
# Builds common and day50 (sm_90a), runs test_llm.py (autocast, devices, transformers),
# the models bench (GPT-2 small, Llama dense and packed rows: day50 vs SDPA, eager and
# CUDA-graph GPU-only times) and a profile of the Llama step that lists the attention kernels
# it runs and fails if a naive (N x N) kernel is among them. Prints a short table last.
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp/day50_gpu_models}}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root/common" && python3 -m pip install -q --no-build-isolation --no-deps . || exit 1
cd "$root/day50_attention_backward" || exit 1
t0=$(date +%s)
MAX_JOBS=16 TORCH_CUDA_ARCH_LIST=9.0 python3 -m pip install -q --no-build-isolation --no-deps . || exit 1
echo "== day50 built in $(( $(date +%s) - t0 )) s"

python3 -m pytest test_llm.py -q -x -n 8 2>&1 | tee "$out/test_llm.log" | tail -5
tests=$(tail -1 "$out/test_llm.log")

python3 bench.py --models --model-rounds "${ROUNDS:-5}" --out "$out/day50" 2>&1 | tail -30

python3 - "$out" <<'EOF'
# The Llama step under the profiler: which kernels does day50's attention run?
import collections
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import day50_attention as da
from kernel_common import models

NAIVE = ("tiled_matmul_kernel", "softmax_forward_kernel", "softmax_backward_kernel", "probs_from_lse_kernel")
name = da.register_transformers()
lines = []
for spec_name in ("llama", "llama_packed"):
    spec = models.build(spec_name, torch.device("cuda"))
    model = models.apply_swap(spec, spec.model, "day50", models.Swap(hf_attention=name), {})
    x, y = spec.make_inputs(torch.Generator().manual_seed(0))
    step = models.make_step(spec, model, x, y)
    for _ in range(2):
        models.clear_grads(model)
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        models.clear_grads(model)
        step()
        torch.cuda.synchronize()
    kernels = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name] += 1
    ours = {k: n for k, n in kernels.items() if "day50::" in k}
    naive = {k: n for k, n in kernels.items() if any(s in k for s in NAIVE)}
    sdpa = {k: n for k, n in kernels.items() if "fmha" in k or "flash_attn" in k.lower() or "cudnn" in k.lower()}
    short = lambda k: k.replace("(anonymous namespace)::", "").replace("void ", "").split("<")[0]  # noqa: E731
    lines.append(f"{spec_name}: day50 kernels {sorted((short(k), n) for k, n in ours.items())}")
    lines.append(f"{spec_name}: naive kernels {naive or 'none'}; SDPA kernels {sdpa or 'none'}")
    if naive:
        lines.append(f"{spec_name}: FAIL, a naive kernel ran")
    del spec, model
    torch.cuda.empty_cache()
print("\n".join(lines))
open(sys.argv[1] + "/profile.txt", "w").write("\n".join(lines) + "\n")
EOF

echo
echo "== summary ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%F))"
echo "test_llm: $tests"
python3 - "$out" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1] + "/day50_models.json"))["rows"]
print(f"{'model':14} {'variant':8} {'eager ms':>9} {'eager x':>8} {'GPU ms':>8} {'GPU x':>7}  note")
for r in rows:
    f = lambda k, p: f"{r[k]:.{p}f}" if isinstance(r.get(k), (int, float)) else "-"
    print(f"{r['model']:14} {r['variant']:8} {f('eager ms', 2):>9} {f('eager speedup', 3):>8} "
          f"{f('GPU-only ms', 2):>8} {f('GPU-only speedup', 3):>7}  {r.get('note', '')[:80]}")
EOF
