"""Probe for the plan's cluster entries (GPU): GPU time (CUDA-graph replay) of the fused
block at versions 2 and 3 (3: a sample per thread-block cluster, se_cluster.cu) over batch
sizes, at EfficientNet's small-image SE shapes, forward (no_grad) and forward + backward.
Where the plan does not take the cluster kernel, version 3 runs version 2's kernels and
the two times agree. (The thresholds it informs: se_plan.cpp, kClusterMaxN and the rest.)

    python tools/probe_cluster.py [--batches 1,2,4,8,16,32] [--out FILE.json]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench as B  # noqa: E402
from kernel_common import bench  # noqa: E402

SHAPES = [(1152, 7, 7, 48), (672, 7, 7, 28), (672, 14, 14, 28), (480, 14, 14, 20), (240, 14, 14, 10),
          (960, 12, 12, 40), (2688, 12, 12, 112), (336, 24, 24, 14), (240, 28, 28, 10)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,2,4,8,16,32")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = []
    for n in (int(b) for b in a.batches.split(",")):
        for c, h, w, s in SHAPES:
            for dtype, cl, cfg in ((torch.float32, False, "fp32"), (torch.bfloat16, True, "bf16cl")):
                _, ours, x, g = B.setup((n, c, h, w, s), dtype, cl)
                r = {"n": n, "cfg": cfg, "shape": B.shape_str((n, c, h, w, s))}
                for v in (2, 3):
                    ours.version = v
                    fwd, fb = B.fwd_and_fwdbwd(ours, list(ours.parameters()), x, g)
                    with torch.no_grad():
                        r[f"v{v}_fwd"] = bench.graph_us(lambda: ours(x.detach()))
                    r[f"v{v}_fb"] = bench.graph_us(fb)
                r["fwd_x"] = r["v2_fwd"] / r["v3_fwd"]
                r["fb_x"] = r["v2_fb"] / r["v3_fb"]
                rows.append(r)
                print(f"{r['shape']:26s} {cfg:6s} fwd v2 {r['v2_fwd']:7.1f} v3 {r['v3_fwd']:7.1f} x{r['fwd_x']:.2f}  "
                      f"fb v2 {r['v2_fb']:7.1f} v3 {r['v3_fb']:7.1f} x{r['fb_x']:.2f}", flush=True)
                del ours, x, g
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
