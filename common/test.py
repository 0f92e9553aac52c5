"""Tests of kernel_common: the CUDA reductions (GPU) and the Python helpers (CPU).

    python test.py            # or: pytest test.py
The reduction kernels are JIT-built from reduce_test/ on first use (GPU only).
"""
import math
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from kernel_common import build, testing  # noqa: E402
from kernel_common.testing import DEVICES, HAS_CUDA, requires_cuda  # noqa: E402,F401

import pytest  # noqa: E402
import torch  # noqa: E402

_ext = None


def ext():
    global _ext
    if _ext is None:
        _ext = build.load_jit("kc_reduce_test", HERE / "reduce_test")
    return torch.ops.kc_test


# --------------------------------------------------------------------------- GPU
BLOCKS = [32, 64, 96, 128, 160, 256, 480, 512, 992, 1024]
LENGTHS = [1, 31, 33, 1000, 4099]


@requires_cuda
@pytest.mark.parametrize("threads", BLOCKS)
@pytest.mark.parametrize("dtype", testing.FLOAT_DTYPES)
def test_block_reduce(threads, dtype):
    ops = ext()
    for L in LENGTHS:
        x = testing.fresh(5, L, dtype=dtype, device="cuda")
        out = ops.block_reduce(x, threads).cpu()  # [rows, threads, 3]
        xd = x.double().cpu()
        want = torch.stack([xd.sum(1), xd.amax(1), (xd * xd).sum(1)], 1)  # [rows, 3]
        # the result is valid in EVERY thread, identical across threads
        assert torch.equal(out, out[:, :1, :].expand_as(out)), "threads disagree on the block result"
        got = out[:, 0, :].double()
        scale = xd.abs().sum(1, keepdim=True).clamp_min(1)
        assert torch.allclose(got[:, 1], want[:, 1]), "max wrong"
        err = (got - want).abs() / torch.cat([scale, scale, (xd * xd).sum(1, keepdim=True).clamp_min(1)], 1)
        err[:, 1] = 0
        assert err.max() < 1e-5, f"sum error {err.max():.2e} (threads={threads}, L={L})"


@requires_cuda
def test_block_reduce_deterministic():
    ops = ext()
    x = testing.fresh(64, 100_003, device="cuda")
    a = ops.block_reduce(x, 256)
    for _ in range(3):
        assert torch.equal(a, ops.block_reduce(x, 256))


@requires_cuda
def test_block_reduce_nan_inf():
    ops = ext()
    x = torch.randn(4, 1000, device="cuda")
    x[0, 17] = float("nan")          # NaN: sum and max both NaN
    x[1, 500] = float("inf")         # +inf: sum inf, max inf
    x[2].fill_(float("-inf"))        # all -inf: max is -inf, sum -inf
    x[3, 3] = float("inf"); x[3, 4] = float("-inf")  # inf - inf: sum NaN, max inf
    out = ops.block_reduce(x, 128)[:, 0, :].cpu()
    assert math.isnan(out[0, 0]) and math.isnan(out[0, 1])
    assert out[1, 0] == math.inf and out[1, 1] == math.inf
    assert out[2, 0] == -math.inf and out[2, 1] == -math.inf
    assert math.isnan(out[3, 0]) and out[3, 1] == math.inf


@requires_cuda
@pytest.mark.parametrize("width", [1, 2, 4, 8, 16, 32])
def test_warp_reduce(width):
    ops = ext()
    for groups in [1, 3, 37]:
        x = testing.fresh(groups, width, device="cuda")
        out = ops.warp_reduce(x, width).cpu()
        xd = x.double().cpu()
        assert torch.equal(out, out[:, :1, :].expand_as(out)), "lanes of a group disagree"
        assert torch.allclose(out[:, 0, 0].double(), xd.sum(1), atol=1e-5, rtol=1e-5)
        assert torch.equal(out[:, 0, 1], x.cpu().amax(1))


