"""Registered ops of day26 and their Python entry points.

torch.ops.day26.layer_norm_fwd / layer_norm_bwd are implemented in C++ (CPU) and
CUDA; this module adds their fake (meta) implementations, so torch.compile and
opcheck can trace them, and autograd, so `layer_norm` is differentiable.
"""
from __future__ import annotations

import numbers
from pathlib import Path
from typing import Sequence

import torch

from kernel_common.build import import_extension

# Registers torch.ops.day26.* (the installed extension, or a JIT build of the
# sources next to this package when KC_JIT=1).
import_extension("day26_layernorm", Path(__file__).resolve().parent.parent)

_ops = torch.ops.day26


def _stat_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


@torch.library.register_fake("day26::layer_norm_fwd")
def _fwd_fake(x, normalized_shape, weight, bias, eps, version=4):
    lead = x.shape[: x.dim() - len(normalized_shape)]
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    return y, x.new_empty(lead, dtype=_stat_dtype(x)), x.new_empty(lead, dtype=_stat_dtype(x))


@torch.library.register_fake("day26::layer_norm_bwd")
def _bwd_fake(dy, x, normalized_shape, mean, rstd, weight, output_mask, version=4):
    wdt = weight.dtype if weight is not None else x.dtype
    dx = torch.empty_like(x, memory_format=torch.contiguous_format) if output_mask[0] else x.new_empty((0,))
    dw = x.new_empty(normalized_shape, dtype=wdt) if output_mask[1] and weight is not None else x.new_empty((0,))
    db = x.new_empty(normalized_shape, dtype=wdt) if output_mask[2] else x.new_empty((0,))
    return dx, dw, db


def _setup_context(ctx, inputs, output):
    x, normalized_shape, weight, bias, eps, version = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, weight, mean, rstd)
    ctx.normalized_shape = normalized_shape
    ctx.version = version
    ctx.bias_dtype = bias.dtype if bias is not None else None


def _backward(ctx, dy, _dmean, _drstd):
    # mean and rstd are statistics returned for the backward, not differentiable outputs.
    x, weight, mean, rstd = ctx.saved_tensors
    mask = [
        ctx.needs_input_grad[0],
        weight is not None and ctx.needs_input_grad[2],
        ctx.bias_dtype is not None and ctx.needs_input_grad[3],
    ]
    if not any(mask):
        return None, None, None, None, None, None
    dx, dw, db = _ops.layer_norm_bwd(dy, x, ctx.normalized_shape, mean, rstd, weight, mask, ctx.version)
    return (
        dx if mask[0] else None,
        None,
        dw if mask[1] else None,
        (db if db.dtype == ctx.bias_dtype else db.to(ctx.bias_dtype)) if mask[2] else None,
        None,
        None,
    )


torch.library.register_autograd("day26::layer_norm_fwd", _backward, setup_context=_setup_context)


def _as_shape(normalized_shape) -> list[int]:
    if isinstance(normalized_shape, numbers.Integral):
        return [int(normalized_shape)]
    return [int(s) for s in normalized_shape]


def layer_norm_forward(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5, version: int = 4):
    """(y, mean, rstd): the forward op. mean/rstd are fp32 (fp64 for fp64 input), shaped like x's leading dims."""
    return _ops.layer_norm_fwd(x, _as_shape(normalized_shape), weight, bias, float(eps), int(version))


def layer_norm_backward(dy, x, normalized_shape, mean, rstd, weight=None,
                        output_mask: Sequence[bool] = (True, True, True), version: int = 4):
    """(dx, dweight, dbias): the backward op. Entries not requested in output_mask
    (and dweight when weight is None) come back as empty tensors of shape [0]."""
    return _ops.layer_norm_bwd(dy, x, _as_shape(normalized_shape), mean, rstd, weight,
                               [bool(m) for m in output_mask], int(version))


def layer_norm(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5, version: int = 4):
    """LayerNorm with the semantics of torch.nn.functional.layer_norm, differentiable.

    x: (..., *normalized_shape) in float32, float16 or bfloat16 (float64 on CPU);
    weight, bias: normalized_shape, in x's dtype or float32. Statistics and all
    sums are computed in fp32 (fp64 on CPU). CUDA kernel versions: 1 = the
    seed's algorithm, 2 = row in registers, 3 = 2 on a cp.async pipeline,
    4 = row slots (the default: v4's kernels where they measured fastest, v2's
    or v3's elsewhere; see the README). The CPU path ignores it.
    """
    return layer_norm_forward(x, normalized_shape, weight, bias, eps, version)[0]
