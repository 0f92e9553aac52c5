"""LayerNorm module: a drop-in for torch.nn.LayerNorm backed by day26's kernels."""
from __future__ import annotations

import torch

from .ops import DEFAULT_VERSION, _as_shape, _fwd


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
