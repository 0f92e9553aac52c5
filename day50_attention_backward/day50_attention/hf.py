"""day50 attention inside Hugging Face transformers: one call, then attn_implementation="day50".

    import day50_attention
    day50_attention.register_transformers()
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="day50")

What the registered function does with what transformers passes it (query, key, value as
(B, H, N, d) with k and v keeping their own, fewer heads under grouped-query attention; they
are never repeated):
  - no mask: attention(), causal as the module says (a single query row sees every key);
  - packed rows (batch 1; cu_seq_lens_q/k and max_length_q/k, as DataCollatorWithFlattening
    passes them to flash-style implementations, or position_ids that restart, read on the
    host): attention_varlen over the documents;
  - a padding mask (transformers builds the (B, Nk) boolean one for this name, as for
    flash-attn): the rows are unpacked to their tokens, run through attention_varlen and
    scattered back (padded query rows get zeros);
  - Nq != Nk with causal or a window (chunked prefill, decoding with a cache): attention_varlen,
    whose causal mask aligns bottom-right like flash-attn's;
  - sliding_window and softcap (Mistral, Gemma 2) become window and softcap.
Anything it cannot honour raises (a 4-D or block mask, dropout, attention sinks): a mask is
never ignored.
"""
from __future__ import annotations

import torch

from . import ops

NAME = "day50"


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _extras(sliding_window, softcap) -> dict:
    """window / softcap keyword arguments of attention() and attention_varlen()."""
    kw = {}
    if sliding_window is not None:
        w = int(sliding_window)
        kw["window"] = (w - 1, w - 1)  # transformers' rule for flash-attn: w keys back, the query's own included
    if softcap:
        kw["softcap"] = float(softcap)
    return kw


def _varlen(q, k, v, cu_q, cu_k, max_q: int, max_k: int, causal: bool, scale, extras: dict):
    """q (T, H, d), k, v (Tk, Hk, d) -> (T, H, d)."""
    return ops.attention_varlen(q, k, v, cu_q.to(torch.int32), cu_k.to(torch.int32), int(max_q), int(max_k),
                                causal=causal, scale=scale, **extras)


def _cu_from_positions(position_ids: torch.Tensor):
    """cu_seqlens and the longest length of one packed row whose positions restart at 0 for each
    document (flash-attn's rule in transformers). Reads the positions on the host."""
    if _capturing():
        raise RuntimeError("day50 attention in transformers: packed rows under CUDA-graph capture need "
                           "cu_seq_lens_q/k and max_length_q/k (the boundaries cannot be read from position_ids "
                           "without a sync)")
    pos = position_ids.reshape(-1)
    starts = torch.nonzero(pos == 0).reshape(-1)
    if starts.numel() == 0 or int(starts[0]) != 0:
        raise ValueError("day50 attention in transformers: packed position_ids must start each document at 0")
    cu = torch.cat([starts, starts.new_tensor([pos.numel()])]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())


def _is_packed(position_ids, batch: int) -> bool:
    """transformers' test for packed rows without cu_seq_lens: one row whose positions are not
    0, 1, 2, ... (reads them on the host, as transformers does for flash-attn)."""
    if position_ids is None or batch != 1 or position_ids.shape[-1] == 1:
        return False
    if _capturing():
        raise RuntimeError("day50 attention in transformers: a batch of one row under CUDA-graph capture needs "
                           "cu_seq_lens_q/k and max_length_q/k if it is packed (position_ids cannot be read without "
                           "a sync); pass them, or a batch of more than one row")
    ref = torch.arange(position_ids.shape[-1], device=position_ids.device) + position_ids.min()
    return bool((position_ids.reshape(-1) != ref).any())


def _padded(query, key, value, mask: torch.Tensor, causal: bool, scale, extras: dict):
    """Rows with padding (mask (B, Nk), True = token): unpack the tokens, attend per row, pack back."""
    if _capturing():
        raise RuntimeError("day50 attention in transformers: padding masks are read on the host; "
                           "not under CUDA-graph capture")
    b, h, nq, d = query.shape
    nk = key.shape[2]
    if mask.dim() != 2 or mask.shape != (b, nk):
        raise ValueError(f"day50 attention in transformers: a padding mask must be (B, Nk) = ({b}, {nk}), "
                         f"got {tuple(mask.shape)}")
    mask = mask.to(torch.bool)
    qmask = mask[:, -nq:]
    len_q, len_k = qmask.sum(1, dtype=torch.int32), mask.sum(1, dtype=torch.int32)
    zero = len_q.new_zeros(1)
    cu_q, cu_k = torch.cat([zero, len_q.cumsum(0, dtype=torch.int32)]), torch.cat([zero, len_k.cumsum(0, dtype=torch.int32)])
    iq, ik = qmask.reshape(-1).nonzero().reshape(-1), mask.reshape(-1).nonzero().reshape(-1)
    q = query.transpose(1, 2).reshape(b * nq, h, d).index_select(0, iq)
    k = key.transpose(1, 2).reshape(b * nk, key.shape[1], d).index_select(0, ik)
    v = value.transpose(1, 2).reshape(b * nk, value.shape[1], d).index_select(0, ik)
    o = _varlen(q, k, v, cu_q, cu_k, int(len_q.max()), int(len_k.max()), causal, scale, extras)
    out = o.new_zeros(b * nq, h, d).index_copy(0, iq, o)
    return out.view(b, nq, h, d)


