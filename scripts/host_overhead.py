"""Host time per forward + backward call: each day's op beside the PyTorch op it replaces.

    python scripts/host_overhead.py [--device cuda|cpu] [--rounds 7] [--n 300]

Tiny shapes, so the GPU's work is shorter than the host's and the launch queue
never fills: wall-clock time per call is then host time (on CUDA the clock stops
before the final synchronize, kernel_common.bench.host_us's method). Variants take
turns in rounds; the median over rounds is printed. On CPU the kernels' own time is
included (a proxy only). Needs the days installed (scripts/build_all.sh).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def per_call_us(fn, n, sync):
    for _ in range(10):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    sync()
    return (t1 - t0) / n * 1e6


def cases(device):
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    out = {}
    try:
        from day26_layernorm import LayerNorm

        ref = torch.nn.LayerNorm(768, device=device, dtype=dt)
        ours = LayerNorm.from_torch(ref)
        x = torch.randn(4, 768, device=device, dtype=dt, requires_grad=True)
        g = torch.randn(4, 768, device=device, dtype=dt)
        out["LayerNorm (4, 768)"] = (lambda m=ours, x=x, g=g: m(x).backward(g), lambda m=ref, x=x, g=g: m(x).backward(g))
    except ImportError as e:
        print("day26 not installed:", e)
    try:
        from day50_attention import attention

        q, k, v = (torch.randn(1, 4, 64, 64, device=device, dtype=dt, requires_grad=True) for _ in range(3))
        g = torch.randn(1, 4, 64, 64, device=device, dtype=dt)
        out["attention (1, 4, 64, 64) causal"] = (
            lambda q=q, k=k, v=v, g=g: attention(q, k, v, causal=True).backward(g),
            lambda q=q, k=k, v=v, g=g: F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g))
    except ImportError as e:
        print("day50 not installed:", e)
    try:
        from se_module import SqueezeExcitation
        from torchvision.ops import SqueezeExcitation as TvSE

        ref = TvSE(32, 8, activation=torch.nn.SiLU).to(device)
        ours = SqueezeExcitation(32, 8).to(device)
        ours.load_state_dict(ref.state_dict())
        x = torch.randn(2, 32, 8, 8, device=device, requires_grad=True)
        g = torch.randn(2, 32, 8, 8, device=device)
        out["SE (2, 32, 8, 8)"] = (lambda m=ours, x=x, g=g: m(x).backward(g), lambda m=ref, x=x, g=g: m(x).backward(g))
    except Exception as e:  # noqa: BLE001  torchvision may import but fail to load its ops
        print("se_module / torchvision not usable:", type(e).__name__, e, flush=True)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--n", type=int, default=300)
    a = p.parse_args()
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    name = torch.cuda.get_device_name() if a.device == "cuda" else "CPU"
    print(f"host us per forward + backward call, {name}, torch {torch.__version__}, median of {a.rounds} rounds")
    print(f"{'case':34s} {'ours':>8s} {'torch':>8s} {'ratio':>6s}")
    for label, (ours, ref) in cases(a.device).items():
        t_o, t_r = [], []
        for _ in range(a.rounds):
            t_o.append(per_call_us(ours, a.n, sync))
            t_r.append(per_call_us(ref, a.n, sync))
        mo, mr = statistics.median(t_o), statistics.median(t_r)
        print(f"{label:34s} {mo:8.1f} {mr:8.1f} {mo / mr:6.2f}")


if __name__ == "__main__":
    main()