@requires_cuda
@pytest.mark.parametrize("skip", [0, 1, 31])
@pytest.mark.parametrize("offset", [0.0, 1e4])
def test_warp_combine_mean_m2(skip, offset):
    """Mean and m2 = sum((x - mean)^2) of a row from 32 lanes' (mean, m2) pairs:
    uneven and empty lanes (len not a multiple of the lanes in use, lanes < skip
    hold nothing), and a mean 1e4 times the spread, where the naive
    sum(x^2) - n * mean^2 in fp32 is off by more than the whole m2."""
    ops = ext()
    for L in [1, 2, 5, 31, 33, 100, 1000, 4099]:
        x = (torch.randn(7, L, device="cuda") + offset).float()
        x[1] = offset                                  # constant row: m2 is 0
        out = ops.warp_mean_m2(x, skip).cpu()          # [rows, 32, 2]
        assert torch.equal(out, out[:, :1, :].expand_as(out)), "lanes disagree"
        xd = x.double().cpu()
        want_mean = xd.mean(1)
        want_m2 = ((xd - want_mean[:, None]) ** 2).sum(1)
        got = out[:, 0, :].double()
        n = -(-L // (32 - skip))                       # values per lane, at most
        u = 2.0**-24
        amax = xd.abs().amax(1)
        rng = xd.amax(1) - xd.amin(1)
        # a lane's mean: its first value (exact) plus a sum of n deviations (each
        # <= rng) divided by n: error e <= u * amax + (n + 1) * u * rng
        e = u * amax + (n + 1) * u * rng
        assert ((got[:, 0] - want_mean).abs() <= e + 6 * u * amax).all(), f"mean (L={L})"
        # m2: the lanes' squared deviations about their shifts (each <= rng^2) round
        # relative to their sum (n + 7 adds deep); a lane mean off by e adds 2 n e d,
        # d <= rng, summed over lanes: <= 2 L e rng (+ L e^2)
        bound = (n + 8) * u * (want_m2 + L * rng * rng) + 2 * L * e * rng + L * e * e
        assert ((got[:, 1] - want_m2).abs() <= bound).all(), f"m2 (L={L}): {got[:, 1]} vs {want_m2}"
        assert got[1, 1] == 0, "a constant row has m2 = 0 exactly (every deviation is 0)"


@requires_cuda
def test_bad_input_is_an_error_and_process_stays_usable():
    ops = ext()
    with pytest.raises(RuntimeError, match="multiple of 32"):
        ops.block_reduce(torch.randn(2, 8, device="cuda"), 48)
    with pytest.raises(RuntimeError, match="float32, float16 or bfloat16"):
        ops.block_reduce(torch.ones(2, 8, device="cuda", dtype=torch.int32), 32)
    assert ops.block_reduce(torch.ones(2, 8, device="cuda"), 32)[0, 0, 0].item() == 8


# --------------------------------------------------------------------------- CPU
def test_tolerances_order():
    t = [testing.tolerance(d)[1] for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16)]
    assert t == sorted(t)


def test_assert_close_catches_nan_and_error():
    ref = torch.randn(10, dtype=torch.float64)
    testing.assert_close(ref.float(), ref, 1e-6, 1e-6)
    bad = ref.float().clone(); bad[3] = float("nan")
    with pytest.raises(AssertionError, match="NaN"):
        testing.assert_close(bad, ref, 1e-6, 1e-6)
    bad = ref.float().clone(); bad[7] += 1
    with pytest.raises(AssertionError, match=r"worst at \[7\]"):
        testing.assert_close(bad, ref, 1e-6, 1e-6)
    with pytest.raises(AssertionError, match="shape"):
        testing.assert_close(ref[:5].float(), ref, 1e-6, 1e-6)


