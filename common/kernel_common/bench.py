"""Benchmark utilities every day's bench.py uses (GPU only).

- time_us(fn): CUDA-event timing, warm-up first, L2 flushed before every repeat by
  reading a buffer larger than the L2 (triton.testing.do_bench zeroes one instead),
  median over repeats.
- graph_us(fn): the same on a CUDA-graph replay of fn (GPU time, no host launch work);
  graphs_us(fns): several such calls interleaved repeat by repeat, for ratios between them
  (the clock a sustained load lowers is the same for each); host_us(fn): host microseconds per call.
- copy_bandwidth_gbs() / matmul_tflops(): the two ceilings, measured on this device
  (bytes read + bytes written per second for a large device-to-device copy; a
  large bf16 matrix product on random data).
- floor_us(bytes, gbs) and flops_floor_us(flops, tflops): the time no version can beat;
  stream_kernel(reads, writes, ...): a kernel that only moves a pass's bytes (Triton), the
  floor in practice for that mix of reads and writes.
- Report: rows -> printed table, JSON and (with matplotlib) a PNG: % of the floor per
  shape beside the peers (plot_rows), or attention's TFLOP/s against N (plot_attention).
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
    return _medians_us([fn], warmup, rep, max_ms, (flush or _l2_flush) if flush_l2 else None)[0]


def _medians_us(fns: list[Callable[[], object]], warmup: int, rep: int, max_ms: float,
                flush: Callable[[], object] | None) -> list[float]:
    """Median microseconds of each of fns: `warmup` rounds untimed, then up to `rep` rounds
    (fewer if they would pass max_ms, at least 3), each running every fn once in turn, timed
    alone between CUDA events, `flush` (if any) before each."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    # estimate, to keep slow variants inside the time budget
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for fn in fns:
        fn()
    e.record()
    torch.cuda.synchronize()
    rep = max(3, min(rep, int(max_ms / max(s.elapsed_time(e), 1e-3))))
    ev = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in fns]
          for _ in range(rep)]
    for row in ev:
        for fn, (a, b) in zip(fns, row):
            if flush is not None:
                flush()
            a.record()
            fn()
            b.record()
    torch.cuda.synchronize()
    return [1e3 * statistics.median(row[j][0].elapsed_time(row[j][1]) for row in ev) for j in range(len(fns))]


def capture_graph(fn: Callable[[], object], warmup: int = 2):
    """fn captured in a CUDA graph, after `warmup` calls on a side stream (what capture
    needs: lazy initialisation and allocator warm-up outside it). Returns (graph, what
    fn returned during the capture: the tensors each replay rewrites)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def graph_us(fn: Callable[[], object], warmup: int = 2) -> float:
    """GPU time alone: fn captured in a CUDA graph (capture_graph), each repeat one
    replay, timed as time_us times (L2 flushed, median): the host's launch work is
    gone from the measurement."""
    graph, _ = capture_graph(fn, warmup)
    t = time_us(graph.replay)
    del graph
    return t


def graphs_us(fns: list[Callable[[], object]], warmup: int = 2, rep: int = 30,
              max_ms: float = 4000.0) -> list[float]:
    """GPU time of several calls to be compared: each captured in a CUDA graph, and every
    repeat replays all of them in turn, L2 flushed before each; medians, in fns' order.
    A GPU under sustained load lowers its clock (an H200 from 1980 to about 1800 MHz within
    a second of attention kernels): timed one after the other, whichever runs second reads
    slower; interleaved, each sees the same clocks."""
    graphs = [capture_graph(fn, warmup)[0] for fn in fns]
    out = _medians_us([g.replay for g in graphs], 1, rep, max_ms, _l2_flush)
    del graphs
    return out


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


def stream_kernel(reads: int, writes: int, numel: int, dtype: torch.dtype) -> Callable[[], object] | None:
    """The practical floor of one pass over memory: a callable running an elementwise
    Triton kernel that reads `reads` (1-3) and writes `writes` (1-2) fresh tensors of
    `numel` elements of `dtype` and does nothing else, at the fastest of a few block
    shapes (graph replays, timed here). Reads cost less than writes, so a kernel's
    bytes over the copy bandwidth (floor_us) are not what it can reach; this is, for
    its mix of reads and writes, with no arithmetic or reduction in the way. None where
    Triton is not installed."""
    try:
        import triton

        from kernel_common import _stream
    except ImportError:
        return None
    if not (1 <= reads <= 3 and 1 <= writes <= 2):
        raise ValueError(f"stream_kernel: 1-3 reads and 1-2 writes, not {reads} and {writes}")
    src = [torch.randn(numel, device="cuda", dtype=dtype) for _ in range(reads)]
    dst = [torch.empty(numel, device="cuda", dtype=dtype) for _ in range(writes)]
    args = (*src, *[src[0]] * (3 - reads), *dst, *[dst[0]] * (2 - writes), numel)
    best = None
    for block, warps in ((1024, 4), (1024, 8), (2048, 8), (4096, 8)):
        grid = (triton.cdiv(numel, block),)

        def run(grid=grid, block=block, warps=warps):
            _stream.stream[grid](*args, NR=reads, NW=writes, BLOCK=block, num_warps=warps)

        us = graph_us(run)
        if best is None or us < best[0]:
            best = (us, run)
    return best[1]


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


def _pyplot():
    """matplotlib's pyplot on the file-only backend, or None (with a message) when
    matplotlib is missing: it is the bench extra, not a requirement."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG written (pip install matplotlib, or the package's [bench] extra)")
        return None
    return plt


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _figure_title(title: str, meta: dict) -> str:
    where = ", ".join(str(meta[k]) for k in ("device", "date") if meta.get(k))
    return f"{title}\n{where}" if where else title


