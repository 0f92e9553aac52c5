"""day26: LayerNorm forward + backward (dx, dweight, dbias) as registered torch ops.

    from day26_layernorm import layer_norm, LayerNorm
    y = layer_norm(x, (768,), weight, bias)          # like F.layer_norm, differentiable
    ln = LayerNorm(768).cuda()                        # drop-in for torch.nn.LayerNorm

Ops: torch.ops.day26.layer_norm_fwd / layer_norm_bwd (CPU and CUDA).
"""
from .nn import LayerNorm
from .ops import layer_norm, layer_norm_backward, layer_norm_forward

__all__ = ["layer_norm", "layer_norm_forward", "layer_norm_backward", "LayerNorm"]