def test_assert_lowp_close_rule():
    ref = torch.randn(1000, dtype=torch.float64)
    torch_out = ref.to(torch.bfloat16)
    testing.assert_lowp_close(torch_out.clone(), ref, torch_out)
    worse = (ref + 0.25).to(torch.bfloat16)
    with pytest.raises(AssertionError, match="max error"):
        testing.assert_lowp_close(worse, ref, torch_out)


def test_rel_err():
    r = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert testing.rel_err(r, r) == 0
    assert abs(testing.rel_err(r * 1.1, r) - 0.1) < 1e-12
    assert testing.rel_err(torch.ones(2), torch.zeros(2)) == pytest.approx(math.sqrt(2))
    # scale: the error relative to the larger of ||ref|| and the natural size given
    assert abs(testing.rel_err(r * 1.1, r, scale=50.0) - 0.01) < 1e-12
    assert abs(testing.rel_err(r * 1.1, r, scale=1.0) - 0.1) < 1e-12


def test_views_keep_values():
    t = torch.randn(3, 7)
    o = testing.offset_view(t, 1)
    assert torch.equal(o, t) and o.data_ptr() % 16 != 0
    s = testing.strided_view(t)
    assert torch.equal(s, t) and not s.is_contiguous()


def test_poison_outputs_calls_every_extension_hook(monkeypatch):
    """testing.poison_outputs switches the private hook of every loaded extension,
    once per module while on, and switches it back off on request."""
    import types

    calls = []
    fake = types.ModuleType("kc_fake_day_C")
    fake._set_poison_outputs = lambda on: calls.append(on)
    monkeypatch.setitem(sys.modules, "kc_fake_day_C", fake)
    assert "kc_fake_day_C" in testing.poison_outputs(True)
    assert "kc_fake_day_C" not in testing.poison_outputs(True)  # already on: skipped
    assert "kc_fake_day_C" in testing.poison_outputs(False)
    assert calls == [True, False]
    testing._POISONED.discard("kc_fake_day_C")


# ------------------------------------------------ no environment read in library code
ROOT = HERE.parent
# Build configuration, read by setup.py/pip and the JIT build (TORCH_CUDA_ARCH_LIST, DEBUG,
# KC_FORCE_CPU, CXX) when something is compiled: not code an import or an op runs. Which
# loader a run uses is set explicitly (build.use_jit), tested below.
_ENV_ALLOWED = {ROOT / "common" / "kernel_common" / "build.py"}
_CXX_ENV = re.compile(r"\b(secure_)?getenv\b|\benviron\b")
_PY_ENV = re.compile(r"\bgetenv\s*\(|environ\s*\.\s*(get|setdefault|copy|items|keys|values)\b"
                     r"|\bin\s+(os\.)?environ\b|environ\s*\[[^\]]*\](?!\s*=[^=])|\bdict\(\s*(os\.)?environ\b")


def test_import_extension_reads_no_environment(monkeypatch):
    """KC_JIT in the environment changes nothing inside the library: only use_jit() (which the
    test runners call) switches import_extension to a JIT build."""
    from kernel_common import build

    monkeypatch.setenv("KC_JIT", "1")
    monkeypatch.setitem(build._JIT, "on", False)
    with pytest.raises(ImportError, match="not built"):
        build.import_extension("kc_no_such_day", None)
    monkeypatch.setitem(build._JIT, "on", True)
    with pytest.raises(RuntimeError, match="use_jit"):
        build.import_extension("kc_no_such_day", None)


def env_reads(text: str, python: bool) -> list[str]:
    """The lines of `text` that read the process environment (writes are not reads)."""
    pat = _PY_ENV if python else _CXX_ENV
    return [line.strip() for line in text.splitlines()
            if pat.search(line.split("#")[0] if python else line.split("//")[0])]


