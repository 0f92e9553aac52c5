"""Test utilities every day's test.py uses.

`poison_outputs()` (the root conftest.py calls it before every test) makes every
output a kernel allocates through kc::new_output start as NaN, in every loaded
day extension: an element the kernel never writes fails the comparison instead
of passing by luck. The switch is each extension's private
`_set_poison_outputs`; the library reads no environment variable for it.
"""
from __future__ import annotations

import sys

try:
    import pytest  # noqa: E402
except ImportError:  # `python test.py` in an env without the test extra: say what to install
    raise SystemExit("The tests need pytest:  pip install pytest   "
                     "(or, in a package folder: pip install --no-build-isolation '.[test]')") from None
import torch  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (none visible)")

#: parametrize a test over every device present; CUDA is skipped with a reason when absent
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]
FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# (atol, rtol) for results computed with fp32 accumulation, per storage dtype.
# fp16/bf16 outputs carry one rounding of their own (2^-11, 2^-8 relative).
_TOL = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


_POISONED: set[str] = set()


def poison_outputs(on: bool = True) -> list[str]:
    """Switch NaN-filled outputs on (or off) in every day extension loaded so far
    (a module in sys.modules with the private `_set_poison_outputs` hook that
    kc::bind_test_hooks binds). Cheap to call again: with `on`, a module already
    switched is skipped. Returns the names of the modules switched by this call."""
    done = []
    for name, mod in list(sys.modules.items()):
        if on and name in _POISONED:
            continue
        try:
            hook = getattr(mod, "_set_poison_outputs", None) if mod is not None else None
        except Exception:  # noqa: BLE001  a lazy module's __getattr__ may raise anything
            continue
        if callable(hook):
            hook(on)
            done.append(name)
            (_POISONED.add if on else _POISONED.discard)(name)
    return done


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) for an output stored in `dtype` and computed in fp32."""
    return _TOL[dtype]


def rel_err(out: torch.Tensor, ref: torch.Tensor, scale: float = 0.0) -> float:
    """||out - ref|| / max(||ref||, scale) in float64 (plain norm of out - ref when
    both are 0). `scale`: the natural size of the result when it can be far below
    the terms it is computed from (a sum that cancels: pass the norm of the sum of
    the terms' absolute values), since rounding is relative to the terms."""
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    den = max(r.norm().item(), scale)
    num = (o - r).norm().item()
    return num / den if den > 0 else num


def max_abs_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if out.numel() == 0:
        return 0.0
    return (out.detach().double().cpu() - ref.detach().double().cpu()).abs().max().item()


def assert_close(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float, name: str = "output"):
    """Elementwise |out - ref| <= atol + rtol * |ref|, NaN never passes, shapes must match."""
    assert out.shape == ref.shape, f"{name}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    nan = torch.isnan(o) & ~torch.isnan(r)
    assert not nan.any(), f"{name}: {int(nan.sum())} NaN element(s) (unwritten output?) first at {nan.nonzero()[0].tolist()}"
    err = (o - r).abs()
    bound = atol + rtol * r.abs()
    bad = err > bound
    if bad.any():
        i = (err - bound).argmax()
        idx = list(torch.unravel_index(i, o.shape)) if o.dim() else []
        raise AssertionError(
            f"{name}: {int(bad.sum())}/{o.numel()} elements out of tolerance (atol={atol}, rtol={rtol}); "
            f"worst at {[int(t) for t in idx]}: got {o.flatten()[i].item()!r}, want {r.flatten()[i].item()!r}"
        )


def assert_close_to_ref(out: torch.Tensor, ref64: torch.Tensor, name: str = "output", scale: float = 1.0):
    """Compare against a float64 reference with the tolerance of out's dtype (times `scale`)."""
    atol, rtol = tolerance(out.dtype)
    assert_close(out, ref64, atol * scale, rtol * scale, name)


def assert_lowp_close(out: torch.Tensor, ref64: torch.Tensor, torch_out: torch.Tensor,
                      name: str = "output", factor: float = 2.0, floor: float | None = None):
    """The fp16/bf16 rule flash-attention's tests use: our max error against the
    float64 reference is at most `factor` x the error of PyTorch's own
    same-precision result, plus a small floor (default: one ulp of the dtype
    at the reference's scale)."""
    assert out.shape == ref64.shape == torch_out.shape, f"{name}: shapes differ"
    assert not torch.isnan(out.detach().cpu()).any(), f"{name}: NaN in output (unwritten element?)"
    ours = max_abs_err(out, ref64)
    theirs = max_abs_err(torch_out, ref64)
    if floor is None:
        eps = torch.finfo(out.dtype).eps
        floor = eps * max(ref64.detach().abs().max().item() if ref64.numel() else 0.0, 1e-6)
    assert ours <= factor * theirs + floor, (
        f"{name}: max error {ours:.3e} > {factor} x PyTorch's {theirs:.3e} + {floor:.1e}")


def fresh(*shape, dtype=torch.float32, device="cpu", scale=1.0, offset=0.0, gen=None) -> torch.Tensor:
    """Random normal data (never zeros: zeros hide unwritten outputs and bad indexing)."""
    t = torch.randn(*shape, dtype=torch.float32, generator=gen) * scale + offset
    return t.to(device=device, dtype=dtype)


def offset_view(t: torch.Tensor, offset: int = 1) -> torch.Tensor:
    """The same values as `t`, stored `offset` elements into a larger buffer
    (a contiguous tensor whose data pointer is not 16-byte aligned)."""
    buf = torch.empty(t.numel() + offset, dtype=t.dtype, device=t.device)
    v = buf[offset:].view(t.shape)
    v.copy_(t)
    return v


def strided_view(t: torch.Tensor) -> torch.Tensor:
    """The same values as `t`, non-contiguous (every other element of a buffer
    twice as wide in the last dimension)."""
    shape = list(t.shape)
    buf = torch.empty(*shape[:-1], 2 * shape[-1], dtype=t.dtype, device=t.device) if shape else None
    if buf is None:
        return t
    v = buf[..., ::2]
    v.copy_(t)
    return v


def optional_import(name: str):
    """Import an optional dependency (torchvision, transformers, ...) for a test, or
    skip the test with the reason when it cannot be used: any failure counts, not only
    ImportError (a torchvision whose compiled ops do not match torch imports but raises
    RuntimeError "operator torchvision::nms does not exist")."""
    import importlib

    try:
        return importlib.import_module(name)
    except Exception as e:  # noqa: BLE001  (any failure to load means: not usable here)
        pytest.skip(f"{name} is not usable here: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


def optional_available(name: str) -> tuple[bool, str]:
    """(True, "") when `name` imports, else (False, why): for skipif marks at module level."""
    import importlib

    try:
        importlib.import_module(name)
        return True, ""
    except Exception as e:  # noqa: BLE001
        return False, f"{name} is not usable here: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def main(test_file: str, argv: list[str] | None = None) -> int:
    """What each test.py's `if __name__ == "__main__":` block calls: run pytest on the
    file with the command line's arguments. `--jit` (build the extension from source
    on import) is taken out of them: the test.py acts on it before its imports."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--jit" in args:
        from .build import use_jit

        args.remove("--jit")
        use_jit()
    return pytest.main([test_file, *args])
