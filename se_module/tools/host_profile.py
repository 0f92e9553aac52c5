"""Where the host time of the fused SE block goes (GPU only).

    python tools/host_profile.py [--n 2000] [--profile]

Each row: microseconds of host time per call, `n` calls enqueued back to back
with time.perf_counter (no sync inside the loop; the GPU work per call is
shorter than the host work at (1, 64, 112, 112), so the launch queue never
fills), median of 5 such loops. The second column adds the final sync
(per call), as a check that the loop was not GPU-bound. Rows compare our
module and op with reference paths (an empty-ish autograd op, the Python
wrapper of autograd.grad, one allocation, one small kernel launch), so the
differences say what each layer costs.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import se_module  # noqa: E402
from se_module import SqueezeExcitation  # noqa: E402

T = torch.ops.se_module
run_backward = torch.autograd.Variable._execution_engine.run_backward


def host_us(fn, n, reps=5):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    enq, tot = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        enq.append((t1 - t0) / n * 1e6)
        tot.append((t2 - t0) / n * 1e6)
    return statistics.median(enq), statistics.median(tot)


def rows_for(shape, n):
    N, C, H, W, S = shape
    torch.manual_seed(0)
    mod = SqueezeExcitation(C, S).cuda()
    x = torch.randn(N, C, H, W, device="cuda", requires_grad=True)
    g = torch.randn(N, C, H, W, device="cuda")
    w1, b1, w2, b2 = mod.fc1.weight, mod.fc1.bias, mod.fc2.weight, mod.fc2.bias
    inputs = [x, w1, b1, w2, b2]
    op = T.se_block.default
    bop = T.se_block_backward.default
    xs = torch.randn(4, device="cuda", requires_grad=True)
    gs = torch.randn(4, device="cuda")
    ws = [torch.randn(4, device="cuda", requires_grad=True) for _ in range(4)]
    buf = torch.empty(1024, device="cuda")

    def mod_fb():
        torch.autograd.grad(mod(x), inputs, g)

    def op_fb():
        torch.autograd.grad(op(x, w1, b1, w2, b2, 1, 3), inputs, g)

    def op_fb_engine():  # autograd.grad without its Python wrapper
        run_backward((op(x, w1, b1, w2, b2, 1, 3),), (g,), False, False, tuple(inputs), False, False)

    def nograd_fwd():
        with torch.no_grad():
            op(x, w1, b1, w2, b2, 1, 3)

    def tiny_fb():  # the engine's round trip for one CUDA op of one input
        torch.autograd.grad(xs * 2.0, [xs], gs)

    def tiny5_fb():  # ... and of five inputs (an addcmul chain: 4 autograd nodes)
        torch.autograd.grad(xs * ws[0] + ws[1] * ws[2] + ws[3], [xs, *ws], gs)

    entry = getattr(se_module.ops._C, "se_block", None)  # the C++ entry (absent before it existed)
    cases = [
        ("module fwd (grad mode)", lambda: mod(x)),
        ("op fwd (grad mode)", lambda: op(x, w1, b1, w2, b2, 1, 3)),
        ("op fwd via _C entry (grad mode)", (lambda: entry(x, w1, b1, w2, b2, 1, 3, 0)) if entry else None),
        ("op fwd (no_grad)", nograd_fwd),
        ("op bwd called directly", lambda: bop(g, x, w1, b1, w2, b2, 1, 3)),
        ("module fwd+bwd (autograd.grad)", mod_fb),
        ("op fwd+bwd (autograd.grad)", op_fb),
        ("op fwd+bwd (engine.run_backward)", op_fb_engine),
        ("ref: x*2 fwd+bwd, 1 input", tiny_fb),
        ("ref: 4-op chain fwd+bwd, 5 inputs", tiny5_fb),
        ("ref: torch.empty(1024) cuda", lambda: torch.empty(1024, device="cuda")),
        ("ref: buf.zero_() (1 launch)", lambda: buf.zero_()),
        ("ref: buf.view(32, 32)", lambda: buf.view(32, 32)),
    ]
    out = []
    for name, fn in cases:
        if fn is None:
            continue
        e, t = host_us(fn, n)
        out.append((name, e, t))
    return out, (mod_fb, mod, x, g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--profile", action="store_true", help="also print a torch.profiler table of fwd+bwd")
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, se_module from {se_module.__file__}")
    for shape in [(1, 64, 112, 112, 16), (8, 64, 112, 112, 16)]:
        rows, (mod_fb, *_rest) = rows_for(shape, args.n if shape[0] == 1 else args.n // 4)
        print(f"\n### host time per call (us), shape {shape[:4]} S={shape[4]}\n")
        print(f"| {'what':40s} | enqueue_us | with_sync_us |")
        print(f"|{'-' * 42}|------------|--------------|")
        for name, e, t in rows:
            print(f"| {name:40s} | {e:10.2f} | {t:12.2f} |")
        if args.profile and shape[0] == 1:
            from torch.profiler import ProfilerActivity, profile
            for _ in range(20):
                mod_fb()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(200):
                    mod_fb()
                torch.cuda.synchronize()
            print("\n" + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30,
                                                   max_name_column_width=48))


if __name__ == "__main__":
    main()