def library_files() -> list[Path]:
    """csrc/ of every day, each day's Python package and common's kernel_common
    (headers included): the code a user's process runs. tools/, scripts/, bench.py,
    test*.py and setup.py are not library code."""
    out = []
    for day in sorted(p for p in ROOT.iterdir() if p.is_dir() and (p / "setup.py").is_file()):
        pkgs = [p for p in day.iterdir() if (p / "__init__.py").is_file()]
        for top in [day / "csrc", *pkgs]:
            out += [f for f in top.rglob("*") if f.suffix in {".py", ".cu", ".cuh", ".h", ".cpp"}
                    and "build" not in f.relative_to(day).parts]
    return [f for f in out if f not in _ENV_ALLOWED]


def test_env_read_detector():
    assert env_reads('x = os.environ.get("A")', True) and env_reads('os.getenv("A")', True)
    assert env_reads('if os.environ["A"] == "1":', True) and env_reads('"A" in os.environ', True)
    assert not env_reads('os.environ["KC_JIT"] = "1"', True)  # a write
    assert not env_reads('# reads no os.environ.get here', True)
    assert env_reads('const char* e = std::getenv("A");', False)
    assert not env_reads("// never getenv", False)


def test_library_reads_no_environment():
    """Library behaviour comes from arguments, never from the environment: no file of
    csrc/ or package code (every day and common) reads an environment variable."""
    files = library_files()
    assert any(f.name == "torch_utils.h" for f in files) and any(f.suffix == ".cu" for f in files)
    bad = {str(f.relative_to(ROOT)): hits for f in files
           if (hits := env_reads(f.read_text(errors="replace"), f.suffix == ".py"))}
    assert not bad, f"environment read in library code: {bad}"


def test_build_policy(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    assert build.arch_list() == "9.0"
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST")
    if not HAS_CUDA:
        assert "9.0" in build.DEFAULT_ARCH_LIST and "+PTX" in build.DEFAULT_ARCH_LIST
        assert build.arch_list() == build.DEFAULT_ARCH_LIST
    monkeypatch.setenv("DEBUG", "1")
    assert {"-O0", "-g", "-lineinfo"} <= set(build.nvcc_flags())
    monkeypatch.setenv("DEBUG", "0")
    assert "-O3" in build.nvcc_flags() and "-O0" not in build.cxx_flags()
    monkeypatch.setenv("KC_FORCE_CPU", "1")
    assert not build.cuda_build_enabled()
    if torch.version.cuda is None:
        monkeypatch.delenv("KC_FORCE_CPU")
        assert not build.cuda_build_enabled()
    srcs = build._sources(HERE / "reduce_test", with_cuda=False)
    assert all(not s.endswith((".cu", "_cuda.cpp")) for s in srcs) and srcs
    assert any(s.endswith(".cu") for s in build._sources(HERE / "reduce_test", with_cuda=True))


def test_gencode_flags():
    """9.0 is built as sm_90a (wgmma, setmaxnreg), +PTX adds portable PTX, and the macro that
    lets host code pick sm_90a kernels is defined exactly when such code is in the build."""
    g = build.gencode_flags("8.0;9.0+PTX")
    assert g == ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90a,code=sm_90a",
                 "-gencode=arch=compute_90,code=compute_90"]
    assert build.arch_macros(g) == ["-DKC_HAS_SM90A"]
    assert build.arch_macros(build.gencode_flags("8.0 8.6+PTX")) == []
    assert build.gencode_flags("9.0a") == ["-gencode=arch=compute_90a,code=sm_90a"]
    # torch adds no arch flags of its own once ours are there (its rule: any flag naming 'arch')
    assert any("arch" in f for f in build._common_args(HERE, True, g)["nvcc"])


def test_headers_shipped():
    inc = Path(build.include_dir()) / "kc"
    for h in ["reduce.cuh", "vec.cuh", "check.cuh", "switch.cuh", "convert.cuh", "types.h", "torch_utils.h", "dispatch.h",
              "tma.cuh", "wgmma.cuh", "wgmma_ops.cuh"]:
        assert (inc / h).exists(), h


