"""Tests of day26: LayerNorm forward + backward on CPU and CUDA.

    python test.py            # pytest underneath; extra args go to pytest
    python test.py --jit      # build the extension from csrc/ on import (no install)

Every result is compared with a float64 reference (torch.nn.functional.layer_norm
and its autograd on float64 inputs). fp32 results must be close to it; fp16/bf16
results may be at most 2x as far from it as PyTorch's own same-dtype result.
Outputs are NaN-poisoned before the kernels run (kernel_common.testing), so an
unwritten element fails.
"""
import contextlib
import os
import sys

if __name__ == "__main__" and "--jit" in sys.argv:
    from kernel_common.build import use_jit

    use_jit()  # before the package below is imported
    sys.argv.remove("--jit")

from kernel_common import testing  # noqa: E402
from kernel_common.testing import DEVICES, HAS_CUDA, requires_cuda  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from day26_layernorm import LayerNorm, layer_norm, layer_norm_backward, layer_norm_forward  # noqa: E402

SANITIZE = os.environ.get("KC_SANITIZE") == "1"

# Row lengths that break naive kernels: 1, odd, not a multiple of 4/8/32,
# each side of the warp/block and register/fallback limits (512, 16384).
COLS = [1, 3, 33, 100, 511, 512, 513, 768, 1000, 1024, 4099, 8192, 16384, 16385, 65536]
# 0 = auto (the default), then one kernel family each (csrc/layernorm_versions.h)
CUDA_VERSIONS = [0, 1, 2, 3, 4, 5, 6]
if SANITIZE:
    COLS = [1, 33, 512, 513, 4099, 16385]


