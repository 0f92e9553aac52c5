"""Which kernels does each call launch? (GPU; a check of the plans, not a benchmark.)

For a list of shapes, dtypes, weight dtypes, output masks and layouts, one forward and one
backward call each under torch.profiler; per call the CUDA kernels it launched, in order,
with grid, block and shared memory (from the profiler's trace). Uses only the public ops
(layer_norm_forward / layer_norm_backward with `version=`), so the same file runs against
any installed day26, e.g. a build of main and a build of a branch:

    python tools/launch_table.py [--version N] [--save FILE] [--quick]
    python tools/launch_table.py --diff A.json B.json      # exit 0 when the launches are identical

--version: the version passed to both ops (default: none, i.e. the library's default:
4 before the versions were renumbered, 0 (auto) after). --diff compares kernel names (with
ln_fwd_v4's kPrefetch template argument dropped where a name has it: it became derived
from the other arguments when the versions were renumbered), grid, block and shared
memory per call; the private plans (ops.backward_plan, ops.forward_plan, where the installed
day26 has them)
are saved beside them for reading, not compared.
"""
import argparse
import json
import os
import re
import sys
import tempfile

SHAPES = [(4096, 768), (32768, 1024), (16384, 4096), (8192, 8192), (4096, 16384),  # bench.py's
          (64, 256), (1000, 512), (300, 600), (37, 1000), (64, 2048), (19, 12288), (8, 32768), (4, 65536),
          (0, 1024), (3, 1)]
QUICK = [(4096, 768), (16384, 4096), (4096, 16384), (300, 600), (37, 1000)]
DTYPES = ["float32", "bfloat16", "float16"]


def cases(shapes):
    """(label, n, d, dtype, weight dtype, output mask, aligned)"""
    for dname in DTYPES:
        for n, d in shapes:
            wdts = [dname] + (["float32"] if dname != "float32" else [])
            for wd in wdts:
                for mask in ("111", "100", "011"):
                    if wd != dname and mask != "111":
                        continue
                    yield f"{n}x{d} {dname} w={wd} mask={mask}", n, d, dname, wd, mask, True
            yield f"{n}x{d} {dname} w={dname} mask=111 unaligned", n, d, dname, dname, "111", False


def kernels_of(fn):
    """The CUDA kernels fn launches, in order: dicts of name, grid, block, smem."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    events = [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel"]
    events.sort(key=lambda e: e.get("ts", 0))
    out = []
    for e in events:
        a = e.get("args", {})
        out.append(dict(name=e.get("name", "?"), grid=a.get("grid"), block=a.get("block"),
                        smem=a.get("shared memory")))
    return out


def run(args):
    import torch

    from day26_layernorm import layer_norm_backward, layer_norm_forward
    from day26_layernorm import ops

    kw = {} if args.version is None else {"version": args.version}
    rows = []
    for label, n, d, dname, wd, mask, aligned in cases(QUICK if args.quick else SHAPES):
        dtype, wdtype = getattr(torch, dname), getattr(torch, wd)
        g = torch.Generator(device="cuda").manual_seed(0)

        def make(*shape, dt=dtype):
            if aligned:
                return torch.randn(*shape, device="cuda", dtype=dt, generator=g)
            buf = torch.randn(int(torch.tensor(shape).prod()) + 1, device="cuda", dtype=dt, generator=g)
            return buf[1:].view(*shape)  # one element in: no 16-byte vectors

        x, dy = make(n, d), make(n, d)
        w = torch.randn(d, device="cuda", dtype=wdtype, generator=g)
        b = torch.randn(d, device="cuda", dtype=wdtype, generator=g)
        m = tuple(c == "1" for c in mask)
        fwd = kernels_of(lambda: layer_norm_forward(x, d, w, b, **kw))
        _, mean, rstd = layer_norm_forward(x, d, w, b, **kw)
        bwd = kernels_of(lambda: layer_norm_backward(dy, x, d, mean, rstd, w, m, **kw))
        row = dict(case=label, fwd=fwd, bwd=bwd)
        if hasattr(ops, "backward_plan"):
            row["bwd_plan"] = ops.backward_plan(dy, x, d, mean, rstd, w, m, **kw)
        if hasattr(ops, "forward_plan"):
            row["fwd_plan"] = ops.forward_plan(x, d, w, b, **kw)
        rows.append(row)
        print(f"{label}\n  fwd: {fmt(fwd)}\n  bwd: {fmt(bwd)}", flush=True)
        del x, dy, w, b, mean, rstd
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                version=args.version, default_version=getattr(ops, "DEFAULT_VERSION", None))
    if args.save:
        with open(args.save, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
        print(f"saved {len(rows)} cases to {args.save}")
    return 0


def fmt(ks):
    return "; ".join(f"{short(k['name'])} {k['grid']} {k['block']} smem={k['smem']}" for k in ks) or "(none)"


def short(name):
    return name.replace("void ", "").replace("day26::(anonymous namespace)::", "")


def normalize(name):
    """ln_fwd_v4<T, TW, VEC, ITERS, kPrefetch, kCluster, kL2pf> (before the renumbering) ->
    ln_fwd_v4<T, TW, VEC, ITERS, kCluster, kL2pf> (after: kPrefetch derived)."""
    name = short(name)
    m = re.match(r"(ln_fwd_v4)<(.*)>\((.*)\)$|(ln_fwd_v4)<(.*)>$", name)
    if m:
        base = m.group(1) or m.group(4)
        args = [a.strip() for a in (m.group(2) or m.group(5)).split(",")]
        if len(args) == 7:
            del args[4]
        return f"{base}<{', '.join(args)}>"
    return re.sub(r"\(.*\)$", "", name)


def key(k):
    return (normalize(k["name"]), json.dumps(k["grid"]), json.dumps(k["block"]), k["smem"])


def diff(a_path, b_path):
    with open(a_path) as f:
        a = json.load(f)
    with open(b_path) as f:
        b = json.load(f)
    ra = {r["case"]: r for r in a["rows"]}
    rb = {r["case"]: r for r in b["rows"]}
    bad = 0
    for case in sorted(set(ra) | set(rb)):
        if case not in ra or case not in rb:
            print(f"only in {'B' if case not in ra else 'A'}: {case}")
            bad += 1
            continue
        for op in ("fwd", "bwd"):
            ka = [key(k) for k in ra[case][op]]
            kb = [key(k) for k in rb[case][op]]
            if ka != kb:
                bad += 1
                print(f"DIFFERENT {case} {op}\n  A: {fmt(ra[case][op])}\n  B: {fmt(rb[case][op])}")
    print(f"{len(set(ra) | set(rb))} cases, {bad} different "
          f"(A: {a['meta'].get('device')}, version {a['meta'].get('version')}; "
          f"B: {b['meta'].get('device')}, version {b['meta'].get('version')})")
    return 0 if bad == 0 else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", type=int, default=None, help="version passed to both ops (default: the library's)")
    p.add_argument("--save", default="", help="write the table as JSON")
    p.add_argument("--quick", action="store_true", help="a few shapes only")
    p.add_argument("--diff", nargs=2, metavar=("A", "B"), help="compare two saved tables; exit 0 when identical")
    args = p.parse_args()
    if args.diff:
        return diff(*args.diff)
    import torch

    if not torch.cuda.is_available():
        print("launch_table.py needs a CUDA GPU")
        return 1
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
