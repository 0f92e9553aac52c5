"""Does the last, partly filled round of rows cost a whole round? (GPU; a development probe.)

A persistent grid of S row slots runs ceil(N / S) rounds; at the benchmark's shapes N / S is
just over a whole number (8192 rows over 132 slots: 62.06), so the last round runs a few rows
while the other SMs idle. For each case: the op on N rows, on the M = S * floor(N / S) rows of
the whole rounds alone, and M rows followed by the N - M tail rows as a second call whose rows
are split across a cluster of C CTAs (knob cluster=C; an emulation of a tail kernel,
two op calls).
    python tools/probe_tail.py [--dtypes bfloat16]
"""
import argparse
import sys

import torch

from kernel_common import bench
from day26_layernorm import layer_norm_backward, layer_norm_forward
from probe_bwd import env_set  # tools/ is on sys.path when run as a script

# (kind, D, N, M): M = the rows of the whole rounds (slots per SM from the launch plans:
# forward bf16 2 x 1, 2 x 2, 1 and 16 slots an SM at D = 8192, 4096, 16384, 1024;
# backward bf16 ring 1, 2, 8 slots an SM, 16384 in 66 clusters of 2)
CASES = [
    ("fwd", 8192, 8192, 8184), ("fwd", 4096, 16384, 16368), ("fwd", 16384, 4096, 4092),
    ("fwd", 1024, 32768, 31680),
    ("bwd", 8192, 8192, 8184), ("bwd", 4096, 16384, 16368), ("bwd", 16384, 4096, 4092),
    ("bwd", 1024, 32768, 32736),
]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtypes", default="bfloat16")
    args = p.parse_args()
    bw = bench.copy_bandwidth_gbs()
    rows = []
    for dname in args.dtypes.split(","):
        dtype = getattr(torch, dname)
        for kind, d, n, m in CASES:
            x = torch.randn(n, d, device="cuda", dtype=dtype)
            w = torch.randn(d, device="cuda", dtype=dtype)
            b = torch.randn(d, device="cuda", dtype=dtype)
            dy = torch.randn(n, d, device="cuda", dtype=dtype)
            _, mean, rstd = layer_norm_forward(x, d, w, b)
            passes = 2 if kind == "fwd" else 3

            def op(r0, r1):
                if kind == "fwd":
                    return layer_norm_forward(x[r0:r1], d, w, b)
                return layer_norm_backward(dy[r0:r1], x[r0:r1], d, mean[r0:r1], rstd[r0:r1], w)

            r = dict(case=f"{kind} {n}x{d} {dname}", floor=bench.floor_us(passes * n * d * x.element_size(), bw))
            r["all"] = bench.time_us(lambda: op(0, n))
            r["whole_rounds"] = bench.time_us(lambda: op(0, m))
            r["scaled"] = r["whole_rounds"] * n / m  # the time the rows would take at the whole rounds' rate
            def split(c):
                op(0, m)
                with env_set({"cluster": c}):
                    op(m, n)

            for c in ("1", "2", "4"):
                r["split_c" + c] = bench.time_us(lambda: split(c))
            with env_set({"cluster": "4"}):
                r["tail_alone_c4"] = bench.time_us(lambda: op(m, n))
            r["pct_all"] = 100 * r["floor"] / r["all"]
            r["pct_scaled"] = 100 * r["floor"] / r["scaled"]
            rows.append(r)
            del x, w, b, dy
            torch.cuda.empty_cache()
    cols = ["case", "floor", "all", "whole_rounds", "scaled", "split_c1", "split_c2", "split_c4", "tail_alone_c4",
            "pct_all", "pct_scaled"]
    print(f"copy bandwidth {bw:.0f} GB/s; us, median, L2 flushed")
    print(bench.format_table(rows, cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
