"""End-to-end model benchmark: a training step of real models with a day's ops swapped in.

Every day's bench.py adds `--models` with `add_args(parser)` and, when it is given, calls
`run(args, day, model_names, swaps)`; common imports no day: the day passes its swaps in.

Models (random init, nothing downloaded, configs built here):
  gpt2             GPT-2 small (12 layers, 768 wide, 12 heads, 1024 positions, dropout 0), batch 8 x 1024
                   tokens. transformers' GPT2LMHeadModel when transformers imports, else GPT2Plain
                   below (same sizes, same structure). On CPU a tiny size (2 layers, 64 wide, 2 x 32).
  llama            transformers' LlamaForCausalLM from a config (RMSNorm, RoPE, SwiGLU, grouped-query
                   attention): 4 layers, 1024 wide, 16 q heads over 4 kv heads of dim 64, batch 4 x 2048
                   tokens. On CPU a tiny size (2 layers, 64 wide, 4 q / 2 kv heads, 2 x 32).
  llama_packed     the same model fed one row of the same token count packed from documents of
                   different lengths (position_ids restart per document; the flash-style kwargs
                   cu_seq_lens_q/k and max_length_q/k are passed, as DataCollatorWithFlattening does).
  efficientnet_b0  torchvision, batch 128 at 224 x 224;  efficientnet_b4: batch 32 at 380 x 380.
                   Dropout and stochastic depth off (p = 0).

Swaps (a dict name -> Swap; several fields in one Swap apply together):
  layer_norm  nn.LayerNorm -> replacement module (e.g. day26_layernorm.LayerNorm.from_torch),
              applied to every nn.LayerNorm of the model.
  attention   (q, k, v, causal, scale) -> out, all (B, H, N, d) (k, v may have fewer heads than q:
              grouped-query attention). transformers: registered with AttentionInterface under its
              own name and set as config._attn_implementation (hf_attention); GPT2Plain: set as the
              model's attention function.
  hf_attention  the name of an implementation the day registered itself with transformers'
              AttentionInterface and AttentionMaskInterface (e.g. day50_attention.register_transformers()):
              the model runs it as a user would, masks and packed-sequence kwargs included.
  convert     model -> model (e.g. se_module.convert), for the CNNs.

Training step: forward + backward under bf16 autocast; loss = cross-entropy of the logits
(float) against random labels (next-token labels for GPT-2 are random tokens too); CNNs in
channels_last; no optimizer: parameter grads are set to None before each step (a step of
SGD would add the same kernels to every variant and measure nothing of ours).

Timing (CUDA): eager steps of every variant in interleaved rounds (each round runs every
variant for k steps after one warm-up step; a variant's figure is the median over rounds of
its round's median step time), CUDA events, no L2 flush (a step is tens of ms). GPU-only:
the step captured in a CUDA graph (warm-up on a side stream, static inputs, autocast's cast
cache off as graphs require) and its replays timed as rounds of time_us; one variant's graph
at a time so only one graph's memory pool is held. A capture that fails reports "-" and why.

Agreement: loss of each variant vs torch on the same weights and inputs (bf16); gradient
error = relative L2 over all parameter grads of the variant's bf16 step against an fp32 step
of the torch model (TF32 off), beside torch's own bf16 step against the same reference.

transformers and masks: the benchmark feeds one unpadded, unpacked sequence per row, so
GPT-2's mask is the plain causal one. In eager mode transformers sees that and passes no
mask (attention is causal); under CUDA-graph capture it cannot check (the check would sync)
and builds a full mask. Both the torch variant ("kc_sdpa": SDPA, is_causal) and each
swapped attention are registered with a mask function that passes no mask when there is no
padding mask, so graph and eager run the same attention. A mask that does reach the
attention is checked for being plain causal (outside capture); anything else falls back to
SDPA with the mask, and the count of such calls is reported in the table's note. llama_packed's torch variant is
transformers' own "sdpa", which builds the block-diagonal causal mask from position_ids (the mask
a user of SDPA gets for packed rows).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

AttnFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool, "float | None"], torch.Tensor]


def sdpa_attention(q, k, v, causal: bool, scale: float | None = None):
    """torch's attention in the swap signature: (B, H, N, d) in and out; k, v may have fewer heads."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=k.shape[1] != q.shape[1])


