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


@pytest.mark.parametrize("device, dtype", [("cpu", torch.bfloat16),
                                           pytest.param("cuda", torch.bfloat16, marks=requires_cuda),
                                           pytest.param("cuda", torch.float16, marks=requires_cuda)],
                         ids=["cpu-bf16", "cuda-bf16", "cuda-fp16"])
def test_autocast_node_casts_and_returns_input_dtypes(device, dtype):
    """Under autocast the op's autograd node takes the float32 q, k themselves (no cast node in
    between, so no cast kernel runs on the way back) and returns their gradients as float32. On
    CUDA the fused backward stores them from its fp32 sums: values a 16-bit cast would have
    rounded, and no less accurate than their rounding."""
    q, k, v, do = _llama_inputs(device)
    v, do = v.detach().to(dtype).requires_grad_(), do.to(dtype)
    with torch.autocast(device, dtype=dtype):
        out = da.attention(q, k, v, causal=True)
    assert out.dtype == dtype
    nodes = [f for f, _ in out.grad_fn.next_functions]
    assert [type(f).__name__ for f in nodes] == ["AccumulateGrad"] * 3, nodes
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
    assert (dq.dtype, dk.dtype, dv.dtype) == (torch.float32, torch.float32, dtype)
    if device == "cuda":
        q64, k64, v64 = (t.detach().to(dtype).double().requires_grad_() for t in (q, k, v))
        ref = F.scaled_dot_product_attention(q64, k64, v64, is_causal=True, enable_gqa=True)
        refs = torch.autograd.grad(ref, (q64, k64, v64), do.double())
        for name, g, r in (("dq", dq, refs[0]), ("dk", dk, refs[1])):
            rounded = g.to(dtype).float()
            assert (g != rounded).any(), f"{name} holds only bf16 values"
            assert testing.max_abs_err(g, r) <= testing.max_abs_err(rounded, r), name


def _bwd_inputs(shape, device, seed, layout="bhnd"):
    """bf16 q, k, v, dout (B, H, N, d); layout "bnhd": views of (B, N, H, d) tensors, a
    transformer's layout (the gradients come back in it)."""
    b, hq, hk, n, d = shape
    g = torch.Generator().manual_seed(seed)

    def make(h):
        if layout == "bnhd":
            return testing.fresh(b, n, h, d, device=device, gen=g).to(torch.bfloat16).transpose(1, 2)
        return testing.fresh(b, h, n, d, device=device, gen=g).to(torch.bfloat16)
    return make(hq), make(hk), make(hk), make(hq)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("shape, layout", [((2, 4, 4, 70, 64), "bhnd"), ((2, 4, 1, 70, 64), "bhnd"),
                                           ((1, 8, 2, 130, 128), "bhnd"), ((1, 2, 2, 40, 96), "bhnd"),
                                           ((2, 4, 2, 70, 64), "bnhd")],
                         ids=["mha", "mqa", "gqa-d128", "d96", "gqa-bnhd"])
@pytest.mark.parametrize("device", DEVICES)
def test_backward_gradients_in_asked_dtypes(device, shape, layout, deterministic):
    """attention_backward(dq_dtype=, dk_dtype=, dv_dtype=): the gradients in those dtypes, the
    values the default call computes. deterministic=True fixes every sum's order, so the float32
    gradients round to the bf16 ones bit for bit; otherwise both are compared with float64.
    On Hopper the main kernel adds a float32 dq in place, in its layout (bnhd: (B, N, H, d))."""
    q, k, v, do = _bwd_inputs(shape, device, seed=41, layout=layout)
    out, lse = da.attention_forward(q, k, v, True)
    base = da.attention_backward(do, q, k, v, out, lse, None, True, deterministic=deterministic)
    f32 = torch.float32
    for dts in ((f32, f32, None), (f32, None, f32), (None, f32, torch.float16)):
        got = da.attention_backward(do, q, k, v, out, lse, None, True, deterministic=deterministic,
                                    dq_dtype=dts[0], dk_dtype=dts[1], dv_dtype=dts[2])
        for name, g, b, dt, like in zip(("dq", "dk", "dv"), got, base, dts, (q, k, v)):
            assert g.dtype == (dt or torch.bfloat16), name
            assert g.shape == b.shape and g.stride() == b.stride(), name
            if deterministic:  # otherwise dq (and a group's dk, dv) add in the order their atomics land
                assert torch.equal(g.to(torch.bfloat16), b) if dt != torch.float16 else \
                    torch.equal(g, b.to(torch.float16)), name
    if not deterministic:
        q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
        ref = F.scaled_dot_product_attention(q64, k64, v64, is_causal=True, enable_gqa=True)
        refs = torch.autograd.grad(ref, (q64, k64, v64), do.double())
        got = da.attention_backward(do, q, k, v, out, lse, None, True, dq_dtype=f32, dk_dtype=f32, dv_dtype=f32)
        for name, g, b, r in zip(("dq", "dk", "dv"), got, base, refs):
            assert testing.max_abs_err(g, r) <= testing.max_abs_err(b, r) * 1.01 + 1e-6, name


