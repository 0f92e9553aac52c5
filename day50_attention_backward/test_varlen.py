"""Tests of sliding windows, softcap and packed sequences (attention_varlen) in day50_attention.

    python -m pytest test_varlen.py        (test.py imports these too)

References: a plain-PyTorch masked softmax in float64 on the CPU with the window / softcap /
bottom-right rules (attention_math.h), and for packed sequences the same per sequence.
fp16/bf16: at most 2x the error of the same plain-PyTorch math run in the inputs' dtype on
their device (flash-attention's rule for features SDPA does not have) plus a small floor.
"""
import contextlib
import math
import os
import sys

from kernel_common import testing  # noqa: E402
from kernel_common.testing import DEVICES, HAS_CUDA, requires_cuda  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import day50_attention as da  # noqa: E402

LOWP_V = [torch.float16, torch.bfloat16]
HOPPER_V = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
SANITIZE = os.environ.get("KC_SANITIZE", "0") == "1"


def masked_attention(q, k, v, causal=False, window=(-1, -1), softcap=0.0, scale=None, bottom_right=False):
    """Plain PyTorch in q's dtype and device: (out, lse) for q (..., H, Nq, d), k, v (..., Hk, Nk, d).
    Rows that see no key: out 0, lse +inf (the contract), without NaN in any gradient."""
    H, Hk, d = q.shape[-3], k.shape[-3], q.shape[-1]
    kr, vr = (t.repeat_interleave(H // Hk, -3) for t in (k, v))
    sc = scale if scale is not None else 1 / math.sqrt(d)
    s = (q @ kr.transpose(-2, -1)) * sc
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    nq, nk = s.shape[-2:]
    left, right = window[0], 0 if causal else window[1]
    diag = torch.arange(nq, device=q.device)[:, None] + (nk - nq if bottom_right else 0)
    j = torch.arange(nk, device=q.device)[None]
    hide = torch.zeros(nq, nk, dtype=torch.bool, device=q.device)
    if right >= 0:
        hide |= j > diag + right
    if left >= 0:
        hide |= j < diag - left
    empty = hide.all(-1)  # (nq,)
    s = s.masked_fill(hide, -math.inf).masked_fill(empty[:, None], 0.0)  # a finite row where nothing is seen
    p = torch.softmax(s, -1) * (~empty)[:, None]
    lse = torch.logsumexp(s.float() if s.dtype in LOWP_V else s, -1).masked_fill(empty, math.inf)
    return p @ vr, lse


def dense_ref(q, k, v, do, glse=None, **kw):
    """float64 (out, lse, dq, dk, dv) on the CPU."""
    q64, k64, v64 = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
    out, lse = masked_attention(q64, k64, v64, **kw)
    outs, grads = [out], [do.detach().cpu().double()]
    if glse is not None:
        outs.append(lse)
        grads.append(glse.detach().cpu().double())
    torch.autograd.backward(outs, grads)
    return out.detach(), lse.detach(), q64.grad, k64.grad, v64.grad


def dense_same_precision(q, k, v, do, **kw):
    """The same plain-PyTorch math in q's dtype on q's device: (out, dq, dk, dv)."""
    qt, kt, vt = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, _ = masked_attention(qt, kt, vt, **kw)
    out.backward(do)
    return out.detach(), qt.grad, kt.grad, vt.grad


def check_all(got, ref, theirs, dtype, prefix):
    """got (out, lse, dq, dk, dv); ref the float64 reference; theirs the same-precision one."""
    names = ["out", "lse", "dq", "dk", "dv"]
    if dtype in (torch.float32, torch.float64):
        for n, a, r in zip(names, got, ref):
            sc = max(r[torch.isfinite(r)].abs().max().item() if r.numel() else 0.0, 1.0)
            tol = (1e-10 * sc, 1e-9) if dtype == torch.float64 else (2e-5 * sc, 1e-4)
            _close_inf(a, r, *tol, prefix + n)
        return
    _close_inf(got[1], ref[1], 2e-4, 2e-4, prefix + "lse")
    for n, a, r, t in zip(["out", "dq", "dk", "dv"], [got[0], *got[2:]], [ref[0], *ref[2:]], theirs):
        floor = torch.finfo(dtype).eps * max(r.abs().max().item() if r.numel() else 0.0, 1.0)
        testing.assert_lowp_close(a, r, t, name=prefix + n, floor=floor)


def _close_inf(a, r, atol, rtol, name):
    """assert_close where +inf must match +inf exactly (lse of rows that see no key)."""
    a, r = a.detach().double().cpu(), r.detach().double().cpu()
    inf = torch.isinf(r)
    assert torch.equal(torch.isinf(a), inf), f"{name}: +inf rows differ"
    testing.assert_close(a.masked_fill(inf, 0), r.masked_fill(inf, 0), atol, rtol, name)


def rand(*shape, dtype, device, gen):
    return testing.fresh(*shape, dtype=dtype, device=device, gen=gen)


# ------------------------------------------------------------------- dense: window, softcap
# (B, H, Hk, Nq, Nk, d), causal, window, softcap
DENSE_CASES = [
    ((1, 2, 2, 70, 70, 64), False, (0, 0), 0.0),      # window 0: the diagonal alone
    ((2, 2, 1, 77, 130, 64), False, (5, 3), 0.0),     # small window, Nq < Nk, multi-query
    ((1, 4, 2, 130, 77, 128), True, (9, -1), 0.0),    # causal + window; rows past Nk + 9 see nothing
    ((1, 2, 2, 100, 100, 64), False, (500, 500), 0.0),  # window larger than N: full attention
    ((1, 2, 2, 65, 97, 64), False, (-1, -1), 5.0),    # softcap alone
    ((1, 4, 1, 129, 129, 128), True, (-1, -1), 2.0),  # softcap + causal
    ((2, 2, 2, 90, 60, 40), False, (7, 2), 10.0),     # softcap + window, odd head dim
    ((1, 2, 2, 300, 300, 64), False, (-1, 0), 0.0),   # (-1, 0) is plain causal
    ((1, 4, 2, 97, 130, 256), True, (20, -1), 0.0),   # d 256: causal + window
    ((1, 2, 2, 70, 90, 136), False, (-1, -1), 5.0),   # d 136: softcap
]


def case_id(c):
    (B, H, Hk, Nq, Nk, d), causal, w, cap = c
    return f"{B}x{H}/{Hk}x{Nq}x{Nk}x{d}{'_causal' if causal else ''}_w{w[0]}.{w[1]}_cap{cap:g}"


def dense_inputs(shape, dtype, device, seed):
    B, H, Hk, Nq, Nk, d = shape
    g = torch.Generator().manual_seed(seed)
    return (rand(B, H, Nq, d, dtype=dtype, device=device, gen=g), rand(B, Hk, Nk, d, dtype=dtype, device=device, gen=g),
            rand(B, Hk, Nk, d, dtype=dtype, device=device, gen=g), rand(B, H, Nq, d, dtype=dtype, device=device, gen=g))


def run_dense(q, k, v, do, causal, window, softcap, backend="auto", glse=None):
    out, lse = da.attention_forward(q, k, v, causal, None, backend, False, window, softcap)
    dq, dk, dv = da.attention_backward(do, q, k, v, out, lse, glse, causal, None, backend, False, window, softcap)
    return out, lse, dq, dk, dv


@pytest.mark.parametrize("case", DENSE_CASES, ids=case_id)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16],
                         ids=["f64", "f32", "f16", "bf16"])
