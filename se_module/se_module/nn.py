"""nn.Module drop-in for torchvision.ops.SqueezeExcitation, and convert()."""
from __future__ import annotations

import warnings
from typing import Callable

import torch
from torch import nn

from . import ops


class TorchvisionSqueezeExcitation(nn.Module):
    """torchvision.ops.SqueezeExcitation's structure and math in plain torch ops:
    the reference our tests and benchmark compare with where torchvision is absent,
    and the parent of our drop-in (same submodules, so the same state_dict)."""

    def __init__(self, input_channels: int, squeeze_channels: int,
                 activation: Callable[..., nn.Module] = nn.ReLU,
                 scale_activation: Callable[..., nn.Module] = nn.Sigmoid) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(input_channels, squeeze_channels, 1)
        self.fc2 = nn.Conv2d(squeeze_channels, input_channels, 1)
        self.activation = activation()
        self.scale_activation = scale_activation()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(input)))))
        return scale * input


class SqueezeExcitation(TorchvisionSqueezeExcitation):
    """Squeeze-and-Excitation block (Hu et al., 2018) on the fused se_module kernels.

    The same submodules, parameter names and shapes as
    ``torchvision.ops.SqueezeExcitation`` (``fc1``, ``fc2``: 1x1 Conv2d with bias;
    ``avgpool``, ``activation``, ``scale_activation`` without parameters), so it
    loads that module's state_dict. ``forward`` does not call the submodules: it
    runs ``se_module.ops.se_block`` on their weights.

    activation: ReLU, SiLU or Hardswish (a class or factory returning an instance,
    as in torchvision; the default here is SiLU, the EfficientNet choice, where
    torchvision's is ReLU). scale_activation: Sigmoid or Hardsigmoid (MobileNetV3's).
    Anything else raises ValueError. version: ``ops.VERSIONS`` (0, the default: the plan
    picks the kernels); anything else raises ValueError."""

    def __init__(self, input_channels: int, squeeze_channels: int,
                 activation: Callable[..., nn.Module] = nn.SiLU,
                 scale_activation: Callable[..., nn.Module] = nn.Sigmoid,
                 version: int = ops.DEFAULT_VERSION) -> None:
        super().__init__(input_channels, squeeze_channels, activation, scale_activation)
        ops.activation_code(self.activation)  # raise for anything the kernels do not have
        ops.scale_activation_code(self.scale_activation)
        self.version = ops.check_version(version)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        # Kept short: at the seed's shapes the block's GPU time is ~10-30 us, so host time counts.
        # The parameters are read from the submodules' dicts (what nn.Module.__getattr__ does,
        # without its Python fallback); anything unusual (parametrizations, a weight that is not a
        # registered parameter) falls back to plain attribute access.
        mods = self._modules
        try:
            p1, p2 = mods["fc1"]._parameters, mods["fc2"]._parameters
            w1, b1, w2, b2 = p1["weight"], p1["bias"], p2["weight"], p2["bias"]
        except KeyError:
            w1, b1, w2, b2 = self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias
        act, gate = mods["activation"], mods["scale_activation"]
        act = 1 if type(act) is nn.SiLU else ops.activation_code(act)
        gate = 0 if type(gate) is nn.Sigmoid else ops.scale_activation_code(gate)
        if input.dim() == 3:
            return ops.call_se_block(input.unsqueeze(0), w1, b1, w2, b2, act, self.version, gate).squeeze(0)
        return ops.call_se_block(input, w1, b1, w2, b2, act, self.version, gate)


def _torchvision_types() -> tuple:
    try:
        from torchvision.ops import SqueezeExcitation as TVSqueezeExcitation
    except ImportError:
        return ()
    return (TVSqueezeExcitation,)


def _unsupported(m: nn.Module, types: tuple) -> str | None:
    # A subclass with its own forward computes something else (torchvision's
    # QuantizableSqueezeExcitation multiplies through a FloatFunctional for
    # quantization): ours would silently drop that.
    if not any(isinstance(m, t) and type(m).forward is t.forward for t in types):
        return f"forward (it overrides {next(t.__name__ for t in types if isinstance(m, t))}.forward)"
    for attr, code in (("activation", ops.activation_code), ("scale_activation", ops.scale_activation_code)):
        try:
            code(getattr(m, attr))
        except (ValueError, AttributeError):
            return f"{attr} {getattr(m, attr, None)!r}"
    for name in ("fc1", "fc2"):
        conv = getattr(m, name, None)
        if not (isinstance(conv, nn.Conv2d) and conv.kernel_size == (1, 1) and conv.groups == 1
                and conv.bias is not None and conv.stride == (1, 1) and conv.padding == (0, 0)):
            return f"{name} {conv!r}"
    return None


def _swap(m: nn.Module, types: tuple, version: int) -> nn.Module:
    why = _unsupported(m, types)
    if why is not None:
        warnings.warn(f"se_module.convert: kept {type(m).__name__} with unsupported {why}")
        return m
    new = SqueezeExcitation(m.fc1.in_channels, m.fc1.out_channels, activation=lambda: m.activation,
                            scale_activation=lambda: m.scale_activation, version=version)
    # share the original submodules: same parameters (values, device, dtype, the
    # optimizer's references) and same hooks on them
    new.avgpool, new.fc1, new.fc2 = m.avgpool, m.fc1, m.fc2
    new.train(m.training)
    return new


def convert(model: nn.Module, types: tuple | None = None, version: int = ops.DEFAULT_VERSION) -> nn.Module:
    """Replace every torchvision ``SqueezeExcitation`` in ``model`` (in place) by
    ours, sharing its fc1/fc2 parameters; returns the model (or the new module if
    ``model`` itself is one). ``types`` overrides the classes to replace (default:
    torchvision.ops.SqueezeExcitation: EfficientNet's blocks (SiLU, Sigmoid) and
    MobileNetV3's (ReLU, Hardsigmoid) alike). Kept, with a warning: blocks whose
    activation is not ReLU/SiLU/Hardswish or whose scale activation is not
    Sigmoid/Hardsigmoid, and subclasses that override forward (torchvision's
    QuantizableSqueezeExcitation)."""
    if types is None:
        types = _torchvision_types()
        if not types:
            raise RuntimeError("se_module.convert: torchvision is not installed; pass types=(YourSEClass,)")
    types = tuple(t for t in types if t is not SqueezeExcitation)
    if isinstance(model, SqueezeExcitation):
        return model
    if isinstance(model, types):
        return _swap(model, types, version)
    for name, child in list(model.named_children()):
        if isinstance(child, SqueezeExcitation):  # already ours (a subclass of the reference class)
            continue
        if isinstance(child, types):
            setattr(model, name, _swap(child, types, version))
        else:
            convert(child, types, version)
    return model
