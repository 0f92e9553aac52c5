"""se_module: Squeeze-and-Excitation as registered torch ops (CPU + CUDA).

- ``ops``: the seed's stages (``global_avg_pool``, ``swish``, ``sigmoid``,
  ``excitation``), the fused block ``se_block`` and the stage pipeline
  ``se_block_staged``; all differentiable (torch.library.register_autograd) and
  traceable (torch.library.register_fake).
- ``SqueezeExcitation``: drop-in for ``torchvision.ops.SqueezeExcitation``.
- ``convert(model)``: swaps torchvision's SE blocks in a model for ours.
"""
from . import ops
from .nn import SqueezeExcitation, TorchvisionSqueezeExcitation, convert
from .ops import (
    DEFAULT_VERSION,
    VERSIONS,
    excitation,
    global_avg_pool,
    se_block,
    se_block_staged,
    sigmoid,
    swish,
)

__all__ = [
    "ops", "SqueezeExcitation", "TorchvisionSqueezeExcitation", "convert", "DEFAULT_VERSION", "VERSIONS", "excitation", "global_avg_pool", "se_block",
    "se_block_staged", "sigmoid", "swish",
]