@pytest.mark.parametrize("device", DEVICES)
def test_window_softcap(device, dtype, case):
    shape, causal, window, softcap = case
    if device == "cpu" and dtype == torch.float64 and shape[3] * shape[4] > 20000:
        pytest.skip("float64 on the CPU: the smaller cases and gradcheck cover it")
    q, k, v, do = dense_inputs(shape, dtype, device, seed=shape[3])
    kw = dict(causal=causal, window=window, softcap=softcap)
    ref = dense_ref(q, k, v, do, **kw)
    theirs = dense_same_precision(q, k, v, do, **kw) if dtype in LOWP_V else None
    backends = ["auto"] if device == "cpu" else (["auto", "fused"] if dtype in LOWP_V and shape[5] % 8 == 0
                                                  and shape[5] <= 128 else ["auto"])
    for be in backends:
        check_all(run_dense(q, k, v, do, causal, window, softcap, be), ref, theirs, dtype, f"{be}:")


@pytest.mark.parametrize("device", DEVICES)
def test_window_rows_without_keys(device):
    """Rows that see no key: out 0, lse +inf, and no gradient through them (a grad_lse too)."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q, k, v, do = dense_inputs((1, 2, 2, 100, 40, 64), dtype, device, seed=3)
    glse = testing.fresh(1, 2, 100, dtype=torch.float32, device=device)
    out, lse, dq, dk, dv = run_dense(q, k, v, do, False, (0, 0), 0.0, glse=glse)  # rows 40.. see nothing
    assert torch.all(out[:, :, 40:] == 0) and torch.all(torch.isposinf(lse[:, :, 40:]))
    assert torch.all(dq[:, :, 40:] == 0)
    assert torch.isfinite(lse[:, :, :40]).all() and not torch.isnan(dk).any()


# ------------------------------------------------------------------------ packed sequences
def cu(lengths, device):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32, device=device)


def varlen_inputs(lq, lk, H, Hk, d, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(lq), sum(lk)
    return (rand(tq, H, d, dtype=dtype, device=device, gen=g), rand(tk, Hk, d, dtype=dtype, device=device, gen=g),
            rand(tk, Hk, d, dtype=dtype, device=device, gen=g), rand(tq, H, d, dtype=dtype, device=device, gen=g))


def varlen_ref(q, k, v, do, lq, lk, same_precision=False, **kw):
    """Per-sequence dense attention (bottom-right aligned): float64 on the CPU (out, lse, dq, dk,
    dv), or with same_precision the math in q's dtype and device (out, dq, dk, dv)."""
    if same_precision:
        qt, kt, vt = (t.detach().clone().requires_grad_() for t in (q, k, v))
    else:
        qt, kt, vt = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
    outs, lses, q0, k0 = [], [], 0, 0
    for nq, nk in zip(lq, lk):
        qs, ks, vs = (t[a:a + n].transpose(0, 1) for t, a, n in ((qt, q0, nq), (kt, k0, nk), (vt, k0, nk)))
        if nk == 0:
            o = qs.new_zeros(qs.shape) * qs
            lse = torch.full((qs.shape[0], nq), math.inf, dtype=torch.float64 if not same_precision else torch.float32)
        else:
            o, lse = masked_attention(qs, ks, vs, bottom_right=True, **kw)
        outs.append(o.transpose(0, 1))
        lses.append(lse)
        q0, k0 = q0 + nq, k0 + nk
    out = torch.cat(outs)
    out.backward(do if same_precision else do.detach().cpu().double())
    if same_precision:
        return out.detach(), qt.grad, kt.grad, vt.grad
    return out.detach(), torch.cat(lses, -1), qt.grad, kt.grad, vt.grad


