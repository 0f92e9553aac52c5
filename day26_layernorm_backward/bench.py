"""Benchmark of day26 LayerNorm forward and backward (GPU).

    python bench.py [--out STEM] [--quick]
    python bench.py --models [--quick] [--out STEM]   # only GPT-2's training step with day26's LayerNorm
                                                      # (kernel_common.models; writes STEM_models.md/.json)
                                                      # and Llama's with day26's RMSNorm (STEM_models_llama)
    python bench.py --rms [--quick] [--out STEM]      # only RMSNorm forward + backward (STEM_rms.md)
    python bench.py --add-norm [--quick] [--out STEM] # only add_norm, fused against unfused (STEM_add_norm.md)

Columns (times in microseconds, median over repeats, L2 flushed before each):
  auto          our default (version 0: the plan's family per shape; results
                files before the versions were renumbered call it v4)
  v1..v6        one kernel family each (1 = the seed's algorithm, 2 = row in
                registers, 3 = 2 on a cp.async pipeline, 4 = row slots, 5 = 4 on a
                copy-engine ring (backward; the forward runs 4), 6 = rows split
                across a cluster); a version that cannot run a shape falls back
                (csrc/layernorm_versions.h)
  torch         forward: F.layer_norm; backward: aten.native_layer_norm_backward
                on precomputed mean/rstd (PyTorch's own CUDA kernels)
  compile       torch.compile of the same math (backward: the closed-form dx,
                dweight, dbias from mean/rstd, as Inductor fuses it)
  floor         the bytes that must move over the measured copy bandwidth:
                forward 2 passes (read x, write y), backward 3 (read x, dy; write dx)
  pct_floor     floor / auto; x_torch = torch / auto, x_compile = compile / auto
  auto_graph, torch_graph, x_torch_graph
                the same two calls replayed from a CUDA graph (GPU time alone,
                no host work), and their ratio
--sweep also times v3 for each value of the block-shape knob target_iters (ops.knobs).
Writes STEM.md (the tables), STEM.json and STEM.png.
"""
import argparse
import sys

import torch
import torch.nn.functional as F

from kernel_common import bench, models
from day26_layernorm import layer_norm_backward, layer_norm_forward
from day26_layernorm.ops import knobs

VERSIONS = [0, 1, 2, 3, 4, 5, 6]  # 0 = auto (the default)


def vcol(v: int) -> str:
    return "auto" if v == 0 else f"v{v}"

SHAPES = [(4096, 768), (32768, 1024), (16384, 4096), (8192, 8192), (4096, 16384)]


def graph_cols(ours, theirs) -> dict:
    """GPU time alone (CUDA-graph replays) of our default and of torch's kernel."""
    a, t = bench.graph_us(ours), bench.graph_us(theirs)
    return {"auto_graph": a, "torch_graph": t, "x_torch_graph": t / a}


def stream_cols(ours_graph: float, stream, partial_rows: int = 0, cols: int = 0) -> dict:
    """The stream ruler (kernel_common.bench.stream_kernel: a kernel that only moves the pass's
    bytes) from graph replays, plus, for a backward, the sum of `partial_rows` fp32 rows of
    `cols` (dweight and dbias from per-block partial rows, as ours): empty without Triton."""
    if stream is None:
        return {}
    if partial_rows:
        part, out = torch.randn(partial_rows, cols, device="cuda"), torch.empty(cols, device="cuda")
        us = bench.graph_us(lambda: (stream(), torch.sum(part, 0, out=out)))
    else:
        us = bench.graph_us(stream)
    return {"stream_graph": us, "pct_stream": 100 * us / ours_graph}


def bars(fwd_rows: list[dict], bwd_rows: list[dict]) -> list[dict]:
    """The worst shape against each bar: speed over torch per call and from graph
    replays (forward 1.0x, backward 1.2x), and % of the floor where the floor is
    at least 40 us (85%)."""
    out = []
    for name, rows, target in (("forward", fwd_rows, 1.0), ("backward", bwd_rows, 1.2)):
        for col in ("x_torch", "x_torch_graph"):
            r = min(rows, key=lambda r: r[col])
            out.append(dict(bar=f"{name} min {col} ({r['shape']})", measured=r[col], target=target,
                            met="yes" if r[col] >= target else "NO"))
        big = [r for r in rows if r["floor"] >= 40]
        if big:
            r = min(big, key=lambda r: r["pct_floor"])
            out.append(dict(bar=f"{name} min pct_floor, floor >= 40 us ({r['shape']})", measured=r["pct_floor"],
                            target=85.0, met="yes" if r["pct_floor"] >= 85 else "NO"))
    return out


