"""LayerNorm module: a drop-in for torch.nn.LayerNorm backed by day26's kernels."""
from __future__ import annotations

import torch

from .ops import layer_norm


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm with the forward and backward of day26.

    Same constructor (normalized_shape, eps, elementwise_affine, bias, device,
    dtype), same parameters (`weight`, `bias`) and state_dict, so it loads a
    torch.nn.LayerNorm's weights. `version` picks the kernels (1: the seed's, 2: registers, 3: cp.async pipeline, 4: row slots, the default).
    """

    def __init__(self, *args, version: int = 4, **kwargs):
        super().__init__(*args, **kwargs)
        self.version = version

    @classmethod
    def from_torch(cls, m: torch.nn.LayerNorm, version: int = 4) -> "LayerNorm":
        """A copy of `m` (same shape, eps, parameters) running on day26's kernels."""
        p = m.weight if m.weight is not None else None
        new = cls(m.normalized_shape, eps=m.eps, elementwise_affine=m.elementwise_affine,
                  bias=m.bias is not None, device=p.device if p is not None else None,
                  dtype=p.dtype if p is not None else None, version=version)
        new.load_state_dict(m.state_dict())
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps, self.version)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", version={self.version}"