# (lengths q, lengths k, H, Hk, d), causal, window, softcap
VARLEN_CASES = [
    (([5, 0, 130, 64, 1], [5, 0, 130, 64, 1], 2, 2, 64), False, (-1, -1), 0.0),   # empty, odd, one
    (([17, 100, 3], [40, 100, 0], 4, 2, 64), True, (-1, -1), 0.0),                # Nq != Nk, a seq with no keys
    (([77, 200], [129, 64], 4, 1, 128), True, (-1, -1), 0.0),                      # bottom-right both ways, MQA
    (([150, 33, 70], [150, 50, 20], 2, 2, 64), False, (16, 4), 0.0),             # small window
    (([90, 0, 45], [120, 10, 45], 4, 2, 128), True, (8, -1), 5.0),               # causal + window + softcap
    (([60, 61], [62, 59], 2, 2, 40), False, (1000, 1000), 3.0),                  # window > N, softcap, d 40
]


def vcase_id(c):
    (lq, lk, H, Hk, d), causal, w, cap = c
    return (f"q{'.'.join(map(str, lq))}_k{'.'.join(map(str, lk))}_{H}/{Hk}_d{d}{'_causal' if causal else ''}"
            f"_w{w[0]}.{w[1]}_cap{cap:g}")


def run_varlen(q, k, v, do, lq, lk, causal, window, softcap, deterministic=False):
    cq, ck = cu(lq, q.device), cu(lk, q.device)
    out, lse = da.attention_varlen_forward(q, k, v, cq, ck, max(lq), max(lk), causal, None, window, softcap,
                                           deterministic)
    dq, dk, dv = da.attention_varlen_backward(do, q, k, v, out, lse, None, cq, ck, max(lq), max(lk), causal, None,
                                              window, softcap, deterministic)
    return out, lse, dq, dk, dv


@pytest.mark.parametrize("case", VARLEN_CASES, ids=vcase_id)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16],
                         ids=["f64", "f32", "f16", "bf16"])