@requires_cuda
def test_float32_dq_with_stride0_kv():
    """k, v expanded over heads (stride 0): the Hopper kernel's maps turn them down at launch and
    version 1 runs after all, into its own workspace; the float32 dq is still right."""
    q, k, v, do = _bwd_inputs((2, 4, 1, 70, 64), "cuda", seed=44)
    k, v = k.expand(2, 4, 70, 64), v.expand(2, 4, 70, 64)
    out, lse = da.attention_forward(q, k, v, True)
    base = da.attention_backward(do, q, k, v, out, lse, None, True)
    got = da.attention_backward(do, q, k, v, out, lse, None, True, dq_dtype=torch.float32)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q64, k64, v64, is_causal=True)
    refs = torch.autograd.grad(ref, (q64, k64, v64), do.double())
    assert got[0].dtype == torch.float32
    for name, g, b, r in zip(("dq", "dk", "dv"), got, base, refs):
        assert testing.max_abs_err(g, r) <= testing.max_abs_err(b, r) * 1.01 + 1e-6, name


@pytest.mark.parametrize("device", DEVICES)
def test_backward_gradient_dtype_must_be_floating(device):
    q, k, v, do = _bwd_inputs((1, 2, 2, 8, 16), device, seed=42)
    out, lse = da.attention_forward(q, k, v)
    with pytest.raises(RuntimeError, match="dk_dtype must be float64, float32, float16 or bfloat16"):
        da.attention_backward(do, q, k, v, out, lse, dk_dtype=torch.int32)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_gradient_dtypes(device):
    q, k, v, do = _bwd_inputs((1, 4, 2, 9, 64), device, seed=43)
    out, lse = da.attention_forward(q, k, v, True)
    torch.library.opcheck(torch.ops.day50.attention_backward.default, (do, q, k, v, out, lse, None, True),
                          {"dq_dtype": torch.float32, "dk_dtype": torch.float32})
    cu = torch.tensor([0, 4, 9], dtype=torch.int32, device=device)
    args = (do[0].transpose(0, 1).contiguous(), q[0].transpose(0, 1).contiguous(),
            k[0].transpose(0, 1).contiguous(), v[0].transpose(0, 1).contiguous())
    o, l_ = da.attention_varlen_forward(*args[1:], cu, cu, 5, 5, causal=True)
    torch.library.opcheck(torch.ops.day50.attention_varlen_backward.default,
                          (args[0], *args[1:], o, l_, None, cu, cu, 5, 5, True), {"dq_dtype": torch.float32})


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_varlen_gradients_in_input_dtypes(device):
    """Packed rows under autocast (a packed Llama batch): float32 q, k get float32 gradients; with
    deterministic=True they round to the gradients of the bf16-cast inputs bit for bit."""
    q, k, v, do = (t.detach()[0].transpose(0, 1).contiguous() for t in _llama_inputs(device, b=1, n=40))
    q.requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    cu = torch.tensor([0, 17, 40], dtype=torch.int32, device=device)
    with torch.autocast(device, dtype=torch.bfloat16):
        out = da.attention_varlen(q, k, v, cu, cu, 23, 23, causal=True, deterministic=True)
    got = torch.autograd.grad(out, (q, k, v), do)
    assert [g.dtype for g in got] == [torch.float32, torch.float32, torch.bfloat16]
    qb, kb, vb = (t.detach().to(torch.bfloat16).requires_grad_() for t in (q, k, v))
    ob = da.attention_varlen(qb, kb, vb, cu, cu, 23, 23, causal=True, deterministic=True)
    want = torch.autograd.grad(ob, (qb, kb, vb), do)
    assert torch.equal(out, ob)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert torch.equal(g.to(torch.bfloat16), w), name


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_torch_compile_fullgraph(device):
    """torch.compile of a step under autocast: the node's own casts and the float32 gradients
    trace through the fakes; the compiled gradients are the eager ones."""
    q, k, v, do = _llama_inputs(device)

    def loss(a, b, c):
        with torch.autocast(device, dtype=torch.bfloat16):
            return (da.attention(a, b, c, causal=True).float() * do.float()).sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    grads = []
    for f in (loss, compiled):
        args = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        val = f(*args)
        val.backward()
        grads.append([val.detach()] + [t.grad for t in args])
    assert [g.dtype for g in grads[1][1:]] == [torch.float32, torch.float32, torch.bfloat16]
    for a, b in zip(*grads):
        testing.assert_close(a, b, *testing.tolerance(torch.bfloat16))


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
