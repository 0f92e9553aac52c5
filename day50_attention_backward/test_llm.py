"""Tests of day50_attention as LLM training uses it (imported by test.py; runs alone too):

- autocast: float32 q, k and bfloat16 v (a transformers Llama after RoPE) under autocast run
  the op in the autocast dtype, as SDPA does, on CPU and CUDA (the fused kernels on CUDA);
  outside autocast mixed dtypes are an error;
- devices: any mix of cpu, cuda and meta among the tensors is an error naming the devices;
- transformers: register_transformers() and attn_implementation="day50" on a tiny Llama
  match SDPA's logits and gradients (causal, grouped-query, padding, packed rows), and
  what it cannot honour raises.
"""
import itertools
import os
import sys

from kernel_common import testing  # noqa: F401  (sets the output poisoning first)
from kernel_common.testing import DEVICES, HAS_CUDA, requires_cuda

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import day50_attention as da  # noqa: E402

HAS_TRANSFORMERS, _why = testing.optional_available("transformers")
requires_transformers = pytest.mark.skipif(not HAS_TRANSFORMERS, reason=f"transformers: {_why}")


def _llama_inputs(device, b=2, hq=4, hk=2, n=33, d=64, seed=0):
    """q, k as float32 and v as bfloat16, as a Llama's attention gets them under bf16 autocast."""
    g = torch.Generator().manual_seed(seed)
    q = testing.fresh(b, hq, n, d, device=device, gen=g).requires_grad_()
    k = testing.fresh(b, hk, n, d, device=device, gen=g).requires_grad_()
    v = testing.fresh(b, hk, n, d, device=device, gen=g).to(torch.bfloat16).requires_grad_()
    do = testing.fresh(b, hq, n, d, device=device, gen=g).to(torch.bfloat16)
    return q, k, v, do


# --------------------------------------------------------------------------- autocast
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
def test_autocast_casts_like_sdpa(device, causal):
    q, k, v, do = _llama_inputs(device)
    # on CUDA, backend="fused" proves the tensor-core kernels run: they take no float32
    backend = "fused" if device == "cuda" else "auto"
    with torch.autocast(device, dtype=torch.bfloat16):
        out = da.attention(q, k, v, causal=causal, backend=backend)
        ref_lowp = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    assert out.dtype == ref_lowp.dtype == torch.bfloat16
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
    tq, tk, tv = torch.autograd.grad(ref_lowp, (q, k, v), do)
    # gradients reach the inputs in their own dtypes, through the casts
    assert (dq.dtype, dk.dtype, dv.dtype) == (torch.float32, torch.float32, torch.bfloat16)
    assert (dq.dtype, dk.dtype, dv.dtype) == (tq.dtype, tk.dtype, tv.dtype)
    # both against the float64 result of the bf16-rounded inputs (what autocast computes with)
    q64, k64, v64 = (t.detach().to(torch.bfloat16).double().cpu().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q64, k64, v64, is_causal=causal, enable_gqa=True)
    r_dq, r_dk, r_dv = torch.autograd.grad(ref, (q64, k64, v64), do.double().cpu())
    testing.assert_lowp_close(out, ref, ref_lowp, "out")
    for name, ours, theirs, r in (("dq", dq, tq, r_dq), ("dk", dk, tk, r_dk), ("dv", dv, tv, r_dv)):
        testing.assert_lowp_close(ours.to(torch.bfloat16), r, theirs.to(torch.bfloat16), name)


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_backward_op_keeps_lse_float32(device):
    q, k, v, do = _llama_inputs(device)
    with torch.autocast(device, dtype=torch.bfloat16):
        out, lse = da.attention_forward(q.detach(), k.detach(), v.detach(), True)
        grads = da.attention_backward(do, q.detach(), k.detach(), v.detach(), out, lse, None, True)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert [g.dtype for g in grads] == [torch.bfloat16] * 3
    assert all(torch.isfinite(g.float()).all() for g in grads)


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_leaves_float64_alone(device):
    q, k, v, _ = (t.detach().double() for t in _llama_inputs(device))
    with torch.autocast(device, dtype=torch.bfloat16):
        out = da.attention(q, k, v, causal=True)
    assert out.dtype == torch.float64
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_dtypes_outside_autocast_raise(device):
    q, k, v, _ = _llama_inputs(device)
    with pytest.raises(RuntimeError, match="same dtype"):
        da.attention(q, k, v)
    da.attention(q, k, v.float())  # the process stays usable