def attention_hf(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
                 dropout: float = 0.0, scaling: float | None = None, sliding_window: int | None = None,
                 softcap: float | None = None, is_causal: bool | None = None, **kwargs):
    """transformers' attention-function signature: returns (out (B, Nq, H, d), None)."""
    if dropout:
        raise NotImplementedError(f"day50 attention has no dropout (got {dropout}); set the model's attention_dropout "
                                  "to 0 or use another implementation for training with it")
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("day50 attention has no attention sinks (s_aux)")
    if attention_mask is not None and (not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2):
        raise NotImplementedError("day50 attention in transformers takes no mask but a (B, Nk) padding mask; got "
                                  f"{type(attention_mask).__name__} of {getattr(attention_mask, 'dim', lambda: '?')()} "
                                  "dimensions (a custom mask): use sdpa or flex_attention for it")
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    extras = _extras(sliding_window, softcap)
    b, h, nq, d = query.shape
    nk = key.shape[2]
    if attention_mask is not None:
        return _padded(query, key, value, attention_mask, causal, scaling, extras), None

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None or cu_k is not None or _is_packed(kwargs.get("position_ids"), b):
        if b != 1:
            raise ValueError(f"day50 attention in transformers: packed sequences come as one row, got batch {b}")
        if cu_q is not None and cu_k is not None:
            max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
            if max_q is None or max_k is None:
                raise ValueError("day50 attention in transformers: cu_seq_lens_q/k need max_length_q/k")
        elif cu_q is None and cu_k is None:
            cu_q, max_q = _cu_from_positions(kwargs["position_ids"])
            cu_k, max_k = cu_q, max_q
        else:
            raise ValueError("day50 attention in transformers: pass both cu_seq_lens_q and cu_seq_lens_k")
        o = _varlen(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1), cu_q, cu_k,
                    max_q, max_k, causal, scaling, extras)
        return o.unsqueeze(0), None

    if nq != nk and nq > 1 and (causal or extras.get("window")):
        # the causal or window mask must align bottom-right (the last query sees the last key)
        cu_q = torch.arange(0, (b + 1) * nq, nq, dtype=torch.int32, device=query.device)
        cu_k = torch.arange(0, (b + 1) * nk, nk, dtype=torch.int32, device=query.device)
        o = _varlen(query.transpose(1, 2).reshape(b * nq, h, d), key.transpose(1, 2).reshape(b * nk, -1, d),
                    value.transpose(1, 2).reshape(b * nk, -1, d), cu_q, cu_k, nq, nk, causal, scaling, extras)
        return o.view(b, nq, h, d), None
    if nq == 1 and extras.get("window") and nk > 1:
        cu_q = torch.arange(0, b + 1, dtype=torch.int32, device=query.device)
        cu_k = torch.arange(0, (b + 1) * nk, nk, dtype=torch.int32, device=query.device)
        o = _varlen(query.transpose(1, 2).reshape(b, h, d), key.transpose(1, 2).reshape(b * nk, -1, d),
                    value.transpose(1, 2).reshape(b * nk, -1, d), cu_q, cu_k, 1, nk, causal, scaling, extras)
        return o.view(b, 1, h, d), None
    out = ops.attention(query, key, value, causal=causal and nq > 1, scale=scaling, **extras)
    return out.transpose(1, 2), None


def padding_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                 mask_function=None, attention_mask: torch.Tensor | None = None, **kwargs):
    """The mask transformers builds for this name: None without padding, else the (B, Nk) boolean
    padding mask (flash-attn's rule: attention_hf applies causality and windows itself)."""
    if attention_mask is None:
        return None
    attention_mask = attention_mask[:, -kv_length:]
    if attention_mask.shape[1] == kv_length and not _capturing() and bool(attention_mask.all()):
        return None
    return attention_mask


def register_transformers(name: str = NAME) -> str:
    """Register day50 with transformers' AttentionInterface (and its mask function with
    AttentionMaskInterface) under `name`; afterwards attn_implementation=name (or
    model.set_attn_implementation(name)) routes every attention layer through day50.
    Returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, attention_hf)
    AttentionMaskInterface.register(name, padding_mask)
    return name
