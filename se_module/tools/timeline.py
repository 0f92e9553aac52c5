"""Where the GPU time of one fused SE call goes, kernel by kernel (GPU; a development probe).

The call (forward, or forward + backward as bench.py's effnet table times it) is captured
in a CUDA graph, as bench.graph_us times it, and replayed `--calls` times under
torch.profiler with the L2 flushed before each replay. For each kernel of a replay:
when it started and ended, relative to the replay's first kernel start (median over
the replays, us), and `adds`: its end minus the previous kernel's end, the time the
kernel adds to the call when kernels overlap under programmatic dependent launch
(a kernel launched early waits inside; its duration then includes that wait).

    python tools/timeline.py --shapes "128 1152 7 7 48;32 960 12 12 40" [--fp32] [--forward]
        [--versions 2 3] [--calls 20] [--fp32-params]

--fp32-params keeps the parameters in fp32 under a bf16 x (what autocast training passes the
op), where the reductions have no parameter-widening blocks.
"""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench as B  # noqa: E402
from kernel_common import bench  # noqa: E402


def short(name: str) -> str:
    name = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "").replace("void ", "")
    head = name.split("(")[0]
    return head[:56]


def timeline(fn, calls: int):
    graph, _ = bench.capture_graph(fn)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            bench._l2_flush()
            graph.replay()
        torch.cuda.synchronize()
    ks = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start)
    groups, cur = [], None
    for s, e, name in ks:
        if name.startswith("void at::native::reduce_kernel"):  # the flush (a sum) opens each replay
            cur = []
            groups.append(cur)
        elif cur is not None:
            cur.append((s, e, name))
    groups = [g for g in groups if g]
    n = min(len(g) for g in groups)
    rows = []
    prev_end = 0.0
    for k in range(n):
        t0s = [g[0][0] for g in groups]
        end = statistics.median(g[k][1] - t0 for g, t0 in zip(groups, t0s))
        rows.append(dict(kernel=short(groups[0][k][2]),
                         start=statistics.median(g[k][0] - t0 for g, t0 in zip(groups, t0s)),
                         end=end, dur=statistics.median(g[k][1] - g[k][0] for g in groups),
                         adds=end - prev_end))
        prev_end = max(prev_end, end)
    del graph
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="128 1152 7 7 48", help="'N C H W S;...'")
    ap.add_argument("--fp32", action="store_true", help="fp32 NCHW (default bf16 channels_last)")
    ap.add_argument("--forward", action="store_true", help="the forward alone (default forward + backward)")
    ap.add_argument("--versions", type=int, nargs="+", default=[0])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--fp32-params", action="store_true", help="fp32 parameters under a bf16 x (autocast's case)")
    a = ap.parse_args()
    dtype, cl = (torch.float32, False) if a.fp32 else (torch.bfloat16, True)
    for spec in a.shapes.split(";"):
        shape = tuple(int(v) for v in spec.split())
        _, ours, x, g = B.setup(shape, dtype, cl)
        if a.fp32_params:
            ours.float()
        for v in a.versions:
            ours.version = v
            fwd, fb = B.fwd_and_fwdbwd(ours, list(ours.parameters()), x, g)
            fn = fwd if a.forward else fb
            gpu = bench.graph_us(fn)
            rows = timeline(fn, a.calls)
            print(f"== {shape} {'fp32 NCHW' if a.fp32 else 'bf16 CL'} {'forward' if a.forward else 'fwd+bwd'}"
                  f"{' fp32 params' if a.fp32_params else ''}"
                  f" v{v}: graph {gpu:.1f} us, last kernel ends {rows[-1]['end'] if rows else 0:.1f} us")
            for r in rows:
                print(f"   {r['start']:7.1f} {r['end']:7.1f} {r['dur']:7.1f} {r['adds']:7.1f}  {r['kernel']}")
        del ours, x, g
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