def test_fastpath_entry_takes_the_fast_way_only_for_plain_calls():
    """fastpath.entry calls the C++ entry for plain tensors, the op for anything that
    must see the op: a torch-function mode, a tensor subclass, torch.compile."""
    from torch.overrides import TorchFunctionMode

    from kernel_common import fastpath

    calls = []

    def fast(a, b, alpha):
        calls.append("fast")
        return torch.ops.aten.add.Tensor(a, b, alpha=alpha)

    op = torch.ops.aten.add.Tensor
    f = fastpath.entry(lambda a, b, alpha: (calls.append("op"), op(a, b, alpha=alpha))[1], fast, 2)
    a, b = torch.ones(3), torch.full((3,), 2.0)
    assert torch.equal(f(a, b, 3), a + 3 * b) and calls == ["fast"]
    assert torch.equal(f(a, b, 1), a + b) and calls == ["fast", "fast"]

    class Sub(torch.Tensor):
        pass

    calls.clear()
    f(a.as_subclass(Sub), b, 1)
    f(a, b.as_subclass(Sub), 1)  # an override in any tensor argument counts
    assert calls == ["op", "op"]

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    calls.clear()
    with Mode():
        f(a, b, 1)
    assert calls == ["op"]
    assert torch.equal(torch.compile(lambda x, y: f(x, y, 2), fullgraph=True, backend="eager")(a, b), a + 2 * b)
    assert calls[-1] == "op"
    assert fastpath.plain_call((a, None)) and not fastpath.plain_call((a.as_subclass(Sub),))


def test_bench_floor_math():
    from kernel_common import bench
    assert bench.floor_us(4e9, 4000) == pytest.approx(1000.0)
    assert bench.flops_floor_us(1e12, 500) == pytest.approx(2000.0)
    t = bench.format_table([{"a": 1.234, "b": None}], ["a", "b"])
    assert "1.23" in t and "-" in t


@requires_cuda
def test_bench_timers_run_the_op():
    """time_us, graph_us (CUDA-graph replays) and host_us each run the op (a counter
    counts the calls on the GPU) and give a positive, finite time; time_us runs a
    given flush before each repeat."""
    from kernel_common import bench
    x = torch.zeros(1 << 16, device="cuda")
    for timer in (bench.time_us, bench.graph_us, bench.host_us):
        before = x[0].item()
        t = timer(lambda: x.add_(1))
        assert math.isfinite(t) and t > 0, timer.__name__
        assert x[0].item() >= before + 3, timer.__name__  # warm-up and timed calls ran
    flushes = []
    bench.time_us(lambda: x.add_(1), rep=4, flush=lambda: flushes.append(1))
    assert len(flushes) == 4  # a given flush runs before each timed repeat, instead of the default


# --------------------------------------------------------------------------- model benchmark
def _copy_ln(m):
    """A fake LayerNorm swap: an identical torch module (same weights), of a subclass, so the
    swap is visible."""
    class CopiedLayerNorm(torch.nn.LayerNorm):
        pass
    n = CopiedLayerNorm(m.normalized_shape, eps=m.eps, device=m.weight.device, dtype=m.weight.dtype)
    n.load_state_dict(m.state_dict())
    return n


def _counting(stats, causal_seen, fn=None):
    from kernel_common import models
    fn = fn or models.sdpa_attention

    def attn(q, k, v, causal, scale):
        stats.append(q.shape)
        causal_seen.add(causal)
        return fn(q, k, v, causal, scale)
    return attn


def _gpt2_swaps(calls, causal_seen):
    from kernel_common import models
    return {"fake LN": models.Swap(layer_norm=_copy_ln),
            "counted SDPA": models.Swap(attention=_counting(calls, causal_seen)),
            "non-causal": models.Swap(attention=lambda q, k, v, causal, scale: models.sdpa_attention(q, k, v, False,
                                                                                                      scale))}


