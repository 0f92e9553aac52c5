#!/usr/bin/env bash
# The fused backward's small kernels at the Llama shape, on a GPU machine, from the repo root:
#   bash day50_attention_backward/tools/gpu_bwd.sh [OUT_DIR]
# Builds common and day50 (sm_90a); per-kernel GPU time of one attention backward at
# B 4, H 16 / 4, N 2048, d 64, causal, bf16 (the Llama step's shape): day50 with out in its own
# layout (the vector preprocess), with out column-strided (the scalar preprocess, as before the
# vector form), and SDPA (cuDNN); an ncu of both preprocess kernels; then the backward tests.
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp/day50_gpu_bwd}}
mkdir -p "$out"
source "$(dirname "$0")/build.sh"  # common and day50 built and installed; cwd: day50_attention_backward/

cat > "$out/bwd_prof.py" <<'PY'
import collections
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import day50_attention as da
from kernel_common import testing

B, HQ, HK, N, D = 4, 16, 4, 2048, 64
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
g = torch.Generator(device="cuda").manual_seed(0)
mk = lambda h: torch.randn(B, N, h, D, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)  # noqa: E731
q, k, v = mk(HQ), mk(HK), mk(HK)
do = mk(HQ)
out, lse = da.attention_forward(q, k, v, True)
out_strided = testing.strided_view(out)
qs, ks, vs = (t.detach().requires_grad_() for t in (q, k, v))
o_sdpa = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
runs = {"day50 (vector preprocess)": lambda: da.attention_backward(do, q, k, v, out, lse, None, True),
        "day50 (out strided: scalar preprocess)":
            lambda: da.attention_backward(do, q, k, v, out_strided, lse, None, True),
        "SDPA": lambda: torch.autograd.grad(o_sdpa, (qs, ks, vs), do, retain_graph=True)}
for name, f in runs.items():
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            f()
        torch.cuda.synchronize()
    us = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name_ = e.name.replace("(anonymous namespace)::", "").replace("void ", "").split("(")[0][:60]
            us[name_] += e.time_range.elapsed_us()
    tot = sum(us.values()) / reps
    print(f"{name}: {tot:.1f} us / backward: " + ", ".join(f"{k} {t / reps:.1f}" for k, t in us.most_common()))
PY
python3 "$out/bwd_prof.py" 20 2>&1 | tee "$out/prof.txt"

echo "== ncu: the preprocess kernels"
timeout 120 ncu --clock-control none -k regex:bwd_preprocess --metrics \
  gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,\
dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active \
  python3 "$out/bwd_prof.py" 1 > "$out/ncu.txt" 2>&1
grep -E "bwd_preprocess|gpu__time|dram__|warps_active" "$out/ncu.txt" | head -40

echo "== tests"
timeout 200 python3 -m pytest test.py test_varlen.py -q -x -n 8 \
  -k "backward or preprocess or gqa or varlen or determin or grad" 2>&1 | tail -6
timeout 60 python3 -m pytest test_llm.py -q -x -n 8 2>&1 | tail -3
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%F)"
cat "$out/prof.txt"
