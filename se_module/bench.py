"""Benchmark of the SE block on the GPU: staged kernels, fused kernels, torch
eager (torchvision's SqueezeExcitation), torch.compile of it, and the floor.

    python bench.py --out STEM      # writes STEM.md, STEM.json, STEM.png; prints the tables last
    python bench.py --models [--quick] [--out STEM]   # only EfficientNet-B0/B4 training steps with convert()
                                                      # (kernel_common.models; writes STEM_models.md/.json)

Tables (fp32, NCHW, SiLU, like the seed): the seed's batch sweep (N = 1..32 at
C = 64, 112 x 112, S = 16) and input-size sweep (56..448 at N = 8, C = 64),
plus EfficientNet-B0-like shapes with their real squeeze widths; forward and
forward + backward (grad of x and all four weights). Floors: the bytes that
must move over the measured copy bandwidth, 3 passes over x forward and 7
forward + backward (csrc/se_fused.cu). Then: the kernel versions, bf16
channels_last, and one EfficientNet-B0 training step with and without convert().

Timing: kernel_common.bench.time_us (CUDA events, L2 flushed before every
repeat, median), in 5 rounds that interleave the variants (staged, fused, eager,
compile) so that a slow spell of the host hits them all; each reports the
median of its 5 round medians. Forward is timed in grad mode (parameters require grad, as in
training) for every column, so torch.compile's one training graph serves both
tables; it is compiled per shape (static shapes).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

from kernel_common import bench, models
from se_module import SqueezeExcitation, ops

try:
    from torchvision.ops import SqueezeExcitation as TVSqueezeExcitation
    EAGER_NAME = "torchvision.ops.SqueezeExcitation"
except ImportError:  # the same code, written out
    from se_module import TorchvisionSqueezeExcitation as TVSqueezeExcitation

    EAGER_NAME = "se_module.TorchvisionSqueezeExcitation (torchvision absent)"

BATCH_SWEEP = [(n, 64, 112, 112, 16) for n in (1, 4, 8, 16, 32)]
SIZE_SWEEP = [(8, 64, s, s, 16) for s in (56, 112, 224, 448)]
EFFNET = [(32, 240, 28, 28, 10), (32, 672, 14, 14, 28), (64, 96, 56, 56, 4)]
VERSION_SHAPES = [(1, 64, 112, 112, 16), (8, 64, 112, 112, 16), (8, 64, 448, 448, 16), (32, 672, 14, 14, 28)]


# ---------------------------------------------------------------- EfficientNet SE shapes
# torchvision's EfficientNet (torchvision/models/efficientnet.py): per MBConv stage
# (expand ratio, kernel, stride, in channels, out channels, layers) before width/depth
# scaling; the SE sits after the depthwise conv with C = expanded channels and
# S = max(1, block input channels // 4). test.py checks the result against
# torchvision's modules (hooks on its SqueezeExcitation) where torchvision imports.
_MBCONV = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
           (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)]
EFFNET_MODELS = {"b0": (1.0, 1.0, 224, 128), "b4": (1.4, 1.8, 380, 32)}  # width, depth, resolution, train batch


def _make_divisible(v, d=8):
    n = max(d, int(v + d / 2) // d * d)
    return n + d if n < 0.9 * v else n


def _conv_out(h, k, s):
    return (h + 2 * ((k - 1) // 2) - k) // s + 1


def effnet_se_shapes(model):
    """(C, S, H, W) of every SE block of torchvision's efficientnet_<model>, in order."""
    import math

    width, depth, res, _ = EFFNET_MODELS[model]
    h = _conv_out(res, 3, 2)  # stem
    out = []
    for e, k, s, cin, cout, n in _MBCONV:
        cin, cout = _make_divisible(cin * width), _make_divisible(cout * width)
        for i in range(int(math.ceil(n * depth))):
            ci = cin if i == 0 else cout
            h = _conv_out(h, k, s if i == 0 else 1)
            out.append((_make_divisible(ci * e), max(1, ci // 4), h, h))
    return out


def effnet_bench_shapes(models=("b0", "b4"), batches=None):
    """Distinct (N, C, H, W, S) bench rows: each model's SE shapes at its training batch and at 1."""
    rows = []
    for m in models:
        for n in (batches or (EFFNET_MODELS[m][3], 1)):
            for c, s, h, w in dict.fromkeys(effnet_se_shapes(m)):
                rows.append((m, (n, c, h, w, s)))
    return rows

ROUNDS, ROUND_REP = 5, 10  # interleaved timing rounds per shape (measure_shape), repeats per round

COLS = ["shape", "staged_us", "fused_us", "eager_us", "compile_us", "floor_us", "eager/fused", "compile/fused",
        "eager/staged", "floor%", "fused_gpu_us", "eager_gpu_us"]


def shape_str(s):
    return f"({s[0]}, {s[1]}, {s[2]}, {s[3]}) S={s[4]}"


def setup(shape, dtype=torch.float32, channels_last=False):
    n, c, h, w, s = shape
    torch.manual_seed(0)
    tv = TVSqueezeExcitation(c, s, activation=nn.SiLU).cuda()
    ours = SqueezeExcitation(c, s).cuda()
    ours.load_state_dict(tv.state_dict())
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(n, c, h, w, device="cuda").to(dtype).contiguous(memory_format=fmt).requires_grad_()
    g = torch.randn(n, c, h, w, device="cuda").to(dtype).contiguous(memory_format=fmt)
    if dtype != torch.float32:
        tv.to(dtype)
        ours.to(dtype)
    return tv, ours, x, g


def host_table():
    shape = (1, 64, 112, 112, 16)
    tv, ours, x, g = setup(shape)
    rows = []
    for name, f, params in (("fused", ours, list(ours.parameters())), ("eager", tv, list(tv.parameters())),
                            ("staged", lambda t: ops.se_block_staged(t, tv.fc1.weight, tv.fc1.bias, tv.fc2.weight,
                                                                     tv.fc2.bias), list(tv.parameters()))):
        fwd, fb = fwd_and_fwdbwd(f, params, x, g)
        rows.append({"variant": name, "forward_host_us": bench.host_us(fwd), "fwd+bwd_host_us": bench.host_us(fb)})
    return rows


def fwd_and_fwdbwd(f, params, x, g):
    inputs = [x, *params]
    return (lambda: f(x)), (lambda: torch.autograd.grad(f(x), inputs, g))


def measure_shape(shape, bw, with_compile=True, dtype=torch.float32, channels_last=False):
    tv, ours, x, g = setup(shape, dtype, channels_last)
    params = list(tv.parameters())
    fns = {
        "staged": lambda t: ops.se_block_staged(t, tv.fc1.weight, tv.fc1.bias, tv.fc2.weight, tv.fc2.bias),
        "fused": ours,
        "eager": tv,
    }
    compile_s = None
    if with_compile:
        torch._dynamo.reset()
        compiled = torch.compile(tv)
        t0 = time.time()
        torch.autograd.grad(compiled(x), [x, *params], g)  # compiles the training graph (fwd + bwd)
        torch.cuda.synchronize()
        compile_s = time.time() - t0
        fns["compile"] = compiled
    res = {}
    calls = {}
    for name, f in fns.items():
        p = list(ours.parameters()) if name == "fused" else params
        calls[name] = fwd_and_fwdbwd(f, p, x, g)
    # Host-bound rows (most of fwd+bwd below 16 x 64 x 112 x 112) swing with the host's load over
    # seconds: eager fwd+bwd measured 404 and 600 us at (8, 64, 56, 56) in two runs a minute apart. So the
    # variants are timed in ROUNDS interleaved rounds and each reports the median of its round medians.
    samples = {}
    for _ in range(ROUNDS):
        for name, (fwd, fb) in calls.items():
            samples.setdefault(("fwd", name), []).append(bench.time_us(fwd, warmup=2, rep=ROUND_REP))
            samples.setdefault(("fb", name), []).append(bench.time_us(fb, warmup=2, rep=ROUND_REP))
    res = {k: statistics.median(v) for k, v in samples.items()}
    for name in ("fused", "eager"):
        fwd, fb = calls[name]
        res[("fwd", name + "_gpu")] = bench.graph_us(fwd)
        res[("fb", name + "_gpu")] = bench.graph_us(fb)
    xbytes = x.numel() * x.element_size()
    rows = {}
    for pas, passes in (("fwd", 3), ("fb", 7)):
        r = {"shape": shape_str(shape)}
        for name in ("staged", "fused", "eager", "compile"):
            r[f"{name}_us"] = res.get((pas, name))
        r["floor_us"] = bench.floor_us(passes * xbytes, bw)
        r["eager/fused"] = r["eager_us"] / r["fused_us"]
        r["compile/fused"] = r["compile_us"] / r["fused_us"] if r["compile_us"] else None
        r["eager/staged"] = r["eager_us"] / r["staged_us"]
        r["floor%"] = 100 * r["floor_us"] / r["fused_us"]
        r["fused_gpu_us"] = res.get((pas, "fused_gpu"))
        r["eager_gpu_us"] = res.get((pas, "eager_gpu"))
        rows[pas] = r
    del tv, ours, x, g, fns
    torch.cuda.empty_cache()
    return rows, compile_s


def versions_table(bw):
    rows = []
    for shape in VERSION_SHAPES:
        tv, ours, x, g = setup(shape)
        params = list(ours.parameters())
        r = {"shape": shape_str(shape)}
        with torch.no_grad():
            r["pool_v1_us"] = bench.time_us(lambda: ops.global_avg_pool(x, 1))
            r["pool_v2_us"] = bench.time_us(lambda: ops.global_avg_pool(x, 2))
        r["pool_floor_us"] = bench.floor_us(x.numel() * x.element_size(), bw)
        for v in (1, 2, 3):
            ours.version = v
            fwd, fb = fwd_and_fwdbwd(ours, params, x, g)
            r[f"fwd_v{v}_us"] = bench.graph_us(fwd)
            r[f"fb_v{v}_us"] = bench.graph_us(fb)
        rows.append(r)
        del tv, ours, x, g
        torch.cuda.empty_cache()
    cols = ["shape", "pool_v1_us", "pool_v2_us", "pool_floor_us", "fwd_v1_us", "fwd_v2_us", "fwd_v3_us",
            "fb_v1_us", "fb_v2_us", "fb_v3_us"]
    return rows, cols


def training_step(use_convert: bool, batch=64, steps=10):
    import torchvision

    from se_module import convert

    torch.manual_seed(0)
    model = torchvision.models.efficientnet_b0(weights=None).cuda().to(memory_format=torch.channels_last)
    if use_convert:
        convert(model)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    t = bench.time_us(step, warmup=3, rep=steps, flush_l2=False)
    del model, opt
    torch.cuda.empty_cache()
    return t


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


EFF_COLS = ["model", "config", "pass", "shape", "fused_gpu_us", "v2_gpu_us", "eager_gpu_us", "eager/fused_gpu",
            "fused_us", "eager_us", "eager/fused", "floor_us", "floor%", "l2_floor_us", "l2_floor%"]


def effnet_table(bw, quick=False, rep=15, rounds=3):
    """Every SE shape of torchvision's EfficientNet-B0 (224) and B4 (380): training batch
    (forward and forward + backward, grad mode) and batch 1 (forward, no_grad), in fp32
    NCHW and bf16 channels_last; GPU time (CUDA-graph replay) and host-inclusive time
    (time_us), ours against torchvision eager. Floors: DRAM, 3 passes over x forward and
    7 forward + backward; L2-resident, 2 and 5 passes (x read from DRAM once, and g once
    in the backward), given where x (forward) or x and g (backward) fit in the L2."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    shapes = effnet_bench_shapes(("b0",), batches=(128,)) if quick else effnet_bench_shapes()
    # the first shape runs twice and its first rows are dropped: the first timings of a
    # run came out 3-4x slow on the H100 (53 us for a 14 us forward)
    for k, (model, shape) in enumerate([shapes[0], *shapes]):
        if k == 1:
            rows.clear()
        for dtype, cl, config in ((torch.float32, False, "fp32 NCHW"), (torch.bfloat16, True, "bf16 CL")):
            tv, ours, x, g = setup(shape, dtype, cl)
            xbytes = x.numel() * x.element_size()
            passes = [("fwd", 3, 2 if xbytes <= l2 else None)]
            if shape[0] > 1:
                passes.append(("fb", 7, 5 if 2 * xbytes <= l2 else None))
            for pas, dram_passes, l2_passes in passes:
                r = {"model": model, "config": config, "pass": "forward" if pas == "fwd" else "fwd+bwd",
                     "shape": shape_str(shape)}
                fns = {}
                v2 = SqueezeExcitation(shape[1], shape[4], version=2).cuda().to(dtype)  # no cluster kernel
                v2.load_state_dict(ours.state_dict())
                for name, f, params in (("fused", ours, list(ours.parameters())), ("eager", tv, list(tv.parameters())),
                                        ("v2", v2, list(v2.parameters()))):
                    fwd, fb = fwd_and_fwdbwd(f, params, x, g)
                    fns[name] = fb if pas == "fb" else fwd
                    if shape[0] == 1:  # inference
                        fns[name] = lambda f=f: f(x.detach())  # noqa: E731
                # interleaved rounds, median of the rounds' medians: one pass of each
                # read 2-3x slow rows at random on the H100
                times = {k: [] for k in ("fused_gpu_us", "fused_us", "eager_gpu_us", "eager_us", "v2_gpu_us")}
                for _ in range(rounds):
                    for name, fn in fns.items():
                        with torch.no_grad() if shape[0] == 1 else contextlib.nullcontext():
                            times[f"{name}_gpu_us"].append(bench.graph_us(fn))
                            if name != "v2":  # GPU time only: the column says what the cluster kernel bought
                                times[f"{name}_us"].append(bench.time_us(fn, warmup=3, rep=rep))
                r.update({k: median(v) for k, v in times.items()})
                r["eager/fused_gpu"] = r["eager_gpu_us"] / r["fused_gpu_us"]
                r["eager/fused"] = r["eager_us"] / r["fused_us"]
                r["floor_us"] = bench.floor_us(dram_passes * xbytes, bw)
                r["floor%"] = 100 * r["floor_us"] / r["fused_gpu_us"]
                r["l2_floor_us"] = bench.floor_us(l2_passes * xbytes, bw) if l2_passes else None
                r["l2_floor%"] = 100 * r["l2_floor_us"] / r["fused_gpu_us"] if l2_passes else None
                rows.append(r)
                print(f"    {config:9} {r['pass']:7} fused {r['fused_gpu_us']:8.1f} eager {r['eager_gpu_us']:8.1f} us GPU"
                      f" (x{r['eager/fused_gpu']:.2f}), per call x{r['eager/fused']:.2f}", flush=True)
            del tv, ours, v2, x, g
            torch.cuda.empty_cache()
        print(f"  effnet {model} {shape_str(shape)} done", flush=True)
    train = [r for r in rows if r["pass"] == "fwd+bwd"]
    summary = []
    if train:
        worst = min(train, key=lambda r: r["eager/fused_gpu"])
        summary.append({"bar": f"min fwd+bwd GPU eager/fused ({worst['model']} {worst['config']} {worst['shape']})",
                        "measured": worst["eager/fused_gpu"], "target": 1.3,
                        "met": "yes" if worst["eager/fused_gpu"] >= 1.3 else "NO"})
        bf = [r["l2_floor%"] for r in train if r["config"] == "bf16 CL" and r["l2_floor%"] is not None]
        if bf:
            m = median(bf)
            summary.append({"bar": "bf16 CL fwd+bwd % of L2-resident floor (median over L2-resident shapes)",
                            "measured": m, "target": 40.0, "met": "yes" if m >= 40 else "NO"})
    slower = [r for r in rows if r["eager/fused_gpu"] < 1.0]
    summary.append({"bar": "rows slower than eager (GPU time)", "measured": len(slower), "target": 0,
                    "met": "yes" if not slower else "NO"})
    return rows, summary


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench_out/se_module")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    ap.add_argument("--quick", action="store_true", help="smoke run: seed sweeps only; EfficientNet: B0 at batch 128")
    ap.add_argument("--only", choices=["effnet"], default=None,
                    help="effnet: only the EfficientNet-B0/B4 SE-shape table (issue 20)")
    ap.add_argument("--compile-budget", type=float, default=200.0,
                    help="seconds after which later shapes skip torch.compile (bench must end well inside 5 min)")
    models.add_args(ap)
    a = ap.parse_args(argv)
    if a.models:  # EfficientNet-B0 / B4 training steps with every SE block converted
        from se_module import convert
        models.run(a, "se_module", ["efficientnet_b0", "efficientnet_b4"], {"convert": models.Swap(convert=convert)})
        return 0
    if not torch.cuda.is_available():
        print("bench.py needs a CUDA GPU")
        return 1
    torch._dynamo.config.automatic_dynamic_shapes = False
    for k in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, k):
            setattr(torch._dynamo.config, k, 256)
    t_start = time.time()
    meta = bench.device_meta()
    bw = bench.copy_bandwidth_gbs()
    meta["copy_gbs"] = round(bw, 1)
    meta["eager"] = EAGER_NAME

    if a.only == "effnet" or a.quick:
        erows, esummary = effnet_table(bw, quick=a.quick)
        etext = ("### EfficientNet-B0 (224) / B4 (380) SE shapes: ours vs torchvision eager\n\n"
                 + bench.format_table(erows, EFF_COLS) + "\n\n### issue 20 bars\n\n"
                 + bench.format_table(esummary, ["bar", "measured", "target", "met"]))
        if a.only == "effnet":
            head = (f"## se_module EfficientNet SE shapes: {meta['device']}, {meta['date']}\n\n"
                    f"torch {meta['torch']}, CUDA {meta['cuda']}, {meta['sms']} SMs, copy bandwidth {bw:.0f} GB/s. "
                    f"Eager = {EAGER_NAME}. *_gpu_us: CUDA-graph replay (GPU time); *_us: host-inclusive "
                    f"(CUDA events, L2 flushed, median); each the median of 3 rounds that interleave ours and eager. "
                    f"torch.compile not timed here (a static-shape compile per "
                    f"row costs minutes). Wall time {time.time() - t_start:.0f} s.\n")
            stem = Path(a.out)
            stem.parent.mkdir(parents=True, exist_ok=True)
            text = head + "\n" + etext + "\n"
            stem.with_suffix(".md").write_text(text)
            import json
            stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": erows, "summary": esummary},
                                                            indent=1, default=str))
            print(text)
            return 0
    # (room for --models, the shared end-to-end benchmark: H3)
    shapes = list(dict.fromkeys(BATCH_SWEEP + SIZE_SWEEP + ([] if a.quick else EFFNET)))
    measured, compile_times = {}, []
    for s in shapes:
        use_compile = not a.no_compile and time.time() - t_start < a.compile_budget
        measured[s], ct = measure_shape(s, bw, with_compile=use_compile)
        if ct is not None:
            compile_times.append(ct)
        print(f"  {shape_str(s)}: fwd fused {measured[s]['fwd']['fused_us']:.1f} us, eager "
              f"{measured[s]['fwd']['eager_us']:.1f}; fwd+bwd fused {measured[s]['fb']['fused_us']:.1f}, eager "
              f"{measured[s]['fb']['eager_us']:.1f} ({time.time() - t_start:.0f} s)", flush=True)

    sections = []
    all_rows = []
    for pas, title in (("fwd", "forward"), ("fb", "forward + backward")):
        for name, group in (("batch sweep", BATCH_SWEEP), ("input-size sweep", SIZE_SWEEP),
                            ("EfficientNet-like", [] if a.quick else EFFNET)):
            if not group:
                continue
            rows = [measured[s][pas] for s in group]
            sections.append(f"### {title}, {name} (fp32, NCHW, SiLU)\n\n" + bench.format_table(rows, COLS))
            all_rows += [dict(r, table=f"{pas} {name}", label=f"{pas} {r['shape']}") for r in rows]

    # the bars of issue 3, at the median over the seed's two sweeps (9 rows: (8, 64, 112, 112) is in both)
    seed_rows = {pas: [measured[s][pas] for s in BATCH_SWEEP + SIZE_SWEEP] for pas in ("fwd", "fb")}
    largest = measured[(8, 64, 448, 448, 16)]
    summary = []
    def bar(name, value, target):
        ok = value is not None and value >= target
        summary.append({"bar": name, "measured": value, "target": target, "met": "yes" if ok else "NO"})
    bar("fused fwd vs eager (median of seed sweeps), x", median(r["eager/fused"] for r in seed_rows["fwd"]), 3.0)
    bar("fused fwd+bwd vs eager (median), x", median(r["eager/fused"] for r in seed_rows["fb"]), 4.0)
    if not a.no_compile:
        bar("fused fwd vs torch.compile (median), x", median(r["compile/fused"] for r in seed_rows["fwd"]), 1.5)
        bar("fused fwd+bwd vs torch.compile (median), x", median(r["compile/fused"] for r in seed_rows["fb"]), 1.5)
    bar("fwd % of floor at (8, 64, 448, 448)", largest["fwd"]["floor%"], 80.0)
    bar("fwd+bwd % of floor at (8, 64, 448, 448)", largest["fb"]["floor%"], 80.0)
    sections.append("### issue 3 bars\n\n" + bench.format_table(summary, ["bar", "measured", "target", "met"]))

    sections.append("### host time per call at (1, 64, 112, 112) (us; enqueue only, GPU not waited for)\n\n"
                    + bench.format_table(host_table(), ["variant", "forward_host_us", "fwd+bwd_host_us"]))

    vrows, vcols = versions_table(bw)
    sections.append("### kernel versions (fp32, NCHW; pool: the stage op; fwd/fb: the fused block, GPU time from "
                    "CUDA-graph replays, us)\n\n"
                    + bench.format_table(vrows, vcols))

    if not a.quick:
        bf = []
        for s in EFFNET:
            r, _ = measure_shape(s, bw, with_compile=False, dtype=torch.bfloat16, channels_last=True)
            for pas in ("fwd", "fb"):
                rr = {k: r[pas][k] for k in ("shape", "staged_us", "fused_us", "eager_us", "floor_us",
                                             "eager/fused", "floor%")}
                rr["pass"] = "forward" if pas == "fwd" else "fwd+bwd"
                bf.append(rr)
        sections.append("### bf16, channels_last, EfficientNet-like shapes (no compile)\n\n" + bench.format_table(
            bf, ["pass", "shape", "staged_us", "fused_us", "eager_us", "floor_us", "eager/fused", "floor%"]))

    try:
        t_tv = training_step(False)
        t_ours = training_step(True)
        sections.append("### EfficientNet-B0 training step (batch 64, 224 x 224, bf16 autocast, channels_last, SGD)"
                        "\n\n" + bench.format_table(
                            [{"model": "torchvision", "ms/step": t_tv / 1e3},
                             {"model": "convert(model)", "ms/step": t_ours / 1e3},
                             {"model": "speedup", "ms/step": t_tv / t_ours}], ["model", "ms/step"]))
    except ImportError as e:
        sections.append(f"### EfficientNet-B0 training step\n\nnot run: {e}")

    head = (f"## se_module benchmark: {meta['device']}, {meta['date']}\n\n"
            f"torch {meta['torch']}, CUDA {meta['cuda']}, {meta['sms']} SMs, measured copy bandwidth "
            f"{bw:.0f} GB/s (read + write). Eager = {EAGER_NAME}. Times are medians in microseconds "
            f"(CUDA events, L2 flushed before each repeat; {ROUNDS} rounds interleaving the variants, median "
            f"of the round medians), host overhead included; *_gpu_us: the same "
            f"work captured in a CUDA graph and replayed (GPU time alone). floor% = floor / fused. torch.compile: "
            f"{len(compile_times)} static-shape compiles, {sum(compile_times):.0f} s. Bench wall time "
            f"{time.time() - t_start:.0f} s.\n")
    if a.quick:
        sections.append(etext)
    text = head + "\n" + "\n\n".join(sections) + "\n"
    stem = Path(a.out)
    stem.parent.mkdir(parents=True, exist_ok=True)
    bench.write_report(all_rows, ["table", *COLS], stem, "se_module: SE block", meta=dict(meta, summary=summary,
                       versions=vrows), plot_cols=["fused_us", "staged_us", "eager_us", "compile_us", "floor_us"],
                       label_col="label")
    stem.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