def compiled_fns():
    fwd = torch.compile(lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5), dynamic=True)

    def bwd_math(dy, x, mean, rstd, w):
        xf = x.float()
        xhat = (xf - mean[:, None]) * rstd[:, None]
        dyf = dy.float()
        g = dyf * w.float()
        a = g.mean(-1, keepdim=True)
        c = (g * xhat).mean(-1, keepdim=True)
        dx = (rstd[:, None] * (g - a - xhat * c)).to(x.dtype)
        return dx, (dyf * xhat).sum(0).to(w.dtype), dyf.sum(0).to(w.dtype)

    return fwd, torch.compile(bwd_math, dynamic=True)


def rms_table(args, meta, bw) -> str:
    """RMSNorm forward + backward through autograd (dx and dweight), ours beside
    eager F.rms_norm, torch.compile'd F.rms_norm and Liger's LigerRMSNorm where
    installed; floor: 5 passes (forward: read x, write y; backward: read x, dy, write dx).
    Each is timed twice: GPU time alone (the step replayed from a CUDA graph: the columns
    named after the implementation, and the ratios) and per call from Python (`*_call`:
    host work included, which is what a small shape costs an eager training step).
    stream: kernels that only move the step's bytes in as many launches (bench.stream_kernel:
    read x, write y; read x, dy, write dx; then torch.sum over one fp32 row an SM, as our
    finalize reads): the floor in practice; pct_stream = stream / ours."""
    from day26_layernorm import rms_norm

    try:
        from liger_kernel.transformers.rms_norm import LigerRMSNorm
    except ImportError:
        LigerRMSNorm = None
    crms = torch.compile(lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6), dynamic=True)
    rows = []
    shapes = [(4096, 4096), (8192, 4096)] if args.quick else [(4096, 768), (4096, 4096), (16384, 4096),
                                                               (8192, 8192), (32768, 4096), (4096, 16384)]
    for dtype in (torch.bfloat16, torch.float32):
        for n, d in shapes:
            x = torch.randn(n, d, device="cuda", dtype=dtype, requires_grad=True)
            w = torch.randn(d, device="cuda", dtype=dtype, requires_grad=True)
            dy = torch.randn(n, d, device="cuda", dtype=dtype)
            impls = {"ours": lambda x, w: rms_norm(x, d, w, 1e-6),
                     "eager": lambda x, w: F.rms_norm(x, (d,), w, 1e-6),
                     "compile": crms}
            if LigerRMSNorm is not None:
                lig = LigerRMSNorm(d, eps=1e-6).to(device="cuda", dtype=dtype)
                with torch.no_grad():
                    lig.weight.copy_(w)
                impls["liger"] = lambda x, w: lig(x)
            t = {}
            for name, f in impls.items():
                params = (x, lig.weight) if name == "liger" else (x, w)
                step = (lambda f=f, params=params: torch.autograd.grad(f(x, w), params, dy))
                t[name] = bench.graph_us(step)
                t[name + "_call"] = bench.time_us(step)
            fwd_s, bwd_s = bench.stream_kernel(1, 1, n * d, dtype), bench.stream_kernel(2, 1, n * d, dtype)
            if fwd_s is not None:
                part, dws = torch.randn(meta["sms"], d, device="cuda"), torch.empty(d, device="cuda")
                t["stream"] = bench.graph_us(lambda: (fwd_s(), bwd_s(), torch.sum(part, 0, out=dws)))
            floor = bench.floor_us(5 * n * d * x.element_size(), bw)
            row = dict(shape=f"{n}x{d} {str(dtype).replace('torch.', '')}", **t, floor=floor,
                       pct_floor=100 * floor / t["ours"], x_eager=t["eager"] / t["ours"],
                       x_eager_call=t["eager_call"] / t["ours_call"], x_compile=t["compile"] / t["ours"])
            if "liger" in t:
                row["x_liger"] = t["liger"] / t["ours"]
                row["liger_pct_floor"] = 100 * floor / t["liger"]
            if "stream" in t:
                row["pct_stream"] = 100 * t["stream"] / t["ours"]
            rows.append(row)
            del x, w, dy, fwd_s, bwd_s
            torch.cuda.empty_cache()
            print(f"  done rms {row['shape']}", file=sys.stderr)
    cols = ["shape", "ours", "ours_call", "eager", "eager_call", "compile", "liger", "liger_call", "floor",
            "pct_floor", "stream", "pct_stream", "liger_pct_floor", "x_eager", "x_eager_call", "x_compile", "x_liger"]
    note = "" if LigerRMSNorm is not None else "\nLiger: not installed on this machine (no liger column).\n"
    return (f"day26 RMSNorm forward + backward (autograd, dx and dweight) on {meta['device']} ({meta['date']}, "
            f"torch {meta['torch']}), copy bandwidth {bw:.0f} GB/s; us, median, L2 flushed; GPU time from "
            f"CUDA-graph replays (`*_call`: per call from Python); floor: 5 passes; stream: kernels that only "
            f"move those bytes in as many launches (pct_stream = stream / ours)\n\n"
            f"{bench.format_table(rows, cols)}\n{note}")


