"""Registered ops of day26 and their Python entry points.

torch.ops.day26.layer_norm_fwd / layer_norm_bwd, rms_norm_fwd / rms_norm_bwd and
add_norm_fwd / add_norm_bwd are implemented in C++ (CPU) and CUDA, with the
forwards' autograd in C++ too; this module adds their fake (meta)
implementations, so torch.compile and opcheck can trace them, and the Python
entry points.
"""
from __future__ import annotations

import contextlib
import numbers
from pathlib import Path
from typing import Sequence

import torch

from kernel_common import fastpath
from kernel_common.build import import_extension

# Registers torch.ops.day26.* (the installed extension, or a JIT build of the
# sources next to this package when KC_JIT=1).
_C = import_extension("day26_layernorm", Path(__file__).resolve().parent.parent)

_ops = torch.ops.day26

#: kernel version used when none is given: the schemas' default (csrc/binding.cpp),
#: the one place it is written (see the README for the versions)
DEFAULT_VERSION = next(a.default_value for a in _ops.layer_norm_fwd.default._schema.arguments if a.name == "version")

# torch.ops.day26.layer_norm_fwd, through the extension's C++ entry for plain
# tensors outside torch.compile (host time per call), the op itself otherwise.
_fwd = fastpath.entry(_ops.layer_norm_fwd.default, _C.layer_norm_fwd)


def _stat_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _check_devices(op: str, x: torch.Tensor, **tensors) -> None:
    # The fakes also serve as the Meta kernels, which the dispatcher picks when any
    # argument is on the meta device: without this, a meta weight beside a CPU
    # input would return an uninitialised CPU tensor instead of an error.
    for name, t in tensors.items():
        if t is not None:
            torch._check(t.device == x.device,
                         lambda: f"{op}: {name} is on {t.device} but input is on {x.device}")


@torch.library.register_fake("day26::layer_norm_fwd")
def _fwd_fake(x, normalized_shape, weight, bias, eps, version=DEFAULT_VERSION):
    _check_devices("layer_norm", x, weight=weight, bias=bias)
    lead = x.shape[: x.dim() - len(normalized_shape)]
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    return y, x.new_empty(lead, dtype=_stat_dtype(x)), x.new_empty(lead, dtype=_stat_dtype(x))


@torch.library.register_fake("day26::layer_norm_bwd")
def _bwd_fake(dy, x, normalized_shape, mean, rstd, weight, output_mask, version=DEFAULT_VERSION):
    _check_devices("layer_norm backward", x, grad_out=dy, mean=mean, rstd=rstd, weight=weight)
    wdt = weight.dtype if weight is not None else x.dtype
    dx = torch.empty_like(x, memory_format=torch.contiguous_format) if output_mask[0] else x.new_empty((0,))
    dw = x.new_empty(normalized_shape, dtype=wdt) if output_mask[1] and weight is not None else x.new_empty((0,))
    db = x.new_empty(normalized_shape, dtype=wdt) if output_mask[2] else x.new_empty((0,))
    return dx, dw, db


# Autograd: a C++ torch::autograd::Function at the Autograd key
# (csrc/binding.cpp); a second derivative raises "not implemented".

@contextlib.contextmanager
def knobs(**values: int):
    """Private, for tests and tools/: override the CUDA plans' own choices inside
    the block (names in csrc/layernorm_knobs.h's LnKnob: target_iters,
    l2_prefetch, grid, ring_stages, cluster; ints, bools as 0/1), restored to the
    plans' choices after. The kernel family is the `version`, not a knob.
    Not thread-safe, not for models."""
    names = list(_C._knob_names())
    bad = sorted(set(values) - set(names))
    if bad:
        raise ValueError(f"unknown day26 knob(s) {bad}; known: {names}")
    try:
        for k, v in values.items():
            _C._set_knob(names.index(k), int(v))
        yield
    finally:
        for k in values:
            _C._set_knob(names.index(k), -1)


def backward_plan(dy, x, normalized_shape, mean, rstd, weight=None,
                  output_mask: Sequence[bool] = (True, True, True), version: int = DEFAULT_VERSION,
                  dsum=None, rms: bool = False) -> dict:
    """Private, for tests and tools/ (CUDA builds, CUDA tensors): the plan that
    layer_norm_backward would launch for these arguments (csrc/layernorm.h's
    LnBwdPlan: family, vec, iters, tpr, warp, prefetch, stages, cluster, slots,
    threads, grid, smem, partial_rows, workspace_floats, finalize, dsum; and the
    device's sms and cc), as a dict of ints. `family` is the kernel family that
    runs (1-6, after the fallbacks of csrc/layernorm_versions.h). dsum: add_norm's
    sum gradient (plan dsum 1: added by the main kernel, 2: after it); rms: RMSNorm."""
    return dict(_C._backward_plan(dy, x, _as_shape(normalized_shape), mean, rstd, weight,
                                  [bool(m) for m in output_mask], int(version), dsum, bool(rms)))