# --------------------------------------------------------------------------- devices
_DEVS = ["cpu", "meta"] + (["cuda"] if HAS_CUDA else [])


def _on(dev, *shape):
    return torch.randn(*shape, device="cpu").to(dev)


@pytest.mark.parametrize("devs", [c for c in itertools.product(_DEVS, repeat=3) if len(set(c)) > 1],
                         ids=lambda c: "-".join(c))
def test_device_mix_forward_raises_naming_devices(devs):
    q, k, v = (_on(d, 1, 2, 8, 16) for d in devs)
    with pytest.raises(RuntimeError, match="one device") as e:
        da.attention(q, k, v)
    for t in (q, k, v):
        assert str(t.device) in str(e.value)


@pytest.mark.parametrize("dout_dev", _DEVS)
@pytest.mark.parametrize("dev", _DEVS)
def test_device_mix_backward_raises_naming_devices(dev, dout_dev):
    if dev == dout_dev:
        pytest.skip("one device")
    q, k, v = (_on(dev, 1, 2, 8, 16) for _ in range(3))
    out, lse = da.attention_forward(q, k, v)
    do = _on(dout_dev, 1, 2, 8, 16)
    with pytest.raises(RuntimeError, match="one device") as e:
        da.attention_backward(do, q, k, v, out, lse)
    assert str(q.device) in str(e.value) and str(do.device) in str(e.value)


def test_all_meta_is_fine():
    q, k, v = (torch.empty(2, 4, 8, 16, device="meta") for _ in range(3))
    out, lse = da.attention_forward(q, k, v, True)
    assert out.device.type == "meta" and out.shape == q.shape and lse.shape == q.shape[:3]


# --------------------------------------------------------------------------- transformers
def _tiny_llama(device, impl, dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=97, max_position_embeddings=128,
                      attention_dropout=0.0, use_cache=False, pad_token_id=0, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(device=device, dtype=dtype).train()
    model.config._attn_implementation = impl
    return model


def _step(model, device, autocast, **kw):
    """Logits (float) and parameter grads of one forward + backward."""
    model.zero_grad(set_to_none=True)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
        logits = model(use_cache=False, **kw).logits.float()
    (logits * torch.linspace(-1, 1, logits.shape[-1], device=device)).sum().backward()
    return logits.detach(), {n: p.grad.detach().double() for n, p in model.named_parameters() if p.grad is not None}


def _rel(a: dict, b: dict) -> float:
    num = sum(float((a[n].double() - b[n].double()).pow(2).sum()) for n in b)
    den = sum(float(b[n].double().pow(2).sum()) for n in b)
    return (num / den) ** 0.5


@requires_transformers
@pytest.mark.parametrize("device", DEVICES)
def test_transformers_llama_matches_sdpa(device):
    name = da.register_transformers()
    ids = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(1)).to(device)
    ours, theirs = _tiny_llama(device, name), _tiny_llama(device, "sdpa")
    if device == "cpu":  # float32 end to end: the same math
        lo, go = _step(ours, device, False, input_ids=ids)
        lt, gt = _step(theirs, device, False, input_ids=ids)
        torch.testing.assert_close(lo, lt, atol=2e-5, rtol=2e-5)
        assert _rel(go, gt) < 1e-4
    # bf16 autocast (fp32 q, k and bf16 v reach the attention): both against a float64 model
    ref = _tiny_llama(device, "sdpa", torch.float64)
    lr, gr = _step(ref, device, False, input_ids=ids)
    lo, go = _step(ours, device, True, input_ids=ids)
    lt, gt = _step(theirs, device, True, input_ids=ids)
    err_o, err_t = (lo.double() - lr).abs().max().item(), (lt.double() - lr).abs().max().item()
    assert err_o <= 2 * err_t + 1e-2, f"logits: {err_o:.3e} vs SDPA's {err_t:.3e}"
    assert _rel(go, gr) <= 2 * _rel(gt, gr) + 1e-3, f"grads: {_rel(go, gr):.3e} vs SDPA's {_rel(gt, gr):.3e}"


