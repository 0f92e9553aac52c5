"""day26: LayerNorm forward + backward (dx, dweight, dbias) as registered torch ops.

    from day26_layernorm import layer_norm, LayerNorm
    y = layer_norm(x, (768,), weight, bias)          # like F.layer_norm, differentiable
    ln = LayerNorm(768).cuda()                        # drop-in for torch.nn.LayerNorm
    y = rms_norm(x, (768,), weight)                   # like F.rms_norm; RMSNorm: torch.nn.RMSNorm
    model = convert(model)                            # swaps LayerNorm / RMSNorm (and transformers')
    y, s = add_norm(x, residual, weight, kind="rms")  # (norm(x + residual), x + residual), one pass

Ops: torch.ops.day26.layer_norm_fwd / _bwd, rms_norm_fwd / _bwd, add_norm_fwd / _bwd (CPU and CUDA).
"""
from .nn import LayerNorm, RMSNorm, convert
from .ops import (add_norm, add_norm_backward, add_norm_forward, layer_norm, layer_norm_backward, layer_norm_forward,
                  rms_norm, rms_norm_backward, rms_norm_forward)

__all__ = ["layer_norm", "layer_norm_forward", "layer_norm_backward", "LayerNorm", "rms_norm", "rms_norm_forward",
           "rms_norm_backward", "RMSNorm", "add_norm", "add_norm_forward", "add_norm_backward", "convert"]
