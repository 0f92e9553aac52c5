"""The se_module ops: Python entry points, autograd formulas and fake tensors.

The kernels live in ``csrc/`` (schemas in binding.cpp); importing this module
loads the extension ``se_module_C``, which registers ``torch.ops.se_module.*``.

Autograd: the stage ops through torch.library.register_autograd (below); the
fused ``se_block`` through a C++ torch::autograd::Function at the Autograd key
(csrc/binding.cpp), because the Python path's host overhead was larger
than the block's GPU time at the seed's shapes (README, version log).

Layout rule (shared with csrc/se_checks.h): an output shaped like ``x`` is
channels_last when ``x`` is channels_last-dense and not NCHW-dense, and
NCHW-contiguous otherwise.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from kernel_common import fastpath
from kernel_common.build import import_extension

_C = import_extension("se_module", Path(__file__).resolve().parent.parent)

_ops = torch.ops.se_module



def _schema_default(op, name: str):
    return next(a.default_value for a in op.default._schema.arguments if a.name == name)


#: the fused op's versions (csrc/se_plan.cpp): version N lets the plan use the kernel families
#: up to N; 0 (auto) all of them. Each family is kept because it teaches a step (README, "Versions").
VERSIONS = {0: "auto: the plan picks the kernels", 1: "the fused block", 2: "+ the spread MLP",
            3: "+ the cluster kernel"}

#: version used when none is given: 0, auto; written once, in the op's schema
DEFAULT_VERSION = _schema_default(_ops.se_block, "version")


def check_version(version) -> int:
    """version if it names one of VERSIONS, else ValueError naming them (versions 4-7 of
    earlier releases are features of the plan now: version 0 uses them)."""
    if isinstance(version, int) and not isinstance(version, bool) and version in VERSIONS:
        return version
    names = ", ".join(f"{v} ({what})" for v, what in VERSIONS.items())
    raise ValueError(f"unsupported se_block version {version!r}: use one of {names}")

# name -> (code in the op's schemas, the torch.nn class); codes: csrc/se_module.h's Act and Gate
ACTIVATIONS = {"relu": (0, torch.nn.ReLU), "silu": (1, torch.nn.SiLU), "hardswish": (2, torch.nn.Hardswish)}
SCALE_ACTIVATIONS = {"sigmoid": (0, torch.nn.Sigmoid), "hardsigmoid": (1, torch.nn.Hardsigmoid)}


def _code(table: dict, value, what: str) -> int:
    if isinstance(value, str):
        if value.lower() in table:
            return table[value.lower()][0]
    elif isinstance(value, int) and not isinstance(value, bool):
        if any(value == code for code, _ in table.values()):
            return value
    else:
        cls = value if isinstance(value, type) else type(value)
        for code, nn_cls in table.values():
            if issubclass(cls, nn_cls):
                return code
    names = ", ".join(nn_cls.__name__ for _, nn_cls in table.values())
    raise ValueError(f"unsupported SE {what} {value!r}: use one of {names}")


def activation_code(activation) -> int:
    """The squeeze activation's code: 0 ReLU, 1 SiLU, 2 Hardswish. Accepts a name
    ("relu", "silu", "hardswish"), the code, or an nn.ReLU / nn.SiLU / nn.Hardswish
    instance or class; anything else raises ValueError."""
    return _code(ACTIVATIONS, activation, "activation")


def scale_activation_code(scale_activation) -> int:
    """The gate's code: 0 Sigmoid, 1 Hardsigmoid. Accepts a name ("sigmoid",
    "hardsigmoid"), the code, or an nn.Sigmoid / nn.Hardsigmoid instance or class;
    anything else raises ValueError."""
    return _code(SCALE_ACTIVATIONS, scale_activation, "scale_activation")


def _out_format(x: torch.Tensor):
    if not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def _like_x(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, memory_format=_out_format(x))


def _check4d(x: torch.Tensor, name: str = "x"):
    torch._check(x.dim() == 4, lambda: f"{name} must be 4-D [N, C, H, W], got {x.dim()}-D")


def _check_one_device(op: str, **tensors):
    """All tensors on one device. Checked in the fakes too: a call with any tensor on the meta
    device dispatches to them, never to the C++ checks, and would return uninitialised memory."""
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        raise RuntimeError(f"{op}: all tensors must be on one device, got "
                           + ", ".join(f"{name} on {d}" for name, d in devices.items()))


# --------------------------------------------------------------------------- public functions

def global_avg_pool(x: torch.Tensor, version: int = 2) -> torch.Tensor:
    """Mean of ``x`` [N, C, H, W] over H and W: [N, C] in x's dtype.

    version 1 is the seed's kernel (one thread per (n, c), uncoalesced in NCHW),
    version 2 the coalesced split reduction. Same result up to rounding order."""
    return _ops.global_avg_pool(x, version)


def swish(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x) (SiLU), elementwise, any shape; output contiguous."""
    return _ops.swish(x)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """1 / (1 + exp(-x)), elementwise, any shape; output contiguous."""
    return _ops.sigmoid(x)


