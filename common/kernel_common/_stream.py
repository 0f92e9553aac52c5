"""The Triton kernel behind bench.stream_kernel (imported only where Triton is installed)."""
import triton
import triton.language as tl


@triton.jit
def stream(a, b, c, o, p, n, NR: tl.constexpr, NW: tl.constexpr, BLOCK: tl.constexpr):
    """o = a (+ b (+ c)) over n elements, NR of a, b, c read; with NW = 2, p = 2 o as well."""
    off = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = off < n
    v = tl.load(a + off, mask=m)
    if NR > 1:
        v += tl.load(b + off, mask=m)
    if NR > 2:
        v += tl.load(c + off, mask=m)
    tl.store(o + off, v, mask=m)
    if NW > 1:
        tl.store(p + off, v + v, mask=m)
