"""Python API of the day-50 attention ops.

    attention(q, k, v, causal=False, scale=None, backend="auto", deterministic=False,
              window=(-1, -1), softcap=0.0) -> out
    attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                     scale=None, window=(-1, -1), softcap=0.0, deterministic=False) -> out

q (B, H, Nq, d), k and v (B, Hkv, Nk, d) with Hkv dividing H (grouped-query
attention when Hkv < H), the semantics of
F.scaled_dot_product_attention (causal aligned top-left when Nq != Nk).
window=(left, right): query i sees keys i - left .. i + right (-1: unbounded; flash-attn's
window_size; causal=True is right = 0); softcap > 0: scores become softcap * tanh(scores / softcap).
A query that sees no key (every query when Nk = 0) gets out 0 (lse +inf) and no gradient.
attention_varlen takes packed sequences as flash-attn's varlen functions do (causal and
window aligned bottom-right).
Differentiable in q, k, v through a C++ autograd Function (csrc/attention_autograd.cpp); fake
implementations make the ops traceable by torch.compile(fullgraph=True).

backend (CUDA only; the CPU has one implementation):
  "naive": the seed's algorithm made general: S = scale QK^T, softmax, O = PV
           with a tiled matmul kernel; the backward runs the seed's steps with
           N x N workspaces. float64 / float32 / float16 / bfloat16, any head dim.
  "fused": flash-style: the forward keeps only O and the row logsumexp, the
           backward recomputes P tile by tile (nothing of size N x N).
           float16 / bfloat16 on tensor cores, head dim a multiple of 8 up to 128.
  "simt":  the same algorithm on CUDA cores in fp32 arithmetic (csrc/flash_simt.cu):
           float32 / float16 / bfloat16, any head dim up to 256, deterministic (no
           atomics), O(B H N) extra memory. The fast path for float32; for float16 /
           bfloat16 several times slower than "fused".
  "auto":  "fused" where it applies (and, with deterministic=True, where its Hopper
           backward runs), else "simt" (a one-time warning for float16 / bfloat16, the
           slow path); "naive" only for float64 and for head dims above 256 (warned).
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from kernel_common import fastpath
from kernel_common.build import import_extension

_C = import_extension("day50_attention", Path(__file__).resolve().parent.parent)

BACKENDS = ("auto", "fused", "simt", "naive")

# torch.ops.day50.attention_forward, through the extension's C++ entry for plain
# tensors outside torch.compile (host time per call), the op itself otherwise.
_fwd = fastpath.entry(torch.ops.day50.attention_forward.default, _C.attention_forward)


def _window(window) -> list[int]:
    w = [int(x) for x in window]
    if len(w) != 2:
        raise ValueError(f"window must be (left, right), got {window!r}")
    return w


def _batched(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """q, k, v as the op's (B, H, N, d), and what undoes it on the output: SDPA's other
    ranks and its broadcasting. (..., H, N, d) for each of q, k, v: 3-D is one batch, the
    leading dims broadcast against each other as SDPA's matmuls broadcast them (k, v of
    batch 1 beside a larger q: one key set for every batch) and are folded into B. A
    broadcast tensor is copied out to the full batch (the kernels read dense batches; its
    gradient sums back through the expand); (B, H, N, d) with one B passes untouched."""
    if q.dim() == 4 and k.dim() == 4 and v.dim() == 4 and q.shape[0] == k.shape[0] == v.shape[0]:
        return q, k, v, None
    if min(q.dim(), k.dim(), v.dim()) < 3:
        return q, k, v, None  # the op's own checks name what is wrong
    try:
        lead = torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    except RuntimeError:
        raise RuntimeError(f"attention: the leading (batch) dims of q, k, v must broadcast, as SDPA's, got "
                           f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}") from None

    def full(t):  # (*lead, H, N, d) -> (B, H, N, d); 3-D all three: B = 1
        if t.shape[:-3] != lead:
            t = t.expand(*lead, *t.shape[-3:]).contiguous()
        return t.reshape(-1, *t.shape[-3:])
    return full(q), full(k), full(v), lambda o: o.reshape(*lead, *o.shape[1:])


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              scale: float | None = None, backend: str = "auto", deterministic: bool = False,
              window: tuple[int, int] = (-1, -1), softcap: float = 0.0) -> torch.Tensor:
    """softmax(scale * q k^T [causal / window mask, softcap]) v, differentiable in q, k, v.
    q, k, v: (B, H, N, d) (k, v with H or fewer heads: grouped-query attention); as SDPA, also
    (H, N, d) and (..., H, N, d), the leading dims broadcast against each other (_batched).
    deterministic=True: the gradients are bitwise the same from run to run (see
    attention_backward). window, softcap: the module docstring."""
    q, k, v, undo = _batched(q, k, v)
    out = _fwd(q, k, v, causal, scale, backend, deterministic, _window(window), float(softcap))[0]
    return out if undo is None else undo(out)


def attention_forward(q, k, v, causal: bool = False, scale: float | None = None, backend: str = "auto",
                      deterministic: bool = False, window: tuple[int, int] = (-1, -1), softcap: float = 0.0):
    """(out, lse): the output and the row logsumexp of the (capped, masked) scores (float32,
    float64 for float64 q; +inf for a row that sees no key). deterministic is carried to the
    backward that autograd runs."""
    return _fwd(q, k, v, causal, scale, backend, deterministic, _window(window), float(softcap))


def attention_backward(grad_out, q, k, v, out, lse, grad_lse=None, causal: bool = False,
                       scale: float | None = None, backend: str = "auto", deterministic: bool = False,
                       window: tuple[int, int] = (-1, -1), softcap: float = 0.0, *,
                       dq_dtype: torch.dtype | None = None, dk_dtype: torch.dtype | None = None,
                       dv_dtype: torch.dtype | None = None):
    """(dq, dk, dv) of attention_forward, given the forward's out and lse.

    dq_dtype, dk_dtype, dv_dtype: the gradients' dtypes (default q's, k's, v's). The fused
    kernels store float32 gradients of 16-bit inputs straight from their fp32 sums; under
    autocast the autograd node asks for them for the float32 tensors it cast (q and k after
    RoPE), so no cast kernel runs on the way back.

    deterministic=True: every sum in a fixed order, so dq, dk, dv are bitwise the same from run
    to run. The fused path's dq is otherwise summed over key blocks with fp32 adds (atomics, or
    the copy engine's reduce-add on Hopper) in whatever order they land, and on Hopper so are
    a grouped-query group's dk, dv over its q heads; deterministic orders them (Hopper version
    2, where it applies; it costs some speed: README). Where version 2 does not run,
    backend="auto" takes the "simt" kernels (no atomics; O(N) memory) and "fused" is an error.
    CPU and naive are deterministic anyway."""
    return torch.ops.day50.attention_backward(grad_out, q, k, v, out, lse, grad_lse, causal, scale, backend,
                                              deterministic, _window(window), float(softcap), dq_dtype=dq_dtype,
                                              dk_dtype=dk_dtype, dv_dtype=dv_dtype)


def attention_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                             causal: bool = False, scale: float | None = None,
                             window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                             deterministic: bool = False):
    """(out, lse) of attention_varlen: out (total_q, H, d), lse (H, total_q) float32 (float64
    for float64 q), flash-attn's varlen layout."""
    return torch.ops.day50.attention_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                                                    int(max_seqlen_k), causal, scale, _window(window),
                                                    float(softcap), deterministic)


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                     scale: float | None = None, window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                     deterministic: bool = False) -> torch.Tensor:
    """Attention over packed sequences (flash-attn's flash_attn_varlen_func), differentiable in q, k, v.

    q (total_q, H, d), k and v (total_k, Hk, d) with Hk dividing H: B sequences stored one after
    the other; sequence b has queries cu_seqlens_q[b]:cu_seqlens_q[b + 1] and keys
    cu_seqlens_k[b]:cu_seqlens_k[b + 1] (int32, B + 1 entries from 0, on q's device, the last
    equal to total_q / total_k). max_seqlen_q / _k must be at least every length (they size the
    grid: on CUDA the offsets are never read on the host, so a shorter max drops rows silently).
    Sequences may be empty and have Nq != Nk; causal and window align bottom-right within each
    (flash-attn's rule: the last query sees the last key). A query that sees no key gets 0.
    CUDA, fp16 / bf16 with head dim a multiple of 8: the fused kernels up to 128 (version 2 on
    Hopper, else version 1) and on Hopper up to 256, deterministic=True included there; no
    host sync, CUDA-graph capturable. float32, other head dims up to 256 and what those do not
    run (d over 128 or deterministic=True off Hopper): the SIMT kernels (backend "simt" of
    attention(); no host sync either, a one-time warning for fp16 / bf16); float64 and head dims
    above 256 run the reference math per sequence after reading the offsets on the host.
    An inf or NaN in one sequence's q, k, v or gradient stays in that sequence's results."""
    return attention_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                                    window, softcap, deterministic)[0]


