#!/usr/bin/env bash
# day50 as LLM training uses it, on a GPU machine, from the repo root:
#   bash day50_attention_backward/tools/gpu_models.sh [OUT_DIR]
# Builds common and day50 (sm_90a), runs test_llm.py (autocast, devices, transformers),
# the models bench (GPT-2 small, Llama dense and packed rows: day50 vs SDPA, eager and
# CUDA-graph GPU-only times), a profile of the Llama steps (the attention kernels day50 runs
# beside SDPA's, GPU time per step; a naive N x N kernel is reported as FAIL) and attention
# alone at the Llama shape. Prints a short table last.
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${1:-${OUT:-/tmp/day50_gpu_models}}
mkdir -p "$out"
source "$(dirname "$0")/build.sh"  # common and day50 built and installed; cwd: day50_attention_backward/

python3 -m pytest test_llm.py -q -x -n 8 2>&1 | tee "$out/test_llm.log" | tail -5
tests=$(tail -1 "$out/test_llm.log")

python3 bench.py --models --model-rounds "${ROUNDS:-5}" --out "$out/day50" 2>&1 | tail -30

python3 - "$out" <<'EOF'
# The Llama steps under the profiler: which attention kernels run, and their GPU time per step,
# day50 against SDPA; then attention alone at the Llama shape, in transformers' layout.
import sys

import torch
import torch.nn.functional as F

import day50_attention as da
from kernel_common import bench, models

sys.path.insert(0, "tools")
from profile_step import kernel_times  # noqa: E402  (one profiled step, kernel time by name)

NAIVE = ("tiled_matmul_kernel", "softmax_forward_kernel", "softmax_backward_kernel", "probs_from_lse_kernel")
SDPA = ("flash", "fmha", "cudnn", "attention", "sm90_xmma")

name = da.register_transformers()
lines = []
for spec_name in ("llama", "llama_packed"):
    spec = models.build(spec_name, torch.device("cuda"))
    x, y = spec.make_inputs(torch.Generator().manual_seed(0))
    for variant in ("torch", "day50"):
        model = spec.model if variant == "torch" else models.apply_swap(
            spec, spec.model, "day50", models.Swap(hf_attention=name), {})
        us, count = kernel_times(spec, model, x, y)
        attn = {k: t for k, t in us.items() if "day50::" in k or any(s in k.lower() for s in SDPA)}
        naive = [k for k in us if any(s in k for s in NAIVE)]
        total = sum(us.values()) / 1e3
        lines.append(f"{spec_name} / {variant}: GPU kernels {total:.2f} ms, attention {sum(attn.values()) / 1e3:.2f} ms: "
                     + ", ".join(f"{k} x{count[k]} {t / 1e3:.2f}" for k, t in sorted(attn.items(), key=lambda a: -a[1])))
        if naive:
            lines.append(f"{spec_name} / {variant}: FAIL, a naive kernel ran: {naive}")
    del spec, model
    torch.cuda.empty_cache()

B, HQ, HK, N, D = 4, 16, 4, 2048, 64
g = torch.Generator(device="cuda").manual_seed(0)
mk = lambda h: torch.randn(B, N, h, D, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)  # noqa: E731
q, k, v = (t.requires_grad_() for t in (mk(HQ), mk(HK), mk(HK)))
do = torch.randn(B, HQ, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
fns = {"day50": lambda: da.attention(q, k, v, causal=True),
       "SDPA": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)}
for n, f in fns.items():
    with torch.no_grad():
        t_f = bench.time_us(f, warmup=5, rep=30)
    t_b = bench.time_us(lambda: torch.autograd.grad(f(), (q, k, v), do), warmup=5, rep=30)
    lines.append(f"attention alone B={B} Hq={HQ} Hkv={HK} N={N} d={D} causal bf16, (B, N, H, d) views: "
                 f"{n} fwd {t_f:.1f} us, fwd+bwd {t_b:.1f} us")
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
