"""The backward's kernels on a timeline (GPU; a development probe).

For each case, 20 calls as bench.py times them (L2 flushed before each) under
torch.profiler; for each kernel of one call: when it started and ended,
relative to the start of the call's first kernel (median over the calls, us).
Shows how long the finalize runs after the main kernel ends, whether its
launch overlaps the main kernel (PDL), and the whole span on the GPU.
    python tools/probe_fin.py [--cases 4096x768:bfloat16,...] [--mask 111] [--knobs plan,grid=132,plan]
--knobs: one pass per entry, each `plan` (the library's choices) or private knobs
(day26_layernorm.ops.knobs) joined by `+`, e.g. `grid=132` (the persistent grids'
cap: fewer blocks, fewer partial rows for the finalize to add). Every pass is
timed in the same process before the profiler runs; each table's title gives the
plan's launch shape.
"""
import argparse
import contextlib
import statistics
import sys

import torch

from kernel_common import bench
from day26_layernorm import layer_norm_backward, layer_norm_forward, ops


def timeline(fn, calls=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            bench._l2_flush()
            fn()
        torch.cuda.synchronize()
    ks = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start)
    groups, cur = [], None
    for s, e, name in ks:
        if "reduce_kernel" in name:  # the L2 flush (a sum over a buffer 4x the L2) opens each call
            cur = []
            groups.append(cur)
        elif cur is not None:
            cur.append((s, e, name))
    groups = [g for g in groups if g]
    n = min(len(g) for g in groups)
    rows = []
    for k in range(n):
        t0s = [g[0][0] for g in groups]
        name = groups[0][k][2].replace("(anonymous namespace)::", "").split("(")[0]
        rows.append(dict(kernel=name[:40],
                         start=statistics.median(g[k][0] - t0 for g, t0 in zip(groups, t0s)),
                         end=statistics.median(g[k][1] - t0 for g, t0 in zip(groups, t0s)),
                         dur=statistics.median(g[k][1] - g[k][0] for g in groups)))
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="8192x768:bfloat16,8192x768:float32,4096x768:bfloat16,32768x1024:bfloat16,"
                                      "8192x8192:bfloat16")
    p.add_argument("--mask", default="111")
    p.add_argument("--knobs", default="plan")
    args = p.parse_args()
    mask = tuple(c == "1" for c in args.mask)
    cases = []
    for case in args.cases.split(","):
        shape, dname = case.split(":")
        n, d = (int(v) for v in shape.split("x"))
        dtype = getattr(torch, dname)
        x = torch.randn(n, d, device="cuda", dtype=dtype)
        dy = torch.randn_like(x)
        w = torch.randn(d, device="cuda", dtype=dtype)
        b = torch.randn_like(w)
        _, mean, rstd = layer_norm_forward(x, d, w, b)
        fn = (lambda dy=dy, x=x, d=d, mean=mean, rstd=rstd, w=w:
              layer_norm_backward(dy, x, d, mean, rstd, w, output_mask=mask))
        plan = (lambda dy=dy, x=x, d=d, mean=mean, rstd=rstd, w=w:
                ops.backward_plan(dy, x, d, mean, rstd, w, mask))
        cases.append((f"{n}x{d} {dname}", fn, plan))
    passes = args.knobs.split(",")

    def knob(entry):
        if entry == "plan":
            return contextlib.nullcontext()
        return ops.knobs(**{k: int(v) for k, v in (kv.split("=") for kv in entry.split("+"))})

    # every case timed before the profiler runs (CUPTI left attached slows later launches)
    times = {}
    for i, entry in enumerate(passes):
        with knob(entry):
            for label, fn, _ in cases:
                times[label, i] = bench.time_us(fn)
    for i, entry in enumerate(passes):
        with knob(entry):
            for label, fn, plan in cases:
                q = plan()
                shape = ", ".join(f"{k} {q[k]}" for k in ("family", "threads", "slots", "grid", "cluster",
                                                          "partial_rows"))
                print(f"\n{label} mask {args.mask} knobs {entry} ({shape}): bench {times[label, i]:.2f} us; "
                      "kernels (us from the first kernel's start):")
                print(bench.format_table(timeline(fn), ["kernel", "start", "end", "dur"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