def attention_varlen_backward(grad_out, q, k, v, out, lse, grad_lse, cu_seqlens_q, cu_seqlens_k,
                              max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                              scale: float | None = None, window: tuple[int, int] = (-1, -1),
                              softcap: float = 0.0, deterministic: bool = False, *,
                              dq_dtype: torch.dtype | None = None, dk_dtype: torch.dtype | None = None,
                              dv_dtype: torch.dtype | None = None):
    """(dq, dk, dv) of attention_varlen_forward, given its out and lse; the dtypes as in
    attention_backward."""
    return torch.ops.day50.attention_varlen_backward(grad_out, q, k, v, out, lse, grad_lse, cu_seqlens_q,
                                                     cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), causal,
                                                     scale, _window(window), float(softcap), deterministic,
                                                     dq_dtype=dq_dtype, dk_dtype=dk_dtype, dv_dtype=dv_dtype)


def matmul(a, b, trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0):
    """The naive path's tiled batched matmul: alpha * op(a) @ op(b) for 3-D a, b."""
    return torch.ops.day50.matmul(a, b, trans_a, trans_b, alpha)


@contextlib.contextmanager
def kernel_versions(fwd: int | None = None, bwd: int | None = None):
    """Pin the fused kernels' versions for the calls inside a with-block; outside one the plan
    (0 = auto: version 2 where it applies, else 1) chooses, as it does for every model.

    fwd: the fused forward, 1 = mma.sync (csrc/flash_fwd.cu), 2 = Hopper TMA + wgmma
    (csrc/hopper_fwd.cu). bwd: the fused backward's main kernel, 1 = mma.sync
    (csrc/flash_bwd.cuh), 2 = Hopper (csrc/hopper_bwd.cu). None leaves that one as it is. A
    pinned version that cannot run an input is an error, never a silent fallback.

    The choice is read at each kernel launch and is process-wide, not per thread (autograd runs
    the backward on its own thread, which must see the forward's choice); leaving the block
    restores the previous choice, so blocks nest. For the benchmark's version ladder and the
    tests that compare versions."""
    restore = []
    try:
        if fwd is not None:
            restore.append((_C._set_fwd_version, _C._set_fwd_version(int(fwd))))
        if bwd is not None:
            restore.append((_C._set_bwd_version, _C._set_bwd_version(int(bwd))))
        yield
    finally:
        for setter, previous in reversed(restore):
            setter(previous)


