"""Experiment check (GPU): a knob setting's backward against version 2's, and the plan it makes.
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
x = torch.randn(n, d, device="cuda", dtype=dtype)
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
    errs = [float((a.float() - b.float()).abs().max() / b.float().abs().max()) for a, b in zip(out, ref)]
    keys = {k: plan[k] for k in ("family", "tpr", "iters", "slots", "threads", "grid", "cluster", "stages", "smem") if k in plan}
    print(spec, keys, "rel err vs v2 (dx, dw, db):", ["%.2e" % e for e in errs])
