"""Where do the microseconds of a small shape go? (GPU; a development probe.)

For 4096x768 (the benchmark's smallest shape), ours (the default, version 0) and torch native, forward and
backward:
- bench: bench.time_us as bench.py measures it (L2 flushed before each repeat; the host's
  dispatch of the op is exposed wherever it takes longer than the flush runs on the GPU);
- graph: the same op captured in a CUDA graph, each repeat one replay (the host's part gone);
- kernels: the GPU time of each kernel of one call (torch.profiler, L2 flushed first);
- host: microseconds of host time per call (shape 64 x D, 2000 calls, GPU far from busy).
    python tools/probe_small.py [--shapes 4096x768] [--dtypes float32,bfloat16]
"""
import argparse
import sys

import torch

from kernel_common import bench
from day26_layernorm import layer_norm_backward, layer_norm_forward


def kernel_times(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(10):
            bench._l2_flush()
            fn()
        torch.cuda.synchronize()
    out = []
    for e in prof.key_averages():
        if "zero" in e.key or "fill" in e.key.lower() or not str(getattr(e, "device_type", "")).endswith("CUDA"):
            continue
        tot = getattr(e, "device_time_total", None)
        if tot is None:
            tot = getattr(e, "cuda_time_total", 0.0)
        if tot <= 0:
            continue
        out.append(f"{e.key[:48]} {tot / max(e.count, 1):.2f}")
    return "; ".join(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="4096x768")
    p.add_argument("--dtypes", default="float32,bfloat16")
    args = p.parse_args()
    rows, kern = [], []
    for dname in args.dtypes.split(","):
        dtype = getattr(torch, dname)
        for s in args.shapes.split(","):
            n, d = (int(v) for v in s.split("x"))
            for nn in (n, 64):
                x = torch.randn(nn, d, device="cuda", dtype=dtype)
                w = torch.randn(d, device="cuda", dtype=dtype)
                b = torch.randn(d, device="cuda", dtype=dtype)
                dy = torch.randn(nn, d, device="cuda", dtype=dtype)
                _, mean, rstd = layer_norm_forward(x, d, w, b)
                _, tm, tr = torch.ops.aten.native_layer_norm(x, [d], w, b, 1e-5)
                fns = {
                    "ours_fwd": lambda: layer_norm_forward(x, d, w, b),
                    "torch_fwd": lambda: torch.nn.functional.layer_norm(x, (d,), w, b),
                    "ours_bwd": lambda: layer_norm_backward(dy, x, d, mean, rstd, w),
                    "torch_bwd": lambda: torch.ops.aten.native_layer_norm_backward(
                        dy, x, [d], tm, tr, w, b, [True, True, True]),
                }
                for name, fn in fns.items():
                    if nn == 64:
                        rows[-4 + list(fns).index(name)]["host"] = bench.host_us(fn, n=2000, warmup=20)
                        continue
                    r = dict(case=f"{name} {n}x{d} {dname}")
                    r["bench"] = bench.time_us(fn)
                    r["graph"] = bench.graph_us(fn, warmup=3)
                    rows.append(r)
                    kern.append(f"{r['case']}: {kernel_times(fn)}")
    print("us, median, L2 flushed before each repeat")
    print(bench.format_table(rows, ["case", "bench", "graph", "host"]))
    print("\nkernels (GPU us, average of 10 calls):")
    print("\n".join(kern))
    return 0


if __name__ == "__main__":
    sys.exit(main())