# --------------------------------------------------------------------------- GPT-2 in plain torch
@dataclass
class GPT2Size:
    n_layer: int = 12
    n_embd: int = 768
    n_head: int = 12
    n_positions: int = 1024
    vocab_size: int = 50257


SMALL = GPT2Size()
TINY = GPT2Size(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=97)


class _Attention(nn.Module):
    def __init__(self, s: GPT2Size):
        super().__init__()
        self.n_head = s.n_head
        self.c_attn = nn.Linear(s.n_embd, 3 * s.n_embd)
        self.c_proj = nn.Linear(s.n_embd, s.n_embd)
        self.attn_fn: AttnFn = sdpa_attention

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (t.view(b, n, self.n_head, c // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = self.attn_fn(q, k, v, True, None)
        return self.c_proj(y.transpose(1, 2).reshape(b, n, c))


class _Block(nn.Module):
    def __init__(self, s: GPT2Size):
        super().__init__()
        self.ln_1 = nn.LayerNorm(s.n_embd)
        self.attn = _Attention(s)
        self.ln_2 = nn.LayerNorm(s.n_embd)
        self.c_fc = nn.Linear(s.n_embd, 4 * s.n_embd)
        self.c_proj = nn.Linear(4 * s.n_embd, s.n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2Plain(nn.Module):
    """A GPT-2-style LM in plain torch (used when transformers is absent): token + position
    embedding, blocks of LN -> causal attention (SDPA) -> LN -> MLP (GELU), final LN, LM head
    tied to the token embedding. forward(idx) -> logits."""

    def __init__(self, s: GPT2Size = SMALL):
        super().__init__()
        self.size = s
        self.wte = nn.Embedding(s.vocab_size, s.n_embd)
        self.wpe = nn.Embedding(s.n_positions, s.n_embd)
        self.h = nn.ModuleList(_Block(s) for _ in range(s.n_layer))
        self.ln_f = nn.LayerNorm(s.n_embd)
        self.lm_head = nn.Linear(s.n_embd, s.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        for m in self.modules():  # GPT-2's init: N(0, 0.02), zero biases
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def set_attention(self, fn: AttnFn):
        for b in self.h:
            b.attn.attn_fn = fn

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for b in self.h:
            x = b(x)
        return self.lm_head(self.ln_f(x))


# --------------------------------------------------------------------------- transformers glue
def have_transformers() -> bool:
    try:
        import transformers  # noqa: F401
        from transformers import AttentionInterface  # noqa: F401
        return True
    except ImportError:
        return False


_MASK_REGISTERED: set = set()


def _register_mask_fn(name: str):
    """Register for `name` a mask function that passes no mask when there is no padding mask
    (the plain causal case; see the module docstring), and sdpa's otherwise."""
    if name in _MASK_REGISTERED:
        return
    try:
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:  # older transformers: masks come through and are checked in the attention
        return

    def mask_fn(*args, **kwargs):
        if kwargs.get("attention_mask") is None:
            return None
        return sdpa_mask(*args, **kwargs)

    AttentionMaskInterface.register(name, mask_fn)
    _MASK_REGISTERED.add(name)


def _is_plain_causal(mask: torch.Tensor, nq: int, nk: int) -> bool:
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return False  # cannot look at its values without a sync
    if mask.dim() < 2 or mask.shape[-2:] != (nq, nk) or nq != nk:
        return False
    allowed = mask if mask.dtype == torch.bool else mask == 0
    tril = torch.ones(nq, nk, dtype=torch.bool, device=mask.device).tril()
    return bool((allowed == tril).all())


def hf_attention(attn_fn: AttnFn, stats: dict | None = None):
    """An attention function for transformers.AttentionInterface from a swap-signature one:
    receives query, key, value as (B, H, N, d), returns (out as (B, N, H, d), None). Calls
    attn_fn with causal = module.is_causal when there is no mask or the mask is the plain
    causal one; any other mask falls back to SDPA with that mask (counted in stats)."""
    stats = {} if stats is None else stats

    def fn(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if dropout:
            raise ValueError("the model benchmark runs with dropout 0")
        if kwargs.get("cu_seq_lens_q") is not None:
            raise ValueError("packed sequences (cu_seq_lens_q/k): an attention swap of signature "
                             "(q, k, v, causal, scale) cannot honour them; register a varlen-aware implementation "
                             "and use Swap(hf_attention=...)")
        causal = bool(getattr(module, "is_causal", True)) and query.shape[2] > 1
        if attention_mask is None or (causal and _is_plain_causal(attention_mask, query.shape[2], key.shape[2])):
            out = attn_fn(query, key, value, causal, scaling)
            stats["swapped"] = stats.get("swapped", 0) + 1
        else:
            m = attention_mask
            if m.dtype != torch.bool and m.dtype != query.dtype:
                m = m.to(query.dtype)
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=m, scale=scaling,
                                                 enable_gqa=key.shape[1] != query.shape[1])
            stats["fallback"] = stats.get("fallback", 0) + 1
        return out.transpose(1, 2), None

    return fn


def set_hf_attention(model: nn.Module, name: str, attn_fn: AttnFn, stats: dict | None = None):
    """Route a transformers model's attention through attn_fn (registered as `name`)."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, hf_attention(attn_fn, stats))
    _register_mask_fn(name)
    model.config._attn_implementation = name


def use_hf_attention(model: nn.Module, name: str, stats: dict | None = None):
    """Run a transformers model with the implementation registered as `name` (its own mask function
    too), through a counting wrapper registered as "kc_count_<name>"."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    fns, masks = AttentionInterface._global_mapping, AttentionMaskInterface._global_mapping
    if name not in fns:
        raise ValueError(f"{name!r} is not registered with transformers' AttentionInterface")
    stats = {} if stats is None else stats
    inner = fns[name]

    def counted(*args, **kwargs):
        stats["swapped"] = stats.get("swapped", 0) + 1
        return inner(*args, **kwargs)

    alias = "kc_count_" + "".join(c if c.isalnum() else "_" for c in name)
    AttentionInterface.register(alias, counted)
    if name in masks:
        AttentionMaskInterface.register(alias, masks[name])
    model.config._attn_implementation = alias


# --------------------------------------------------------------------------- models
@dataclass
class Spec:
    """One model as the benchmark runs it."""
    name: str
    model: nn.Module
    make_inputs: Callable[[torch.Generator], tuple]  # generator -> (x, labels)
    forward: Callable[[nn.Module, torch.Tensor], torch.Tensor]  # -> logits
    kind: str  # "hf-gpt2", "hf-llama", "plain-gpt2", "cnn"
    desc: str


def _gpt2_sizes(device: torch.device):
    return (SMALL, 8, 1024) if device.type == "cuda" else (TINY, 2, 32)


def build_gpt2(device: torch.device, use_transformers: bool | None = None, size: GPT2Size | None = None,
               batch: int | None = None, seq: int | None = None) -> Spec:
    s, b, n = _gpt2_sizes(device)
    s, b, n = size or s, batch or b, seq or n
    if use_transformers is None:
        use_transformers = have_transformers()
    torch.manual_seed(0)
    if use_transformers:
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_layer=s.n_layer, n_embd=s.n_embd, n_head=s.n_head, n_positions=s.n_positions,
                         vocab_size=s.vocab_size, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         bos_token_id=0, eos_token_id=0, use_cache=False)
        model = GPT2LMHeadModel(cfg)
        # torch's attention under a registered name, so the graph capture sees no mask (docstring)
        set_hf_attention(model, "kc_sdpa", sdpa_attention)
        kind, fwd = "hf-gpt2", (lambda m, x: m(input_ids=x, use_cache=False).logits)
        import transformers
        desc = f"transformers {transformers.__version__} GPT2LMHeadModel"
    else:
        model = GPT2Plain(s)
        kind, fwd = "plain-gpt2", (lambda m, x: m(x))
        desc = "GPT-2-style model in plain torch (transformers absent)"
    model = model.to(device).train()

    def make_inputs(g):
        x = torch.randint(0, s.vocab_size, (b, n), generator=g, device="cpu").to(device)
        y = torch.randint(0, s.vocab_size, (b, n), generator=g, device="cpu").to(device)
        return x, y

    return Spec("gpt2", model, make_inputs, fwd, kind,
                f"{desc}: {s.n_layer} layers, {s.n_embd} wide, {s.n_head} heads; batch {b} x {n} tokens")


@dataclass
class LlamaSize:
    n_layer: int = 4
    hidden: int = 1024
    n_head: int = 16
    n_kv_head: int = 4
    head_dim: int = 64
    intermediate: int = 2816
    vocab_size: int = 32000
    max_positions: int = 4096


LLAMA = LlamaSize()
LLAMA_TINY = LlamaSize(n_layer=2, hidden=64, n_head=4, n_kv_head=2, head_dim=16, intermediate=128, vocab_size=97,
                       max_positions=64)


class PackedTokens:
    """One packed row as the model benchmark feeds it: input_ids (1, T), position_ids (1, T) that restart
    at each document, and the flash-style kwargs (cu_seq_lens int32 (docs + 1,), max_length)."""

    def __init__(self, ids: torch.Tensor, lengths: list[int]):
        self.ids = ids
        self.device = ids.device
        self.shape = ids.shape
        self.position_ids = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0).to(ids.device)
        cu = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        self.cu_seq_lens = cu.to(ids.device)
        self.max_length = max(lengths)
        self.lengths = lengths

    def kwargs(self) -> dict:
        return {"position_ids": self.position_ids, "cu_seq_lens_q": self.cu_seq_lens, "cu_seq_lens_k": self.cu_seq_lens,
                "max_length_q": self.max_length, "max_length_k": self.max_length}


def packed_lengths(total: int, g: torch.Generator, shortest: int = 16) -> list[int]:
    """Document lengths summing to total, drawn from g: between shortest and total / 2, the
    remainder as the last document."""
    out, left = [], total
    hi = max(shortest + 1, total // 2)
    while left > 0:
        n = min(left, int(torch.randint(shortest, hi, (1,), generator=g)))
        if left - n < shortest:
            n = left
        out.append(n)
        left -= n
    return out


def _llama_sizes(device: torch.device):
    return (LLAMA, 4, 2048) if device.type == "cuda" else (LLAMA_TINY, 2, 32)


def build_llama(device: torch.device, packed: bool = False, size: LlamaSize | None = None, batch: int | None = None,
                seq: int | None = None) -> Spec:
    """transformers' LlamaForCausalLM from a config (nothing downloaded). packed: one row of
    batch * seq tokens from documents of different lengths (PackedTokens)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    import transformers

    s, b, n = _llama_sizes(device)
    s, b, n = size or s, batch or b, seq or n
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=s.hidden, intermediate_size=s.intermediate, num_hidden_layers=s.n_layer,
                      num_attention_heads=s.n_head, num_key_value_heads=s.n_kv_head, head_dim=s.head_dim,
                      vocab_size=s.vocab_size, max_position_embeddings=s.max_positions, attention_dropout=0.0,
                      bos_token_id=0, eos_token_id=0, pad_token_id=0, use_cache=False, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    # unpacked rows: torch's attention under a registered name whose mask function passes no
    # mask (module docstring); packed: transformers' own sdpa, which builds the packed mask
    if packed:
        model.config._attn_implementation = "sdpa"
    else:
        set_hf_attention(model, "kc_sdpa", sdpa_attention)
    model = model.to(device).train()

    def make_inputs(g):
        if packed:
            lengths = packed_lengths(b * n, g)
            x = PackedTokens(torch.randint(0, s.vocab_size, (1, b * n), generator=g).to(device), lengths)
            y = torch.randint(0, s.vocab_size, (1, b * n), generator=g).to(device)
            return x, y
        x = torch.randint(0, s.vocab_size, (b, n), generator=g).to(device)
        y = torch.randint(0, s.vocab_size, (b, n), generator=g).to(device)
        return x, y

    def forward(m, x):
        if isinstance(x, PackedTokens):
            return m(input_ids=x.ids, use_cache=False, **x.kwargs()).logits
        return m(input_ids=x, use_cache=False).logits

    rows = f"1 packed row of {b * n} tokens" if packed else f"batch {b} x {n} tokens"
    desc = (f"transformers {transformers.__version__} LlamaForCausalLM: {s.n_layer} layers, {s.hidden} wide, "
            f"{s.n_head} q heads over {s.n_kv_head} kv heads of dim {s.head_dim}, RoPE, SwiGLU {s.intermediate}; "
            f"{rows}")
    return Spec("llama_packed" if packed else "llama", model, make_inputs, forward, "hf-llama", desc)


EFFNETS = {"efficientnet_b0": (128, 224), "efficientnet_b4": (32, 380)}


def no_dropout(model: nn.Module) -> nn.Module:
    """Dropout and stochastic depth off (p = 0), so every variant runs the same math."""
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) or type(m).__name__ == "StochasticDepth":
            m.p = 0.0
    return model


def build_efficientnet(name: str, device: torch.device, batch: int | None = None,
                       size: int | None = None) -> Spec:
    import torchvision

    b, hw = EFFNETS[name]
    b, hw = batch or b, size or hw
    torch.manual_seed(0)
    model = no_dropout(getattr(torchvision.models, name)(weights=None))
    model = model.to(device).to(memory_format=torch.channels_last).train()

    def make_inputs(g):
        x = torch.randn(b, 3, hw, hw, generator=g).to(device).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (b,), generator=g).to(device)
        return x, y

    return Spec(name, model, make_inputs, lambda m, x: m(x), "cnn",
                f"torchvision {torchvision.__version__} {name}: batch {b} at {hw} x {hw}, channels_last")


def cnn_spec(name: str, model: nn.Module, inputs_shape: tuple, classes: int, device) -> Spec:
    """Any classification model as a Spec (used by the tests with a small CNN)."""
    model = no_dropout(model).to(device).to(memory_format=torch.channels_last).train()

    def make_inputs(g):
        x = torch.randn(*inputs_shape, generator=g).to(device).contiguous(memory_format=torch.channels_last)
        return x, torch.randint(0, classes, (inputs_shape[0],), generator=g).to(device)

    return Spec(name, model, make_inputs, lambda m, x: m(x), "cnn", name)


def build(name: str, device: torch.device) -> Spec:
    if name == "gpt2":
        return build_gpt2(device)
    if name in ("llama", "llama_packed"):
        return build_llama(device, packed=name == "llama_packed")
    if name in EFFNETS:
        return build_efficientnet(name, device)
    raise ValueError(f"unknown model {name!r}: gpt2, llama, llama_packed, " + ", ".join(EFFNETS))


# --------------------------------------------------------------------------- swaps
@dataclass
class Swap:
    layer_norm: Callable[[nn.LayerNorm], nn.Module] | None = None
    attention: AttnFn | None = None
    convert: Callable[[nn.Module], nn.Module] | None = None
    hf_attention: str | None = None


def swap_layer_norms(model: nn.Module, fn: Callable[[nn.LayerNorm], nn.Module]) -> int:
    """Replace every nn.LayerNorm below model (in place) by fn(module); returns the count."""
    n = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.LayerNorm:  # exactly torch's: a replacement may subclass it
                setattr(parent, name, fn(child))
                n += 1
    return n


def apply_swap(spec: Spec, model: nn.Module, name: str, swap: Swap, stats: dict) -> nn.Module:
    """A swapped copy's setup, in place: returns the model to run. Raises where a swap does
    not fit the model (e.g. a LayerNorm swap on a model without LayerNorm)."""
    if swap.layer_norm is not None:
        if swap_layer_norms(model, swap.layer_norm) == 0:
            raise ValueError(f"{name}: no nn.LayerNorm in {spec.name}")
    if swap.hf_attention is not None:
        if not spec.kind.startswith("hf-"):
            raise ValueError(f"{name}: a transformers attention swap does not apply to {spec.name}")
        use_hf_attention(model, swap.hf_attention, stats)
    if swap.attention is not None:
        if spec.kind in ("hf-gpt2", "hf-llama"):
            set_hf_attention(model, "kc_" + "".join(c if c.isalnum() else "_" for c in name), swap.attention, stats)
        elif spec.kind == "plain-gpt2":
            fn = swap.attention

            def counted(q, k, v, causal, scale):
                stats["swapped"] = stats.get("swapped", 0) + 1
                return fn(q, k, v, causal, scale)

            model.set_attention(counted)
        else:
            raise ValueError(f"{name}: an attention swap does not apply to {spec.name}")
    if swap.convert is not None:
        model = swap.convert(model)
    return model


# --------------------------------------------------------------------------- the step
def make_step(spec: Spec, model: nn.Module, x, y, amp: bool = True, cache: bool = True):
    """fwd + bwd of one training step; grads are NOT cleared here (callers set them to None)."""
    dev = x.device.type  # a tensor or PackedTokens

    def step():
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=amp, cache_enabled=cache):
            logits = spec.forward(model, x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        return loss

    return step


def clear_grads(model: nn.Module):
    for p in model.parameters():
        p.grad = None


def run_step(spec, model, x, y, amp=True):
    clear_grads(model)
    loss = make_step(spec, model, x, y, amp)()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    clear_grads(model)
    return loss.item(), grads


class _NoTF32:
    def __enter__(self):
        self.s = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def __exit__(self, *a):
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.s


def grad_rel_err(g: dict, ref: dict) -> float:
    """Relative L2 error over all parameter grads: ||g - ref|| / ||ref|| (names must match)."""
    if set(g) != set(ref):
        missing = sorted(set(ref) ^ set(g))[:3]
        raise ValueError(f"grads of different parameters: {missing}")
    num = sum(float((g[n].double() - ref[n].double()).pow(2).sum()) for n in ref)
    den = sum(float(ref[n].double().pow(2).sum()) for n in ref)
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


# --------------------------------------------------------------------------- timing
def _require_cuda(what: str):
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} needs CUDA")


def time_eager_rounds(steps: dict, rounds: int, k: int) -> dict:
    """steps: name -> callable (a whole step, grads cleared inside). Interleaved rounds:
    each round runs every variant for one warm-up step then k timed steps; returns
    name -> median over rounds of the round's median step time (ms)."""
    _require_cuda("time_eager_rounds")
    from . import bench

    per = {n: [] for n in steps}
    for _ in range(rounds):
        for n, fn in steps.items():
            per[n].append(bench.time_us(fn, warmup=1, rep=k, flush_l2=False, max_ms=1e9) / 1e3)
    return {n: statistics.median(v) for n, v in per.items()}


def time_graph(spec, model, x, y, rounds: int, k: int) -> float:
    """GPU time (ms) of one fwd + bwd step replayed from a CUDA graph: median over rounds
    of each round's median replay time. Raises if the step cannot be captured."""
    _require_cuda("time_graph")
    from . import bench

    fb = make_step(spec, model, x, y, amp=True, cache=False)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            clear_grads(model)
            fb()
    torch.cuda.current_stream().wait_stream(side)
    clear_grads(model)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fb()
        meds = [bench.time_us(graph.replay, warmup=1, rep=k, flush_l2=False, max_ms=1e9) / 1e3
                for _ in range(rounds)]
    finally:
        del graph
        clear_grads(model)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return statistics.median(meds)


# --------------------------------------------------------------------------- one model
COLS = ["model", "variant", "eager ms", "eager speedup", "GPU-only ms", "GPU-only speedup", "loss diff",
        "grad err ours", "grad err torch", "note"]


def _short(e: BaseException) -> str:
    s = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    return s[:140]


def _add_note(row: dict, msg: str):
    row["note"] = f"{row['note']}; {msg}" if row.get("note") else msg


def bench_model(spec: Spec, swaps: dict, rounds: int = 5, k: int = 10, timing: bool | None = None,
                log=print) -> list[dict]:
    """Rows (one per variant: "torch" then each swap) for one model: eager and GPU-only step
    times with speedups vs torch, loss diff vs torch and gradient errors vs an fp32 step."""
    dev = next(spec.model.parameters()).device
    timing = dev.type == "cuda" if timing is None else timing
    g = torch.Generator().manual_seed(1234)
    x, y = spec.make_inputs(g)
    variants, notes, stats = {"torch": spec.model}, {}, {}
    for name, swap in swaps.items():
        stats[name] = {}
        try:
            variants[name] = apply_swap(spec, copy.deepcopy(spec.model), name, swap, stats[name])
        except Exception as e:  # a swap that does not fit is reported, the others still run
            notes[name] = _short(e)
            log(f"   {spec.name} / {name}: swap failed: {notes[name]}")
    rows = {n: {"model": spec.name, "variant": n} for n in [*variants, *notes]}
    for n, msg in notes.items():
        rows[n]["note"] = "swap failed: " + msg

    # agreement: fp32 reference of the torch model, then each variant's bf16 step
    with _NoTF32():
        _, ref = run_step(spec, spec.model, x, y, amp=False)
    base_loss, base_err = None, None
    for n, m in variants.items():
        try:
            loss, grads = run_step(spec, m, x, y, amp=True)
            err = grad_rel_err(grads, ref)
            if n == "torch":
                base_loss, base_err = loss, err
            rows[n].update({"loss": loss, "loss diff": abs(loss - base_loss), "grad err ours": err,
                            "grad err torch": base_err})
            del grads
        except Exception as e:
            rows[n]["note"] = "step failed: " + _short(e)
            log(f"   {spec.name} / {n}: step failed: {rows[n]['note']}")
    del ref
    for n, swap in swaps.items():  # e.g. a transformers version whose GPT-2 ignores AttentionInterface
        if ((swap.attention is not None or swap.hf_attention is not None) and n in variants and "note" not in rows[n]
                and not stats[n].get("swapped")):
            rows[n]["note"] = "attention swap never called: not timed"
            log(f"   {spec.name} / {n}: {rows[n]['note']}")
    ok = {n: m for n, m in variants.items() if "note" not in rows[n]}
    if timing and ok:
        steps = {}
        for n, m in ok.items():
            fb = make_step(spec, m, x, y)

            def whole(m=m, fb=fb):
                clear_grads(m)
                fb()

            steps[n] = whole
        try:
            eager = time_eager_rounds(steps, rounds, k)
        except Exception as e:  # e.g. out of memory: the rows keep their agreement figures
            eager = {}
            for n in ok:
                rows[n]["note"] = "eager timing: " + _short(e)
            log(f"   {spec.name}: eager timing failed: {_short(e)}")
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        for n, t in eager.items():
            rows[n]["eager ms"] = t
            rows[n]["eager speedup"] = eager["torch"] / t if "torch" in eager else None
        for n, m in ok.items():
            try:
                rows[n]["GPU-only ms"] = time_graph(spec, m, x, y, rounds, k)
            except Exception as e:
                _add_note(rows[n], "graph: " + _short(e))
                if isinstance(e, torch.OutOfMemoryError):
                    torch.cuda.empty_cache()
                log(f"   {spec.name} / {n}: CUDA graph failed: {_short(e)}")
            t0 = rows["torch"].get("GPU-only ms")
            if rows[n].get("GPU-only ms") and t0:
                rows[n]["GPU-only speedup"] = t0 / rows[n]["GPU-only ms"]
    elif not timing:
        for r in rows.values():
            r.setdefault("note", "not timed: " + ("on CPU" if dev.type != "cuda" else "timing off"))
    for n, st in stats.items():
        if st.get("fallback"):
            _add_note(rows[n], f"attention fell back to SDPA in {st['fallback']} of "
                               f"{st['fallback'] + st.get('swapped', 0)} calls")
    return list(rows.values())


# --------------------------------------------------------------------------- bench.py glue
def _display(r: dict) -> dict:
    """Errors in scientific notation (format_table would print 3e-5 as 0.000)."""
    d = dict(r)
    for c in ("loss diff", "grad err ours", "grad err torch"):
        if isinstance(d.get(c), float):
            d[c] = f"{d[c]:.1e}"
    return d


def add_args(p: argparse.ArgumentParser):
    """--models (only the model section), --model-names, --model-rounds; adds --quick if absent."""
    p.add_argument("--models", action="store_true",
                   help="run only the end-to-end model benchmark (a training step with our ops swapped in)")
    p.add_argument("--model-names", default=None, help="comma-separated subset of the day's models")
    p.add_argument("--model-rounds", type=int, default=None, help="interleaved timing rounds (default 7, quick 3)")
    if "--quick" not in p._option_string_actions:
        p.add_argument("--quick", action="store_true", help="fewer rounds")


def run(args, day: str, model_names: list[str], swaps: dict, out: str | None = None, log=print,
        device: torch.device | None = None) -> list[dict]:
    """The model section of a day's bench: builds each model, benchmarks torch and every swap,
    prints the table and writes <out>.md and <out>.json (out defaults to args.out + "_models")."""
    from . import bench

    dev = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    quick = bool(getattr(args, "quick", False))
    rounds = args.model_rounds or (3 if quick else 7)
    k = 5 if quick else 10
    if getattr(args, "model_names", None):
        model_names = [m for m in args.model_names.split(",") if m]
    meta = bench.device_meta() if dev.type == "cuda" else {"device": "cpu", "torch": torch.__version__,
                                                            "date": time.strftime("%Y-%m-%d")}
    rows, descs = [], []
    t_start = time.time()
    for name in model_names:
        t0 = time.time()
        try:
            spec = build(name, dev)
        except ImportError as e:  # e.g. torchvision absent: a row says so
            rows.append({"model": name, "variant": "-", "note": f"not run: {_short(e)}"})
            log(f"   {name}: not run ({_short(e)})")
            continue
        descs.append(f"- {name}: {spec.desc}")
        try:
            rows += bench_model(spec, swaps, rounds, k, log=log)
        except Exception as e:  # one model's failure (e.g. out of memory) leaves the others to run
            traceback.print_exc()
            rows.append({"model": name, "variant": "-", "note": f"failed: {_short(e)}"})
        del spec
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        log(f"   {name}: done in {time.time() - t0:.0f} s")
    head = (f"## {day}: training step of real models, our ops swapped in ({meta['device']}, {meta['date']}, "
            f"torch {meta['torch']})\n\n" + "\n".join(descs) + "\n\n"
            f"One step = forward + backward, bf16 autocast, cross-entropy on random labels, grads set to None "
            f"(no optimizer). eager ms: median over {rounds} interleaved rounds of each round's median of {k} "
            f"steps; GPU-only ms: the step replayed from a CUDA graph (GPU time alone); speedup = torch / variant. "
            f"loss diff: |loss - torch's loss| (bf16, same weights and inputs); grad err: relative L2 of all "
            f"parameter grads of the bf16 step against an fp32 step of the torch model (TF32 off), ours beside "
            f"torch's own bf16 error. Wall time {time.time() - t_start:.0f} s.\n")
    text = head + "\n" + bench.format_table([_display(r) for r in rows], COLS) + "\n"
    stem = out or (getattr(args, "out", None) or f"bench_out/{day}") + "_models"
    Path(stem).parent.mkdir(parents=True, exist_ok=True)
    Path(stem + ".md").write_text(text)
    with open(stem + ".json", "w") as f:
        json.dump({"title": f"{day} model benchmark", "meta": meta, "columns": COLS, "rows": rows}, f, indent=1,
                  default=str)
    print(text)
    return rows