def forward_plan(x, normalized_shape, weight=None, bias=None, version: int = DEFAULT_VERSION, residual=None,
                 rms: bool = False) -> dict:
    """Private, for tests and tools/ (CUDA builds, CUDA tensors): the plan that the
    forward (layer_norm_forward, rms_norm_forward with rms, add_norm_forward with a
    residual) would launch for these arguments (csrc/layernorm.h's LnFwdPlanInfo:
    family, vec, iters, tpr, warp, stages, slots, threads, grid, cluster, smem, l2pf,
    add, add_first, pack; and the device's sms and cc), as a dict of ints. `family`
    is the kernel family that runs (1-6, after the fallbacks of csrc/layernorm_versions.h)."""
    return dict(_C._forward_plan(x, _as_shape(normalized_shape), weight, bias, int(version), residual, bool(rms)))


def _as_shape(normalized_shape) -> list[int]:
    if isinstance(normalized_shape, numbers.Integral):
        return [int(normalized_shape)]
    return [int(s) for s in normalized_shape]


def layer_norm_forward(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5,
                       version: int = DEFAULT_VERSION):
    """(y, mean, rstd): the forward op. mean/rstd are fp32 (fp64 for fp64 input), shaped like x's leading dims."""
    return _fwd(x, _as_shape(normalized_shape), weight, bias, float(eps), int(version))


def layer_norm_backward(dy, x, normalized_shape, mean, rstd, weight=None,
                        output_mask: Sequence[bool] = (True, True, True), version: int = DEFAULT_VERSION):
    """(dx, dweight, dbias): the backward op. Entries not requested in output_mask
    (and dweight when weight is None) come back as empty tensors of shape [0]."""
    return _ops.layer_norm_bwd(dy, x, _as_shape(normalized_shape), mean, rstd, weight,
                               [bool(m) for m in output_mask], int(version))


def layer_norm(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5, version: int = DEFAULT_VERSION):
    """LayerNorm with the semantics of torch.nn.functional.layer_norm, differentiable.

    x: (..., *normalized_shape) in float32, float16 or bfloat16 (float64 on CPU);
    weight, bias: normalized_shape, in x's dtype or float32. Statistics and all
    sums are computed in fp32 (fp64 on CPU). CUDA kernel versions: 0 = auto
    (the default: the plan's table picks per shape), 1 = the seed's algorithm,
    2 = row in registers, 3 = 2 on a cp.async pipeline, 4 = row slots, 5 = 4 on
    a copy-engine ring (backward; the forward runs 4), 6 = rows split across a
    thread-block cluster. A version that cannot run a shape falls back
    (csrc/layernorm_versions.h; the README). The CPU path checks it and ignores it.
    """
    return _fwd(x, _as_shape(normalized_shape), weight, bias, float(eps), int(version))[0]


# ----------------------------------------------------------------- RMSNorm
# torch.ops.day26.rms_norm_fwd / rms_norm_bwd: the LayerNorm kernels and plan
# run without centring and without bias (csrc/layernorm.h: a null mean), so
# RMSNorm gets the same families, fallbacks and deterministic dweight.

@torch.library.register_fake("day26::rms_norm_fwd")
def _rms_fwd_fake(x, normalized_shape, weight, eps, version=DEFAULT_VERSION):
    _check_devices("rms_norm", x, weight=weight)
    lead = x.shape[: x.dim() - len(normalized_shape)]
    return torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(lead, dtype=_stat_dtype(x))


@torch.library.register_fake("day26::rms_norm_bwd")
def _rms_bwd_fake(dy, x, normalized_shape, rstd, weight, output_mask, version=DEFAULT_VERSION):
    _check_devices("rms_norm backward", x, grad_out=dy, rstd=rstd, weight=weight)
    wdt = weight.dtype if weight is not None else x.dtype
    dx = torch.empty_like(x, memory_format=torch.contiguous_format) if output_mask[0] else x.new_empty((0,))
    dw = x.new_empty(normalized_shape, dtype=wdt) if output_mask[1] and weight is not None else x.new_empty((0,))
    return dx, dw