def rows_for(cols: int) -> int:
    return max(1, min(37, 200_000 // cols))


def ref_forward(x, shape, w, b, eps):
    return F.layer_norm(x.double(), shape, None if w is None else w.double(), None if b is None else b.double(), eps)


def ref_grads(x, shape, w, b, eps, dy):
    """float64 autograd of F.layer_norm: (dx, dw, db)."""
    xd = x.detach().double().requires_grad_()
    wd = None if w is None else w.detach().double().requires_grad_()
    bd = None if b is None else b.detach().double().requires_grad_()
    y = F.layer_norm(xd, shape, wd, bd, eps)
    y.backward(dy.double())
    return xd.grad, None if wd is None else wd.grad, None if bd is None else bd.grad


def torch_same_dtype_grads(x, shape, w, b, eps, dy):
    """PyTorch's own result in the test dtype (the yardstick for fp16/bf16).

    With fp32 weights and a low-precision input, PyTorch's path is the one
    autocast takes (layer_norm in fp32, results rounded to the input dtype);
    its CUDA kernel does not take the mixed dtypes directly."""
    if w is not None and w.dtype != x.dtype:
        y, dx, dw, db = torch_same_dtype_grads(x.float(), shape, w, b, eps, dy.float())
        return y.to(x.dtype), dx.to(x.dtype), dw, db
    xs = x.detach().clone().requires_grad_()
    ws = None if w is None else w.detach().clone().requires_grad_()
    bs = None if b is None else b.detach().clone().requires_grad_()
    y = F.layer_norm(xs, shape, ws, bs, eps)
    y.backward(dy)
    return y.detach(), xs.grad, None if ws is None else ws.grad, None if bs is None else bs.grad


def check(out, ref, torch_out, name, natural=0.0, natural_norm=0.0):
    """`natural`: the magnitude of the terms the result is computed from, when it
    exceeds the result itself. dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
    cancels to exactly 0 for D = 1, where rstd = 1/sqrt(eps) ~ 316: rounding
    errors there are ulps of rstd * |g|, not of the (zero) result.
    `natural_norm`: the same for the fp32 norm check: the norm of dx's terms in
    absolute value (a row of 3 can give a dx far below them), or of a column
    sum's (dweight, dbias) sums of |terms|. A sum of random signs can cancel to far
    below its terms (seen on an H200: dbias at D = 1 over 37 rows, -0.089 from
    terms of size ~1, 4.1e-6 relative to itself), and fp32 rounding is relative to
    the terms."""
    scale = max(ref.abs().max().item() if ref.numel() else 0.0, natural)
    if out.dtype in (torch.float16, torch.bfloat16):
        testing.assert_lowp_close(out, ref, torch_out, name=name, floor=torch.finfo(out.dtype).eps * scale)
    else:
        # fp32 (fp64): relative to the largest value, since gradients are sums of
        # many terms: 2e-5 of the scale elementwise, and tight in norm.
        testing.assert_close(out, ref, atol=2e-5 * scale + 1e-6, rtol=1e-4, name=name)
        if ref.numel() and max(ref.norm().item(), natural_norm) > 1e-3:
            err = testing.rel_err(out, ref, scale=natural_norm)
            assert err < (1e-12 if out.dtype == torch.float64 else 3e-6), f"{name}: {err:.3g} relative"


def make(rows, cols, dtype, device, wdtype="same", affine=(True, True), lead=None):
    shape = (rows, cols) if lead is None else (*lead, cols)
    x = testing.fresh(*shape, dtype=dtype, device=device, scale=2.0, offset=0.5)
    wdt = dtype if wdtype == "same" else wdtype
    w = testing.fresh(cols, dtype=wdt, device=device, scale=0.5, offset=1.0) if affine[0] else None
    b = testing.fresh(cols, dtype=wdt, device=device) if affine[1] else None
    dy = testing.fresh(*shape, dtype=dtype, device=device)
    return x, w, b, dy


def run_and_check(x, w, b, dy, shape, eps=1e-5, version=3):
    y, mean, rstd = layer_norm_forward(x, shape, w, b, eps, version)
    y_ref = ref_forward(x, shape, w, b, eps)
    y_t, dx_t, dw_t, db_t = torch_same_dtype_grads(x, shape, w, b, eps, dy)
    check(y, y_ref, y_t, "y")
    xd = x.double()
    dims = tuple(range(x.dim() - len(shape), x.dim()))
    mean_d = xd.mean(dims, keepdim=True)
    rstd_d = (xd.var(dims, unbiased=False, keepdim=True) + eps).rsqrt()
    testing.assert_close(mean, mean_d.reshape(mean.shape), atol=1e-5, rtol=1e-5, name="mean")
    testing.assert_close(rstd, rstd_d.reshape(rstd.shape), atol=1e-5, rtol=1e-4, name="rstd")
    dx, dw, db = layer_norm_backward(dy, x, shape, mean, rstd, w, (True, True, b is not None), version)
    dx_r, dw_r, db_r = ref_grads(x, shape, w, b, eps, dy)
    g = dy.double() * (1.0 if w is None else w.double())
    xhat = (xd - mean_d) * rstd_d
    # dx's terms in absolute value: for short rows dx can cancel far below them (D = 3:
    # dx is g projected on the one direction orthogonal to 1 and xhat)
    dx_terms = rstd_d * (g.abs() + g.mean(dims, keepdim=True).abs()
                         + xhat.abs() * (g * xhat).mean(dims, keepdim=True).abs())
    check(dx, dx_r, dx_t, "dx", natural=rstd.double().max().item() * g.abs().max().item() if dx.numel() else 0.0,
          natural_norm=dx_terms.norm().item() if dx.numel() else 0.0)
    # the column sums' terms, summed in absolute value (their natural scale)
    rows_dims = tuple(range(x.dim() - len(shape)))
    dyd = dy.double()
    if w is not None:
        check(dw, dw_r, dw_t, "dweight", natural_norm=(dyd * xhat).abs().sum(rows_dims).norm().item())
    else:
        assert dw.numel() == 0
    if b is not None:
        check(db.to(b.dtype), db_r, db_t, "dbias", natural_norm=dyd.abs().sum(rows_dims).norm().item())
    return y, dx, dw, db


# ------------------------------------------------------------------ numerics
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", testing.FLOAT_DTYPES)
@pytest.mark.parametrize("cols", COLS)
def test_forward_backward_shapes(device, dtype, cols):
    versions = CUDA_VERSIONS if device == "cuda" else [3]
    for v in versions:  # noqa: B007
        x, w, b, dy = make(rows_for(cols), cols, dtype, device)
        run_and_check(x, w, b, dy, (cols,), version=v)


@pytest.fixture
def knob():
    """Sets day26's private tuning knobs (day26_layernorm.ops.knobs) inside one test;
    every knob it set is back to the library's choice after."""
    from day26_layernorm import ops

    with contextlib.ExitStack() as stack:
        class Knobs:
            def set(self, name, value):
                stack.enter_context(ops.knobs(**{name: int(value)}))

        yield Knobs()


@requires_cuda
@pytest.mark.parametrize("target", ["1", "2", "8"])
def test_cuda_launch_configurations(target, knob):
    """The knob target_iters tuning knob picks other block shapes: all must be right."""
    knob.set("target_iters", target)
    for cols in [513, 1000, 4096, 8192, 12288]:
        for dtype in (torch.float32, torch.bfloat16):
            for v in (0, 2, 3, 4):
                x, w, b, dy = make(19, cols, dtype, "cuda")
                run_and_check(x, w, b, dy, (cols,), version=v)


@requires_cuda
@pytest.mark.parametrize("grid", ["0", "3"])
def test_cuda_row_slots(grid, knob):
    """Version 4 (row slots) wherever it can run, its slot shapes: one warp per row up
    to 512 threads per row, 1 to 16 slots per block, the next row prefetched (16-bit
    rows of 512-1023 columns); with knob grid = 3 every slot walks many rows. (16-bit
    rows over 8192 columns have no version 4 backward: version 2 runs them.)"""
    if grid != "0":
        knob.set("grid", grid)
    for cols in [33, 100, 600, 768, 1000, 4096, 12288, 16384]:
        for dtype in (torch.float32, torch.bfloat16):
            x, w, b, dy = make(37, cols, dtype, "cuda")
            run_and_check(x, w, b, dy, (cols,), version=4)


@requires_cuda
@pytest.mark.parametrize("stages", ["2", "3", "5"] if SANITIZE else ["2", "3", "4", "5", "6"])
def test_cuda_ring(stages, knob):
    """Version 5: row slots on the ring of rows filled by bulk copies (knob
    ring_stages), for every slot shape and dtype, backward (the forward runs 4).
    knob grid caps the grid at 3 blocks, so every slot walks many rows and its ring
    wraps around several times (each stage refilled, mbarrier phases flipping).
    Rows over 8192 columns have no unsplit ring: they fall back (version 2)."""
    knob.set("ring_stages", stages)
    knob.set("grid", "3")
    for cols in ([96, 1000, 4096] if SANITIZE else [8, 96, 768, 1000, 4096, 12288, 16384]):
        for dtype in testing.FLOAT_DTYPES:
            x, w, b, dy = make(400 if cols < 4096 else 50, cols, dtype, "cuda")
            run_and_check(x, w, b, dy, (cols,), version=5)


# Row lengths per knob cluster value: 1 (no split: version 5 up to 8192 columns, longer
# rows fall back along version 6's chain to version 2) at every size; 2 and 4 only
# where each CTA's share is over 4096 columns (the plan's own splits, the only split
# kernels compiled: csrc/layernorm_knobs.h), up to shares of 16384 (16-bit, 4 vectors a
# thread). Sizes without a split into whole 16-byte vectors, or whose share no kernel
# holds (fp32 shares over 8192), fall back along version 6's chain.
CLUSTER_COLS = {
    "1": [64, 768, 1000, 4096, 12288, 16384],
    "2": [8320, 12288, 16384, 24576],
    "4": [16448, 32768, 65536],
}
CLUSTER_COLS_SANITIZE = {"1": [64, 1000, 4096], "2": [8320, 24576], "4": [16448]}


@requires_cuda
@pytest.mark.parametrize("cluster", ["1", "2", "4"])
def test_cuda_ring_cluster(cluster, knob):
    """Version 6: the ring backward with each row split across a cluster of CTAs
    (knob cluster; 1: no split, version 5 runs; the row sums exchanged through
    distributed shared memory; the forward split too, next test), for shares of a
    row over 4096 columns (fp32: 4 vectors a thread; 16-bit: 2, and 4 over 8192), every
    dtype, fp32 or same-dtype weights, whole and dx-only; with the grid capped at 8
    blocks so every slot walks many rows (both exchange buffers reused many times), and
    bitwise reproducible. Then row counts under the clusters' count: clusters with no
    row, or one."""
    knob.set("cluster", cluster)
    knob.set("grid", "8")
    if cluster == "2":
        for rows in (1, 3, 5):
            x, w, b, dy = make(rows, 8320, torch.bfloat16, "cuda")
            run_and_check(x, w, b, dy, (8320,), version=6)
    for cols in (CLUSTER_COLS_SANITIZE if SANITIZE else CLUSTER_COLS)[cluster]:
        for dtype in ([torch.float32, torch.bfloat16] if SANITIZE else testing.FLOAT_DTYPES):
            for wdtype in (("same",) if SANITIZE else ("same", torch.float32)):
                x, w, b, dy = make(300 if cols < 4096 else 40, cols, dtype, "cuda", wdtype=wdtype)
                _, dx, dw, db = run_and_check(x, w, b, dy, (cols,), version=6)
                _, mean, rstd = layer_norm_forward(x, cols, w, b, version=6)
                dx_only, dw0, db0 = layer_norm_backward(dy, x, cols, mean, rstd, w, (True, False, False), version=6)
                assert dw0.numel() == 0 and db0.numel() == 0
                # another kernel instantiation: the same math, but the compiler may contract
                # other products into FMAs, so equal up to a few roundings, not bitwise
                ulp = torch.finfo(dtype).eps
                torch.testing.assert_close(dx_only.float(), dx.float(), rtol=2 * ulp,
                                           atol=8 * ulp * dx.abs().max().item())
                again = layer_norm_backward(dy, x, cols, mean, rstd, w, version=6)
                for a, c in zip((dx, dw, db), again):
                    assert torch.equal(a, c), "cluster ring backward is not bitwise reproducible"


@requires_cuda
@pytest.mark.parametrize("cluster", ["2", "4"])
@pytest.mark.parametrize("version", [0, 6])
def test_cuda_forward_cluster(cluster, version, knob):
    """The forward with each row split across a cluster of CTAs (version 6; auto's
    choice for fp32 rows longer than 8192; knob cluster sets the CTAs, and splits
    16-bit rows under auto too): each CTA's share reduced to (mean, m2), the pairs
    exchanged through distributed shared memory and combined in rank order. Shares
    over 4096 columns (the only split kernels compiled) to 16384, every dtype, fp32
    or same-dtype weights; the grid capped at 8 blocks so every slot walks many rows
    (both exchange buffers reused many times); bitwise reproducible."""
    knob.set("cluster", cluster)
    knob.set("grid", "8")
    for cols in (CLUSTER_COLS_SANITIZE if SANITIZE else CLUSTER_COLS)[cluster]:
        for dtype in ([torch.float32, torch.bfloat16] if SANITIZE else testing.FLOAT_DTYPES):
            for wdtype in ("same", torch.float32):
                x, w, b, dy = make(300 if cols < 4096 else 40, cols, dtype, "cuda", wdtype=wdtype)
                y, mean, rstd = layer_norm_forward(x, cols, w, b, version=version)
                check(y, ref_forward(x, (cols,), w, b, 1e-5), torch_same_dtype_grads(x, (cols,), w, b, 1e-5, dy)[0], "y")
                xd = x.double()
                testing.assert_close(mean, xd.mean(-1), atol=1e-5, rtol=1e-5, name="mean")
                testing.assert_close(rstd, (xd.var(-1, unbiased=False) + 1e-5).rsqrt(), atol=1e-5, rtol=1e-4,
                                     name="rstd")
                again = layer_norm_forward(x, cols, w, b, version=version)
                for a, c in zip((y, mean, rstd), again):
                    assert torch.equal(a, c), "cluster forward is not bitwise reproducible"


@requires_cuda
def test_cuda_forward_l2_prefetch(knob):
    """Where version 4's and 6's forward leaves one row slot per SM (4 vectors a thread: 16-bit
    rows over 8192 columns, fp32 shares of a cluster-split row) it also asks the
    copy engine to prefetch the row after next into L2 (knob l2_prefetch, default
    on). A hint must change nothing: against the reference, and bitwise against
    the same kernels without it (16-bit rows, unsplit: the kernels without it are
    sm_80's; split rows have none, test_cuda_knobs_without_kernels_are_refused);
    the grid capped at 5 blocks so that every slot walks many rows and the
    prefetch runs past the last one it may touch. The split rows' prefetch: the
    cluster tests."""
    knob.set("grid", "5")
    for cols in ([12288] if SANITIZE else [8200, 12288, 16384]):
        for dtype in (torch.float16, torch.bfloat16):
            x, w, b, dy = make(61, cols, dtype, "cuda")
            out = {}
            for l2pf in ("1", "0"):
                knob.set("l2_prefetch", l2pf)
                out[l2pf] = layer_norm_forward(x, cols, w, b)
            y, mean, rstd = out["1"]
            check(y, ref_forward(x, (cols,), w, b, 1e-5), torch_same_dtype_grads(x, (cols,), w, b, 1e-5, dy)[0], "y")
            xd = x.double()
            testing.assert_close(mean, xd.mean(-1), atol=1e-5, rtol=1e-5, name="mean")
            for a, c in zip(out["1"], out["0"]):
                assert torch.equal(a, c), "the L2 prefetch changed the forward's output"


@requires_cuda
def test_cuda_knobs_without_kernels_are_refused(knob):
    """Knob values that would reach a kernel that is not compiled are an error, not a quiet
    fallback (csrc/layernorm_knobs.h): cluster 2 or 4 with shares of at most 4096
    columns; l2_prefetch=0 with a forward row that may be split."""
    x, w, b, dy = make(8, 4096, torch.float32, "cuda")
    _, mean, rstd = layer_norm_forward(x, 4096, w, b)
    knob.set("cluster", "2")
    with pytest.raises(RuntimeError, match="knob cluster=2 would split rows of 4096 columns into shares of 2048"):
        layer_norm_forward(x, 4096, w, b)
    with pytest.raises(RuntimeError, match="knob cluster=2"):
        layer_norm_backward(dy, x, 4096, mean, rstd, w, version=6)
    knob.set("cluster", "-1")
    x, w, b, dy = make(8, 12288, torch.float32, "cuda")
    _, mean, rstd = layer_norm_forward(x, 12288, w, b)
    knob.set("l2_prefetch", "0")
    with pytest.raises(RuntimeError, match="knob l2_prefetch=0"):
        layer_norm_forward(x, 12288, w, b, version=3)  # whatever the version
    layer_norm_backward(dy, x, 12288, mean, rstd, w)  # the knob concerns the forward only


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_large_mean(device, dtype):
    """Rows whose mean is 500 times their spread: the variance must not come
    from sum(x^2) - D * mean^2 (in fp32 that cancels to noise; rstd is checked
    to 1e-4). Every version, including v4's cluster split (each CTA's share
    reduced to (mean, m2), the pairs combined with kc::warp_combine_mean_m2)
    at 12288 and 16384 in fp32. y = x * rstd - mean * rstd (times w, plus b) cancels
    terms ~500 times larger than y, and mean is an fp32 value: in fp32, y is
    good to a few ulps of those terms, not of y (PyTorch's own fp32 kernels
    alike), so that is the bound."""
    versions = CUDA_VERSIONS if device == "cuda" else [3]
    for cols in [7, 100, 1024, 4096, 12288, 16384]:
        for v in versions:
            x, w, b, dy = make(64, cols, dtype, device)
            x = (x.float() + 1000.0).to(dtype)
            y, mean, rstd = layer_norm_forward(x, cols, w, b, 1e-5, v)
            xd = x.double()
            mean_d = xd.mean(-1)
            rstd_d = (xd.var(-1, unbiased=False) + 1e-5).rsqrt()
            testing.assert_close(mean, mean_d, atol=0, rtol=1e-6, name="mean")
            testing.assert_close(rstd, rstd_d, atol=0, rtol=1e-4, name="rstd")
            y_ref = ref_forward(x, (cols,), w, b, 1e-5)
            if dtype == torch.float32:
                terms = xd.abs().amax() * rstd_d.amax() * w.double().abs().amax() + b.double().abs().amax()
                testing.assert_close(y, y_ref, atol=8 * 2.0**-24 * terms.item(), rtol=0, name="y")
            else:
                check(y, y_ref, torch_same_dtype_grads(x, (cols,), w, b, 1e-5, dy)[0], "y")


@requires_cuda
@pytest.mark.parametrize("cols", [768, 1024, 4096, 8192, 16384])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_many_rows_per_block(cols, dtype):
    """Enough rows that each block of the persistent grid walks many of them, so
    v3's shared-memory stages are reused many times over."""
    rows = 64 if SANITIZE else max(3000, 4_000_000 // cols)
    for v in (0, 2, 3, 4, 5, 6):
        x, w, b, dy = make(rows, cols, dtype, "cuda")
        run_and_check(x, w, b, dy, (cols,), version=v)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [0, 1, 2, 9, 300])
def test_row_counts(device, rows):
    for v in (CUDA_VERSIONS if device == "cuda" else [3]):
        x, w, b, dy = make(rows, 256, torch.float32, device)
        y, dx, dw, db = run_and_check(x, w, b, dy, (256,), version=v)
        if rows == 0:  # sums over no rows are zeros, not poison
            assert torch.equal(dw, torch.zeros_like(dw)) and torch.equal(db, torch.zeros_like(db))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("affine", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_optional_weight_bias(device, affine, dtype):
    x, w, b, dy = make(7, 1024, dtype, device, affine=affine)
    run_and_check(x, w, b, dy, (1024,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp32_weights_with_low_precision_input(device, dtype):
    x, w, b, dy = make(5, 768, dtype, device, wdtype=torch.float32)
    y, dx, dw, db = run_and_check(x, w, b, dy, (768,))
    assert y.dtype == dtype and dw.dtype == torch.float32 and db.dtype == torch.float32


@requires_cuda
@pytest.mark.parametrize("dtype,wdtype", [(d, "same") for d in testing.FLOAT_DTYPES]
                         + [(d, torch.float32) for d in testing.FLOAT_DTYPES if d != torch.float32])
def test_cuda_weight_dtype_and_dx_only(dtype, wdtype):
    """Kernels that take the weight dtype, or whether to keep the column sums, at run time
    (version 4's backward, the ring at up to 16 columns a thread, version 3, version 2's
    warp rows; for 16-bit input also version 2's and 3's forward and version 2's backward
    kernels that the plan never runs: warp rows, block rows of 1 and 2 vectors a thread
    at 256-2048 columns): both weight dtypes against the reference, and dx alone equal to
    the whole backward's up to a few roundings. Aligned and offset (no 16-byte vectors)
    inputs."""
    for cols in [256, 512, 768, 2048, 4096]:
        for offset in (False, True):
            for v in (2, 3, 4, 5, 6):
                x, w, b, dy = make(40, cols, dtype, "cuda", wdtype=wdtype)
                if offset:
                    x, w, b, dy = (testing.offset_view(t) for t in (x, w, b, dy))
                _, dx, _, _ = run_and_check(x, w, b, dy, (cols,), version=v)
                _, mean, rstd = layer_norm_forward(x, cols, w, b, version=v)
                dx_only, _, _ = layer_norm_backward(dy, x, cols, mean, rstd, w, (True, False, False), version=v)
                ulp = torch.finfo(dtype).eps
                torch.testing.assert_close(dx_only.float(), dx.float(), rtol=2 * ulp,
                                           atol=8 * ulp * dx.abs().max().item())


@pytest.mark.parametrize("device", DEVICES)
def test_multi_dim_normalized_shape_and_leading_dims(device):
    x = testing.fresh(2, 3, 5, 4, 6, device=device)
    w = testing.fresh(4, 6, device=device)
    b = testing.fresh(4, 6, device=device)
    dy = testing.fresh(2, 3, 5, 4, 6, device=device)
    y, mean, rstd = layer_norm_forward(x, (4, 6), w, b)
    assert mean.shape == (2, 3, 5) and rstd.shape == (2, 3, 5)
    run_and_check(x, w, b, dy, (4, 6))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["strided", "offset"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_non_contiguous_and_offset_inputs(device, layout, dtype):
    view = testing.strided_view if layout == "strided" else testing.offset_view
    x, w, b, dy = make(6, 1024, dtype, device)
    run_and_check(view(x), view(w), view(b), view(dy), (1024,))
    xt = testing.fresh(1024, 6, dtype=dtype, device=device).t()  # transposed: rows not contiguous
    run_and_check(xt, w, b, dy, (1024,))


@pytest.mark.parametrize("device", DEVICES)
def test_autograd_matches_reference(device):
    x, w, b, dy = make(12, 640, torch.float32, device)
    xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
    layer_norm(xs, 640, ws, bs).backward(dy)
    dx_r, dw_r, db_r = ref_grads(x, (640,), w, b, 1e-5, dy)
    for got, ref, name in [(xs.grad, dx_r, "dx"), (ws.grad, dw_r, "dw"), (bs.grad, db_r, "db")]:
        check(got, ref, None, name)
    # only the input requires grad: no dweight/dbias work requested
    xs2 = x.clone().requires_grad_()
    layer_norm(xs2, 640, w, b).backward(dy)
    check(xs2.grad, dx_r, None, "dx (input only)")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("affine,wants", [
    (a, w) for a in [(True, True), (False, True), (True, False)] for w in ["x", "w", "b", "wb", "xb"]
    if (a[0] or "w" not in w) and (a[1] or "b" not in w)])
def test_autograd_each_requested_gradient(device, affine, wants):
    """Each subset of (x, weight, bias) asked for through torch.autograd.grad gets its own
    gradient, with or without the other parameter (the C++ autograd node's input
    indices shift when weight is None)."""
    x, w, b, dy = make(7, 96, torch.float32, device)
    w = w if affine[0] else None
    b = b if affine[1] else None
    named = {"x": x, "w": w, "b": b}
    leaves = {k: t.clone().requires_grad_() for k, t in named.items() if t is not None and k in wants}
    args = {k: leaves.get(k, t) for k, t in named.items()}
    y = layer_norm(args["x"], 96, args["w"], args["b"])
    got = torch.autograd.grad(y, list(leaves.values()), dy)
    ref = dict(zip("xwb", ref_grads(x, (96,), w, b, 1e-5, dy)))
    for (k, _), g in zip(leaves.items(), got):
        check(g, ref[k], None, "d" + k)


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward_is_a_clear_error(device):
    """A second derivative is not implemented: it must raise, never come back as zeros."""
    x, w, b, dy = make(5, 64, torch.float32, device)
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = layer_norm(xs, 64, ws, b)
    (gx,) = torch.autograd.grad(y, xs, dy, create_graph=True)
    dx_r, _, _ = ref_grads(x, (64,), w, b, 1e-5, dy)
    check(gx.detach(), dx_r, None, "dx under create_graph")  # first order still right
    with pytest.raises(RuntimeError, match="not implemented"):
        torch.autograd.grad(gx.sum(), xs)


@pytest.mark.parametrize("device", DEVICES)
def test_eps(device):
    x, w, b, dy = make(4, 300, torch.float32, device)
    x = x * 1e-3  # variance ~ eps: eps matters
    run_and_check(x, w, b, dy, (300,), eps=1e-3)


# -------------------------------------------------------- determinism, large
@requires_cuda
@pytest.mark.parametrize("rows,cols", [(3000, 2048), (2000, 4100), (700, 16384), (300, 65536)])
def test_cuda_finalize_shapes(rows, cols):
    """The wide finalize (rows over 1024 columns) over many partial rows (a persistent
    grid of one or more blocks per SM), at row lengths that are and are not multiples
    of 4, 128 or the SM count's columns: dweight and dbias against the float64
    reference, under version 0 and version 2 (another grid)."""
    for dtype in (torch.float32, torch.bfloat16):
        x, w, b, dy = make(rows, cols, dtype, "cuda")
        for v in (0, 2):
            run_and_check(x, w, b, dy, (cols,), version=v)


@requires_cuda
@pytest.mark.skipif(SANITIZE, reason="KC_SANITIZE=1: sanitize.sh turns the caching allocator off, which graph capture needs")
def test_cuda_backward_in_a_cuda_graph():
    """The backward captured in a CUDA graph (the finalize kernels are launched with PDL
    after the main kernel) and replayed twice: bitwise the eager result, for the ring (5),
    the cluster split (6) and row slots (4)."""
    from kernel_common import bench

    for rows, cols, dtype in [(4096, 1024, torch.bfloat16), (300, 16384, torch.bfloat16), (1000, 768, torch.float32),
                              (500, 2048, torch.float32)]:
        x, w, b, dy = make(rows, cols, dtype, "cuda")
        _, mean, rstd = layer_norm_forward(x, cols, w, b)
        eager = layer_norm_backward(dy, x, cols, mean, rstd, w)
        graph, out = bench.capture_graph(lambda: layer_norm_backward(dy, x, cols, mean, rstd, w), warmup=1)
        for _ in range(2):
            for t in out:
                t.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            for a, c in zip(eager, out):
                assert torch.equal(a, c), f"{rows}x{cols} {dtype}: graph replay differs from eager"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cols", [768, 4096, 8191, 16384])
def test_deterministic(device, cols):
    x, w, b, dy = make(3000 if device == "cuda" and not SANITIZE else 64, cols, torch.bfloat16, device,
                       wdtype=torch.float32)
    for v in ((0, 2, 3, 4, 5, 6) if device == "cuda" else (2,)):
        y, mean, rstd = layer_norm_forward(x, cols, w, b, version=v)
        first = layer_norm_backward(dy, x, cols, mean, rstd, w, version=v)
        for _ in range(3):
            again = layer_norm_backward(dy, x, cols, mean, rstd, w, version=v)
            for a, c in zip(first, again):
                assert torch.equal(a, c), f"v{v} backward is not bitwise reproducible"


@requires_cuda
@pytest.mark.skipif(SANITIZE, reason="too large for compute-sanitizer")
def test_cuda_indexing_past_2_31_elements():
    cols = 4096
    rows = (1 << 31) // cols + 3  # 2^31 + 3 * 4096 elements
    try:
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn_like(x)
    except torch.OutOfMemoryError:
        pytest.skip("not enough GPU memory for a 2^31-element test")
    w = testing.fresh(cols, device="cuda", dtype=torch.bfloat16, offset=1.0)
    b = testing.fresh(cols, device="cuda", dtype=torch.bfloat16)
    for v in (0, 1, 3):
        y, mean, rstd = layer_norm_forward(x, cols, w, b, version=v)
        dx, _, _ = layer_norm_backward(dy, x, cols, mean, rstd, w, (True, False, False), version=v)
        for r in (0, rows // 2, rows - 1):  # check rows on both sides of 2^31
            y_ref = ref_forward(x[r:r + 1], (cols,), w, b, 1e-5)
            dx_ref = ref_grads(x[r:r + 1], (cols,), w, b, 1e-5, dy[r:r + 1])[0]
            y_t, dx_t, _, _ = torch_same_dtype_grads(x[r:r + 1], (cols,), w, b, 1e-5, dy[r:r + 1])
            check(y[r:r + 1], y_ref, y_t, f"y row {r} (v{v})")
            check(dx[r:r + 1], dx_ref, dx_t, f"dx row {r} (v{v})")
        del y, dx, mean, rstd
    del x, dy
    torch.cuda.empty_cache()


# ------------------------------------------------------------ torch plumbing
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x, w, b, dy = make(5, 96, torch.float32, device)
    x.requires_grad_()
    w.requires_grad_()
    b.requires_grad_()
    torch.library.opcheck(torch.ops.day26.layer_norm_fwd, (x, [96], w, b, 1e-5, 3))
    torch.library.opcheck(torch.ops.day26.layer_norm_fwd, (x.detach(), [96], None, None, 1e-5, 1))
    y, mean, rstd = layer_norm_forward(x.detach(), 96, w.detach(), b.detach())
    torch.library.opcheck(torch.ops.day26.layer_norm_bwd, (dy, x.detach(), [96], mean, rstd, w.detach(),
                                                           [True, True, True], 2))
    torch.library.opcheck(torch.ops.day26.layer_norm_bwd, (dy, x.detach(), [96], mean, rstd, None,
                                                           [True, False, True], 2))


def test_gradcheck_float64_cpu():
    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: layer_norm(x, 7, w, b), (x, w, b))
    assert torch.autograd.gradcheck(lambda x: layer_norm(x, 7), (x,))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    torch._dynamo.reset()
    m = LayerNorm(64).to(device)

    def f(x):
        return m(x * 2.0).sum()

    cf = torch.compile(f, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")
    x = testing.fresh(8, 64, device=device).requires_grad_()
    out = cf(x)
    out.backward()
    x2 = x.detach().clone().requires_grad_()
    ref = F.layer_norm(x2 * 2.0, (64,), m.weight, m.bias).sum()
    ref.backward()
    testing.assert_close(out, ref, 1e-4, 1e-5, "compiled output")
    testing.assert_close(x.grad, x2.grad, 1e-5, 1e-4, "compiled grad")


@pytest.mark.parametrize("device", DEVICES)
def test_subclass_in_any_tensor_argument_sees_the_op(device):
    """The host fast path (kernel_common.fastpath) is taken only when no tensor argument
    overrides __torch_function__: a subclass given as weight, bias or residual (as
    FSDP2's DTensor parameters are) must see the registered op, and get the same values."""
    from day26_layernorm import add_norm, rms_norm

    seen = []

    class Rec(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(func)
            return super().__torch_function__(func, types, args, kwargs or {})

    t = dict(x=testing.fresh(4, 16, device=device), r=testing.fresh(4, 16, device=device),
             w=testing.fresh(16, device=device), b=testing.fresh(16, device=device))
    ops = torch.ops.day26
    cases = {"rms_norm": (ops.rms_norm_fwd.default, lambda t: rms_norm(t["x"], 16, t["w"], 1e-6), "xw"),
             "layer_norm": (ops.layer_norm_fwd.default, lambda t: layer_norm(t["x"], 16, t["w"], t["b"]), "xwb"),
             "add_norm": (ops.add_norm_fwd.default, lambda t: add_norm(t["x"], t["r"], t["w"], t["b"])[0], "xrwb")}
    for name, (op, f, args) in cases.items():
        plain = f(t)
        for a in args:
            seen.clear()
            out = f({**t, a: t[a].as_subclass(Rec)})
            assert op in seen, (name, a, seen)
            assert torch.equal(out.as_subclass(torch.Tensor), plain), (name, a)


@pytest.mark.parametrize("device", DEVICES)
def test_module_is_a_drop_in(device):
    ref = torch.nn.LayerNorm(48, eps=1e-6).to(device)
    with torch.no_grad():
        ref.weight.normal_()
        ref.bias.normal_()
    m = LayerNorm(48, eps=1e-6).to(device)
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in ref.named_parameters()]
    m.load_state_dict(ref.state_dict())
    x = testing.fresh(3, 5, 48, device=device)
    testing.assert_close(m(x), ref(x), 1e-5, 1e-5, "module output")
    m2 = LayerNorm.from_torch(ref, version=1)
    testing.assert_close(m2(x), ref(x), 1e-5, 1e-5, "from_torch output")
    for kw in [dict(elementwise_affine=False), dict(bias=False)]:
        r, ours = torch.nn.LayerNorm(48, **kw).to(device), LayerNorm(48, **kw).to(device)
        assert set(r.state_dict()) == set(ours.state_dict())
        ours.load_state_dict(r.state_dict())
        testing.assert_close(ours(x), r(x), 1e-5, 1e-5, f"module {kw}")


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_raises_clear_errors(device):
    x, w, b, dy = make(4, 16, torch.float32, device)
    with pytest.raises(RuntimeError, match="float32, float16 or bfloat16"):
        layer_norm(x.to(torch.int32), 16)
    with pytest.raises(RuntimeError, match="does not match the last"):
        layer_norm(x, 15)
    with pytest.raises(RuntimeError, match="fewer dims"):
        layer_norm(x, (2, 4, 16))
    with pytest.raises(RuntimeError, match="weight of shape"):
        layer_norm(x, 16, w[:8])
    with pytest.raises(RuntimeError, match="input's dtype"):
        layer_norm(x, 16, w.double())
    with pytest.raises(RuntimeError, match="same dtype"):
        layer_norm(x.bfloat16(), 16, w.bfloat16(), b)
    y, mean, rstd = layer_norm_forward(x, 16, w, b)
    with pytest.raises(RuntimeError, match="grad_out of shape"):
        layer_norm_backward(dy[:2], x, 16, mean, rstd, w)
    with pytest.raises(RuntimeError, match="grad_out dtype"):
        layer_norm_backward(dy.half(), x, 16, mean, rstd, w)
    with pytest.raises(RuntimeError, match="one per normalized row"):
        layer_norm_backward(dy, x, 16, mean[:2], rstd, w)
    for bad in (-1, 7):
        with pytest.raises(RuntimeError, match="version must be 0 \\(auto\\) to 6"):
            layer_norm(x, 16, version=bad)
        with pytest.raises(RuntimeError, match="version must be 0 \\(auto\\) to 6"):
            layer_norm_backward(dy, x, 16, mean, rstd, w, version=bad)
    # still usable afterwards
    run_and_check(x, w, b, dy, (16,))


@pytest.mark.parametrize("which", ["x", "weight", "bias"])
def test_meta_device_mix_is_an_error(which):
    """One argument of the forward on the meta device and the others on the CPU: a clear
    error, not an uninitialised output (the meta kernels check devices too)."""
    x, w, b, dy = make(3, 16, torch.float32, "cpu")
    args = {"x": x, "weight": w, "bias": b}
    args[which] = args[which].to("meta")
    with pytest.raises(RuntimeError, match="is on meta|is on cpu"):
        layer_norm(args["x"], 16, args["weight"], args["bias"])
    with pytest.raises(RuntimeError, match="is on meta|is on cpu"):
        layer_norm_forward(args["x"], 16, args["weight"], args["bias"])


@pytest.mark.parametrize("which", ["dy", "x", "mean", "rstd", "weight"])
def test_meta_device_mix_is_an_error_backward(which):
    """Every tensor argument of the backward, alone on the meta device: a clear error."""
    x, w, b, dy = make(3, 16, torch.float32, "cpu")
    _, mean, rstd = layer_norm_forward(x, 16, w, b)
    args = {"dy": dy, "x": x, "mean": mean, "rstd": rstd, "weight": w}
    args[which] = args[which].to("meta")
    with pytest.raises(RuntimeError, match="is on meta|is on cpu"):
        layer_norm_backward(args["dy"], args["x"], 16, args["mean"], args["rstd"], args["weight"])


@pytest.mark.parametrize("version", range(7))
def test_every_version_is_accepted_on_cpu(version):
    """0 (auto) to 6 are valid everywhere (the CPU checks the range and ignores the value)."""
    x, w, b, dy = make(3, 16, torch.float32, "cpu")
    run_and_check(x, w, b, dy, (16,), version=version)


def test_library_reads_no_environment():
    """Kernel choices come from the plan and, for experiments, the private knobs
    (ops.knobs): no source of the extension reads an environment variable."""
    from pathlib import Path

    for f in (Path(__file__).resolve().parent / "csrc").iterdir():
        assert "getenv" not in f.read_text(), f.name


def test_knobs_reject_unknown_names():
    from day26_layernorm import ops

    with pytest.raises(ValueError, match="unknown day26 knob"):
        with ops.knobs(not_a_knob=1):
            pass


@requires_cuda
@pytest.mark.parametrize("which", ["x", "weight", "bias"])
def test_cuda_cpu_mix_is_an_error(which):
    """Each tensor argument of the forward on the other device than the rest: a clear error."""
    x, w, b, dy = make(4, 16, torch.float32, "cuda")
    args = {"x": x, "weight": w, "bias": b}
    args[which] = args[which].cpu()
    with pytest.raises(RuntimeError, match="is on (cpu|cuda)"):
        layer_norm(args["x"], 16, args["weight"], args["bias"])
    run_and_check(x, w, b, dy, (16,))


@requires_cuda
@pytest.mark.parametrize("which", ["dy", "x", "mean", "rstd", "weight"])
def test_cuda_cpu_mix_is_an_error_backward(which):
    """Each tensor argument of the backward on the CPU, the rest on the GPU: a clear error."""
    x, w, b, dy = make(4, 16, torch.float32, "cuda")
    y, mean, rstd = layer_norm_forward(x, 16, w, b)
    args = {"dy": dy, "x": x, "mean": mean, "rstd": rstd, "weight": w}
    args[which] = args[which].cpu()
    with pytest.raises(RuntimeError, match="is on (cpu|cuda)"):
        layer_norm_backward(args["dy"], args["x"], 16, args["mean"], args["rstd"], args["weight"])
    run_and_check(x, w, b, dy, (16,))


# ------------------------------------------------------------------ the plan
def _plan(rows, cols, dtype, version=0, mask=(True, True, True), offset=False):
    from day26_layernorm import ops

    x, w, b, dy = make(rows, cols, dtype, "cuda")
    if offset:  # one element in: no 16-byte vectors
        x, dy = (testing.offset_view(t) for t in (x, dy))
    _, mean, rstd = layer_norm_forward(x, cols, w, b)
    return ops.backward_plan(dy, x, cols, mean, rstd, w, mask, version)


# version 0's family on sm_90+ (aligned tensors), from the table in csrc/layernorm_bwd_plan.cu
AUTO_FAMILY_SM90 = {
    torch.float32: {256: 5, 768: 5, 2048: 5, 8192: 5, 16384: 6},
    torch.bfloat16: {256: 4, 768: 4, 2048: 5, 8192: 5, 16384: 6},
}


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cols", [256, 768, 2048, 8192, 16384])
def test_cuda_plan_auto_table(dtype, cols):
    """Version 0's family per shape is the table's (layernorm_bwd_plan.cu, README), its
    workspace is one [2][cols] fp32 row per partial row, and none without dweight/dbias."""
    p = _plan(64, cols, dtype)
    if p["cc"] < 90:
        pytest.skip("the table's entries are for sm_90+")
    want = AUTO_FAMILY_SM90[dtype][cols]
    assert p["family"] == want, p
    assert p["cluster"] == (2 if want == 6 else 1)
    assert p["workspace_floats"] == p["partial_rows"] * 2 * cols
    assert p["finalize"] == (1 if cols <= 1024 else 2)
    q = _plan(64, cols, dtype, mask=(True, False, False))
    assert q["family"] == want and q["workspace_floats"] == 0 and q["finalize"] == 0


@requires_cuda
def test_cuda_plan_ring_stages():
    """The ring's depth without the knob (kRingStages in layernorm_bwd_ring.cu): fp32 rows of
    1024-4096 columns 5 stages where a block of them holds 256 threads, else 3; 16-bit rows 3,
    4 where one slot fills the SM; the knob's value wherever it is set."""
    if _plan(64, 1024, torch.float32)["cc"] < 90:
        pytest.skip("the ring runs on sm_90+")
    for rows, cols, dtype, stages, threads in [
        (4096, 4096, torch.float32, 5, 256),   # one 256-thread slot, five rows ahead
        (4096, 2048, torch.float32, 5, 256),   # two 128-thread slots
        (4096, 1024, torch.float32, 5, 256),   # four 64-thread slots
        (4096, 3072, torch.float32, 3, 384),   # five stages would leave one 192-thread slot
        (4096, 768, torch.float32, 3, None),   # below 1024 columns: 3
        (4096, 5120, torch.float32, 3, None),  # above 4096 columns: 3
        (4096, 8192, torch.float32, 3, 512),   # five stages of 64 KB rows do not fit
        (4096, 256, torch.float32, 3, None),   # short rows keep 3
        (4096, 2048, torch.bfloat16, 3, None),  # several slots an SM
        (4096, 8192, torch.bfloat16, 4, 512),  # one slot an SM
        (4096, 16384, torch.bfloat16, 4, 512),  # each CTA of the 2-CTA cluster: one slot
    ]:
        p = _plan(rows, cols, dtype)
        assert p["family"] in (5, 6) and p["stages"] == stages, (cols, dtype, p)
        if threads is not None:
            assert p["threads"] == threads, (cols, dtype, p)
        # the smem holds `stages` rows of x and dy per slot
        assert p["smem"] >= p["slots"] * stages * 2 * cols // p["cluster"] * dtype.itemsize, p
    from day26_layernorm import ops
    with ops.knobs(ring_stages=2):
        assert _plan(4096, 4096, torch.float32)["stages"] == 2
        assert _plan(4096, 8192, torch.bfloat16)["stages"] == 2


@requires_cuda
def test_cuda_plan_fallbacks():
    """A version that cannot run a shape runs the next of its chain (layernorm_versions.h)."""
    assert _plan(16, 256, torch.float32, version=3)["family"] == 2  # warp rows: no cp.async path
    assert _plan(4, 65536, torch.float32, version=2)["family"] == 1  # longer than registers hold
    assert _plan(16, 768, torch.bfloat16, version=5, offset=True)["family"] == 4  # no 16-byte vectors
    assert _plan(16, 4096, torch.bfloat16, version=6)["family"] in (5, 4)  # 4096: no split (cluster 1)
    # 16-bit rows over 8192 columns: no version 4 backward, no unsplit ring (version 5)
    assert _plan(16, 16384, torch.bfloat16, version=4)["family"] == 2
    assert _plan(16, 16384, torch.bfloat16, version=5)["family"] == 2
    # auto: a row over 8192 columns that splits into no whole 16-byte vectors runs 2, not 5
    assert _plan(16, 8200, torch.bfloat16)["family"] == 2
    p = _plan(16, 768, torch.bfloat16, version=4)
    assert p["family"] == 4 and p["prefetch"] == 1 and p["vec"] == 8
    assert _plan(16, 2048, torch.bfloat16, version=4)["prefetch"] == 0
    for v in range(1, 7):
        assert _plan(16, 1000, torch.float32, version=v)["version"] == v


@requires_cuda
def test_cuda_plan_v1_long_rows():
    """Rows over 8192 columns without 16-byte vectors run version 1 in its long shape
    (csrc/layernorm_common.cuh, V1Shape): 1024 threads, the rows of dy and x in shared
    memory where both fit 96 KiB; rows up to 8192 columns keep the seed's 256 threads."""
    for cols, dtype, offset, smem in [(16383, torch.bfloat16, False, 2 * 16383 * 2),
                                      (16384, torch.bfloat16, True, 2 * 16384 * 2),  # misaligned view
                                      (16383, torch.float32, False, 0), (32767, torch.bfloat16, False, 0)]:
        p = _plan(8, cols, dtype, offset=offset)
        assert (p["family"], p["threads"], p["smem"]) == (1, 1024, smem), (cols, dtype, offset)
    p = _plan(8, 768, torch.bfloat16, version=1)
    assert (p["family"], p["threads"], p["smem"]) == (1, 256, 0)


@requires_cuda
@pytest.mark.parametrize("cols", [768, 4096, 8192])
def test_cuda_forward_versions_5_and_6_run_4(cols):
    """The forward has no ring: version 5 runs version 4's kernels. Version 6 splits a
    16-bit row that one CTA holds only over 8192 columns (ring_cluster's shares), so up
    to 8192 it runs version 4's too. Both bitwise version 4's output (a split row adds
    its shares' (mean, m2) in another order)."""
    from day26_layernorm import ops

    x, w, b, dy = make(300, cols, torch.bfloat16, "cuda")
    ref = layer_norm_forward(x, cols, w, b, version=4)
    for v in (5, 6):
        if ops.forward_plan(x, cols, w, b, v)["cc"] >= 90:  # below sm_90 6 runs 4 anyway
            assert ops.forward_plan(x, cols, w, b, v)["family"] == 4, v
        for a, c in zip(layer_norm_forward(x, cols, w, b, version=v), ref):
            assert torch.equal(a, c), v


def _fplan(cols, dtype, version=0, offset=False, residual=False, rms=False, rows=64):
    from day26_layernorm import ops

    x, w, b, _ = make(rows, cols, dtype, "cuda")
    if offset:  # one element in: no 16-byte vectors
        x = testing.offset_view(x)
    r = testing.fresh(rows, cols, dtype=dtype, device="cuda") if residual else None
    return ops.forward_plan(x, cols, w, None if rms else b, version, r, rms)


@requires_cuda
def test_cuda_forward_plan():
    """The forward's plan (layernorm_fwd_plan.cu, README "The plan") on sm_90+, for both
    norms: 16-bit rows run 4 up to 16384 columns, 6 above in the fewest CTAs that hold a
    share; fp32 rows 2 up to 8192 columns, 6 above. Without 16-byte vectors: 4 (16-bit, up to
    2048 columns) or 2 (fp32), above 3 on the rows' covering granules where a stage is at most
    52 KiB, 1 beyond (1024 threads, the row kept in shared memory where it fits 96 KiB). add_norm adds in the kernel of 4 (16-bit) and 2 (fp32) in 16-byte vectors,
    else first (ln_add), then the norm's plan of the sum (a new, aligned tensor)."""
    if _fplan(768, torch.float32)["cc"] < 90:
        pytest.skip("the table's entries are for sm_90+")
    bf16, f32 = torch.bfloat16, torch.float32
    for rms in (False, True):
        for cols, dtype, offset, family, cluster in [
                (768, bf16, False, 4, 1), (4096, bf16, False, 4, 1), (16384, bf16, False, 4, 1),
                (32768, bf16, False, 6, 2), (768, f32, False, 2, 1), (8192, f32, False, 2, 1),
                (16384, f32, False, 6, 2),
                (2048, bf16, True, 4, 1), (4096, bf16, True, 3, 1), (768, f32, True, 2, 1),
                (16383, bf16, False, 3, 1), (16383, f32, False, 1, 1), (65535, bf16, False, 1, 1),
                (333, f32, True, 2, 1)]:
            p = _fplan(cols, dtype, offset=offset, rms=rms)
            assert (p["family"], p["cluster"]) == (family, cluster), (cols, dtype, offset, rms, p)
            v = 16 // dtype.itemsize
            assert p["vec"] == (1 if offset or cols % v else v), p
            if family == 1:
                cache = cols * dtype.itemsize
                assert (p["threads"], p["smem"]) == (1024, cache if cache <= 96 * 1024 else 0), p
    # forced versions: 5 has no forward kernel (runs 4); 6 splits 16-bit rows over 8192
    assert _fplan(768, bf16, version=5)["family"] == 4
    assert _fplan(768, bf16, version=6)["family"] == 4
    assert (_fplan(16384, bf16, version=6)["family"], _fplan(16384, bf16, version=6)["cluster"]) == (6, 2)
    assert _fplan(4096, f32, version=3)["family"] == 3
    assert (_fplan(768, f32, version=1)["threads"], _fplan(768, f32, version=1)["smem"]) == (256, 0)
    # add_norm
    for kind_rms in (False, True):
        for cols, dtype, offset, family, add, pack in [
                (4096, bf16, False, 4, 1, 0), (8192, bf16, False, 4, 1, 1), (4096, f32, False, 2, 1, 0),
                (16384, f32, False, 6, 0, 0), (4096, bf16, True, 4, 0, 0)]:  # the sum is aligned
            p = _fplan(cols, dtype, offset=offset, residual=True, rms=kind_rms)
            got = (p["family"], p["add"], p["add_first"], p["pack"])
            assert got == (family, add, 1 - add, pack), (cols, dtype, offset, kind_rms, p)


@requires_cuda
@pytest.mark.parametrize("dtype", testing.FLOAT_DTYPES)
def test_cuda_forward_rows_without_vectors(dtype):
    """Version 3's rows without 16-byte vectors (csrc/layernorm_fwd_v3.cu,
    ln_fwd_v3_granules) copy the aligned 16-byte granules that cover each row: odd D
    (each row at another offset in its first granule) and views 1 to v - 1 elements
    into a buffer; weights of x's dtype, fp32 or none; LayerNorm and RMSNorm; one row,
    a few, and enough that each block walks more rows than its stages (each stage
    refilled after other threads read it). Against the float64 reference; auto runs 3
    there above 2048 columns."""
    from day26_layernorm import ops

    v = 16 // dtype.itemsize
    for cols, offsets, cases in [
            (4099, (1,), [("same", (True, True), 3000)]),
            *[(c, (0, 1, v - 1), [("same", (True, True), 7), (torch.float32, (True, True), 5),
                                  ("same", (False, False), 1)]) for c in (513, 1000, 4099, 8191, 2047 * v - 1)]]:
        for offset in offsets:
            for wdtype, affine, rows in cases:
                if wdtype is torch.float32 and dtype == torch.float32:
                    continue
                x, w, b, dy = make(rows, cols, dtype, "cuda", wdtype=wdtype, affine=affine)
                if offset:
                    x, dy = (testing.offset_view(t, offset) for t in (x, dy))
                if not (cols % v or offset):
                    continue
                assert ops.forward_plan(x, cols, w, b, 3)["family"] == 3, (cols, offset)
                if cols > 2048:
                    assert ops.forward_plan(x, cols, w, b)["family"] == 3, (cols, offset)
                run_and_check(x, w, b, dy, (cols,), version=3)
                run_rms_and_check(x, w, dy, (cols,), version=3)


# ------------------------------------------------------------------ RMSNorm
# The LayerNorm kernels and plan without centring or bias (csrc/layernorm.h: a
# null mean); references: F.rms_norm in float64 and its autograd.

def rms_ref(x, shape, w, eps, dy):
    """float64 F.rms_norm: (y, dx, dw)."""
    xd = x.detach().double().requires_grad_()
    wd = None if w is None else w.detach().double().requires_grad_()
    y = F.rms_norm(xd, shape, wd, eps)
    y.backward(dy.double())
    return y.detach(), xd.grad, None if wd is None else wd.grad


def rms_torch_same_dtype(x, shape, w, eps, dy):
    """PyTorch's own F.rms_norm in the test dtype (fp32 weight with 16-bit x: in fp32, rounded)."""
    if w is not None and w.dtype != x.dtype:
        y, dx, dw = rms_torch_same_dtype(x.float(), shape, w, eps, dy.float())
        return y.to(x.dtype), dx.to(x.dtype), dw
    xs = x.detach().clone().requires_grad_()
    ws = None if w is None else w.detach().clone().requires_grad_()
    y = F.rms_norm(xs, shape, ws, eps)
    y.backward(dy)
    return y.detach(), xs.grad, None if ws is None else ws.grad


def run_rms_and_check(x, w, dy, shape, eps=1e-5, version=0):
    from day26_layernorm import rms_norm_backward, rms_norm_forward

    y, rstd = rms_norm_forward(x, shape, w, eps, version)
    y_r, dx_r, dw_r = rms_ref(x, shape, w, eps, dy)
    y_t, dx_t, dw_t = rms_torch_same_dtype(x, shape, w, eps, dy)
    check(y, y_r, y_t, "rms y")
    xd = x.double()
    dims = tuple(range(x.dim() - len(shape), x.dim()))
    rstd_d = ((xd * xd).mean(dims, keepdim=True) + eps).rsqrt()
    testing.assert_close(rstd, rstd_d.reshape(rstd.shape), atol=1e-5, rtol=1e-4, name="rms rstd")
    dx, dw = rms_norm_backward(dy, x, shape, rstd, w, (True, True), version)
    g = dy.double() * (1.0 if w is None else w.double())
    xhat = xd * rstd_d
    dx_terms = rstd_d * (g.abs() + xhat.abs() * (g * xhat).mean(dims, keepdim=True).abs())
    # natural: dx's terms, not dx, set the fp32 rounding where they cancel; at D = 1,
    # dx = rstd * g * eps / (x^2 + eps) comes from 1 - xhat^2 (seen: fp32, version 3,
    # an error of 1.3e-6 on dx = 1.8e-3 from terms near 33, H100 2026-11-26)
    check(dx, dx_r, dx_t, "rms dx", natural=dx_terms.max().item() if dx.numel() else 0.0,
          natural_norm=dx_terms.norm().item() if dx.numel() else 0.0)
    if w is not None:
        rows_dims = tuple(range(x.dim() - len(shape)))
        check(dw, dw_r, dw_t, "rms dweight", natural_norm=(dy.double() * xhat).abs().sum(rows_dims).norm().item())
    else:
        assert dw.numel() == 0
    return y, dx, dw


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", testing.FLOAT_DTYPES)
@pytest.mark.parametrize("cols", COLS)
def test_rms_forward_backward_shapes(device, dtype, cols):
    x, w, _, dy = make(rows_for(cols), cols, dtype, device, affine=(True, False))
    run_rms_and_check(x, w, dy, (cols,))


@requires_cuda
@pytest.mark.parametrize("version", CUDA_VERSIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_rms_every_version(version, dtype):
    """Every kernel family (and its fallbacks) runs RMSNorm, fp32 or same-dtype weights."""
    for cols in [1, 33, 513, 768, 4099, 8192, 16385, 65536]:
        for wdtype in ("same", torch.float32):
            x, w, _, dy = make(rows_for(cols), cols, dtype, "cuda", wdtype=wdtype, affine=(True, False))
            run_rms_and_check(x, w, dy, (cols,), version=version)


@requires_cuda
@pytest.mark.parametrize("cluster", ["2", "4"])
def test_cuda_rms_cluster(cluster, knob):
    """RMSNorm with rows split across a cluster (forward and backward): the shares'
    exchange combines (0, sum of squares) pairs; bitwise reproducible; fp32 or
    same-dtype weights. The backward with dweight runs RMSNorm's own split kernel
    (kRms), the dx-only one the kernel both norms share: the same dx up to a few
    roundings."""
    from day26_layernorm import rms_norm_backward, rms_norm_forward

    knob.set("cluster", cluster)
    knob.set("grid", "8")
    for cols in (CLUSTER_COLS_SANITIZE if SANITIZE else CLUSTER_COLS)[cluster]:
        for dtype in ([torch.float32, torch.bfloat16] if SANITIZE else testing.FLOAT_DTYPES):
            for wdtype in ("same", torch.float32):
                x, w, _, dy = make(40, cols, dtype, "cuda", wdtype=wdtype, affine=(True, False))
                y, dx, dw = run_rms_and_check(x, w, dy, (cols,), version=6)
                y2, rstd = rms_norm_forward(x, cols, w, 1e-5, 6)
                assert torch.equal(y, y2)
                for a, c in zip((dx, dw), rms_norm_backward(dy, x, cols, rstd, w, version=6)):
                    assert torch.equal(a, c), "cluster RMSNorm backward is not bitwise reproducible"
                dx_only, dw0 = rms_norm_backward(dy, x, cols, rstd, w, (True, False), version=6)
                assert dw0.numel() == 0
                ulp = torch.finfo(dtype).eps
                torch.testing.assert_close(dx_only.float(), dx.float(), rtol=2 * ulp,
                                           atol=8 * ulp * dx.abs().max().item())


@pytest.mark.parametrize("device", DEVICES)
def test_rms_float64_and_no_weight(device):
    dtypes = [torch.float32] + ([torch.float64] if device == "cpu" else [])
    for dtype in dtypes:
        x, _, _, dy = make(9, 100, dtype, device)
        run_rms_and_check(x, None, dy, (100,))
        x, w, _, dy = make(9, 100, dtype, device, affine=(True, False))
        run_rms_and_check(x, w, dy, (100,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rms_fp32_weight_with_low_precision_input(device, dtype):
    x, w, _, dy = make(64, 1000, dtype, device, wdtype=torch.float32, affine=(True, False))
    run_rms_and_check(x, w, dy, (1000,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", testing.FLOAT_DTYPES)
def test_rms_weight_of_any_float_dtype(device, dtype):
    """F.rms_norm takes a weight of any float dtype and returns x's dtype, dweight in the
    weight's (fp32 input with a bf16 weight: a bf16 model fed an fp32 residual stream).
    Ours casts such a weight to the kernels' fp32, so float64 weights carry fp32
    precision (as torch's composite, whose normalised x is fp32): checked as fp32."""
    from day26_layernorm import RMSNorm, rms_norm

    for wdtype in [t for t in (torch.float16, torch.bfloat16, torch.float64) if t != dtype]:
        x, w, _, dy = make(16, 200, dtype, device, wdtype=wdtype, affine=(True, False))
        xa, wa, xb, wb = (t.clone().requires_grad_() for t in (x, w, x, w))
        y, yb = rms_norm(xa, 200, wa, 1e-5), F.rms_norm(xb, (200,), wb, 1e-5)
        y.backward(dy)
        yb.backward(dy)
        assert (y.dtype, wa.grad.dtype) == (yb.dtype, wb.grad.dtype) == (dtype, wdtype)
        y_r, dx_r, dw_r = rms_ref(x, (200,), w, 1e-5, dy)
        check(y, y_r, yb.detach(), f"y, {wdtype} weight")
        check(xa.grad, dx_r, xb.grad, f"dx, {wdtype} weight", natural_norm=dx_r.abs().norm().item())
        as32 = (lambda t: t.float()) if wdtype == torch.float64 else (lambda t: t)
        check(as32(wa.grad), dw_r, as32(wb.grad), f"dweight, {wdtype} weight")
        m = RMSNorm(200, eps=1e-5, device=device, dtype=wdtype)
        with torch.no_grad():
            m.weight.copy_(w)
        testing.assert_close(m(x), y.detach(), 0, 0, f"module, {wdtype} weight")


@pytest.mark.parametrize("device", DEVICES)
def test_rows_of_no_element_as_torch(device):
    """normalized_shape with a dim of size 0: torch returns empty outputs (mean 0, rstd
    NaN) and empty gradients; so do ours (nothing launched)."""
    from day26_layernorm import add_norm, rms_norm, rms_norm_forward

    x, w, b = (testing.fresh(*s, device=device) for s in ((3, 5, 0), (5, 0), (5, 0)))
    y, mean, rstd = layer_norm_forward(x, (5, 0), w, b)
    ym, mm, rm = torch.native_layer_norm(x, (5, 0), w, b, 1e-5)
    assert y.shape == ym.shape == (3, 5, 0)
    assert mean.shape == rstd.shape == (3,) and (mean == 0).all() and rstd.isnan().all()
    assert (mm == 0).all() and rm.isnan().all()  # torch's, for the record
    y, rstd = rms_norm_forward(x, (5, 0), w)
    assert y.shape == (3, 5, 0) and rstd.shape == (3,) and rstd.isnan().all()
    for f in (lambda x, w, b: layer_norm(x, (5, 0), w, b), lambda x, w, b: rms_norm(x, (5, 0), w),
              lambda x, w, b: F.layer_norm(x, (5, 0), w, b), lambda x, w, b: F.rms_norm(x, (5, 0), w),
              lambda x, w, b: sum(add_norm(x, x.detach().clone(), w, b))):
        xa, wa, ba = (t.clone().requires_grad_() for t in (x, w, b))
        y = f(xa, wa, ba)
        y.sum().backward()
        assert y.shape == (3, 5, 0) and xa.grad.shape == (3, 5, 0) and wa.grad.shape == (5, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_rms_strided_and_multi_dim(device):
    base = testing.fresh(6, 5, 130, device=device, scale=2.0)
    x = base[:, :, 1:129]  # rows not contiguous with each other
    w = testing.fresh(128, device=device, offset=1.0)
    dy = testing.fresh(6, 5, 128, device=device)
    run_rms_and_check(x, w, dy, (128,))
    x = testing.fresh(3, 4, 8, 16, device=device).transpose(0, 1)
    w = testing.fresh(8, 16, device=device, offset=1.0)
    run_rms_and_check(x, w, testing.fresh(4, 3, 8, 16, device=device), (8, 16))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rms_eps_none_follows_torch(device, dtype):
    """eps=None is F.rms_norm's: float32's epsilon for 16-bit and fp32 input (rows of
    1e-3, where the eps dominates the mean square, tell the rules apart)."""
    from day26_layernorm import rms_norm

    x = torch.full((4, 64), 1e-3, dtype=dtype, device=device)
    torch.testing.assert_close(rms_norm(x, 64).float(), F.rms_norm(x, (64,)).float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(rms_norm(x, 64, eps=0.1).float(), F.rms_norm(x, (64,), eps=0.1).float(),
                               rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_rms_under_autocast_keeps_torch_dtypes(device):
    """F.rms_norm is on no autocast list (CUDA, torch 2.11, H100 2026-11-26: fp32 x stays
    fp32, fp16 x with fp32 weight gives fp16): our op, registered without an autocast
    kernel, falls through the same way."""
    from day26_layernorm import rms_norm

    low = torch.bfloat16 if device == "cpu" else torch.float16
    x = testing.fresh(4, 64, device=device)
    w = testing.fresh(64, device=device, offset=1.0)
    with torch.autocast(device, dtype=low):
        for xi in (x, x.to(low)):
            assert rms_norm(xi, 64, w).dtype == F.rms_norm(xi, (64,), w).dtype


@pytest.mark.parametrize("device", DEVICES)
def test_rms_autograd_and_each_gradient(device):
    from day26_layernorm import rms_norm

    x, w, _, dy = make(7, 96, torch.float32, device, affine=(True, False))
    for wants in [(True, True), (True, False), (False, True)]:
        xs = x.clone().requires_grad_(wants[0])
        ws = w.clone().requires_grad_(wants[1])
        rms_norm(xs, 96, ws, 1e-5).backward(dy)
        _, dx_r, dw_r = rms_ref(x, (96,), w, 1e-5, dy)
        if wants[0]:
            testing.assert_close(xs.grad, dx_r, atol=1e-5, rtol=1e-4, name="dx")
        if wants[1]:
            testing.assert_close(ws.grad, dw_r, atol=1e-4, rtol=1e-4, name="dw")
    xs = x.clone().requires_grad_()
    y = rms_norm(xs, 96, w)
    g, = torch.autograd.grad(y.sum(), xs, create_graph=True)
    with pytest.raises(RuntimeError):
        g.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cols", [768, 4096, 8191])
def test_rms_deterministic(device, cols):
    from day26_layernorm import rms_norm_backward, rms_norm_forward

    x, w, _, dy = make(2000, cols, torch.bfloat16, device, affine=(True, False))
    _, rstd = rms_norm_forward(x, cols, w)
    first = rms_norm_backward(dy, x, cols, rstd, w)
    for _ in range(2):
        for a, c in zip(first, rms_norm_backward(dy, x, cols, rstd, w)):
            assert torch.equal(a, c)


@pytest.mark.parametrize("device", DEVICES)
def test_rms_opcheck_and_compile(device):
    from day26_layernorm import RMSNorm, rms_norm_forward

    x, w, _, dy = make(5, 96, torch.float32, device, affine=(True, False))
    torch.library.opcheck(torch.ops.day26.rms_norm_fwd, (x.clone().requires_grad_(), [96], w.clone().requires_grad_(),
                                                         1e-5, 0))
    torch.library.opcheck(torch.ops.day26.rms_norm_fwd, (x, [96], None, 1e-6, 2))
    _, rstd = rms_norm_forward(x, 96, w)
    torch.library.opcheck(torch.ops.day26.rms_norm_bwd, (dy, x, [96], rstd, w, [True, True], 0))
    torch.library.opcheck(torch.ops.day26.rms_norm_bwd, (dy, x, [96], rstd, None, [True, False], 3))
    torch._dynamo.reset()
    m = RMSNorm(64).to(device)
    cf = torch.compile(lambda t: m(t * 2.0).sum(), fullgraph=True,
                       backend="aot_eager" if device == "cpu" else "inductor")
    xa = testing.fresh(8, 64, device=device).requires_grad_()
    out = cf(xa)
    out.backward()
    xb = xa.detach().clone().requires_grad_()
    ref = F.rms_norm(xb * 2.0, (64,), m.weight).sum()
    ref.backward()
    testing.assert_close(out, ref, 1e-4, 1e-5, "compiled output")
    testing.assert_close(xa.grad, xb.grad, 1e-5, 1e-4, "compiled grad")


def test_rms_gradcheck_float64_cpu():
    from day26_layernorm import rms_norm

    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: rms_norm(x, 7, w, 1e-5), (x, w))
    assert torch.autograd.gradcheck(lambda x: rms_norm(x, 7), (x,))


@requires_cuda
@pytest.mark.skipif(SANITIZE, reason="KC_SANITIZE=1: sanitize.sh turns the caching allocator off, which graph capture needs")
def test_cuda_rms_in_a_cuda_graph():
    from kernel_common import bench
    from day26_layernorm import rms_norm_backward, rms_norm_forward

    for rows, cols, dtype in [(4096, 1024, torch.bfloat16), (300, 16384, torch.bfloat16), (1000, 768, torch.float32)]:
        x, w, _, dy = make(rows, cols, dtype, "cuda", affine=(True, False))
        eager = (*rms_norm_forward(x, cols, w), )
        eager_b = rms_norm_backward(dy, x, cols, eager[1], w)
        graph, out = bench.capture_graph(lambda: (*rms_norm_forward(x, cols, w),
                                                  *rms_norm_backward(dy, x, cols, eager[1], w)), warmup=1)
        for t in out:
            t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for a, c in zip((*eager, *eager_b), out):
            assert torch.equal(a, c), f"{rows}x{cols} {dtype}: graph replay differs from eager"


class _HFStyleRMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm math, written here (a test double): fp32 compute,
    cast back to the input dtype before the weight."""

    def __init__(self, hidden, eps=1e-6, dtype=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden, dtype=dtype))
        self.variance_epsilon = eps

    def forward(self, h):
        dt = h.dtype
        h = h.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dt)


_HFStyleRMSNorm.__name__ = "LlamaRMSNorm"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,wdtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                          (torch.bfloat16, torch.float32)])
def test_rms_module_from_torch_and_hf(device, dtype, wdtype):
    from day26_layernorm import RMSNorm

    ref = torch.nn.RMSNorm(256, eps=1e-6, device=device, dtype=wdtype)
    with torch.no_grad():
        ref.weight.copy_(testing.fresh(256, device=device, offset=1.0))
    ours = RMSNorm.from_torch(ref)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    plain = RMSNorm(256, device=device)
    plain.load_state_dict(torch.nn.RMSNorm(256, device=device).state_dict())
    hf = _HFStyleRMSNorm(256, eps=1e-6, dtype=wdtype).to(device)
    with torch.no_grad():
        hf.weight.copy_(ref.weight)
    hf_ours = RMSNorm.from_torch(hf)
    x = testing.fresh(32, 256, dtype=dtype, device=device, scale=2.0)
    dy = testing.fresh(32, 256, dtype=dtype, device=device)
    for mod, theirs in ((ours, ref), (hf_ours, hf)):
        xa = x.clone().requires_grad_()
        xb = x.clone().requires_grad_()
        ya, yb = mod(xa), theirs(xb)
        assert ya.dtype == yb.dtype, (ya.dtype, yb.dtype)
        ya.backward(dy.to(ya.dtype))
        yb.backward(dy.to(yb.dtype))
        y_r, dx_r, dw_r = rms_ref(x, (256,), ref.weight, 1e-6, dy)
        # their result in this dtype is the yardstick (2x its error vs float64); an fp32
        # result from 16-bit x (transformers' promotion) carries the 16-bit rounding
        if dtype != torch.float32:
            testing.assert_lowp_close(ya, y_r, yb.detach(), name=f"{type(theirs).__name__} y")
        else:
            check(ya, y_r, yb.detach(), f"{type(theirs).__name__} y")
        check(xa.grad, dx_r, xb.grad, f"{type(theirs).__name__} dx", natural_norm=dx_r.abs().norm().item())
        check(mod.weight.grad, dw_r, theirs.weight.grad, f"{type(theirs).__name__} dw")


@pytest.mark.parametrize("device", DEVICES)
def test_rms_bad_input_names_rms_norm(device):
    """rms_norm's errors name rms_norm (the checks are LayerNorm's, shared)."""
    from day26_layernorm import rms_norm, rms_norm_backward, rms_norm_forward

    x, w, _, dy = make(4, 16, torch.float32, device)
    with pytest.raises(RuntimeError, match="rms_norm: input must be float32, float16 or bfloat16"):
        rms_norm(x.to(torch.int32), 16)
    with pytest.raises(RuntimeError, match="rms_norm: normalized_shape .* does not match the last"):
        rms_norm(x, 15)
    with pytest.raises(RuntimeError, match="rms_norm: weight of shape"):
        rms_norm(x, 16, w[:8])
    with pytest.raises(RuntimeError, match="rms_norm: version must be 0 \\(auto\\) to 6"):
        rms_norm(x, 16, w, version=7)
    _, rstd = rms_norm_forward(x, 16, w)
    with pytest.raises(RuntimeError, match="rms_norm backward: grad_out of shape"):
        rms_norm_backward(dy[:2], x, 16, rstd, w)
    with pytest.raises(RuntimeError, match="rms_norm backward: rstd has 2 elements"):
        rms_norm_backward(dy, x, 16, rstd[:2], w)
    with pytest.raises(RuntimeError, match="layer_norm: weight of shape"):
        layer_norm(x, 16, w[:8])
    run_rms_and_check(x, w, dy, (16,))


# ------------------------------------------------------------------ add_norm
# (norm(x + residual), x + residual) in one pass, differentiable through both
# outputs; references: float64 autograd of the add and F.layer_norm / F.rms_norm.

def add_norm_ref(x, r, shape, w, b, eps, kind, dy, ds):
    """float64 autograd of the norm of the sum x + r as the op defines it (in x's
    dtype, as torch's add: checked bitwise apart): (y, s, dx (= dresidual, the sum's
    gradient), dw, db) with gradients dy of y and ds of s (either None: unused)."""
    sd = (x + r).detach().double().requires_grad_()
    wd = None if w is None else w.detach().double().requires_grad_()
    bd = None if b is None else b.detach().double().requires_grad_()
    y = F.layer_norm(sd, shape, wd, bd, eps) if kind == "layer" else F.rms_norm(sd, shape, wd, eps)
    outs = [(y, dy), (sd, ds)]
    torch.autograd.backward([o for o, g in outs if g is not None], [g.double() for o, g in outs if g is not None])
    grad = lambda t: None if t is None else t.grad  # noqa: E731
    return y.detach(), sd.detach(), sd.grad, grad(wd), grad(bd)


def add_norm_torch(x, r, shape, w, b, eps, kind, dy, ds):
    """PyTorch in the test dtype (fp32 weight with 16-bit x: the norm in fp32 of the
    16-bit sum, results rounded): (y, dx, dw, db)."""
    xs = x.detach().clone().requires_grad_()
    ws = None if w is None else w.detach().clone().requires_grad_()
    bs = None if b is None else b.detach().clone().requires_grad_()
    s = xs + r
    mixed = w is not None and w.dtype != x.dtype
    sn = s.float() if mixed else s
    y = F.layer_norm(sn, shape, ws, bs, eps) if kind == "layer" else F.rms_norm(sn, shape, ws, eps)
    outs = [(y, None if dy is None else dy.to(y.dtype)), (s, ds)]
    torch.autograd.backward([o for o, g in outs if g is not None], [g for o, g in outs if g is not None])
    grad = lambda t: None if t is None else t.grad  # noqa: E731
    return y.detach().to(x.dtype), xs.grad, grad(ws), grad(bs)


def run_add_norm_and_check(x, r, w, b, dy, ds, shape, kind, eps=1e-5, version=0):
    """Our add_norm through autograd against the float64 reference (2x PyTorch's
    same-dtype error for 16-bit): y, the sum (exactly x + r in the dtype), dx and
    dresidual (one value), dweight, dbias. y must equal our plain norm of x + r
    bitwise (the fused kernels normalise the rounded sum, as the unfused do)."""
    from day26_layernorm import add_norm, rms_norm

    xa, ra = x.detach().clone().requires_grad_(), r.detach().clone().requires_grad_()
    wa = None if w is None else w.detach().clone().requires_grad_()
    ba = None if b is None else b.detach().clone().requires_grad_()
    y, s = add_norm(xa, ra, wa, ba, eps=eps, kind=kind, version=version)
    outs = [(y, dy), (s, ds)]
    torch.autograd.backward([o for o, g in outs if g is not None], [g for o, g in outs if g is not None])
    s_plain = x + r
    assert torch.equal(s, s_plain), "sum differs from x + residual"
    y_plain = layer_norm(s_plain, shape, w, b, eps, version) if kind == "layer" else rms_norm(s_plain, shape, w, eps,
                                                                                             version)
    assert torch.equal(y, y_plain), "fused y differs from the norm of x + residual"
    y_r, s_r, dx_r, dw_r, db_r = add_norm_ref(x, r, shape, w, b, eps, kind, dy, ds)
    y_t, dx_t, dw_t, db_t = add_norm_torch(x, r, shape, w, b, eps, kind, dy, ds)
    check(y, y_r, y_t, "add_norm y")
    if dx_r is None:
        assert xa.grad is None and ra.grad is None
        return
    assert torch.equal(xa.grad, ra.grad), "dx and dresidual differ"
    # dx's natural scale: the norm's dx terms (run_and_check's) plus |ds|
    sd = s_plain.double()
    dims = tuple(range(x.dim() - len(shape), x.dim()))
    mean_d = sd.mean(dims, keepdim=True) if kind == "layer" else 0.0
    rstd_d = ((sd - mean_d).pow(2).mean(dims, keepdim=True) + eps).rsqrt()
    terms = torch.zeros_like(sd)
    if dy is not None:
        g = dy.double() * (1.0 if w is None else w.double())
        xhat = (sd - mean_d) * rstd_d
        terms = rstd_d * (g.abs() + g.mean(dims, keepdim=True).abs()
                          + xhat.abs() * (g * xhat).mean(dims, keepdim=True).abs())
    if ds is not None:
        terms = terms + ds.double().abs()
    check(xa.grad, dx_r, dx_t, "add_norm dx", natural=terms.max().item(), natural_norm=terms.norm().item())
    rows_dims = tuple(range(x.dim() - len(shape)))
    if w is not None and dw_r is not None:
        xhat = (sd - mean_d) * rstd_d
        check(wa.grad, dw_r, dw_t, "add_norm dweight",
              natural_norm=(dy.double() * xhat).abs().sum(rows_dims).norm().item())
    if b is not None and db_r is not None:
        check(ba.grad.to(b.dtype), db_r, db_t, "add_norm dbias",
              natural_norm=dy.double().abs().sum(rows_dims).norm().item())


def make_add_norm(rows, cols, dtype, device, kind, wdtype="same"):
    x, w, b, dy = make(rows, cols, dtype, device, wdtype=wdtype, affine=(True, kind == "layer"))
    r = testing.fresh(rows, cols, dtype=dtype, device=device, scale=3.0, offset=-0.25)
    ds = testing.fresh(rows, cols, dtype=dtype, device=device)
    return x, r, w, b, dy, ds


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", testing.FLOAT_DTYPES)
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("cols", [1, 33, 768, 1000, 4096])
def test_add_norm_shapes(device, dtype, kind, cols):
    x, r, w, b, dy, ds = make_add_norm(rows_for(cols), cols, dtype, device, kind)
    run_add_norm_and_check(x, r, w, b, dy, ds, (cols,), kind)


@requires_cuda
@pytest.mark.parametrize("dtype", testing.FLOAT_DTYPES)
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_cuda_add_norm_plan_families(dtype, kind):
    """The fused kernels at the plan's own families (forward 2 fp32 / 4 16-bit, backward
    4 and 5 with dsum added as dx is written: plan dsum 1), the unfused paths beside
    them (fp32 rows over 8192 split across a cluster, 16-bit rows over 8192 in the
    backward: dsum 2), both weight dtypes, many rows per block."""
    from day26_layernorm import add_norm_forward, ops

    for cols in [256, 512, 768, 1024, 2048, 4096, 8192, 16384]:
        for wdtype in ("same", torch.float32):
            x, r, w, b, dy, ds = make_add_norm(300, cols, dtype, "cuda", kind, wdtype)
            run_add_norm_and_check(x, r, w, b, dy, ds, (cols,), kind)
        y, s, mean, rstd = add_norm_forward(x, r, cols, w, b, kind=kind)
        plan = ops.backward_plan(dy, s, cols, rstd if kind == "rms" else mean, rstd, w, (True, True, b is not None),
                                 dsum=ds, rms=kind == "rms")
        fused = plan["family"] in (4, 5)
        assert plan["dsum"] == (1 if fused else 2), (cols, plan)
        if plan["cc"] >= 90:  # the table's families at these shapes (before sm_90: no ring, 2 above 4096)
            assert fused == (cols <= 8192), (cols, plan)


@requires_cuda
@pytest.mark.parametrize("version", CUDA_VERSIONS)
def test_cuda_add_norm_every_version(version):
    """Every forced version: fused where its family has the kernel, else the add apart."""
    for cols in [33, 768, 4096, 16384]:
        for dtype in (torch.float32, torch.bfloat16):
            for kind in ("layer", "rms"):
                x, r, w, b, dy, ds = make_add_norm(40, cols, dtype, "cuda", kind)
                run_add_norm_and_check(x, r, w, b, dy, ds, (cols,), kind, version=version)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_add_norm_one_output_used(device, kind):
    """Either output alone takes a gradient (the other's is undefined): y alone is the
    norm's backward of the sum; the sum alone passes its gradient to x and residual."""
    for dtype in (torch.float32, torch.bfloat16):
        x, r, w, b, dy, ds = make_add_norm(24, 768, dtype, device, kind)
        run_add_norm_and_check(x, r, w, b, dy, None, (768,), kind)
        run_add_norm_and_check(x, r, w, b, None, ds, (768,), kind)


@pytest.mark.parametrize("device", DEVICES)
def test_add_norm_strided_misaligned_and_fp32_weights(device):
    """Non-contiguous x, a transposed residual, offset (misaligned) views (no 16-byte
    vectors: the add apart on CUDA), fp32 weights with 16-bit input, 3-d input."""
    base = testing.fresh(6, 5, 130, device=device, scale=2.0)
    x = base[:, :, 1:129]
    r = testing.fresh(5, 6, 128, device=device).transpose(0, 1)
    w = testing.fresh(128, device=device, offset=1.0)
    b = testing.fresh(128, device=device)
    dy, ds = testing.fresh(6, 5, 128, device=device), testing.fresh(6, 5, 128, device=device)
    run_add_norm_and_check(x, r, w, b, dy, ds, (128,), "layer")
    run_add_norm_and_check(x, r, w, None, dy, ds, (128,), "rms")
    for dtype in (torch.float16, torch.bfloat16):
        x, r, w, b, dy, ds = make_add_norm(64, 1000, dtype, device, "layer", wdtype=torch.float32)
        run_add_norm_and_check(x, r, w, b, dy, ds, (1000,), "layer")
        x, r, w, b, dy, ds = make_add_norm(64, 1024, dtype, device, "rms")
        xo, ro, dyo, dso = (testing.offset_view(t) for t in (x, r, dy, ds))
        run_add_norm_and_check(xo, ro, w, None, dyo, dso, (1024,), "rms")


@pytest.mark.parametrize("device", DEVICES)
def test_add_norm_bad_input(device):
    from day26_layernorm import add_norm, add_norm_forward

    x, r, w, b, dy, ds = make_add_norm(12, 200, torch.float32, device, "layer")
    with pytest.raises(ValueError, match="kind"):
        add_norm(x, r, w, kind="batch")
    with pytest.raises(ValueError, match="bias"):
        add_norm(x, r, w, bias=b, kind="rms")
    with pytest.raises(RuntimeError, match="add_norm: residual of shape .* must have one shape"):
        add_norm(x, r[:, :100], w)
    with pytest.raises(RuntimeError, match="add_norm: residual .* must have one dtype"):
        add_norm_forward(x, r.double(), 200, w)
    with pytest.raises(RuntimeError, match="add_norm: normalized_shape \\[100\\] does not match"):
        add_norm(x, r, w[:100])
    with pytest.raises(RuntimeError, match="add_norm: bias of shape"):
        add_norm(x, r, w, b[:100])
    with pytest.raises(RuntimeError, match="add_norm: input must be float32"):
        add_norm(x.int(), r.int(), w)
    with pytest.raises(RuntimeError, match="add_norm: version must be 0 \\(auto\\) to 6"):
        add_norm(x, r, w, version=9)
    other = "meta" if device == "cpu" else "cpu"
    for name in ("residual", "weight", "bias"):
        args = {"residual": r, "weight": w, "bias": b}
        args[name] = args[name].to(other)
        with pytest.raises(RuntimeError, match="is on (meta|cpu|cuda)"):
            add_norm(x, args["residual"], args["weight"], args["bias"])
    run_add_norm_and_check(x, r, w, b, dy, ds, (200,), "layer")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_add_norm_mixed_dtypes_promote(device, kind):
    """A 16-bit x and an fp32 residual (a bf16 sublayer output and the fp32 residual
    stream under autocast) run in fp32, as x + residual does: the same outputs as the
    fp32 call, and x's gradient comes back in x's dtype."""
    from day26_layernorm import add_norm

    x, r, w, b, dy, ds = make_add_norm(24, 256, torch.float32, device, kind)
    xh = x.detach().to(torch.bfloat16).requires_grad_()
    r = r.detach().requires_grad_()
    y, s = add_norm(xh, r, w, b, kind=kind)
    y32, s32 = add_norm(xh.detach().float(), r.detach(), w.detach(), None if b is None else b.detach(), kind=kind)
    assert y.dtype == s.dtype == torch.float32
    torch.testing.assert_close(y, y32, rtol=0, atol=0)
    torch.testing.assert_close(s, s32, rtol=0, atol=0)
    (y * dy + s * ds).sum().backward()
    assert xh.grad.dtype == torch.bfloat16 and r.grad.dtype == torch.float32
    torch.testing.assert_close(xh.grad, r.grad.to(torch.bfloat16), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_add_norm_opcheck_and_compile(device):
    from day26_layernorm import add_norm, add_norm_forward

    x, r, w, b, dy, ds = make_add_norm(5, 96, torch.float32, device, "layer")
    g = lambda t: t.clone().requires_grad_()  # noqa: E731
    torch.library.opcheck(torch.ops.day26.add_norm_fwd, (g(x), g(r), [96], g(w), g(b), 1e-5, False, 0))
    torch.library.opcheck(torch.ops.day26.add_norm_fwd, (x, r, [96], w, None, 1e-6, True, 0))
    y, s, mean, rstd = add_norm_forward(x, r, 96, w, b)
    torch.library.opcheck(torch.ops.day26.add_norm_bwd, (dy, ds, s, [96], mean, rstd, w, False, [True, True, True], 0))
    torch.library.opcheck(torch.ops.day26.add_norm_bwd,
                          (dy, None, s, [96], mean, rstd, w, False, [True, False, True], 2))
    _, s, mean, rstd = add_norm_forward(x, r, 96, w, kind="rms")
    torch.library.opcheck(torch.ops.day26.add_norm_bwd, (dy, ds, s, [96], mean, rstd, w, True, [True, True, False], 0))
    torch._dynamo.reset()

    def block(x, r, w):  # a pre-norm residual step
        y, s = add_norm(x * 2.0, r, w, kind="rms", eps=1e-6)
        return (y * 3.0).sum() + s.square().sum()

    cf = torch.compile(block, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")
    xa, ra, wa = g(x), g(r), g(w)
    out = cf(xa, ra, wa)
    out.backward()
    xb, rb, wb = g(x), g(r), g(w)
    sb = xb * 2.0 + rb
    ref = (F.rms_norm(sb, (96,), wb, 1e-6) * 3.0).sum() + sb.square().sum()
    ref.backward()
    testing.assert_close(out, ref, 1e-4, 1e-5, "compiled output")
    for a, c, name in ((xa, xb, "x"), (ra, rb, "residual"), (wa, wb, "weight")):
        testing.assert_close(a.grad, c.grad, 1e-4, 1e-4, f"compiled grad of {name}")


def test_add_norm_gradcheck_float64_cpu():
    from day26_layernorm import add_norm

    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    r = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, r, w, b: add_norm(x, r, w, b), (x, r, w, b))
    assert torch.autograd.gradcheck(lambda x, r, w: add_norm(x, r, w, kind="rms"), (x, r, w))


@requires_cuda
@pytest.mark.skipif(SANITIZE, reason="KC_SANITIZE=1: sanitize.sh turns the caching allocator off, which graph capture needs")
def test_cuda_add_norm_in_a_cuda_graph():
    from kernel_common import bench
    from day26_layernorm import add_norm_backward, add_norm_forward

    for rows, cols, dtype, kind in [(4096, 1024, torch.bfloat16, "rms"), (1000, 768, torch.float32, "layer"),
                                    (300, 16384, torch.float32, "rms")]:
        x, r, w, b, dy, ds = make_add_norm(rows, cols, dtype, "cuda", kind)
        eager = add_norm_forward(x, r, cols, w, b, kind=kind)
        eager_b = add_norm_backward(dy, ds, eager[1], cols, eager[2], eager[3], w, kind, (True, True, b is not None))
        graph, out = bench.capture_graph(lambda: (*add_norm_forward(x, r, cols, w, b, kind=kind),
                                                  *add_norm_backward(dy, ds, eager[1], cols, eager[2], eager[3], w,
                                                                     kind, (True, True, b is not None))), warmup=1)
        for t in out:
            t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for a, c in zip((*eager, *eager_b), out):
            assert torch.equal(a, c), f"{rows}x{cols} {dtype}: graph replay differs from eager"


def test_convert_swaps_every_norm():
    from day26_layernorm import LayerNorm as OurLN, RMSNorm as OurRMS, convert

    class Odd(torch.nn.LayerNorm):
        def forward(self, x):
            return super().forward(x) * 2

    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16), torch.nn.RMSNorm(16),
                                torch.nn.Sequential(_HFStyleRMSNorm(16), Odd(16)))
    x = testing.fresh(4, 16)
    before = model(x)
    with pytest.warns(UserWarning, match="kept Odd"):
        convert(model)
    assert type(model[1]) is OurLN and type(model[2]) is OurRMS and type(model[3][0]) is OurRMS
    assert type(model[3][1]) is Odd
    testing.assert_close(model(x), before, atol=1e-5, rtol=1e-5, name="converted model")
    assert type(convert(torch.nn.RMSNorm(8))) is OurRMS


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", testing.FLOAT_DTYPES)
def test_layer_norm_dx_is_exactly_zero_at_d1(device, dtype):
    """One column: x - mean is 0, so dx is exactly 0 for every dtype and version."""
    x, w, b, dy = make(37, 1, dtype, device)
    for version in (CUDA_VERSIONS if device == "cuda" else [0]):
        _, mean, rstd = layer_norm_forward(x, 1, w, b, version=version)
        dx, _, _ = layer_norm_backward(dy, x, 1, mean, rstd, w, version=version)
        assert torch.equal(dx, torch.zeros_like(dx)), f"version {version}: {dx.abs().max().item()}"


def test_cuda_tests_are_not_silently_skipped_on_a_gpu_machine():
    """On a machine with a GPU every CUDA test runs: HAS_CUDA must agree with torch."""
    assert HAS_CUDA == torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(testing.main(__file__))