def add_norm_table(args, meta, bw) -> str:
    """add_norm (y, s) = (norm(x + r), x + r): ours fused against `x + r` then our
    norm (unfused) and eager torch (`x + r` then F.rms_norm / F.layer_norm), GPU time
    from CUDA-graph replays. fwd: the forward alone; step: forward + backward through
    autograd with gradients of both outputs (dx = dresidual, dweight); norm_fwd: our
    norm's forward alone on the sum (no add), for reference. Floors: the
    fused forward moves 4 passes (read x, r; write s, y), the unfused 5 (the add 3,
    the norm 2); the step 8 (backward: read dy, ds, s; write dx) against 11 (the
    norm's backward 3, then autograd adds ds to its dx: 3). saved_fwd, saved: the
    time fused saves against unfused, in passes at the floor's rate (of 1 and 3).
    stream_fwd, stream: kernels that only move the fused op's bytes (bench.stream_kernel:
    read x, r, write s, y; the step adds read s, dy, ds, write dx and a sum over one fp32
    row an SM), with stream_saved_fwd / stream_saved: what a fused op as fast as those would
    save against unfused, the most a fused kernel can."""
    from day26_layernorm import add_norm, layer_norm, rms_norm

    rows = []
    shapes = [(4096, 4096), (16384, 1024)] if args.quick else [(4096, 768), (16384, 1024), (8192, 4096),
                                                                (4096, 8192), (32768, 4096)]
    for kind, dtype in (("rms", torch.bfloat16), ("layer", torch.bfloat16), ("rms", torch.float32)):
        for n, d in shapes:
            mk = lambda: torch.randn(n, d, device="cuda", dtype=dtype)  # noqa: E731
            x, r, dy, ds = mk().requires_grad_(), mk().requires_grad_(), mk(), mk()
            w = torch.randn(d, device="cuda", dtype=dtype, requires_grad=True)
            b = torch.randn(d, device="cuda", dtype=dtype) if kind == "layer" else None
            if kind == "rms":
                ours = lambda s: rms_norm(s, d, w, 1e-6)  # noqa: E731
                theirs = lambda s: F.rms_norm(s, (d,), w, 1e-6)  # noqa: E731
            else:
                ours = lambda s: layer_norm(s, d, w, b, 1e-5)  # noqa: E731
                theirs = lambda s: F.layer_norm(s, (d,), w, b, 1e-5)  # noqa: E731
            eps = 1e-6 if kind == "rms" else 1e-5
            impls = {"fused": lambda: add_norm(x, r, w, b, eps=eps, kind=kind),
                     "unfused": lambda: (lambda s: (ours(s), s))(x + r),
                     "eager": lambda: (lambda s: (theirs(s), s))(x + r)}
            s0 = (x + r).detach()

            def fwd(f):
                with torch.no_grad():
                    return f()
            t = {"norm_fwd": bench.graph_us(lambda: fwd(lambda: ours(s0)))}  # our norm alone, for reference
            for name, f in impls.items():
                t[name + "_fwd"] = bench.graph_us(lambda f=f: fwd(f))
                t[name] = bench.graph_us(lambda f=f: torch.autograd.grad(f(), (x, r, w), (dy, ds)))
            s22, s31 = bench.stream_kernel(2, 2, n * d, dtype), bench.stream_kernel(3, 1, n * d, dtype)
            if s22 is not None:
                part, dws = torch.randn(meta["sms"], d, device="cuda"), torch.empty(d, device="cuda")
                t["stream_fwd"] = bench.graph_us(s22)
                t["stream"] = bench.graph_us(lambda: (s22(), s31(), torch.sum(part, 0, out=dws)))
            esz = x.element_size()
            ffwd, fstep = bench.floor_us(4 * n * d * esz, bw), bench.floor_us(8 * n * d * esz, bw)
            rows.append(dict(shape=f"{kind} {n}x{d} {str(dtype).replace('torch.', '')}", **t,
                             floor_fwd=ffwd, floor=fstep, pct_floor_fwd=100 * ffwd / t["fused_fwd"],
                             pct_floor=100 * fstep / t["fused"],
                             x_unfused_fwd=t["unfused_fwd"] / t["fused_fwd"], x_unfused=t["unfused"] / t["fused"],
                             x_eager_fwd=t["eager_fwd"] / t["fused_fwd"], x_eager=t["eager"] / t["fused"],
                             saved_fwd=(t["unfused_fwd"] - t["fused_fwd"]) / (ffwd / 4),
                             saved=(t["unfused"] - t["fused"]) / (fstep / 8)))
            if "stream" in t:
                rows[-1].update(stream_saved_fwd=(t["unfused_fwd"] - t["stream_fwd"]) / (ffwd / 4),
                                stream_saved=(t["unfused"] - t["stream"]) / (fstep / 8))
            del x, r, dy, ds, w, b, s0, s22, s31
            torch.cuda.empty_cache()
            print(f"  done add_norm {rows[-1]['shape']}", file=sys.stderr)
    cols = ["shape", "norm_fwd", "fused_fwd", "unfused_fwd", "eager_fwd", "floor_fwd", "pct_floor_fwd", "x_unfused_fwd",
            "x_eager_fwd", "saved_fwd", "stream_fwd", "stream_saved_fwd", "fused", "unfused", "eager", "floor",
            "pct_floor", "x_unfused", "x_eager", "saved", "stream", "stream_saved"]
    return (f"day26 add_norm on {meta['device']} ({meta['date']}, torch {meta['torch']}), copy bandwidth "
            f"{bw:.0f} GB/s; us, median, L2 flushed, GPU time from CUDA-graph replays. *_fwd: forward alone "
            f"(floor 4 passes; unfused 5); the rest: forward + backward of both outputs (floor 8 passes; "
            f"unfused 11); saved_fwd / saved: time saved against unfused in passes at the floor's rate "
            f"(the fused forward skips 1 pass, the step 3); stream_fwd, stream: kernels that only move the fused "
            f"op's bytes, stream_saved_*: what a fused op at their speed would save (the most any can)\n\n"
            f"{bench.format_table(rows, cols)}\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="bench_out/day26")
    p.add_argument("--quick", action="store_true", help="two shapes only")
    p.add_argument("--sweep", action="store_true", help="also time v3 for the knob target_iters in 1, 2, 4, 8")
    p.add_argument("--rms", action="store_true", help="only the RMSNorm table (STEM_rms.md)")
    p.add_argument("--add-norm", action="store_true", help="only the add_norm table (STEM_add_norm.md)")
    models.add_args(p)
    args = p.parse_args()
    if args.models:  # GPT-2 small's step with day26's LayerNorm; Llama's with day26's RMSNorm
        from day26_layernorm import LayerNorm
        names = (args.model_names or "gpt2,llama").split(",")
        one = argparse.Namespace(**{**vars(args), "model_names": None})  # each run below names its model
        if "gpt2" in names:
            models.run(one, "day26", ["gpt2"], {"day26 LayerNorm": models.Swap(layer_norm=LayerNorm.from_torch)})
        if "llama" in names:
            # Llama's norms are transformers' LlamaRMSNorm: convert swaps them for day26's RMSNorm
            from day26_layernorm import convert
            models.run(one, "day26", ["llama"], {"day26 RMSNorm": models.Swap(convert=convert)},
                       out=args.out + "_models_llama")
        return 0
    if not torch.cuda.is_available():
        print("bench.py needs a CUDA GPU")
        return 1
    meta = bench.device_meta()
    bw = bench.copy_bandwidth_gbs()
    meta["copy_gbs"] = round(bw, 1)
    if args.rms or args.add_norm:
        md, stem = (rms_table(args, meta, bw), "rms") if args.rms else (add_norm_table(args, meta, bw), "add_norm")
        with open(f"{args.out}_{stem}.md", "w") as f:
            f.write(md)
        print(md)
        return 0
    cfwd, cbwd = compiled_fns()
    shapes = SHAPES[:2] if args.quick else SHAPES
    fwd_rows, bwd_rows, sweep_rows = [], [], []
    for dtype in (torch.float32, torch.bfloat16):
        for n, d in shapes:
            x = torch.randn(n, d, device="cuda", dtype=dtype)
            w = torch.randn(d, device="cuda", dtype=dtype)
            b = torch.randn(d, device="cuda", dtype=dtype)
            dy = torch.randn(n, d, device="cuda", dtype=dtype)
            label = f"{n}x{d} {str(dtype).replace('torch.', '')}"
            esz = x.element_size()
            t = {}
            for v in VERSIONS:
                t[vcol(v)] = bench.time_us(lambda: layer_norm_forward(x, d, w, b, version=v))
            t["torch"] = bench.time_us(lambda: F.layer_norm(x, (d,), w, b))
            t["compile"] = bench.time_us(lambda: cfwd(x, w, b))
            t.update(graph_cols(lambda: layer_norm_forward(x, d, w, b), lambda: F.layer_norm(x, (d,), w, b)))
            t.update(stream_cols(t["auto_graph"], bench.stream_kernel(1, 1, n * d, dtype)))
            floor = bench.floor_us(2 * n * d * esz, bw)
            fwd_rows.append(dict(shape=label, **t, floor=floor, pct_floor=100 * floor / t["auto"],
                                 x_torch=t["torch"] / t["auto"], x_compile=t["compile"] / t["auto"]))
            _, mean, rstd = torch.ops.aten.native_layer_norm(x, [d], w, b, 1e-5)
            m1, r1 = mean.view(-1), rstd.view(-1)
            t = {}
            for v in VERSIONS:
                t[vcol(v)] = bench.time_us(lambda: layer_norm_backward(dy, x, d, m1, r1, w, version=v))
            t["torch"] = bench.time_us(lambda: torch.ops.aten.native_layer_norm_backward(
                dy, x, [d], mean, rstd, w, b, [True, True, True]))
            t["compile"] = bench.time_us(lambda: cbwd(dy, x, m1, r1, w))
            t.update(graph_cols(lambda: layer_norm_backward(dy, x, d, m1, r1, w),
                                lambda: torch.ops.aten.native_layer_norm_backward(
                                    dy, x, [d], mean, rstd, w, b, [True, True, True])))
            t.update(stream_cols(t["auto_graph"], bench.stream_kernel(2, 1, n * d, dtype), meta["sms"], 2 * d))
            floor = bench.floor_us(3 * n * d * esz, bw)
            bwd_rows.append(dict(shape=label, **t, floor=floor, pct_floor=100 * floor / t["auto"],
                                 x_torch=t["torch"] / t["auto"], x_compile=t["compile"] / t["auto"]))
            if args.sweep:
                row = dict(shape=label)
                for ti in (1, 2, 4, 8):
                    with knobs(target_iters=ti):
                        row[f"fwd_t{ti}"] = bench.time_us(lambda: layer_norm_forward(x, d, w, b, version=3))
                        row[f"bwd_t{ti}"] = bench.time_us(lambda: layer_norm_backward(dy, x, d, m1, r1, w, version=3))
                sweep_rows.append(row)
            del x, w, b, dy, mean, rstd
            torch.cuda.empty_cache()
            print(f"  done {label}", file=sys.stderr)
    cols = ["shape", *map(vcol, VERSIONS), "torch", "compile", "floor", "pct_floor", "x_torch", "x_compile",
            "auto_graph", "torch_graph", "x_torch_graph", "stream_graph", "pct_stream"]
    head = (f"day26 LayerNorm on {meta['device']} ({meta['date']}, torch {meta['torch']}), "
            f"copy bandwidth {bw:.0f} GB/s; times in us, median; pct_floor = floor / auto (the default); "
            f"*_graph: GPU time from CUDA-graph replays; stream: a kernel that only moves the same bytes "
            f"(pct_stream = stream / auto_graph)")
    md = (f"{head}\n\nForward (floor: 2 passes)\n\n{bench.format_table(fwd_rows, cols)}\n\n"
          f"Backward (dx, dweight, dbias; floor: 3 passes)\n\n{bench.format_table(bwd_rows, cols)}\n")
    if sweep_rows:
        scols = ["shape"] + [f"{k}_t{ti}" for k in ("fwd", "bwd") for ti in ("1", "2", "4", "8")]
        md += f"\nv3 by knob target_iters (us)\n\n{bench.format_table(sweep_rows, scols)}\n"
    md += f"\nIssue 19's bars\n\n{bench.format_table(bars(fwd_rows, bwd_rows), ['bar', 'measured', 'target', 'met'])}\n"
    with open(f"{args.out}.md", "w") as f:
        f.write(md)
    bench.write_report(fwd_rows + [dict(r, shape="bwd " + r["shape"]) for r in bwd_rows], cols, args.out,
                       "day26 LayerNorm fwd / bwd (us)", meta, plot_cols=["v2", "v4", "auto", "torch", "compile", "floor"],
                       label_col="shape")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