# torch.ops.day26.rms_norm_fwd through the extension's C++ entry for plain tensors (as _fwd).
_rms_fwd = fastpath.entry(_ops.rms_norm_fwd.default, _C.rms_norm_fwd)


def rms_eps(x: torch.Tensor, eps: float | None) -> float:
    """F.rms_norm's rule for eps=None: the machine epsilon of the type it computes
    in (float32 for float16/bfloat16/float32 input, float64 for float64), not of
    x's own dtype (measured: torch 2.13, bfloat16 input, eps=None gives float32's)."""
    if eps is not None:
        return float(eps)
    return _EPS64 if x.dtype == torch.float64 else _EPS32


_EPS32, _EPS64 = torch.finfo(torch.float32).eps, torch.finfo(torch.float64).eps


def rms_weight(x: torch.Tensor, weight):
    """F.rms_norm takes a weight of any float dtype and returns x's dtype; the kernels
    take x's dtype or float32. Any other weight (16-bit beside float32 input, the other
    16-bit type, float64 beside 16/32-bit input) is cast to the type the kernels
    compute in (float32; float64 for float64 input): differentiable, so dweight comes
    back in the weight's own dtype, as torch's does."""
    if weight is None or weight.dtype == x.dtype or weight.dtype == torch.float32 or not weight.is_floating_point():
        return weight
    return weight.to(torch.float64 if x.dtype == torch.float64 else torch.float32)


def rms_norm_forward(x, normalized_shape, weight=None, eps: float | None = None, version: int = DEFAULT_VERSION):
    """(y, rstd): the RMSNorm forward op. rstd is fp32 (fp64 for fp64 input), shaped like x's leading dims."""
    return _rms_fwd(x, _as_shape(normalized_shape), weight, rms_eps(x, eps), int(version))


def rms_norm_backward(dy, x, normalized_shape, rstd, weight=None, output_mask: Sequence[bool] = (True, True),
                      version: int = DEFAULT_VERSION):
    """(dx, dweight): the RMSNorm backward op (empty [0] tensors where not requested)."""
    return _ops.rms_norm_bwd(dy, x, _as_shape(normalized_shape), rstd, weight,
                             [bool(m) for m in output_mask], int(version))


def rms_norm(x, normalized_shape, weight=None, eps: float | None = None, version: int = DEFAULT_VERSION):
    """RMSNorm with the semantics of torch.nn.functional.rms_norm, differentiable:
    y = x / sqrt(mean(x^2) + eps) * weight over the last len(normalized_shape) dims.

    eps=None: as F.rms_norm (float32's epsilon, float64's for float64 input).
    Dtypes and versions as layer_norm's (no bias); the weight may have any float
    dtype, and y has x's, as F.rms_norm's (rms_weight)."""
    return _rms_fwd(x, _as_shape(normalized_shape), rms_weight(x, weight), rms_eps(x, eps), int(version))[0]


# ---------------------------------------------------------------- add_norm
# torch.ops.day26.add_norm_fwd / add_norm_bwd: the residual add fused into the
# norm (csrc/layernorm.h: LnForwardArgs::residual, LnBackwardArgs::dsum).

def _add_norm_stats_fake(x, normalized_shape, rms):
    lead = x.shape[: x.dim() - len(normalized_shape)]
    mean = x.new_empty((0,), dtype=_stat_dtype(x)) if rms else x.new_empty(lead, dtype=_stat_dtype(x))
    return mean, x.new_empty(lead, dtype=_stat_dtype(x))


@torch.library.register_fake("day26::add_norm_fwd")
def _add_norm_fwd_fake(x, residual, normalized_shape, weight, bias, eps, rms, version=DEFAULT_VERSION):
    _check_devices("add_norm", x, residual=residual, weight=weight, bias=bias)
    torch._check(residual.shape == x.shape, lambda: f"add_norm: residual of shape {tuple(residual.shape)} and "
                                                    f"input of shape {tuple(x.shape)} must have one shape")
    torch._check(residual.dtype == x.dtype, lambda: f"add_norm: residual ({residual.dtype}) and input ({x.dtype}) "
                                                    f"must have one dtype")
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    s = torch.empty_like(x, memory_format=torch.contiguous_format)
    return (y, s, *_add_norm_stats_fake(x, normalized_shape, rms))


