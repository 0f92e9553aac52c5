"""EXPERIMENT check (GPU): the backward under knob settings against version 2's, and the plan.
    python tools/exp_check.py NxD dtype KNOB=VAL[:KNOB=VAL] ...
"""
import sys
import torch
from day26_layernorm import layer_norm_backward
from day26_layernorm.ops import knobs, backward_plan

shape, dname = sys.argv[1], sys.argv[2]
n, d = (int(v) for v in shape.split("x"))
dtype = getattr(torch, dname)
torch.manual_seed(0)
x = torch.randn(n, d, device="cuda", dtype=dtype) * 2 + 0.5
w = torch.randn(d, device="cuda", dtype=dtype)
dy = torch.randn(n, d, device="cuda", dtype=dtype)
_, mean, rstd = torch.ops.aten.native_layer_norm(x, [d], w, None, 1e-5)
m1, r1 = mean.view(-1), rstd.view(-1)
ref = layer_norm_backward(dy, x, d, m1, r1, w, version=2)
for spec in sys.argv[3:]:
    env = {k: int(v) for k, v in (p.split("=") for p in spec.split(":"))}
    with knobs(**env):
        plan = backward_plan(dy, x, d, m1, r1, w, version=0)
        out = layer_norm_backward(dy, x, d, m1, r1, w, version=0)
        again = layer_norm_backward(dy, x, d, m1, r1, w, version=0)
    errs = [float((a.float() - b.float()).abs().max() / b.float().abs().max()) for a, b in zip(out, ref)]
    same = all(torch.equal(a, b) for a, b in zip(out, again))
    keys = {k: plan[k] for k in ("family", "tpr", "iters", "slots", "grid", "cluster", "stages", "ring_rows", "smem") if k in plan}
    bad = max(errs) > 2e-2 or not same or any(not torch.isfinite(o).all() for o in out)
    print("FAIL" if bad else "ok", shape, dname, spec, keys, "rel err vs v2 (dx, dw, db):", ["%.1e" % e for e in errs], "repro", same)