@pytest.mark.parametrize("device", DEVICES)
def test_varlen(device, dtype, case):
    (lq, lk, H, Hk, d), causal, window, softcap = case
    q, k, v, do = varlen_inputs(lq, lk, H, Hk, d, dtype, device, seed=sum(lq))
    kw = dict(causal=causal, window=window, softcap=softcap)
    ref = varlen_ref(q, k, v, do, lq, lk, **kw)
    theirs = varlen_ref(q, k, v, do, lq, lk, same_precision=True, **kw) if dtype in LOWP_V else None
    check_all(run_varlen(q, k, v, do, lq, lk, causal, window, softcap), ref, theirs, dtype, "varlen:")
    if device == "cuda" and dtype in LOWP_V:  # deterministic=True: version 2 (Hopper) or the SIMT kernels
        check_all(run_varlen(q, k, v, do, lq, lk, causal, window, softcap, True), ref, theirs, dtype, "det:")
    if HOPPER_V and device == "cuda" and dtype in LOWP_V and d % 8 == 0:  # each version pinned
        for version in (1, 2):
            with da.ops.kernel_versions(fwd=version, bwd=version):
                check_all(run_varlen(q, k, v, do, lq, lk, causal, window, softcap), ref, theirs, dtype, f"v{version}:")


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_matches_dense(device):
    """One sequence packed is dense attention with bottom-right alignment: Nq == Nk makes it the
    same as attention()'s top-left causal, and the outputs agree to rounding."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q, k, v, _ = dense_inputs((1, 4, 2, 200, 200, 64), dtype, device, seed=9)
    dense = da.attention(q, k, v, causal=True, window=(31, -1))
    c = cu([200], device)
    packed = da.attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), c, c, 200, 200,
                                 causal=True, window=(31, -1))
    testing.assert_close(packed.transpose(0, 1)[None], dense, 1e-2, 1e-2, "varlen vs dense")


def test_gradcheck_window_softcap_float64():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 6, 4, dtype=torch.float64, generator=g).requires_grad_()
    k = torch.randn(1, 1, 5, 4, dtype=torch.float64, generator=g).requires_grad_()
    v = torch.randn(1, 1, 5, 4, dtype=torch.float64, generator=g).requires_grad_()

    def fn(a, b, c):
        out, lse = da.attention_forward(a, b, c, True, None, "auto", False, (2, -1), 1.5)
        return out, lse
    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_gradcheck_varlen_float64():
    g = torch.Generator().manual_seed(4)
    lq, lk = [3, 0, 4], [3, 3, 5]  # every row sees a key (lse +inf has no finite difference)
    q = torch.randn(7, 2, 4, dtype=torch.float64, generator=g).requires_grad_()
    k = torch.randn(11, 1, 4, dtype=torch.float64, generator=g).requires_grad_()
    v = torch.randn(11, 1, 4, dtype=torch.float64, generator=g).requires_grad_()
    cq, ck = cu(lq, "cpu"), cu(lk, "cpu")

    def fn(a, b, c):
        return da.attention_varlen_forward(a, b, c, cq, ck, 4, 5, True, 0.7, (1, -1), 2.0)
    assert torch.autograd.gradcheck(fn, (q, k, v))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_varlen_window(device):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    lq, lk = [5, 0, 19], [7, 3, 19]
    q, k, v, do = varlen_inputs(lq, lk, 4, 2, 64, dtype, device, seed=1)
    cq, ck = cu(lq, device), cu(lk, device)
    args = (q, k, v, cq, ck, 19, 19, True, None, [4, -1], 3.0, False)
    torch.library.opcheck(torch.ops.day50.attention_varlen_forward.default, args)
    out, lse = torch.ops.day50.attention_varlen_forward(*args)
    torch.library.opcheck(torch.ops.day50.attention_varlen_backward.default,
                          (do, q, k, v, out, lse, None, cq, ck, 19, 19, True, None, [4, -1], 3.0, False))
    qd, kd, vd, _ = dense_inputs((1, 2, 2, 33, 40, 64), dtype, device, seed=2)
    torch.library.opcheck(torch.ops.day50.attention_forward.default,
                          (qd, kd, vd, False, None, "auto", False, [3, 2], 4.0))


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_torch_compile_fullgraph(device):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    lq, lk = [9, 30], [12, 30]
    q, k, v, do = varlen_inputs(lq, lk, 2, 1, 64, dtype, device, seed=6)
    cq, ck = cu(lq, device), cu(lk, device)

    def loss(a, b, c):
        o = da.attention_varlen(a, b, c, cq, ck, 30, 30, causal=True, window=(5, -1), softcap=4.0)
        return (o.float() * do.float()).sum()
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    grads = []
    for f in (loss, compiled):
        xs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        f(*xs).backward()
        grads.append([x.grad for x in xs])
    for a, b in zip(*grads):
        testing.assert_close(a, b, 1e-6, 1e-6, "compiled grad")


# A non-finite value in one packed sequence: (tensor, row) of two sequences of 100 and 300 rows.
# Row 100 (the second's first) lies in the first sequence's last key block and query tile; row 99
# (the first's last) before the second's first forward query tile.
POISON = [(t, row) for row in (100, 99) for t in ("q", "k", "v", "dout")]


# (H, Hk, d, deterministic, version): the multi-head stores, the grouped-query accumulator and
# partials of each backward family (version 2 on Hopper, auto: d 64 one consumer, d 64
# deterministic and d 128 two, d 256 split), and version 1 pinned.
NONFINITE_CASES = [(2, 2, 64, False, 0), (4, 2, 64, False, 0), (2, 2, 64, False, 1), (4, 2, 128, False, 0),
                   (4, 2, 64, True, 0), (2, 2, 256, False, 0), (4, 2, 256, True, 0)]


@pytest.mark.parametrize("case", NONFINITE_CASES,
                         ids=lambda c: f"H{c[0]}-{c[1]}-d{c[2]}{'-det' if c[3] else ''}-{'v1' if c[4] else 'auto'}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("device", DEVICES)
def test_varlen_sequences_keep_non_finite_values_to_themselves(device, causal, case):
    """An inf or NaN in one sequence's q, k, v or dout leaves every other sequence's output and
    gradients finite (flash-attn's rule: the sequences are independent). Version 2's tiles cross
    a sequence's end and read the next sequence's rows, which a product would multiply by P = 0
    or dS = 0 (0 x inf is NaN) unless they are zeroed first (hopper_common::zero_rows)."""
    H, Hk, d, det, version = case
    if version and device != "cuda":
        pytest.skip("the version pin is the CUDA kernels'")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    cuq = cu([100, 300], device)
    leaks = []
    for t, row in POISON:
        for bad in (math.inf, math.nan):
            gen = torch.Generator().manual_seed(row)
            q, k, v, do = (rand(400, n, d, dtype=dtype, device=device, gen=gen) for n in (H, Hk, Hk, H))
            {"q": q, "k": k, "v": v, "dout": do}[t][row] = bad
            xs = [x.requires_grad_() for x in (q, k, v)]
            with da.kernel_versions(fwd=version, bwd=version) if version else contextlib.nullcontext():
                out = da.attention_varlen(*xs, cuq, cuq, 300, 300, causal=causal, deterministic=det)
                grads = torch.autograd.grad(out, xs, do)
            other = slice(0, 100) if row >= 100 else slice(100, 400)
            for name, x in zip(("out", "dq", "dk", "dv"), (out, *grads)):
                if not torch.isfinite(x[other]).all():
                    leaks.append(f"{t}[{row}] = {bad} -> {name}")
    assert not leaks, leaks


@requires_cuda
@pytest.mark.skipif(SANITIZE, reason="scripts/sanitize.sh turns the caching allocator off "
                    "(PYTORCH_NO_CUDA_MEMORY_CACHING=1), and a capture cannot call cudaMalloc")
def test_varlen_cuda_graph_capture():
    """fp16 varlen forward + backward captured in a CUDA graph (no host read of the offsets), then
    replayed with new lengths written into the same offset buffers."""
    H, Hk, d = 4, 2, 64
    lq, lk = [50, 0, 77], [60, 5, 77]
    q, k, v, do = varlen_inputs(lq, lk, H, Hk, d, torch.float16, "cuda", seed=8)
    cq, ck = cu(lq, "cuda"), cu(lk, "cuda")
    xs = [t.detach().clone().requires_grad_() for t in (q, k, v)]

    def step():
        out = da.attention_varlen(*xs, cq, ck, 100, 100, causal=True, window=(20, -1))
        out.backward(do)
        return out

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up outside the graph
        for x in xs:
            x.grad = None
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    lq2, lk2 = [100, 20, 7], [90, 20, 32]  # same totals, other lengths, within the max
    cq.copy_(cu(lq2, "cuda"))
    ck.copy_(cu(lk2, "cuda"))
    for x in xs:
        x.grad.zero_()
    graph.replay()
    torch.cuda.synchronize()
    ref = varlen_ref(q, k, v, do, lq2, lk2, causal=True, window=(20, -1))
    theirs = varlen_ref(q, k, v, do, lq2, lk2, same_precision=True, causal=True, window=(20, -1))
    got = [out, ref[1], xs[0].grad, xs[1].grad, xs[2].grad]  # lse is not an output of the graph: skip it
    check_all(got, ref, theirs, torch.float16, "graph:")


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_bad_input(device):
    lq, lk = [3, 4], [3, 4]
    q, k, v, _ = varlen_inputs(lq, lk, 2, 2, 16, torch.float32, device, seed=0)
    good_q, good_k = cu(lq, device), cu(lk, device)
    f = da.attention_varlen
    with pytest.raises(RuntimeError, match="int32"):
        f(q, k, v, good_q.long(), good_k, 4, 4)
    with pytest.raises(RuntimeError, match="1-D"):
        f(q, k, v, good_q[None], good_k, 4, 4)
    with pytest.raises(RuntimeError, match="same length"):
        f(q, k, v, good_q[:2], good_k, 4, 4)
    with pytest.raises(RuntimeError, match="3-D"):
        f(q[None], k, v, good_q, good_k, 4, 4)
    with pytest.raises(RuntimeError, match="window"):
        f(q, k, v, good_q, good_k, 4, 4, window=(-2, 3))
    with pytest.raises(RuntimeError, match="softcap"):
        f(q, k, v, good_q, good_k, 4, 4, softcap=-1.0)
    with pytest.raises(RuntimeError, match="max_seqlen"):
        f(q, k, v, good_q, good_k, -1, 4)
    if device == "cpu":  # the offsets' values are checked where they are read on the host
        with pytest.raises(RuntimeError, match="nondecreasing"):
            f(q, k, v, torch.tensor([0, 4, 3], dtype=torch.int32), good_k, 4, 4)
        with pytest.raises(RuntimeError, match="max_seqlen"):
            f(q, k, v, good_q, good_k, 3, 4)
    else:
        with pytest.raises(RuntimeError, match="device"):
            f(q, k, v, good_q.cpu(), good_k, 4, 4)
    with pytest.raises(ValueError, match="window"):
        da.attention(q[None], k[None], v[None], window=(1, 2, 3))
    out = f(q, k, v, good_q, good_k, 4, 4)  # still usable
    assert torch.isfinite(out).all()


_BAD_OFFSETS_SCRIPT = """
import sys, torch
import day50_attention as da
lq, cu_q = int(sys.argv[1]), [int(x) for x in sys.argv[2].split(",")]
q = torch.randn(lq, 2, 16, device="cuda", dtype=torch.bfloat16)
cq = torch.tensor(cu_q, dtype=torch.int32, device="cuda")
ck = torch.tensor([0, 3, lq], dtype=torch.int32, device="cuda")
try:
    da.attention_varlen(q, q, q, cq, ck, int(sys.argv[3]), lq)
    torch.cuda.synchronize()
except RuntimeError as e:  # the context is gone: leave without tearing it down
    print("RAISED", e, flush=True)
    import os
    os._exit(3)
print("NO ERROR")
"""


@requires_cuda
@pytest.mark.skipif(SANITIZE, reason="a deliberate trap under the sanitizer")
@pytest.mark.parametrize("cu_q,max_q,bad", [("0,3,8", 8, False),    # the control: valid offsets run
                                            ("0,3,6", 8, True),     # rows 6, 7 belong to no sequence
                                            ("0,5,8", 4, True),     # a length above max_seqlen_q
                                            ("0,5,3,8", 8, True)],  # decreasing offsets
                         ids=["valid", "tail", "over_max", "decreasing"])
def test_varlen_cuda_bad_offsets_raise(cu_q, max_q, bad):
    """The CUDA path never reads the offsets on the host (graph capture), so a device kernel checks
    them (varlen_check.cu) and traps, as a bad index in a PyTorch kernel does; the trap ends the
    CUDA context, hence a child process. Bad offsets must raise, never return rows nobody wrote;
    valid ones must not."""
    import subprocess
    script = _BAD_OFFSETS_SCRIPT
    if cu_q.count(",") == 3:  # three sequences: the k offsets need as many
        script = script.replace("[0, 3, lq]", "[0, 3, 5, lq]")
    r = subprocess.run([sys.executable, "-c", script, "8", cu_q, str(max_q)], capture_output=True, text=True,
                       timeout=120, cwd=os.path.dirname(os.path.abspath(__file__)))
    assert r.returncode == (3 if bad else 0), (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert ("RAISED" in r.stdout) == bad


# Windows and softcaps on the Hopper kernels (version 2), pinned: many tiles and both edges,
# one edge alone, rows (and whole forward tiles) that see no key, grouped- and multi-query
# heads, d 96 and 256 (version 2's d 256 kernels both ways), softcaps with
# causal, full and windowed masks, and the deterministic backward, whose ordered adds start at
# the first key block that reaches a query tile: bitwise equal from run to run. The last three
# have grids large enough for version 2's plan to give a CTA several q heads of a group
# (flash_bwd.cu, kGqaMinCtasV2): the whole group at d 64 and 256, two of eight at d 128.
# (B, H, Hk, Nq, Nk, d), causal, window, softcap
HOPPER_WINDOW_CASES = [
    ((1, 2, 2, 1000, 1000, 64), False, (100, 30), 0.0),
    ((2, 4, 2, 700, 900, 128), True, (250, -1), 0.0),
    ((1, 2, 1, 900, 300, 64), False, (0, 0), 0.0),     # rows 300.. see nothing: 192-row tiles with no key
    ((1, 2, 2, 520, 520, 128), False, (-1, 7), 0.0),   # right edge only
    ((1, 2, 2, 600, 600, 64), False, (5, -1), 0.0),    # left edge only
    ((1, 4, 2, 300, 500, 96), True, (40, -1), 0.0),
    ((1, 4, 2, 400, 400, 256), True, (64, -1), 0.0),
    ((1, 4, 2, 600, 600, 64), True, (-1, -1), 2.0),    # softcaps: causal ...
    ((1, 2, 2, 300, 700, 128), False, (-1, -1), 5.0),  # ... full ...
    ((2, 4, 1, 500, 500, 128), True, (200, -1), 30.0),  # ... windowed (Gemma 2's local layers)
    ((1, 2, 2, 300, 300, 256), True, (-1, -1), 10.0),
    ((32, 8, 2, 500, 500, 64), True, (100, -1), 0.0),
    ((16, 8, 1, 600, 600, 128), True, (200, -1), 30.0),
    ((32, 4, 2, 400, 400, 256), True, (-1, -1), 0.0),
]


@pytest.mark.skipif(not HOPPER_V, reason="version 2 needs a compute capability 9.0 GPU")
@pytest.mark.parametrize("case", HOPPER_WINDOW_CASES, ids=case_id)
def test_hopper_window_softcap(case):
    shape, causal, window, softcap = case
    d = shape[5]
    if SANITIZE and shape[0] > 1:
        pytest.skip("too slow under compute-sanitizer; the single-batch cases take the kernels' branches")
    q, k, v, do = dense_inputs(shape, torch.bfloat16, "cuda", seed=shape[3] + d)
    kw = dict(causal=causal, window=window, softcap=softcap)
    ref = dense_ref(q, k, v, do, **kw)
    theirs = dense_same_precision(q, k, v, do, **kw)
    backend = "fused" if d <= 128 else "auto"  # "fused" names the kernels up to d 128
    with da.ops.kernel_versions(fwd=2, bwd=2):
        got = run_dense(q, k, v, do, causal, window, softcap, backend)
        check_all(got, ref, theirs, torch.bfloat16, "v2:")
        out, lse = got[:2]
        det = [da.attention_backward(do, q, k, v, out, lse, None, causal, None, backend, True, window, softcap)
               for _ in range(2)]
        check_all((out, lse, *det[0]), ref, theirs, torch.bfloat16, "v2 deterministic:")
        assert all(torch.equal(a, b) for a, b in zip(*det)), "deterministic backward differs run to run"



# Packed sequences on the Hopper kernels (version 2), pinned: sequences over several query and
# key tiles (the forward's tiles end-aligned to their sequence, so a tile's first rows may
# belong to the sequence before: never stored; the backward's key blocks start-aligned, so a
# sequence's last block holds the next one's first keys: masked, and multi-head dK, dV stored
# row by row), empty sequences, sequences whose keys end early or that have no key, grouped-
# query heads (the backward's accumulator; deterministic: its partials), bottom-right windows,
# a softcap, d 40, 96, 192 and 256; the deterministic backward bitwise equal run to run.
# (lengths q, lengths k, H, Hk, d), causal, window, softcap
HOPPER_VARLEN_CASES = [
    (([700, 1, 1300, 0, 257], [700, 1, 1300, 0, 257], 8, 2, 128), True, (-1, -1), 0.0),
    (([1000, 300, 50], [1200, 100, 0], 4, 4, 64), True, (-1, -1), 0.0),  # rows without keys
    (([500, 900], [500, 900], 4, 2, 64), False, (128, 0), 0.0),          # a window, bottom-right
    (([600, 400], [600, 700], 2, 1, 96), True, (-1, -1), 30.0),           # softcap, d 96
    (([300, 333], [300, 333], 2, 2, 128), False, (-1, -1), 0.0),         # full attention, multi-head
    (([333, 777], [500, 129], 2, 2, 40), False, (-1, -1), 0.0),         # multi-head, partial key blocks
    (([400, 257, 0], [400, 300, 64], 4, 2, 256), True, (-1, -1), 0.0),  # d 256, grouped-query
    (([200, 70], [200, 130], 2, 2, 256), False, (-1, -1), 0.0),         # d 256, multi-head, partial blocks
    (([300, 500], [300, 500], 2, 2, 192), False, (64, 64), 10.0),       # d 192, window and softcap
]


@pytest.mark.skipif(not HOPPER_V, reason="version 2 needs a compute capability 9.0 GPU")
@pytest.mark.parametrize("case", HOPPER_VARLEN_CASES, ids=vcase_id)
def test_hopper_varlen(case):
    (lq, lk, H, Hk, d), causal, window, softcap = case
    q, k, v, do = varlen_inputs(lq, lk, H, Hk, d, torch.bfloat16, "cuda", seed=sum(lq) + d)
    kw = dict(causal=causal, window=window, softcap=softcap)
    ref = varlen_ref(q, k, v, do, lq, lk, **kw)
    theirs = varlen_ref(q, k, v, do, lq, lk, same_precision=True, **kw)
    with da.ops.kernel_versions(fwd=2, bwd=2):
        got = run_varlen(q, k, v, do, lq, lk, causal, window, softcap)
        check_all(got, ref, theirs, torch.bfloat16, "v2:")
        det = [run_varlen(q, k, v, do, lq, lk, causal, window, softcap, True) for _ in range(2)]
    check_all(det[0], ref, theirs, torch.bfloat16, "v2 deterministic:")
    assert all(torch.equal(a, b) for a, b in zip(*det)), "deterministic backward differs run to run"
    out = da.attention_varlen(q, k, v, cu(lq, "cuda"), cu(lk, "cuda"), max(lq), max(lk), causal, None, window,
                              softcap)
    assert torch.equal(out, got[0]), "auto does not run version 2's forward for packed sequences"


# backend "auto" runs version 2 for windows and softcaps: its out, lse, dk and dv (one q head per
# kv head: no atomics there) bitwise equal to the version-2-pinned call's, and version 1's differ.
@pytest.mark.skipif(not HOPPER_V, reason="version 2 needs a compute capability 9.0 GPU")
@pytest.mark.parametrize("window, softcap", [((256, 0), 0.0), ((-1, 0), 30.0), ((100, 50), 10.0)])
def test_auto_runs_version2_for_window_and_softcap(window, softcap):
    q, k, v, do = dense_inputs((1, 4, 4, 1024, 1024, 128), torch.bfloat16, "cuda", seed=7)
    causal = window[1] == 0
    got = {}
    for name, pin in (("auto", {}), ("v2", dict(fwd=2, bwd=2)), ("v1", dict(fwd=1, bwd=1))):
        with da.ops.kernel_versions(**pin):
            out, lse, _, dk, dv = run_dense(q, k, v, do, causal, window, softcap)
        got[name] = (out, lse, dk, dv)
    for n, a, b, c in zip(["out", "lse", "dk", "dv"], got["auto"], got["v2"], got["v1"]):
        assert torch.equal(a, b), f"{n}: auto differs from version 2"
        assert not torch.equal(a, c), f"{n}: version 1 gives the same bits (the test cannot tell them apart)"


if __name__ == "__main__":
    sys.exit(testing.main(__file__))
