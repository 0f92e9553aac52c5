"""The short way from Python to a registered op (host time per call).

A day's extension exposes C++ functions that call its ops through the C++
dispatcher (``kc/dispatch.h``); ``entry(op, fast)`` returns a callable that
uses ``fast`` when calling it is the same thing as calling ``op``: the
leading tensor argument is a plain ``torch.Tensor``, no argument overrides
``__torch_function__`` (no subclass, no torch-function mode) and we are not
inside ``torch.compile``. Everything else (tracing, subclasses, modes, fake
tensors) goes through ``op`` itself, so torch.compile, opcheck and
``__torch_function__`` users see the op as registered.

The fast callable must take the op's arguments in the schema's order, all
positional, with no defaults left to fill.
"""
from __future__ import annotations

from typing import Callable

import torch

_has_torch_function = torch._C._has_torch_function
_is_compiling = torch.compiler.is_compiling


def plain_call(tensors: tuple) -> bool:
    """True when ``tensors`` (Tensors or None) can go the fast way: the first is a
    plain torch.Tensor, none overrides __torch_function__, not compiling."""
    return type(tensors[0]) is torch.Tensor and not _is_compiling() and not _has_torch_function(tensors)


def tensor_span(op) -> int:
    """1 + the position of the last tensor argument (Tensor, Tensor?, Tensor[]) in an
    OpOverload's schema: how many leading arguments ``entry`` checks."""
    return 1 + max(i for i, a in enumerate(op._schema.arguments) if "Tensor" in str(a.type))


def entry(op: Callable, fast: Callable, n_tensors: int | None = None) -> Callable:
    """``call(*args)``: ``fast(*args)`` when ``plain_call(args[:n_tensors])``, else ``op(*args)``.

    op: the OpOverload (``torch.ops.ns.name.default``); fast: the extension's
    C++ entry for the same op; n_tensors: how many leading arguments to check,
    by default read from op's schema (tensor_span: every tensor argument, so a
    subclass given as any of them sees the op)."""
    if n_tensors is None:
        n_tensors = tensor_span(op)

    def call(*args):
        if plain_call(args[:n_tensors]):
            return fast(*args)
        return op(*args)

    call.__name__ = getattr(op, "__name__", "call")
    call.__doc__ = f"{op} through the C++ dispatcher when the arguments are plain tensors."
    return call
