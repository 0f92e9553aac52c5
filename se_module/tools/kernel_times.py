"""Per-kernel GPU time of one fused SE forward + backward, kernels run one at a
time (no PDL overlap, which makes profiler durations of chained kernels
misleading): run under Nsight Compute, e.g.

    ncu --metrics gpu__time_duration.sum --cache-control none -k regex:se:: \\
        python tools/kernel_times.py 128 1152 7 7 48 --dtype bf16 --cl --versions 1 2 [--forward]

Each version's calls sit between NVTX-free markers: the script prints the
version before its call, and ncu lists the kernels in launch order.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench as B  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", type=int, nargs=5, metavar="N C H W S")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--cl", action="store_true")
    ap.add_argument("--versions", type=int, nargs="+", default=[0])
    ap.add_argument("--forward", action="store_true", help="the forward alone, under no_grad (inference)")
    a = ap.parse_args()
    dtype = torch.float32 if a.dtype == "fp32" else torch.bfloat16
    _, ours, x, g = B.setup(tuple(a.shape), dtype, a.cl)
    for v in a.versions:
        ours.version = v
        for k in range(2):  # warm: the last call is the one to read
            torch.cuda.synchronize()
            print(f"version {v} call {k + 1}", flush=True)
            if a.forward:
                with torch.no_grad():
                    ours(x)
            else:
                ours(x).backward(g)
        torch.cuda.synchronize()
        print(f"version {v}: {'forward' if a.forward else 'forward + backward'}", flush=True)


if __name__ == "__main__":
    main()