def _check_gpt2_rows(rows, calls, causal_seen, n_layer):
    by = {r["variant"]: r for r in rows}
    assert set(by) == {"torch", "fake LN", "counted SDPA", "non-causal"}
    t = by["torch"]
    # bf16 is not exact against fp32, and not wildly off either
    assert 1e-5 < t["grad err torch"] < 0.1 and t["grad err ours"] == t["grad err torch"]
    for v in ("fake LN", "counted SDPA"):  # identical math: the same loss and grads as torch
        assert by[v]["loss diff"] < 1e-6, by[v]
        assert by[v]["grad err ours"] == pytest.approx(t["grad err torch"], rel=1e-3, abs=1e-7), by[v]
        assert "not timed" in by[v]["note"]
    # the swapped attention ran in every layer, causal; a non-causal one shows in loss and grads
    assert len(calls) >= n_layer and causal_seen == {True}
    assert by["non-causal"]["loss diff"] > 1e-3 and by["non-causal"]["grad err ours"] > 10 * t["grad err torch"]


def test_models_plain_gpt2_step_and_agreement_cpu():
    """The plain-torch GPT-2 (tiny) through the harness on CPU: an identical LayerNorm swap and
    an identical attention swap agree with torch (loss diff ~0, grad error = torch's own), a
    wrong attention does not; every LayerNorm was replaced."""
    from kernel_common import models
    spec = models.build_gpt2(torch.device("cpu"), use_transformers=False)
    calls, causal_seen = [], set()
    rows = models.bench_model(spec, _gpt2_swaps(calls, causal_seen), log=lambda *a: None)
    _check_gpt2_rows(rows, calls, causal_seen, spec.model.size.n_layer)
    m = __import__("copy").deepcopy(spec.model)
    n = models.swap_layer_norms(m, _copy_ln)
    assert n == 2 * spec.model.size.n_layer + 1
    assert not any(type(x) is torch.nn.LayerNorm for x in m.modules())


def test_models_transformers_gpt2_cpu():
    pytest.importorskip("transformers", reason="transformers is not installed: its GPT-2 path is not tested here")
    from kernel_common import models
    if not models.have_transformers():
        pytest.skip("this transformers has no AttentionInterface")
    spec = models.build_gpt2(torch.device("cpu"), use_transformers=True)
    assert spec.kind == "hf-gpt2"
    calls, causal_seen = [], set()
    rows = models.bench_model(spec, _gpt2_swaps(calls, causal_seen), log=lambda *a: None)
    _check_gpt2_rows(rows, calls, causal_seen, spec.model.config.n_layer)
    assert all("fell back" not in r.get("note", "") for r in rows)


def test_models_hf_attention_masks():
    """The AttentionInterface adapter: (B, H, N, d) in, (B, N, H, d) out; no mask or the plain
    causal mask (bool or additive) -> the swap, causal; any other mask -> SDPA with it, counted."""
    from kernel_common import models
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    seen = []
    stats = {}
    fn = models.hf_attention(lambda q, k, v, c, s: (seen.append(c), models.sdpa_attention(q, k, v, c, s))[1], stats)
    mod = torch.nn.Module()
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    tril = torch.ones(5, 5, dtype=torch.bool).tril()
    additive = torch.zeros(5, 5).masked_fill(~tril, float("-inf"))
    for mask in (None, tril[None, None].expand(2, 1, 5, 5), additive[None, None]):
        out, w = fn(mod, q, k, v, mask, scaling=None)
        assert w is None and out.shape == (2, 5, 3, 4) and torch.allclose(out, want, atol=1e-6)
    assert seen == [True] * 3 and stats == {"swapped": 3}
    pad = tril.clone(); pad[:, 0] = False; pad[0, 0] = True
    out, _ = fn(mod, q, k, v, pad[None, None], scaling=0.3)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=pad, scale=0.3).transpose(1, 2)
    assert torch.allclose(out, ref, atol=1e-6) and stats["fallback"] == 1 and len(seen) == 3
    with pytest.raises(ValueError, match="dropout"):
        fn(mod, q, k, v, None, dropout=0.1)