@torch.library.register_fake("day26::add_norm_bwd")
def _add_norm_bwd_fake(dy, dsum, s, normalized_shape, mean, rstd, weight, rms, output_mask,
                       version=DEFAULT_VERSION):
    _check_devices("add_norm backward", s, grad_out=dy, dsum=dsum, mean=mean, rstd=rstd, weight=weight)
    wdt = weight.dtype if weight is not None else s.dtype
    dx = torch.empty_like(s, memory_format=torch.contiguous_format) if output_mask[0] else s.new_empty((0,))
    dw = s.new_empty(normalized_shape, dtype=wdt) if output_mask[1] and weight is not None else s.new_empty((0,))
    db = s.new_empty(normalized_shape, dtype=wdt) if output_mask[2] else s.new_empty((0,))
    return dx, dw, db


# torch.ops.day26.add_norm_fwd through the extension's C++ entry for plain tensors (as _fwd).
_add_norm_fwd = fastpath.entry(_ops.add_norm_fwd.default, _C.add_norm_fwd)


def add_norm_forward(x, residual, normalized_shape, weight=None, bias=None, eps: float | None = 1e-5,
                     kind: str = "layer", version: int = DEFAULT_VERSION):
    """(y, sum, mean, rstd): the add_norm forward op (mean an empty [0] tensor for kind "rms")."""
    rms = _kind_is_rms(kind, bias)
    return _add_norm_fwd(x, residual, _as_shape(normalized_shape), weight, bias, _add_norm_eps(x, eps, rms), rms,
                         int(version))


def add_norm_backward(dy, dsum, s, normalized_shape, mean, rstd, weight=None, kind: str = "layer",
                      output_mask: Sequence[bool] = (True, True, True), version: int = DEFAULT_VERSION):
    """(dx, dweight, dbias): the add_norm backward op. dx = the norm's dx + dsum (dsum
    may be None), the gradient of x and of the residual alike; entries not requested
    come back as empty [0] tensors."""
    return _ops.add_norm_bwd(dy, dsum, s, _as_shape(normalized_shape), mean, rstd, weight, kind == "rms",
                             [bool(m) for m in output_mask], int(version))


def _kind_is_rms(kind: str, bias) -> bool:
    if kind not in ("layer", "rms"):
        raise ValueError(f"add_norm: kind must be 'layer' or 'rms', got {kind!r}")
    if kind == "rms" and bias is not None:
        raise ValueError("add_norm: kind='rms' takes no bias")
    return kind == "rms"


def _add_norm_eps(x, eps, rms: bool) -> float:
    if rms:
        return rms_eps(x, eps)
    return 1e-5 if eps is None else float(eps)


def add_norm(x, residual, weight=None, bias=None, eps: float | None = 1e-5, kind: str = "layer",
             version: int = DEFAULT_VERSION):
    """(norm(x + residual), x + residual) in one pass: kind "layer" (LayerNorm, with
    bias) or "rms" (RMSNorm, bias must be None), normalised over weight's shape (or
    bias's; else the last dim), differentiable through both outputs.

    The CUDA kernels read x and residual once and write the sum and y (4 passes
    where the add, then the norm, take 5); the backward writes dx = the norm's dx
    + the sum's gradient once (4 passes where the unfused take 6) and returns it
    for both x and residual. Where the plan's kernel family has no fused form
    (other families a forced version picks, fp32 forward rows over 8192 columns,
    misaligned tensors, CPU) the add runs apart, with the same results. x and
    residual of different float dtypes run in the promoted one, as `x + residual` does;
    "rms" takes a weight of any float dtype, as rms_norm does.
    eps=None: 1e-5 for "layer", F.rms_norm's rule for "rms". Dtypes and versions
    as layer_norm's."""
    rms = _kind_is_rms(kind, bias)
    if x.dtype != residual.dtype and x.is_floating_point() and residual.is_floating_point():
        # As `x + residual` promotes: under autocast a 16-bit sublayer output meets an fp32
        # residual stream; both run in the promoted dtype (the cast is one pass over x).
        dt = torch.promote_types(x.dtype, residual.dtype)
        x, residual = x.to(dt), residual.to(dt)
    if rms:
        weight = rms_weight(x, weight)
    nshape = list(weight.shape) if weight is not None else ([x.shape[-1]] if bias is None else list(bias.shape))
    y, s, _, _ = _add_norm_fwd(x, residual, nshape, weight, bias, _add_norm_eps(x, eps, rms), rms, int(version))
    return y, s
