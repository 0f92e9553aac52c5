"""day50_attention: attention forward + backward as registered torch ops.

    from day50_attention import attention
    out = attention(q, k, v, causal=True)          # q (B, H, Nq, d), k/v (B, Hkv, Nk, d), Hkv divides H
    out.sum().backward()                           # dq, dk, dv through the op's backward

See ops.py for the backends ("auto", "fused", "naive").
"""
from .ops import (BACKENDS, attention, attention_backward, attention_forward, attention_varlen,
                  attention_varlen_backward, attention_varlen_forward, matmul)
from .hf import register_transformers
from .ops import kernel_versions

__all__ = ["BACKENDS", "attention", "attention_forward", "attention_backward", "attention_varlen",
           "attention_varlen_forward", "attention_varlen_backward", "matmul", "kernel_versions",
           "register_transformers"]
