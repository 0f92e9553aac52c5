"""Where does the time go? (GPU; a development probe, not the benchmark.)

For each benchmark shape and each variant ("V" or "V:KNOB=VAL:KNOB=VAL", e.g.
"5:ring_stages=4"; versions 0 (auto) to 6, knob names: day26_layernorm.ops.knobs): the whole backward, dx only (no dgamma/dbeta), and the
forward; plus torch.add(x, dy, out=dx) - the backward's 3 passes of bytes with no
math - and copy_ (the forward's 2 passes).
    python tools/probe_bwd.py [--variants 2,0] [--dtypes float32,bfloat16] [--no-dx] [--fwd-only]
                              [--shapes 32768x1024,8192x8192]
"""
import argparse
import sys

import torch

from kernel_common import bench
from day26_layernorm import layer_norm_backward, layer_norm_forward
from day26_layernorm.ops import knobs

SHAPES = [(4096, 768), (32768, 1024), (16384, 4096), (8192, 8192), (4096, 16384)]


def env_set(env):
    """day26's private tuning knobs (ops.knobs) set inside the block, e.g. {"ring_stages": "4"};
    None where the installed day26 lacks one of them (a base build in an A/B: that variant is skipped)."""
    from day26_layernorm.ops import _C

    if set(env) - set(_C._knob_names()):
        return None
    return knobs(**{k: int(v) for k, v in env.items()})


def parse_variant(s):
    parts = s.split(":")
    env = dict(p.split("=", 1) for p in parts[1:])
    name = "v" + parts[0] + "".join("_" + k + v
                                    for k, v in env.items())
    return name, int(parts[0]), env


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--variants", default="2,0")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--no-dx", action="store_true")
    p.add_argument("--fwd-only", action="store_true", help="time the forward only")
    p.add_argument("--shapes", default="", help="NxD,... (default: the benchmark's shapes)")
    args = p.parse_args()
    variants = [parse_variant(v) for v in args.variants.split(",")]
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    bw = bench.copy_bandwidth_gbs()
    brows, frows = [], []
    for dname in args.dtypes.split(","):
        dtype = getattr(torch, dname)
        for n, d in shapes:
            x = torch.randn(n, d, device="cuda", dtype=dtype)
            w = torch.randn(d, device="cuda", dtype=dtype)
            b = torch.randn(d, device="cuda", dtype=dtype)
            dy = torch.randn(n, d, device="cuda", dtype=dtype)
            _, mean, rstd = torch.ops.aten.native_layer_norm(x, [d], w, b, 1e-5)
            m1, r1 = mean.view(-1), rstd.view(-1)
            out = torch.empty_like(x)
            label = f"{n}x{d} {dname}"
            floor = bench.floor_us(3 * n * d * x.element_size(), bw)
            ffloor = bench.floor_us(2 * n * d * x.element_size(), bw)
            br = dict(shape=label, floor=floor)
            fr = dict(shape=label, floor=ffloor)
            br["add3"] = float("nan") if args.fwd_only else bench.time_us(lambda: torch.add(x, dy, out=out))
            fr["copy2"] = bench.time_us(lambda: out.copy_(x))
            br["torch"] = float("nan") if args.fwd_only else bench.time_us(
                lambda: torch.ops.aten.native_layer_norm_backward(dy, x, [d], mean, rstd, w, b, [True, True, True]))
            fr["torch"] = bench.time_us(lambda: torch.nn.functional.layer_norm(x, (d,), w, b))
            for name, v, env in variants:
                ctx = env_set(env)
                if ctx is None:
                    for k in (name, name + "_dx", "pct_" + name, "xt_" + name):
                        br[k] = float("nan")
                    fr[name] = fr["pct_" + name] = float("nan")
                    continue
                with ctx:
                    br[name] = float("nan") if args.fwd_only else bench.time_us(
                        lambda: layer_norm_backward(dy, x, d, m1, r1, w, version=v))
                    if not args.no_dx and not args.fwd_only:
                        br[name + "_dx"] = bench.time_us(lambda: layer_norm_backward(
                            dy, x, d, m1, r1, w, output_mask=(True, False, False), version=v))
                    fr[name] = bench.time_us(lambda: layer_norm_forward(x, d, w, b, version=v))
                br["pct_" + name] = 100 * floor / br[name]
                br["xt_" + name] = br["torch"] / br[name]
                fr["pct_" + name] = 100 * ffloor / fr[name]
            brows.append(br)
            frows.append(fr)
            del x, w, b, dy, out
            torch.cuda.empty_cache()
    names = [v[0] for v in variants]
    bcols = ["shape", "floor", "add3", "torch"]
    for nm in names:
        bcols += [nm] + ([] if args.no_dx else [nm + "_dx"]) + ["pct_" + nm, "xt_" + nm]
    fcols = ["shape", "floor", "copy2", "torch"] + [c for nm in names for c in (nm, "pct_" + nm)]
    print(f"copy bandwidth {bw:.0f} GB/s; us, median, L2 flushed")
    print("\nforward\n" + bench.format_table(frows, fcols))
    if not args.fwd_only:
        print("\nbackward (pct = floor / time, xt = torch / time)\n" + bench.format_table(brows, bcols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