def test_models_cnn_convert_cpu():
    """A CNN through the harness with a convert swap (model -> model): an identity convert
    agrees exactly; dropout is switched off in every variant."""
    from kernel_common import models
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.SiLU(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Dropout(0.5),
                              torch.nn.Linear(8, 10))
    spec = models.cnn_spec("tiny cnn", net, (4, 3, 12, 12), 10, torch.device("cpu"))
    assert spec.model[5].p == 0
    converted = []
    rows = models.bench_model(spec, {"convert": models.Swap(convert=lambda m: (converted.append(1), m)[1])},
                              log=lambda *a: None)
    by = {r["variant"]: r for r in rows}
    assert converted == [1] and by["convert"]["loss diff"] == 0
    assert by["convert"]["grad err ours"] == pytest.approx(by["torch"]["grad err torch"], rel=1e-6)


def test_models_run_writes_report(tmp_path):
    from kernel_common import models
    p = __import__("argparse").ArgumentParser()
    p.add_argument("--out")
    models.add_args(p)
    args = p.parse_args(["--models", "--quick", "--out", str(tmp_path / "d")])
    assert args.models and args.quick
    rows = models.run(args, "dayX", ["gpt2"], {"fake LN": models.Swap(layer_norm=_copy_ln)},
                      log=lambda *a: None, device=torch.device("cpu"))
    assert [r["variant"] for r in rows] == ["torch", "fake LN"]
    assert (tmp_path / "d_models.md").exists() and (tmp_path / "d_models.json").exists()
    assert "fake LN" in (tmp_path / "d_models.md").read_text()


def test_models_timers_need_cuda():
    from kernel_common import models
    if HAS_CUDA:
        pytest.skip("CUDA present: the timers run in the GPU test")
    with pytest.raises(RuntimeError, match="needs CUDA"):
        models.time_eager_rounds({"a": lambda: None}, 1, 1)
    spec = models.build_gpt2(torch.device("cpu"), use_transformers=False)
    x, y = spec.make_inputs(torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError, match="needs CUDA"):
        models.time_graph(spec, spec.model, x, y, 1, 1)


@requires_cuda
def test_models_timing_cuda():
    """On a GPU: the tiny plain GPT-2 is timed eagerly and from a CUDA graph (positive times,
    torch's speedup vs itself 1)."""
    from kernel_common import models
    spec = models.build_gpt2(torch.device("cuda"), use_transformers=False, size=models.TINY, batch=2, seq=32)
    rows = models.bench_model(spec, {"fake LN": models.Swap(layer_norm=_copy_ln)}, rounds=2, k=3,
                              log=lambda *a: None)
    for r in rows:
        assert r.get("eager ms", 0) > 0 and r.get("GPU-only ms", 0) > 0, r
    assert rows[0]["eager speedup"] == 1 and rows[0]["GPU-only speedup"] == 1


def test_check_cache_key(tmp_path):
    """The nvcc check's cache key changes with the source, any header, the command line
    and the compiler version, and with nothing else."""
    src, hdr = tmp_path / "a.cu", tmp_path / "a.cuh"
    src.write_text("int a;"); hdr.write_text("int h;")
    key = lambda cmd=("nvcc", "-O3"), ver="13.0": build._check_key(src, list(cmd), [hdr], ver)
    k0 = key()
    assert key() == k0
    assert key(cmd=("nvcc", "-O2")) != k0 and key(ver="13.2") != k0
    hdr.write_text("int h2;")
    k1 = key()
    assert k1 != k0
    src.write_text("int b;")
    assert key() != k1


def _synthetic_rows():
    rows = []
    for i, shape in enumerate(["4096x768", "8192x1000", "1x3"]):
        rows.append({"shape": shape, "ours": 10.0 + i, "torch": 20.0 + i, "compile": None, "floor": 5.0})
    return rows


