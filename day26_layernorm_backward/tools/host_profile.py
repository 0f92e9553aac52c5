"""Where the host time of one LayerNorm forward + backward call goes (GPU; a development probe).

    python tools/host_profile.py [--rows 4] [--cols 768]

torch.profiler's CPU-side self time per op over many tiny calls, ours beside torch.nn.LayerNorm:
at a tiny shape the GPU work is shorter than the host's, so these are the host costs that
scripts/host_overhead.py adds up.
"""
import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from day26_layernorm import LayerNorm


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--cols", type=int, default=768)
    p.add_argument("--n", type=int, default=200)
    a = p.parse_args()
    ref = torch.nn.LayerNorm(a.cols, device="cuda", dtype=torch.bfloat16)
    ours = LayerNorm.from_torch(ref)
    x = torch.randn(a.rows, a.cols, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn_like(x)
    for name, m in (("ours", ours), ("torch", ref)):
        for _ in range(20):
            m(x).backward(g)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(a.n):
                m(x).backward(g)
            torch.cuda.synchronize()
        print(f"== {name}: CPU self time per call (us), {a.n} calls")
        rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:14]
        for e in rows:
            print(f"   {e.self_cpu_time_total / a.n:8.1f}  {e.count / a.n:4.1f}x  {e.key[:90]}")


if __name__ == "__main__":
    main()
