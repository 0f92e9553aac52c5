"""One forward or backward call (for ncu / compute-sanitizer).
    python tools/one_call.py bwd 16384 4096 bfloat16 [version] [mask: 111]"""
import sys

import torch

from day26_layernorm import layer_norm_backward, layer_norm_forward

which, n, d, dname = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
version = int(sys.argv[5]) if len(sys.argv) > 5 else 2
mask = tuple(c == "1" for c in (sys.argv[6] if len(sys.argv) > 6 else "111"))
dtype = getattr(torch, dname)
x = torch.randn(n, d, device="cuda", dtype=dtype)
w = torch.randn(d, device="cuda", dtype=dtype)
b = torch.randn(d, device="cuda", dtype=dtype)
dy = torch.randn(n, d, device="cuda", dtype=dtype)
y, mean, rstd = layer_norm_forward(x, d, w, b, version=version)
if which == "bwd":
    for _ in range(2):
        layer_norm_backward(dy, x, d, mean, rstd, w, output_mask=mask, version=version)
torch.cuda.synchronize()