def plot_rows(rows: list[dict], plot_cols: list[str], path: str | Path, title: str, meta: dict | None = None,
              label_col: str | None = None, floor_col: str | None = None, value_label: str | None = None):
    """One PNG a person can read: a horizontal group of bars per row (shape), one bar
    per series in plot_cols. With floor_col (a time no kernel can beat, same unit as
    the series) each bar is floor / time in % (100% = at the hardware floor; longer is
    faster); otherwise the values themselves, `value_label` naming their unit.
    Returns the path, or None without matplotlib."""
    plt = _pyplot()
    if plt is None:
        return None
    meta = meta or {}
    series = [c for c in plot_cols if c != floor_col]
    labels = [str(r.get(label_col, i)) if label_col else str(i) for i, r in enumerate(rows)]

    def val(r, c):
        v = _num(r.get(c))
        if floor_col is None:
            return v
        f = _num(r.get(floor_col))
        return 100.0 * f / v if v and f else None

    n, k = len(rows), max(1, len(series))
    h = 0.8 / k
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.16 * n * k + 0.1 * n))
    cmap = plt.get_cmap("tab10")
    for j, c in enumerate(series):
        ys = [i + (j - (k - 1) / 2) * h for i in range(n)]
        xs = [val(r, c) for r in rows]
        ax.barh([y for y, x in zip(ys, xs) if x is not None], [x for x in xs if x is not None], h,
                label=c, color=cmap(j % 10))
    ax.set_yticks(range(n))
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_ylim(n - 0.5, -0.5)  # first row at the top, as in the table
    ax.set_ylabel(label_col or "row")
    if floor_col is not None:
        ax.set_xlabel(f"% of the hardware floor ({floor_col} / time; 100% = at the floor, longer is faster)")
        ax.axvline(100, color="k", lw=0.8, ls="--")
    else:
        ax.set_xlabel(value_label or "value")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(_figure_title(title, meta), fontsize=10)
    ax.legend(fontsize=8, loc="lower right", framealpha=0.9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


ATTENTION_PEERS = {"flash": "FA2 (SDPA flash)", "cudnn": "cuDNN (SDPA)", "efficient": "SDPA mem-efficient"}


def plot_attention(rows: list[dict], path: str | Path, title: str, meta: dict | None = None,
                   ours: str = "fused", peers: dict[str, str] | None = None, passes=("fwd", "bwd")):
    """Attention's PNG: TFLOP/s against sequence length N, one panel per
    (dtype, head dim d, causal) and pass (fwd / bwd), ours beside the peers.
    Rows carry N, d, causal (and dtype, else meta["dtype"], else bf16) and
    "<name> <pass> TF/s" columns. Returns the path, or None without matplotlib or without
    a point to draw (e.g. a quick run that timed no grid)."""
    plt = _pyplot()
    if plt is None:
        return None
    meta = meta or {}
    peers = ATTENTION_PEERS if peers is None else peers
    names = {ours: f"ours ({ours})", **peers}

    def key(r):
        return (str(r.get("dtype", meta.get("dtype", "bf16"))), int(r["d"]), bool(r.get("causal", False)))

    panels = sorted({key(r) for r in rows if "N" in r and "d" in r})
    passes = [p for p in passes if any(f"{n} {p} TF/s" in r for r in rows for n in names)]
    if not panels or not passes:
        return None
    ncol = max(1, len(panels))
    fig, axes = plt.subplots(len(passes) or 1, ncol, figsize=(3.6 * ncol, 3.2 * max(1, len(passes))),
                             squeeze=False)
    cmap = plt.get_cmap("tab10")
    for i, p in enumerate(passes):
        for j, pk in enumerate(panels):
            ax = axes[i][j]
            sel = sorted((r for r in rows if "N" in r and "d" in r and key(r) == pk), key=lambda r: r["N"])
            for c, (name, label) in enumerate(names.items()):
                pts = [(r["N"], _num(r.get(f"{name} {p} TF/s"))) for r in sel]
                pts = [(x, y) for x, y in pts if y is not None]
                if pts:
                    ax.plot(*zip(*pts), marker="o", lw=2.2 if name == ours else 1.2, color=cmap(c), label=label)
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({r["N"] for r in sel}))
            ax.set_xticklabels([str(r) for r in sorted({r["N"] for r in sel})], fontsize=8)
            ax.set_title(f"{p}: {pk[0]}, d={pk[1]}, {'causal' if pk[2] else 'full'}", fontsize=9)
            ax.set_xlabel("sequence length N")
            if j == 0:
                ax.set_ylabel(f"{p} TFLOP/s")
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=8, bbox_to_anchor=(0.5, 0.925))
    fig.suptitle(_figure_title(title, meta), fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.88))
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(rows: list[dict], cols: list[str], path_stem: str | Path, title: str,
                 meta: dict | None = None, plot_cols: list[str] | None = None, label_col: str | None = None,
                 floor_col: str | None = None, value_label: str | None = None):
    """Write <stem>.json (meta + rows) and, when plot_cols is given, <stem>.png
    (plot_rows: % of floor per row beside the peers when a floor column is there,
    floor_col or the plot column whose name starts with "floor"; else the values).
    Without matplotlib the PNG is skipped with a message."""
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(meta or {})
    with open(stem.with_suffix(".json"), "w") as f:
        json.dump({"title": title, "meta": meta, "columns": cols, "rows": rows}, f, indent=1, default=str)
    if not plot_cols:
        return
    if floor_col is None:
        floor_col = next((c for c in plot_cols if c.startswith("floor")), None)
    plot_rows(rows, plot_cols, stem.with_suffix(".png"), title, meta, label_col, floor_col, value_label)