@requires_transformers
@pytest.mark.parametrize("device", DEVICES)
def test_transformers_padding_mask_matches_sdpa(device):
    name = da.register_transformers()
    ids = torch.randint(1, 97, (3, 24), generator=torch.Generator().manual_seed(2)).to(device)
    mask = torch.ones(3, 24, dtype=torch.long, device=device)
    mask[0, 17:] = 0  # right padding
    mask[2, :5] = 0   # left padding
    with torch.no_grad():
        lo = _tiny_llama(device, name)(input_ids=ids, attention_mask=mask, use_cache=False).logits
        lt = _tiny_llama(device, "sdpa")(input_ids=ids, attention_mask=mask, use_cache=False).logits
    keep = mask.bool()  # padded positions' outputs are not defined alike
    torch.testing.assert_close(lo[keep], lt[keep], atol=1e-4, rtol=1e-4)


@requires_transformers
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_cu", [True, False], ids=["cu_seq_lens", "position_ids"])
def test_transformers_packed_rows_match_separate_rows(device, with_cu):
    from kernel_common.models import PackedTokens

    name = da.register_transformers()
    lengths = [11, 20, 7]
    ids = torch.randint(1, 97, (1, sum(lengths)), generator=torch.Generator().manual_seed(3)).to(device)
    packed = PackedTokens(ids, lengths)
    kw = packed.kwargs() if with_cu else {"position_ids": packed.position_ids}
    model = _tiny_llama(device, name)
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False, **kw).logits
        a = 0
        for n in lengths:
            alone = model(input_ids=ids[:, a:a + n], use_cache=False).logits
            torch.testing.assert_close(logits[:, a:a + n], alone, atol=1e-4, rtol=1e-4)
            a += n


@requires_transformers
def test_transformers_custom_mask_raises():
    name = da.register_transformers()
    model = _tiny_llama("cpu", name)
    ids = torch.randint(1, 97, (2, 12), generator=torch.Generator().manual_seed(4))
    mask4d = torch.ones(2, 1, 12, 12, dtype=torch.bool).tril()
    with pytest.raises(NotImplementedError, match="custom mask"):
        model(input_ids=ids, attention_mask=mask4d, use_cache=False)
    # no padding: the mask is dropped by the mask function, and the dense path runs
    model(input_ids=ids, attention_mask=torch.ones(2, 12, dtype=torch.long), use_cache=False)


@requires_transformers
def test_transformers_dropout_raises():
    name = da.register_transformers()
    model = _tiny_llama("cpu", name)
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    with pytest.raises(NotImplementedError, match="dropout"):
        model(input_ids=torch.zeros(1, 8, dtype=torch.long), use_cache=False)


@requires_transformers
def test_models_llama_spec_with_day50_cpu():
    from kernel_common import models

    name = da.register_transformers()
    spec = models.build("llama", torch.device("cpu"))
    assert spec.kind == "hf-llama" and spec.model.config.num_key_value_heads < spec.model.config.num_attention_heads
    rows = {r["variant"]: r for r in models.bench_model(spec, {"day50": models.Swap(hf_attention=name)},
                                                         log=lambda *a: None)}
    assert "note" in rows["day50"] and "failed" not in rows["day50"]["note"], rows["day50"]
    assert rows["day50"]["grad err ours"] <= 2 * rows["torch"]["grad err ours"] + 1e-3


if __name__ == "__main__":
    sys.exit(testing.main(__file__))
