"""Benchmark utilities every day's bench.py uses (GPU only).

- time_us(fn): CUDA-event timing, warm-up first, L2 flushed before every repeat by
  reading a buffer larger than the L2 (triton.testing.do_bench zeroes one instead),
  median over repeats.
- graph_us(fn): the same on a CUDA-graph replay of fn (GPU time, no host launch work);
  host_us(fn): host microseconds per call.
- copy_bandwidth_gbs() / matmul_tflops(): the two ceilings, measured on this device
  (bytes read + bytes written per second for a large device-to-device copy; a
  large bf16 matrix product on random data).
- floor_us(bytes, gbs) and flops_floor_us(flops, tflops): the time no version can beat.
- Report: rows -> printed table, JSON and (with matplotlib) a PNG bar plot.
The end-to-end model benchmark (a training step with a day's ops swapped in) is in models.py.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

_flush_buf: torch.Tensor | None = None
_flush_out: torch.Tensor | None = None


def _l2_flush():
    """Empty the L2 of the timed op's data by READING a buffer of 4x the L2 (a sum into a
    preallocated scalar): the L2 is left holding clean lines, so nothing is written back
    inside the timed op (zeroing a buffer, as triton.testing.do_bench does, leaves dirty
    lines whose write-back competes with it)."""
    global _flush_buf, _flush_out
    if _flush_buf is None:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        l2 = getattr(props, "L2_cache_size", 64 << 20) or (64 << 20)
        _flush_buf = torch.zeros(l2 + (1 << 20), dtype=torch.float32, device="cuda")  # 4 bytes each: 4x L2
        _flush_out = torch.zeros((), dtype=torch.float32, device="cuda")
    torch.sum(_flush_buf, 0, out=_flush_out)


def time_us(fn: Callable[[], object], warmup: int = 5, rep: int = 30, flush_l2: bool = True,
            max_ms: float = 2000.0, flush: Callable[[], object] | None = None) -> float:
    """Median microseconds of fn() over `rep` runs (fewer if they would pass max_ms).
    flush: what empties the L2 before each run when flush_l2 (default: a read of a
    buffer 4x the L2, see _l2_flush)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    # estimate, to keep slow variants inside the time budget
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); fn(); e.record(); torch.cuda.synchronize()
    est = max(s.elapsed_time(e), 1e-3)
    rep = max(3, min(rep, int(max_ms / est)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    for i in range(rep):
        if flush_l2:
            (flush or _l2_flush)()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return 1e3 * statistics.median(a.elapsed_time(b) for a, b in zip(starts, ends))


def graph_us(fn: Callable[[], object], warmup: int = 2) -> float:
    """GPU time alone: fn captured in a CUDA graph (after `warmup` calls on a side
    stream), each repeat one replay, timed as time_us times (L2 flushed, median):
    the host's launch work is gone from the measurement."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    t = time_us(graph.replay)
    del graph
    return t


def host_us(fn: Callable[[], object], n: int = 200, warmup: int = 10) -> float:
    """Host microseconds per call: n calls enqueued back to back, wall clock taken
    before the final synchronize (use a shape whose GPU work is shorter than the
    host's, so the launch queue never fills and the host never waits)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


_ceilings: dict = {}


def copy_bandwidth_gbs(nbytes: int = 2 << 30) -> float:
    """Measured device-to-device copy bandwidth, counting bytes read + written (GB/s)."""
    if "copy" not in _ceilings:
        src = torch.randint(0, 1 << 30, (nbytes // 4,), dtype=torch.int32, device="cuda")
        dst = torch.empty_like(src)
        t = time_us(lambda: dst.copy_(src), warmup=3, rep=20, flush_l2=False)
        _ceilings["copy"] = 2 * nbytes / (t * 1e-6) / 1e9
        del src, dst
        torch.cuda.empty_cache()
    return _ceilings["copy"]


def matmul_tflops(dtype: torch.dtype = torch.bfloat16, n: int = 8192) -> float:
    """Measured dense matrix-product rate on random data (TFLOP/s)."""
    key = ("mm", dtype, n)
    if key not in _ceilings:
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        t = time_us(lambda: a @ b, warmup=3, rep=10, flush_l2=False)
        _ceilings[key] = 2 * n**3 / (t * 1e-6) / 1e12
        del a, b
        torch.cuda.empty_cache()
    return _ceilings[key]


def floor_us(nbytes: float, gbs: float) -> float:
    """Time to move `nbytes` at `gbs` GB/s, in microseconds."""
    return nbytes / (gbs * 1e9) * 1e6


def flops_floor_us(flops: float, tflops: float) -> float:
    return flops / (tflops * 1e12) * 1e6


def device_meta() -> dict:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        "device": props.name,
        "sms": props.multi_processor_count,
        "date": _dt.date.today().isoformat(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        return f"{v:.1f}" if abs(v) >= 100 else f"{v:.2f}" if abs(v) >= 1 else f"{v:.3f}"
    return str(v)


def format_table(rows: list[dict], cols: list[str]) -> str:
    """A markdown table (what the READMEs quote)."""
    cells = [[_fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) if cells else len(c) for i, c in enumerate(cols)]
    line = lambda xs: "| " + " | ".join(x.rjust(w) for x, w in zip(xs, widths)) + " |"
    out = [line(cols), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(x) for x in cells]
    return "\n".join(out)


def write_report(rows: list[dict], cols: list[str], path_stem: str | Path, title: str,
                 meta: dict | None = None, plot_cols: list[str] | None = None, label_col: str | None = None):
    """Write <stem>.json (meta + rows) and, when matplotlib is present and
    plot_cols is given, <stem>.png (grouped bars of plot_cols per row)."""
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(meta or {})
    with open(stem.with_suffix(".json"), "w") as f:
        json.dump({"title": title, "meta": meta, "columns": cols, "rows": rows}, f, indent=1, default=str)
    if not plot_cols:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    labels = [str(r.get(label_col, i)) for i, r in enumerate(rows)]
    n = len(plot_cols)
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows) * n / 2 + 2), 4))
    w = 0.8 / n
    for j, c in enumerate(plot_cols):
        ys = [r.get(c) if isinstance(r.get(c), (int, float)) else 0 for r in rows]
        ax.bar([i + j * w for i in range(len(rows))], ys, w, label=c)
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(rows))])
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
    ax.set_title(f"{title} ({meta.get('device', '')}, {meta.get('date', '')})", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=110)
    plt.close(fig)
