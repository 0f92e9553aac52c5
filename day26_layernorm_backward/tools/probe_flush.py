"""What does the benchmark's L2 flush itself cost the timed op? (GPU; a development probe.)

bench.time_us flushes the L2 before each repeat by zeroing a buffer the size of the L2, which
leaves the L2 full of dirty lines; the timed op then writes them back as it evicts them. Here
dst.copy_(src) (the floor's own operation) and day26's backward are timed three ways:
- zero: as bench.time_us (zero_ of the flush buffer);
- read: the L2 filled by reading a buffer of that size (clean lines: nothing to write back);
- zero+read: zero_, then the read (the zero_'s lines written back before the timed op).
    python tools/probe_flush.py
"""
import sys

import torch

from kernel_common import bench
from day26_layernorm import layer_norm_backward, layer_norm_forward


def main():
    bench._l2_flush()
    zbuf = bench._flush_buf
    rbuf = torch.ones_like(zbuf)
    flushes = {
        "zero": lambda: zbuf.zero_(),
        "read": lambda: rbuf.sum(),
        "zero+read": lambda: (zbuf.zero_(), rbuf.sum()),
    }
    bw = bench.copy_bandwidth_gbs()
    rows = []
    for n, d in [(4096, 768), (32768, 1024), (16384, 4096), (8192, 8192)]:
        x = torch.randn(n, d, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn_like(x)
        w = torch.randn(d, device="cuda", dtype=torch.bfloat16)
        b = torch.randn_like(w)
        out = torch.empty_like(x)
        _, mean, rstd = layer_norm_forward(x, d, w, b)
        _, tm, tr = torch.ops.aten.native_layer_norm(x, [d], w, b, 1e-5)
        ops = {
            "copy_": (lambda: out.copy_(x), 2),
            "ours_bwd": (lambda: layer_norm_backward(dy, x, d, mean, rstd, w), 3),
            "torch_bwd": (lambda: torch.ops.aten.native_layer_norm_backward(
                dy, x, [d], tm, tr, w, b, [True, True, True]), 3),
        }
        for name, (fn, passes) in ops.items():
            r = dict(case=f"{name} {n}x{d} bf16", floor=bench.floor_us(passes * x.numel() * 2, bw))
            for fname, fl in flushes.items():
                r[fname] = bench.time_us(fn, flush=fl)
            rows.append(r)
        del x, dy, out
        torch.cuda.empty_cache()
    print(f"L2 flush buffer {zbuf.numel() * 4 / 2**20:.0f} MiB; copy bandwidth {bw:.0f} GB/s; us, median (bench.time_us)")
    print(bench.format_table(rows, ["case", "floor", "zero", "read", "zero+read"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