def test_report_plot_is_readable(tmp_path):
    """write_report's PNG: written, one bar group per shape, % of floor on a labelled x
    axis, shapes on a labelled y axis, device and date in the title."""
    testing.optional_import("matplotlib")
    from kernel_common import bench
    import matplotlib.pyplot as plt

    seen = {}
    real_close = plt.close
    plt.close = lambda fig=None: seen.setdefault("fig", fig)  # keep the figure to inspect it
    try:
        bench.write_report(_synthetic_rows(), ["shape", "ours", "torch", "compile", "floor"], tmp_path / "r", "t",
                           {"device": "DEV", "date": "2026-11-23"}, plot_cols=["ours", "torch", "compile", "floor"],
                           label_col="shape")
    finally:
        plt.close = real_close
    assert (tmp_path / "r.json").exists() and (tmp_path / "r.png").stat().st_size > 0
    ax = seen["fig"].axes[0]
    assert "% of the hardware floor" in ax.get_xlabel() and ax.get_ylabel() == "shape"
    assert "DEV" in ax.get_title() and "2026-11-23" in ax.get_title()
    assert [t.get_text() for t in ax.get_yticklabels()] == ["4096x768", "8192x1000", "1x3"]
    widths = sorted(round(p.get_width(), 6) for p in ax.patches)
    assert widths[-1] == pytest.approx(50.0) and widths[0] == pytest.approx(100 * 5 / 22)  # floor / time
    real_close(seen["fig"])


def test_attention_plot_is_readable(tmp_path):
    testing.optional_import("matplotlib")
    from kernel_common import bench
    import matplotlib.pyplot as plt

    rows = [{"N": n, "d": d, "causal": c, "fused bwd TF/s": 100.0 + n / 100, "flash bwd TF/s": 150.0,
             "cudnn bwd TF/s": 200.0} for n in (1024, 2048, 4096) for d in (64, 128) for c in (False, True)]
    seen = {}
    real_close = plt.close
    plt.close = lambda fig=None: seen.setdefault("fig", fig)
    try:
        assert bench.plot_attention(rows, tmp_path / "a.png", "attn", {"device": "DEV", "date": "D"})
    finally:
        plt.close = real_close
    fig = seen["fig"]
    assert (tmp_path / "a.png").stat().st_size > 0
    assert len(fig.axes) == 4  # one panel per (d, causal); only bwd columns given
    # nothing to draw (a quick run times no grid): no file, no error
    assert bench.plot_attention([], tmp_path / "b.png", "attn") is None and not (tmp_path / "b.png").exists()
    for ax in fig.axes:
        assert ax.get_xlabel() == "sequence length N" and len(ax.get_lines()) == 3
    assert fig.axes[0].get_ylabel() == "bwd TFLOP/s" and "DEV" in fig._suptitle.get_text()
    real_close(fig)


def test_report_without_matplotlib(tmp_path, monkeypatch, capsys):
    from kernel_common import bench

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as when it is not installed
    bench.write_report(_synthetic_rows(), ["shape", "ours"], tmp_path / "r", "t", {}, plot_cols=["ours", "floor"],
                       label_col="shape")
    assert (tmp_path / "r.json").exists() and not (tmp_path / "r.png").exists()
    assert "matplotlib is not installed" in capsys.readouterr().out


def test_optional_import_skips_on_any_failure(monkeypatch):
    import types

    broken = types.ModuleType("kc_broken_dep")
    monkeypatch.setitem(sys.modules, "kc_broken_dep", None)
    with pytest.raises(pytest.skip.Exception, match="kc_broken_dep"):
        testing.optional_import("kc_broken_dep")
    ok, why = testing.optional_available("kc_broken_dep")
    assert not ok and "kc_broken_dep" in why
    monkeypatch.setitem(sys.modules, "kc_broken_dep", broken)
    assert testing.optional_import("kc_broken_dep") is broken


if __name__ == "__main__":
    sys.exit(testing.main(__file__, ["-q", *sys.argv[1:]]))