def excitation(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """x[n, c, h, w] * s[n, c] with x [N, C, H, W] and s [N, C]; the output has x's dtype."""
    return _ops.excitation(x, s)


def _flat(w: torch.Tensor) -> torch.Tensor:
    return w.flatten(1) if w.dim() == 4 else w


def se_block(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor,
             activation="silu", version: int = DEFAULT_VERSION, scale_activation="sigmoid") -> torch.Tensor:
    """The fused SE block: ``x * gate(fc2(act(fc1(mean_hw(x)))))``.

    activation (act): ReLU, SiLU or Hardswish; scale_activation (gate): Sigmoid or
    Hardsigmoid (MobileNetV3's); names, codes or nn classes (activation_code,
    scale_activation_code).

    x: [N, C, H, W] (NCHW or channels_last; fp32, fp16 or bf16 on CUDA, also
    fp64 on CPU). w1: fc1.weight [S, C, 1, 1] or [S, C], b1 [S], w2: fc2.weight
    [C, S, 1, 1] or [C, S], b2 [C], in any floating dtype (computed in fp32).
    Differentiable in x and all four weights (gradients in the weights' shapes).
    version: VERSIONS (0, the default: the plan picks the kernels)."""
    return call_se_block(x, w1, b1, w2, b2, activation_code(activation), version,
                         scale_activation_code(scale_activation))


# torch.ops.se_module.se_block(x, w1, b1, w2, b2, act, version, scale_act), through the
# extension's C++ entry where that is the same thing (plain tensors outside
# torch.compile: kernel_common.fastpath), the op itself otherwise (tracing,
# subclasses, modes). Same op, autograd and dispatch; less host time per call.
call_se_block = fastpath.entry(_ops.se_block.default, _C.se_block)


def se_block_staged(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor,
                    activation="silu", pool_version: int = 2, scale_activation="sigmoid") -> torch.Tensor:
    """The same block the way the seed ran it: our pool, swish, sigmoid and
    excitation kernels as separate ops, the two 1x1 convs as torch matmuls
    (ReLU, Hardswish and Hardsigmoid, which the seed had no kernels for, as torch's)."""
    act, gate = activation_code(activation), scale_activation_code(scale_activation)
    w1, w2 = _flat(w1), _flat(w2)
    p = global_avg_pool(x, pool_version)
    h = F.linear(p.to(w1.dtype), w1, b1)
    a = (torch.relu, swish, F.hardswish)[act](h)
    s = (sigmoid, F.hardsigmoid)[gate](F.linear(a, w2, b2))
    return excitation(x, s)


# --------------------------------------------------------------------------- fakes

@torch.library.register_fake("se_module::global_avg_pool")
def _pool_fake(x, version=2):
    _check4d(x)
    return x.new_empty((x.shape[0], x.shape[1]))


@torch.library.register_fake("se_module::global_avg_pool_backward")
def _pool_bwd_fake(grad, H, W, channels_last):
    torch._check(grad.dim() == 2, lambda: "grad must be [N, C]")
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return torch.empty((grad.shape[0], grad.shape[1], H, W), dtype=grad.dtype, device=grad.device,
                       memory_format=fmt)


def _pointwise_fake(a, b=None):
    return torch.empty_like(a, memory_format=torch.contiguous_format)


for _name in ("swish", "sigmoid"):
    torch.library.register_fake(f"se_module::{_name}")(lambda x: _pointwise_fake(x))
for _name in ("swish_backward", "sigmoid_backward"):
    torch.library.register_fake(f"se_module::{_name}")(lambda grad, t: _pointwise_fake(grad, t))


@torch.library.register_fake("se_module::excitation")
def _excitation_fake(x, s):
    _check_one_device("excitation", x=x, s=s)
    _check4d(x)
    return _like_x(x)


@torch.library.register_fake("se_module::excitation_backward")
def _excitation_bwd_fake(grad, x, s):
    _check4d(x)
    return _like_x(x), torch.empty((x.shape[0], x.shape[1]), dtype=s.dtype, device=s.device)


@torch.library.register_fake("se_module::se_block")
def _se_block_fake(x, w1, b1, w2, b2, activation, version=DEFAULT_VERSION, scale_activation=0):
    _check_one_device("se_block", x=x, w1=w1, b1=b1, w2=w2, b2=b2)
    _check4d(x)
    return _like_x(x)


@torch.library.register_fake("se_module::se_block_train")
def _se_block_train_fake(x, w1, b1, w2, b2, activation, version=DEFAULT_VERSION, scale_activation=0):
    _check_one_device("se_block", x=x, w1=w1, b1=b1, w2=w2, b2=b2)
    _check4d(x)
    # the saved state: fp32 [N, 3 C + 2 S] (csrc/se_checks.h's state_cols)
    return _like_x(x), x.new_empty((x.shape[0], 3 * x.shape[1] + 2 * w1.shape[0]), dtype=torch.float32)


@torch.library.register_fake("se_module::se_block_backward")
def _se_block_bwd_fake(grad, x, w1, b1, w2, b2, activation, version=DEFAULT_VERSION, scale_activation=0,
                       state=None):
    _check_one_device("se_block_backward", grad=grad, x=x, w1=w1, b1=b1, w2=w2, b2=b2, state=state)
    _check4d(x)
    c = torch.contiguous_format
    return (_like_x(x), torch.empty_like(w1, memory_format=c), torch.empty_like(b1, memory_format=c),
            torch.empty_like(w2, memory_format=c), torch.empty_like(b2, memory_format=c))


# --------------------------------------------------------------------------- autograd

def _pool_setup(ctx, inputs, output):
    x, _version = inputs
    ctx.hw = (x.shape[2], x.shape[3])
    ctx.channels_last = _out_format(x) == torch.channels_last


def _pool_backward(ctx, grad):
    return _ops.global_avg_pool_backward(grad, ctx.hw[0], ctx.hw[1], ctx.channels_last), None


torch.library.register_autograd("se_module::global_avg_pool", _pool_backward, setup_context=_pool_setup)


def _save_input(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _save_output(ctx, inputs, output):
    ctx.save_for_backward(output)


torch.library.register_autograd(
    "se_module::swish", lambda ctx, grad: _ops.swish_backward(grad, ctx.saved_tensors[0]), setup_context=_save_input)
torch.library.register_autograd(
    "se_module::sigmoid", lambda ctx, grad: _ops.sigmoid_backward(grad, ctx.saved_tensors[0]),
    setup_context=_save_output)


def _excitation_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _excitation_backward(ctx, grad):
    x, s = ctx.saved_tensors
    return _ops.excitation_backward(grad, x, s)


torch.library.register_autograd("se_module::excitation", _excitation_backward, setup_context=_excitation_setup)


# se_block: autograd registered in C++ (csrc/binding.cpp), see the module docstring.