def fwd_version(version: int):
    """kernel_versions(fwd=version)."""
    return kernel_versions(fwd=version)


def bwd_version(version: int):
    """kernel_versions(bwd=version)."""
    return kernel_versions(bwd=version)


def _lse_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _layout_strides(like: torch.Tensor) -> list[int]:
    """Strides of out, dq, dk and dv: like's (q's, k's, v's) dimension order, dense (csrc/attention_checks.h,
    layout_strides, is the rule every backend follows; this copy is for the fakes)."""
    order = sorted(range(4), key=lambda i: -like.stride(i))  # stable: ties keep their order
    if order[3] != 3:
        order = [0, 1, 2, 3]
    strides, s = [0] * 4, 1
    for i in reversed(order):
        strides[i] = s
        s *= max(like.shape[i], 1)
    return strides


def _check_one_device(op: str, **tensors):
    """Every tensor argument on one device, as SDPA requires. The check lives in the fakes too: a
    call with any argument on the meta device dispatches here, never to the C++ checks, and
    would otherwise return an uninitialised tensor on q's device."""
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        raise RuntimeError(f"{op}: all tensors must be on one device, got "
                           + ", ".join(f"{name} on {d}" for name, d in devices.items()))


@torch.library.register_fake("day50::attention_forward")
def _attention_forward_fake(q, k, v, causal=False, scale=None, backend="auto", deterministic=False,
                            window=(-1, -1), softcap=0.0):
    _check_one_device("attention", q=q, k=k, v=v)
    torch._check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4, lambda: "attention: q, k, v must be 4-D")
    out = q.new_empty_strided(q.shape, _layout_strides(q))
    lse = q.new_empty(q.shape[:3], dtype=_lse_dtype(q.dtype))
    return out, lse


