"""Benchmark of day50_attention on the GPU: forward and backward, bf16, B=4, H=16.

    python bench.py --out STEM [--quick]
    python bench.py --llm [--quick] [--out STEM]      # packed sequences, a sliding window, a softcap (STEM_llm.*)
    python bench.py --cudnn [--quick] [--out STEM]    # against SDPA cuDNN, GPU time (STEM_cudnn.md)
    python bench.py --forward --backward [--quick] [--out STEM]   # the version ladders, bf16 and fp16
                                                      # (writes STEM_fwd.* and STEM_bwd.*: md, json, png)
    python bench.py --models [--quick] [--out STEM]   # only the training step of GPT-2 small and a Llama
                                                      # (dense and packed rows) with day50 as transformers'
                                                      # attention (kernel_common.models; STEM_models.md/.json)

Rows: N in 1024, 2048, 4096, 8192; d in 64, 128; causal and not. Columns: time and
TFLOP/s of our fused and naive paths and of SDPA's flash, cuDNN, efficient and
math backends. FLOPs: forward 4*B*H*Nq*Nk*d, backward 2.5x that, halved when
causal (the issue's convention). The floor is the backward's FLOPs over the
measured dense bf16 matmul rate. Writes STEM.md (tables), STEM.json, STEM.png.
--forward / --backward: the Hopper issues' grid (bf16 and fp16, B=4, H=16, N 1024-8192, d 64 and
128, causal and not) for each version of our fused forward (ops.fwd_version) or backward main
kernel (ops.bwd_version): 1 mma.sync, 2 Hopper; beside SDPA's flash and cuDNN backends, plus
grouped-query rows (16 q heads over 4 and 1 kv heads).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import day50_attention as da  # noqa: E402
from day50_attention.ops import bwd_version, fwd_version  # noqa: E402
from kernel_common import bench, models  # noqa: E402

B, H = 4, 16
SDPA = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def flops(n, d, causal):
    f = 4.0 * B * H * n * n * d
    return f / 2 if causal else f


def tf(fl, us):
    return None if us is None else fl / (us * 1e-6) / 1e12


def spread(label, vals):
    """'label: worst ..x, median ..x, best ..x' over the values present, or None."""
    vals = sorted(v for v in vals if v)
    if not vals:
        return None
    # the median of an even count is the mean of the middle two (the upper one read 0.995 as 1.00x)
    return f"{label}: worst {vals[0]:.2f}x, median {statistics.median(vals):.3f}x, best {vals[-1]:.2f}x"


def timed(fn, args):
    try:
        return bench.time_us(fn, warmup=args.warmup, rep=args.rep, max_ms=args.max_ms)
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return None
    except RuntimeError as e:  # a backend that does not take this shape
        print(f"   ({str(e).splitlines()[0][:100]})")
        return None


def ours(q, k, v, do, causal, backend, args):
    fwd = lambda: da.attention_forward(q, k, v, causal, None, backend)  # noqa: E731
    try:
        out, lse = fwd()
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return None, None
    bwd = lambda: da.attention_backward(do, q, k, v, out, lse, None, causal, None, backend)  # noqa: E731
    return timed(fwd, args), timed(bwd, args)


def sdpa(q, k, v, do, causal, name, args):
    try:
        with sdpa_kernel(SDPA[name]):
            with torch.no_grad():
                t_f = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), args)
            qr, kr, vr = (t.detach().requires_grad_() for t in (q, k, v))
            out = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
            t_b = timed(lambda: torch.autograd.grad(out, (qr, kr, vr), do, retain_graph=True), args)
            del out
            return t_f, t_b
    except (RuntimeError, torch.OutOfMemoryError) as e:
        torch.cuda.empty_cache()
        print(f"   sdpa {name}: {str(e).splitlines()[0][:100]}")
        return None, None


def ladder(args, pas):
    """TF/s of each version of our fused forward (pas = "fwd") or backward main kernel
    ("bwd"), beside SDPA's flash and cuDNN backends, bf16 and fp16, one run."""
    meta = bench.device_meta()
    print(f"== {pas} ladder: {meta['device']} {meta['date']} torch {meta['torch']}", flush=True)
    hopper = torch.cuda.get_device_capability() == (9, 0)
    versions = (1, 2) if hopper else (1,)
    pin = fwd_version if pas == "fwd" else bwd_version
    mult = 1.0 if pas == "fwd" else 2.5

    def ours_t(q, k, v, do, causal, det=False):
        if pas == "fwd":
            return timed(lambda: da.attention_forward(q, k, v, causal, None, "fused"), args)
        out, lse = da.attention_forward(q, k, v, causal, None, "fused")
        return timed(lambda: da.attention_backward(do, q, k, v, out, lse, None, causal, None, "fused", det), args)

    def peer_t(q, k, v, do, causal, name, gqa=False):
        try:
            with sdpa_kernel(SDPA[name]):
                if pas == "fwd":
                    with torch.no_grad():
                        return timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                            enable_gqa=gqa), args)
                qr, kr, vr = (t.detach().requires_grad_() for t in (q, k, v))
                out = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal, enable_gqa=gqa)
                return timed(lambda: torch.autograd.grad(out, (qr, kr, vr), do, retain_graph=True), args)
        except RuntimeError:
            return None

    def row(r, q, k, v, do, causal, fl, gqa=False):
        for ver in versions:
            with pin(ver):
                try:
                    r[f"v{ver} {pas} TF/s"] = tf(fl, ours_t(q, k, v, do, causal))
                except RuntimeError:  # version 2 pinned where it does not apply
                    r[f"v{ver} {pas} TF/s"] = None
        if pas == "bwd" and hopper:  # deterministic=True (v2, dq adds ordered by key block)
            r["v2 det bwd TF/s"] = tf(fl, ours_t(q, k, v, do, causal, det=True))
            if r.get("v2 bwd TF/s") and r["v2 det bwd TF/s"]:
                r["det/v2"] = r["v2 det bwd TF/s"] / r["v2 bwd TF/s"]
        for name in ("flash", "cudnn"):
            r[f"{name} {pas} TF/s"] = tf(fl, peer_t(q, k, v, do, causal, name, gqa))
        best = r.get(f"v{versions[-1]} {pas} TF/s")
        for name in ("flash", "cudnn"):
            if best and r.get(f"{name} {pas} TF/s"):
                r[f"ours/{name}"] = best / r[f"{name} {pas} TF/s"]
        return r

    rows = []
    for dtype, dname in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        for n in (1024, 2048, 4096, 8192):
            for d in (64, 128):
                for causal in (False, True):
                    g = torch.Generator(device="cuda").manual_seed(n + d)
                    q, k, v, do = (torch.randn(B, H, n, d, device="cuda", dtype=dtype, generator=g) for _ in range(4))
                    r = row({"shape": f"{dname} N={n} d={d}{' causal' if causal else ''}", "dtype": dname, "N": n,
                             "d": d, "causal": causal}, q, k, v, do, causal, mult * flops(n, d, causal))
                    rows.append(r)
                    print("   " + "  ".join(f"{c} {r[c]:.2f}" if isinstance(r.get(c), float) else f"{c} {r[c]}"
                                            for c in r if c not in ("dtype", "N", "d", "causal")), flush=True)
                    del q, k, v, do
    grows = []
    for hkv in (4, 1):  # grouped-query and multi-query, bf16, N = 4096, d = 128
        for causal in (False, True):
            g = torch.Generator(device="cuda").manual_seed(hkv)
            q, do = (torch.randn(B, H, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
            k, v = (torch.randn(B, hkv, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
            grows.append(row({"shape": f"bf16 N=4096 d=128 Hkv={hkv}{' causal' if causal else ''}"},
                             q, k, v, do, causal, mult * flops(4096, 128, causal), gqa=True))
    vcols = [f"v{v} {pas} TF/s" for v in versions]
    if pas == "bwd" and hopper:
        vcols += ["v2 det bwd TF/s", "det/v2"]
    cols = ["shape", *vcols, f"flash {pas} TF/s", f"cudnn {pas} TF/s", "ours/flash", "ours/cudnn"]
    big = [r for r in rows if r["N"] >= 2048]
    summary = [spread(f"ours (v{versions[-1]}) / {name} at N >= 2048", [r.get(f"ours/{name}") for r in big])
               for name in ("flash", "cudnn")]
    summary.append(spread("deterministic=True / default (v2) at N >= 2048", [r.get("det/v2") for r in big]))
    summary = [x for x in summary if x]
    what = {"fwd": "forward 4*B*H*N*N*d", "bwd": "backward 2.5 x 4*B*H*N*N*d"}[pas]
    text = (f"# day50 {pas} ladder: {meta['device']}, {meta['date']}, torch {meta['torch']}, B={B}, H={H}\n\n"
            f"TF/s counts {what}, halved when causal. v1 = mma.sync, v2 = TMA + wgmma "
            "(Hopper; grouped-query backward runs v1).\n\n" + "\n".join(f"- {x}" for x in summary) + "\n\n"
            + bench.format_table(rows, cols) + "\n\n## Grouped-query (H = 16 q heads)\n\n"
            + bench.format_table(grows, cols) + "\n")
    stem = f"{args.out}_{pas}"
    os.makedirs(os.path.dirname(os.path.abspath(stem)), exist_ok=True)
    with open(stem + ".md", "w") as f:
        f.write(text)
    bench.write_report(rows + grows, sorted({c for r in rows + grows for c in r}), stem, f"day50 {pas} TFLOP/s", meta)
    bench.plot_attention(rows, stem + ".png", f"day50 {pas}, B={B}, H={H}", meta, ours=f"v{versions[-1]}",
                         peers={"v1": "ours v1 (mma.sync)", "flash": "SDPA flash (FA2)", "cudnn": "SDPA cuDNN"},
                         passes=(pas,))
    print(text)


def packed_rows(add, fwd_bwd, mk, hi, hq, hkv, d):
    """--llm's packed-sequence rows: 8 causal sequences of 512..hi - 1 tokens, hq q heads over hkv,
    head dim d; ours (auto, and version 1 pinned where it runs), SDPA on the padded batch and
    torch's own varlen attention."""
    g = torch.Generator().manual_seed(0)
    lens = [int(x) for x in torch.randint(512, hi, (8,), generator=g)]
    total, mx = sum(lens), max(lens)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q, k, v = mk(total, hq, d), mk(total, hkv, d), mk(total, hkv, d)
    do = torch.randn(total, hq, d, device="cuda", dtype=torch.bfloat16)
    tag = f"varlen B={len(lens)} total={total} max={mx} Hq={hq} Hkv={hkv} d={d} causal"
    add(f"{tag}: day50 attention_varlen",
        *fwd_bwd(lambda: da.attention_varlen(q, k, v, cu, cu, mx, mx, causal=True), (q, k, v), do))
    if d <= 128:  # version 1's forward stops at d 128
        with da.ops.kernel_versions(fwd=1, bwd=1):
            add(f"{tag}: day50 attention_varlen, version 1 (mma.sync)",
                *fwd_bwd(lambda: da.attention_varlen(q, k, v, cu, cu, mx, mx, causal=True), (q, k, v), do))
    qp, kp, vp = mk(len(lens), hq, mx, d), mk(len(lens), hkv, mx, d), mk(len(lens), hkv, mx, d)
    dop = torch.randn(len(lens), hq, mx, d, device="cuda", dtype=torch.bfloat16)
    for name in ("flash", "cudnn"):
        try:
            with sdpa_kernel(SDPA[name]):
                res = fwd_bwd(lambda: F.scaled_dot_product_attention(qp, kp.repeat_interleave(hq // hkv, 1),
                                                                     vp.repeat_interleave(hq // hkv, 1),
                                                                     is_causal=True), (qp, kp, vp), dop)
        except RuntimeError as e:
            print(f"   sdpa {name}: {str(e).splitlines()[0][:100]}")
            res = (None, None)
        add(f"{tag}: SDPA {name} on the padded batch (B, H, {mx}, d)", *res)
    try:  # torch's own varlen attention (torch.nn.attention.varlen, where this torch has it)
        from torch.nn.attention.varlen import varlen_attn
        kr, vr = (t.detach().repeat_interleave(hq // hkv, 1).requires_grad_() for t in (k, v))
        import inspect
        # causal is `is_causal=True` in torch 2.10 and `window_size=(-1, 0)` from 2.11 on
        causal_kw = ({"is_causal": True} if "is_causal" in inspect.signature(varlen_attn).parameters
                     else {"window_size": (-1, 0)})
        res = fwd_bwd(lambda: varlen_attn(q, kr, vr, cu, cu, mx, mx, **causal_kw), (q, kr, vr), do)
    except Exception as e:  # noqa: BLE001 (absent in this torch, or a signature or shape it refuses)
        print(f"   torch varlen_attn: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
        res = (None, None)
    add(f"{tag}: torch.nn.attention.varlen.varlen_attn (k, v repeated to Hq)", *res)


def llm_rows(args):
    """--llm: packed sequences (ours against SDPA on the padded batch and torch's own varlen
    attention where it runs), dense attention at d 256, a sliding window and a softcap (ours against FlexAttention with
    the same mask or score_mod, against version 1 pinned and against our own plain causal
    call), bf16, forward and forward + backward, ms."""
    meta = bench.device_meta()
    print(f"== llm rows: {meta['device']} {meta['date']} torch {meta['torch']}", flush=True)
    rows = []

    def fwd_bwd(f, xs, do):
        def both():
            for x in xs:
                x.grad = None
            f().backward(do)
        with torch.no_grad():
            t_f = timed(f, args)
        return t_f, timed(both, args)

    def add(name, t_f, t_b, **extra):
        r = {"row": name, "fwd ms": None if t_f is None else t_f / 1e3, "fwd+bwd ms": None if t_b is None else t_b / 1e3}
        r.update(extra)
        rows.append(r)
        print(f"   {name}: fwd {r['fwd ms']} ms, fwd+bwd {r['fwd+bwd ms']} ms", flush=True)

    mk = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16).requires_grad_()  # noqa: E731
    # packed sequences: 8 causal sequences of 512..4096 tokens, 32 q heads over 8 kv heads, d 128;
    # then 8 of 512..2048 tokens, 8 q heads over 4 of d 256 (Gemma's head dim)
    for (hi, hq, hkv, d) in ((4097, 32, 8, 128), (2049, 8, 4, 256)):
        packed_rows(add, fwd_bwd, mk, hi, hq, hkv, d)

    # dense attention at d 256 (Gemma's head dim): ours, its backward pinned to version 1 (the
    # mma.sync column halves it replaced), SDPA's backends
    b, hq, hkv, n, d = 2, 16, 8, 4096, 256
    q, k, v = mk(b, hq, n, d), mk(b, hkv, n, d), mk(b, hkv, n, d)
    do = torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16)
    tag = f"dense B={b} Hq={hq} Hkv={hkv} N={n} d={d} causal"
    add(f"{tag}: day50", *fwd_bwd(lambda: da.attention(q, k, v, causal=True), (q, k, v), do))
    with da.ops.kernel_versions(bwd=1):
        add(f"{tag}: day50, backward version 1 (mma.sync column halves)",
            *fwd_bwd(lambda: da.attention(q, k, v, causal=True), (q, k, v), do))
    for name in ("flash", "cudnn"):
        try:
            with sdpa_kernel(SDPA[name]):
                res = fwd_bwd(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                              (q, k, v), do)
        except RuntimeError as e:
            print(f"   sdpa {name}: {str(e).splitlines()[0][:100]}")
            res = (None, None)
        add(f"{tag}: SDPA {name}", *res)
    del q, k, v, do

    # sliding window: causal with 1024 keys to the left (Mistral's shape of window), N = 16384
    n, hq, d, left = 16384, 16, 128, 1024
    q, k, v = mk(1, hq, n, d), mk(1, hq, n, d), mk(1, hq, n, d)
    do = torch.randn(1, hq, n, d, device="cuda", dtype=torch.bfloat16)
    tag = f"window B=1 H={hq} N={n} d={d} causal left={left}"
    add(f"{tag}: day50 window", *fwd_bwd(lambda: da.attention(q, k, v, causal=True, window=(left, -1)), (q, k, v), do))
    with da.ops.kernel_versions(fwd=1, bwd=1):
        add(f"{tag}: day50 window, version 1 (mma.sync)",
            *fwd_bwd(lambda: da.attention(q, k, v, causal=True, window=(left, -1)), (q, k, v), do))
    add(f"{tag}: day50 full causal (no window)", *fwd_bwd(lambda: da.attention(q, k, v, causal=True), (q, k, v), do))
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention)
        bm = create_block_mask(lambda b, h, i, j: (j <= i) & (i - j <= left), 1, 1, n, n, device="cuda")
        res = fwd_bwd(lambda: flex(q, k, v, block_mask=bm), (q, k, v), do)
    except Exception as e:  # noqa: BLE001 (FlexAttention needs Triton and a compile)
        print(f"   flex_attention: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
        res = (None, None)
    add(f"{tag}: FlexAttention (compiled, sliding-window block mask)", *res)
    del q, k, v, do

    # softcap (Gemma 2: 50 on the scaled scores), causal, N = 8192
    n, cap = 8192, 50.0
    q, k, v = mk(1, hq, n, d), mk(1, hq, n, d), mk(1, hq, n, d)
    do = torch.randn(1, hq, n, d, device="cuda", dtype=torch.bfloat16)
    tag = f"softcap B=1 H={hq} N={n} d={d} causal softcap={cap:g}"
    add(f"{tag}: day50 softcap", *fwd_bwd(lambda: da.attention(q, k, v, causal=True, softcap=cap), (q, k, v), do))
    with da.ops.kernel_versions(fwd=1, bwd=1):
        add(f"{tag}: day50 softcap, version 1 (mma.sync)",
            *fwd_bwd(lambda: da.attention(q, k, v, causal=True, softcap=cap), (q, k, v), do))
    add(f"{tag}: day50 causal (no softcap)", *fwd_bwd(lambda: da.attention(q, k, v, causal=True), (q, k, v), do))
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention)
        bm = create_block_mask(lambda b, h, i, j: j <= i, 1, 1, n, n, device="cuda")
        res = fwd_bwd(lambda: flex(q, k, v, block_mask=bm, score_mod=lambda s, b, h, i, j: cap * torch.tanh(s / cap)),
                      (q, k, v), do)
    except Exception as e:  # noqa: BLE001 (FlexAttention needs Triton and a compile)
        print(f"   flex_attention: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
        res = (None, None)
    add(f"{tag}: FlexAttention (compiled, causal block mask, tanh score_mod)", *res)
    text = (f"# day50 LLM features: {meta['device']}, {meta['date']}, torch {meta['torch']}, bf16\n\n"
            "Median ms, CUDA events, L2 emptied by a read before each repeat.\n\n"
            + bench.format_table(rows, ["row", "fwd ms", "fwd+bwd ms"]) + "\n")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + "_llm.md", "w") as f:
        f.write(text)
    bench.write_report(rows, ["row", "fwd ms", "fwd+bwd ms"], args.out + "_llm", "day50 LLM features, ms", meta)
    print(text)


# The cuDNN issue's shapes: (B, H, Hk, N, d, causal, name); then the grid B 4, H 16.
MODEL_SHAPES = [(8, 12, 12, 1024, 64, True, "GPT-2 small"), (4, 16, 4, 2048, 64, True, "small Llama"),
                (2, 32, 8, 4096, 128, True, "Llama-8B-like"), (1, 32, 8, 8192, 128, True, "8B, N 8192")]
GRID_SHAPES = [(4, 16, 16, n, d, c, "grid") for n in (1024, 2048, 4096, 8192) for d in (64, 128) for c in (True, False)]


def plot_cudnn(rows, path, meta):
    """TF/s against N of the --cudnn grid rows: day50 beside SDPA cuDNN and flash (FA2)."""
    pts = [{"N": r["N"], "d": r["d"], "causal": r["causal"], "dtype": "bf16",
            **{f"{who} {pas} TF/s": r.get(f"{pre}{pas} TF/s") for who, pre in
               (("day50", ""), ("cudnn", "cudnn "), ("flash", "flash ")) for pas in ("fwd", "bwd")}}
           for r in rows if r.get("group") == "grid"]
    return bench.plot_attention(pts, path, f"day50 against SDPA, bf16, B={B}, H={H}", meta, ours="day50",
                                peers={"cudnn": "SDPA cuDNN", "flash": "SDPA flash (FA2)"})


def cudnn_rows(args):
    """--cudnn: forward and backward against SDPA's cuDNN kernels at the model shapes and the
    grid (there beside SDPA's flash backend too), bf16. GPU time: the call captured in a CUDA
    graph and replayed (L2 emptied before each replay, median); per call: the eager call timed
    with CUDA events (host launch work included). deterministic=True beside the default. SDPA's
    backward: forward + backward captured together, less its forward. Ours and the peers' graphs
    replay in turn each repeat (bench.graphs_us). Writes STEM_cudnn.md and STEM_cudnn.png (TF/s
    against N over the grid)."""
    meta = bench.device_meta()
    print(f"== vs cuDNN: {meta['device']} {meta['date']} torch {meta['torch']}", flush=True)

    def peer(backend, q, kr, vr, do, causal):
        """An SDPA backend's forward as training runs it (inputs needing grad: it saves the
        logsumexp, as ours does) and its forward + backward, both to be captured whole (a
        backward captured alone would run on the stream of a forward outside the graph; its
        GPU time is their difference), and its eager call times."""
        qr, krr, vrr = (t.detach().requires_grad_() for t in (q, kr, vr))
        c_fwd = lambda: F.scaled_dot_product_attention(qr, krr, vrr, is_causal=causal)  # noqa: E731

        def c_both():  # fresh leaves each call: no autograd node outlives a capture
            xs = [t.detach().requires_grad_() for t in (q, kr, vr)]
            return torch.autograd.grad(F.scaled_dot_product_attention(*xs, is_causal=causal), xs, do)

        def pinned(fn):  # the backend chosen when the graph is captured
            def run():
                with sdpa_kernel(SDPA[backend]):
                    return fn()
            return run
        with sdpa_kernel(SDPA[backend]):
            try:
                c_both()
            except RuntimeError as e:  # a shape this backend refuses
                print(f"   sdpa {backend}: {str(e).splitlines()[0][:100]}")
                return {}, {}
            o_c = c_fwd()
            c_bwd = lambda: torch.autograd.grad(o_c, (qr, krr, vrr), do, retain_graph=True)  # noqa: E731
            calls = {f"{backend} fwd call us": timed(c_fwd, args), f"{backend} bwd call us": timed(c_bwd, args)}
        return {f"{backend} fwd": pinned(c_fwd), f"{backend} both": pinned(c_both)}, calls

    def gpu_us(fns):
        """GPU time of each of fns (name -> call), interleaved (bench.graphs_us): the clock a
        sustained load lowers is the same for ours and the peers'."""
        try:
            return dict(zip(fns, bench.graphs_us(list(fns.values()))))
        except (RuntimeError, torch.OutOfMemoryError) as e:
            torch.cuda.empty_cache()
            print(f"   ({str(e).splitlines()[0][:100]})")
            return {}

    rows = []
    for bb, h, hk, n, d, causal, name in (MODEL_SHAPES if args.quick else MODEL_SHAPES + GRID_SHAPES):
        g = torch.Generator(device="cuda").manual_seed(n + d)
        mk = lambda heads: torch.randn(bb, heads, n, d, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
        q, k, v, do = mk(h), mk(hk), mk(hk), mk(h)
        fl = 4.0 * bb * h * n * n * d / (2 if causal else 1)
        out, lse = da.attention_forward(q, k, v, causal)
        fwd = lambda: da.attention_forward(q, k, v, causal)  # noqa: E731
        bwd = lambda: da.attention_backward(do, q, k, v, out, lse, None, causal)  # noqa: E731
        det = lambda: da.attention_backward(do, q, k, v, out, lse, None, causal, None, "auto", True)  # noqa: E731
        # SDPA reads k, v repeated to H heads where grouped (its kernels take no GQA here)
        kr, vr = (t.repeat_interleave(h // hk, 1) for t in (k, v))
        fns, calls = peer("cudnn", q, kr, vr, do, causal)
        if name == "grid":
            more, more_calls = peer("flash", q, kr, vr, do, causal)
            fns.update(more)
            calls.update(more_calls)
        g = gpu_us({**fns, "fwd": fwd, "bwd": bwd, "det": det})
        t = {"cudnn fwd us": None, "cudnn bwd us": None}
        for pre in ("cudnn", "flash"):
            if f"{pre} fwd" in g:
                t[f"{pre} fwd us"] = g[f"{pre} fwd"]
                t[f"{pre} bwd us"] = g[f"{pre} both"] - g[f"{pre} fwd"]
        t.update({"fwd us": g.get("fwd"), "bwd us": g.get("bwd"), "det bwd us": g.get("det"), **calls,
                  "fwd call us": timed(fwd, args), "bwd call us": timed(bwd, args)})
        r = {"shape": f"{name}: B{bb} H{h}/{hk} N{n} d{d}{' causal' if causal else ''}", "group": name,
             "N": n, "d": d, "causal": causal, **t}
        for pas, mult in (("fwd", 1.0), ("bwd", 2.5)):
            for pre in ("", "cudnn ", "flash "):
                if r.get(f"{pre}{pas} us"):
                    r[f"{pre}{pas} TF/s"] = tf(mult * fl, r[f"{pre}{pas} us"])
            if r[f"{pas} us"] and r[f"cudnn {pas} us"]:
                r[f"{pas} vs cudnn"] = r[f"cudnn {pas} us"] / r[f"{pas} us"]
        if r["det bwd us"] and r["bwd us"]:
            r["det/default"] = r["bwd us"] / r["det bwd us"]
        rows.append(r)
        print("   " + "  ".join(f"{c} {r[c]:.3g}" if isinstance(r[c], float) else f"{c} {r[c]}" for c in r
                                if c not in ("group", "N", "d", "causal")), flush=True)
        del q, k, v, do, out, lse, kr, vr
        torch.cuda.empty_cache()
    grid = [r for r in rows if r["group"] == "grid"]
    summary = [spread(f"grid {pas} vs cuDNN", [r.get(f"{pas} vs cudnn") for r in grid]) for pas in ("fwd", "bwd")]
    summary.append(spread("deterministic / default backward speed", [r.get("det/default") for r in rows]))
    summary = [x for x in summary if x]
    cols = ["shape", "fwd us", "cudnn fwd us", "fwd vs cudnn", "fwd TF/s", "flash fwd TF/s", "bwd us", "cudnn bwd us",
            "bwd vs cudnn", "bwd TF/s", "flash bwd TF/s", "det bwd us", "det/default", "fwd call us", "cudnn fwd call us", "bwd call us",
            "cudnn bwd call us"]
    text = (f"# day50 against SDPA's cuDNN kernels: {meta['device']}, {meta['date']}, torch {meta['torch']}, bf16\n\n"
            "GPU time (us): CUDA-graph replays, L2 emptied before each, median; a row's graphs (ours and the peers') "
            "replay in turn each repeat, so each sees the same clocks. 'vs cudnn' = cuDNN's time / ours (above 1: we are faster). Call time: the eager call, CUDA events. TF/s: forward 4*B*H*N*N*d, backward "
            "2.5x, halved when causal; flash: SDPA's flash backend (FA2), grid rows only. SDPA reads k, v repeated "
            "to H heads where grouped.\n\n"
            + "\n".join(f"- {x}" for x in summary) + "\n\n" + bench.format_table(rows, cols) + "\n")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + "_cudnn.md", "w") as f:
        f.write(text)
    plot_cudnn(rows, args.out + "_cudnn.png", meta)
    print(text)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="bench_out/day50_attention")
    p.add_argument("--quick", action="store_true", help="fewer repeats, naive and math at small N only")
    p.add_argument("--forward", action="store_true", help="only the forward's version ladder (bf16 and fp16)")
    p.add_argument("--backward", action="store_true", help="only the backward's version ladder (bf16 and fp16)")
    p.add_argument("--llm", action="store_true", help="only the packed-sequence, sliding-window and softcap rows")
    p.add_argument("--cudnn", action="store_true", help="only forward and backward against SDPA cuDNN, GPU "
                   "time from graph replays, at the model shapes and the grid (--quick: model shapes only)")
    models.add_args(p)
    args = p.parse_args()
    if args.models:  # training steps with day50 as every attention layer, registered as a user would
        models.run(args, "day50", ["gpt2", "llama", "llama_packed"],
                   {"day50": models.Swap(hf_attention=da.register_transformers())})
        return
    args.warmup, args.rep, args.max_ms = (2, 5, 150.0) if args.quick else (3, 15, 600.0)
    if not torch.cuda.is_available():
        print("bench.py needs a CUDA GPU")
        return 1
    if args.llm:
        llm_rows(args)
        return 0
    if args.cudnn:
        cudnn_rows(args)
        return 0
    if args.forward or args.backward:
        for pas, on in (("fwd", args.forward), ("bwd", args.backward)):
            if on:
                ladder(args, pas)
        return 0
    meta = bench.device_meta()
    mm = bench.matmul_tflops(torch.bfloat16)
    meta["bf16_matmul_tflops"] = round(mm, 1)
    print(f"== {meta['device']} {meta['date']} torch {meta['torch']}: bf16 matmul {mm:.0f} TFLOP/s", flush=True)
    rows = []
    for n in (1024, 2048, 4096, 8192):
        for d in (64, 128):
            for causal in (False, True):
                g = torch.Generator(device="cuda").manual_seed(n + d)
                q, k, v, do = (torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
                               for _ in range(4))
                ff, fb = flops(n, d, causal), 2.5 * flops(n, d, causal)
                r = {"shape": f"N={n} d={d}{' causal' if causal else ''}", "N": n, "d": d, "causal": causal}
                impls = ["fused"] + list(SDPA) + ["naive"]
                for name in impls:
                    if name == "naive" and n > (1024 if args.quick else 2048):
                        continue
                    if name == "math" and args.quick and n > 2048:
                        continue
                    if name in SDPA:
                        t_f, t_b = sdpa(q, k, v, do, causal, name, args)
                    else:
                        t_f, t_b = ours(q, k, v, do, causal, name, args)
                    r[f"{name} fwd ms"] = None if t_f is None else t_f / 1e3
                    r[f"{name} bwd ms"] = None if t_b is None else t_b / 1e3
                    r[f"{name} fwd TF/s"] = tf(ff, t_f)
                    r[f"{name} bwd TF/s"] = tf(fb, t_b)
                if r.get("fused bwd TF/s") and r.get("flash bwd TF/s"):
                    r["fused/flash bwd"] = r["fused bwd TF/s"] / r["flash bwd TF/s"]
                r["bwd floor ms"] = bench.flops_floor_us(fb, mm) / 1e3
                # layout: q, k, v, dout as (B, N, H, d).transpose(1, 2), read by strides vs copied first
                if n == 4096 and not causal:
                    qs, ks, vs, dos = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, do))
                    _, tb_s = ours(qs, ks, vs, dos, causal, "fused", args)
                    qc, kc, vc, doc = (t.contiguous() for t in (qs, ks, vs, dos))
                    out, lse = da.attention_forward(qc, kc, vc, causal, None, "fused")

                    def copy_then_bwd():
                        a, b_, c, e = (t.contiguous() for t in (qs, ks, vs, dos))
                        return da.attention_backward(e, a, b_, c, out, lse, None, causal, None, "fused")

                    r["bnhd strided bwd ms"] = None if tb_s is None else tb_s / 1e3
                    tcp = timed(copy_then_bwd, args)
                    r["bnhd copy+bwd ms"] = None if tcp is None else tcp / 1e3
                rows.append(r)
                print(f"   {r['shape']}: fused bwd {r.get('fused bwd TF/s') or 0:.0f} TF/s, "
                      f"flash {r.get('flash bwd TF/s') or 0:.0f}, ratio {r.get('fused/flash bwd') or 0:.2f}",
                      flush=True)
                del q, k, v, do
                torch.cuda.empty_cache()

    bwd_cols = ["shape", "fused bwd ms", "fused bwd TF/s", "flash bwd TF/s", "cudnn bwd TF/s",
                "efficient bwd TF/s", "math bwd TF/s", "naive bwd TF/s", "fused/flash bwd", "bwd floor ms"]
    fwd_cols = ["shape", "fused fwd ms", "fused fwd TF/s", "flash fwd TF/s", "cudnn fwd TF/s",
                "efficient fwd TF/s", "math fwd TF/s", "naive fwd TF/s"]
    lay_cols = ["shape", "fused bwd ms", "bnhd strided bwd ms", "bnhd copy+bwd ms"]
    head = (f"# day50_attention bench: {meta['device']}, {meta['date']}, torch {meta['torch']}, "
            f"bf16, B={B}, H={H}\n\nMeasured bf16 matmul rate: {mm:.0f} TFLOP/s. TF/s counts forward "
            f"4*B*H*N*N*d and backward 2.5x that, halved when causal.\n")
    parts = [head, "## Backward\n", bench.format_table(rows, bwd_cols), "\n## Forward\n",
             bench.format_table(rows, fwd_cols), "\n## Layout: q, k, v, dout as (B, N, H, d).transpose(1, 2)\n",
             bench.format_table([r for r in rows if "bnhd strided bwd ms" in r], lay_cols)]
    text = "\n".join(parts) + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".md", "w") as f:
        f.write(text)
    bench.write_report(rows, sorted({c for r in rows for c in r}), args.out, "day50 attention TFLOP/s", meta)
    bench.plot_attention(rows, args.out + ".png", f"day50 attention, bf16, B={B}, H={H}", meta)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
