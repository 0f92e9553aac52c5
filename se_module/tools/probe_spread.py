"""Probe for the plan's spread threshold (GPU): GPU time (CUDA-graph replay) of the fused
block at version 1 (one MLP block per sample) and version 2 (the spread MLP where the weights
are large) against torchvision eager, at every EfficientNet-B0/B4 SE shape (bench.py's list),
then a per-kernel breakdown (torch.profiler) at (128, 1152, 7, 7). (The threshold it informs:
se_plan.cpp, kSpreadMinWeights.)

    python tools/probe_spread.py [--quick] [--out FILE.json]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench as B  # noqa: E402
from kernel_common import bench  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = []
    shapes = B.effnet_bench_shapes(("b0",), batches=(128,)) if a.quick else B.effnet_bench_shapes()
    for model, shape in shapes:
        for dtype, cl, cfg in ((torch.float32, False, "fp32"), (torch.bfloat16, True, "bf16cl")):
            tv, ours, x, g = B.setup(shape, dtype, cl)
            r = {"model": model, "cfg": cfg, "shape": B.shape_str(shape), "2SC": 2 * shape[1] * shape[4]}
            for name, f, params in (("v1", ours, list(ours.parameters())), ("v2", ours, list(ours.parameters())),
                                    ("eager", tv, list(tv.parameters()))):
                if name in ("v1", "v2"):
                    ours.version = int(name[1])
                fwd, fb = B.fwd_and_fwdbwd(f, params, x, g)
                r[name + "_fwd"] = bench.graph_us(fwd)
                if shape[0] > 1:
                    r[name + "_fb"] = bench.graph_us(fb)
            rows.append(r)
            print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()), flush=True)
            del tv, ours, x, g
            torch.cuda.empty_cache()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)
    # per-kernel breakdown at the shape the spread MLP was made for
    for dtype, cl in ((torch.float32, False), (torch.bfloat16, True)):
        tv, ours, x, g = B.setup((128, 1152, 7, 7, 48), dtype, cl)
        for v in (1, 2):
            ours.version = v
            fwd, fb = B.fwd_and_fwdbwd(ours, list(ours.parameters()), x, g)
            for _ in range(3):
                fb()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    fb()
                torch.cuda.synchronize()
            print(f"--- kernels, fwd+bwd x10, (128, 1152, 7, 7) S=48 {dtype} cl={cl} v{v}")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))
        fwd, fb = B.fwd_and_fwdbwd(tv, list(tv.parameters()), x, g)
        for _ in range(3):
            fb()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                fb()
            torch.cuda.synchronize()
        print(f"--- kernels, fwd+bwd x10, (128, 1152, 7, 7) S=48 {dtype} cl={cl} eager")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))


if __name__ == "__main__":
    main()
