"""LayerNorm and RMSNorm modules (drop-ins for torch's) backed by day26's kernels, and convert()."""
from __future__ import annotations

import warnings

import torch

from .ops import DEFAULT_VERSION, _as_shape, _fwd, _rms_fwd, rms_eps, rms_weight


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm with the forward and backward of day26.

    Same constructor (normalized_shape, eps, elementwise_affine, bias, device,
    dtype), same parameters (`weight`, `bias`) and state_dict, so it loads a
    torch.nn.LayerNorm's weights. `version` picks the CUDA kernels (0: auto, the
    default; 1: the seed's, 2: registers, 3: cp.async pipeline, 4: row slots, 5:
    copy-engine ring, 6: cluster split; see day26_layernorm.layer_norm).
    """

    def __init__(self, *args, version: int = DEFAULT_VERSION, **kwargs):
        super().__init__(*args, **kwargs)
        self.version = version
        self._nshape = _as_shape(self.normalized_shape)  # the op's int[] argument, built once

    @classmethod
    def from_torch(cls, m: torch.nn.LayerNorm, version: int = DEFAULT_VERSION) -> "LayerNorm":
        """A copy of `m` (same shape, eps, parameters) running on day26's kernels."""
        p = m.weight if m.weight is not None else None
        new = cls(m.normalized_shape, eps=m.eps, elementwise_affine=m.elementwise_affine,
                  bias=m.bias is not None, device=p.device if p is not None else None,
                  dtype=p.dtype if p is not None else None, version=version)
        new.load_state_dict(m.state_dict())
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _fwd(x, self._nshape, self.weight, self.bias, self.eps, self.version)[0]

    def extra_repr(self) -> str:
        return super().extra_repr() + f", version={self.version}"


def _is_hf_rms_norm(m: torch.nn.Module) -> bool:
    """transformers' RMSNorm classes (LlamaRMSNorm, MistralRMSNorm, ...): a `weight`
    of one dimension and a `variance_epsilon`, the math computed in fp32 and the
    normalised value cast back to the input dtype before the weight multiplies it.
    Some variants differ (Gemma's 1 + weight, OLMo's no weight); those are named
    in _HF_UNSUPPORTED and kept."""
    return (type(m).__name__.endswith("RMSNorm") and hasattr(m, "variance_epsilon")
            and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 1
            and type(m).__name__ not in _HF_UNSUPPORTED)


# transformers RMSNorms whose math is not weight * x / rms(x) (kept by convert).
_HF_UNSUPPORTED = {"GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm", "Qwen3NextRMSNorm", "T5LayerNorm"}


class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm with the forward and backward of day26 (the LayerNorm
    kernels without centring or bias).

    Same constructor (normalized_shape, eps=None, elementwise_affine, device,
    dtype), same `weight` and state_dict. eps=None: as torch (float32's epsilon,
    float64's for float64 input). `version` as LayerNorm's.
    """

    def __init__(self, *args, version: int = DEFAULT_VERSION, **kwargs):
        super().__init__(*args, **kwargs)
        self.version = version
        self._nshape = _as_shape(self.normalized_shape)
        # transformers' RMSNorm returns weight * x_normed.to(x.dtype): with an fp32
        # weight and 16-bit x, an fp32 result (type promotion); from_torch sets this.
        self._promote_output = False

    @classmethod
    def from_torch(cls, m: torch.nn.Module, version: int = DEFAULT_VERSION) -> "RMSNorm":
        """A copy of `m` (torch.nn.RMSNorm, or transformers' RMSNorm classes with
        `weight` and `variance_epsilon` such as LlamaRMSNorm) on day26's kernels,
        sharing nothing: parameters copied."""
        if isinstance(m, torch.nn.RMSNorm):
            w = m.weight
            new = cls(m.normalized_shape, eps=m.eps, elementwise_affine=m.elementwise_affine,
                      device=w.device if w is not None else None, dtype=w.dtype if w is not None else None,
                      version=version)
            new.load_state_dict(m.state_dict())
            return new
        if _is_hf_rms_norm(m):
            w = m.weight
            new = cls(tuple(w.shape), eps=float(m.variance_epsilon), device=w.device, dtype=w.dtype,
                      version=version)
            with torch.no_grad():
                new.weight.copy_(w)
            new.weight.requires_grad_(w.requires_grad)
            new._promote_output = True
            return new
        raise TypeError(f"RMSNorm.from_torch: expected torch.nn.RMSNorm or a transformers RMSNorm "
                        f"(weight + variance_epsilon), got {type(m).__name__}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _rms_fwd(x, self._nshape, rms_weight(x, self.weight), rms_eps(x, self.eps), self.version)[0]
        if self._promote_output and self.weight is not None and self.weight.dtype != x.dtype:
            return y.to(torch.promote_types(self.weight.dtype, x.dtype))
        return y

    def extra_repr(self) -> str:
        return super().extra_repr() + f", version={self.version}"


def convert(model: torch.nn.Module, version: int = DEFAULT_VERSION) -> torch.nn.Module:
    """Replace every torch.nn.LayerNorm, torch.nn.RMSNorm and transformers RMSNorm
    (see RMSNorm.from_torch) in `model`, in place, by day26's (parameters copied
    onto the module's device and dtype); returns the model, or the new module if
    `model` itself is one. Kept, with a warning: transformers RMSNorm variants
    whose math differs (Gemma's 1 + weight and others in _HF_UNSUPPORTED)."""
    new = _swap(model, version)
    if new is not None:
        return new
    for name, child in list(model.named_children()):
        swapped = _swap(child, version)
        if swapped is not None:
            setattr(model, name, swapped)
        else:
            convert(child, version)
    return model


def _swap(m: torch.nn.Module, version: int):
    if isinstance(m, (LayerNorm, RMSNorm)):
        return None
    if type(m) is torch.nn.LayerNorm:
        return LayerNorm.from_torch(m, version)
    if type(m) is torch.nn.RMSNorm or _is_hf_rms_norm(m):
        return RMSNorm.from_torch(m, version)
    if type(m).__name__ in _HF_UNSUPPORTED or (isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm))):
        warnings.warn(f"day26_layernorm.convert: kept {type(m).__name__} (its forward is not plain "
                      f"LayerNorm/RMSNorm)", stacklevel=3)
    return None