@torch.library.register_fake("day50::attention_backward")
def _attention_backward_fake(grad_out, q, k, v, out, lse, grad_lse=None, causal=False, scale=None,
                             backend="auto", deterministic=False, window=(-1, -1), softcap=0.0, *,
                             dq_dtype=None, dk_dtype=None, dv_dtype=None):
    _check_one_device("attention_backward", grad_out=grad_out, q=q, k=k, v=v, out=out, lse=lse, grad_lse=grad_lse)
    return (q.new_empty_strided(q.shape, _layout_strides(q), dtype=dq_dtype or q.dtype),
            k.new_empty_strided(k.shape, _layout_strides(k), dtype=dk_dtype or k.dtype),
            v.new_empty_strided(v.shape, _layout_strides(v), dtype=dv_dtype or v.dtype))


@torch.library.register_fake("day50::attention_varlen_forward")
def _attention_varlen_forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                                   scale=None, window=(-1, -1), softcap=0.0, deterministic=False):
    _check_one_device("attention_varlen", q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    torch._check(q.dim() == 3 and k.dim() == 3 and v.dim() == 3,
                 lambda: "attention_varlen: q, k, v must be 3-D (total, heads, d)")
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=_lse_dtype(q.dtype))


@torch.library.register_fake("day50::attention_varlen_backward")
def _attention_varlen_backward_fake(grad_out, q, k, v, out, lse, grad_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, causal=False, scale=None, window=(-1, -1), softcap=0.0,
                                    deterministic=False, *, dq_dtype=None, dk_dtype=None, dv_dtype=None):
    _check_one_device("attention_varlen_backward", grad_out=grad_out, q=q, k=k, v=v, out=out, lse=lse,
                      grad_lse=grad_lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    return (q.new_empty(q.shape, dtype=dq_dtype or q.dtype), k.new_empty(k.shape, dtype=dk_dtype or k.dtype),
            v.new_empty(v.shape, dtype=dv_dtype or v.dtype))


@torch.library.register_fake("day50::matmul")
def _matmul_fake(a, b, trans_a=False, trans_b=False, alpha=1.0):
    m = a.shape[2] if trans_a else a.shape[1]
    n = b.shape[1] if trans_b else b.shape[2]
    return a.new_empty((a.shape[0], m, n))


# Autograd: a C++ torch::autograd::Function at the Autograd key
# (csrc/attention_autograd.cpp); a second derivative raises "not implemented".
