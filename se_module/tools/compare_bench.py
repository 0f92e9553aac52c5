"""Compare two bench.py JSON outputs row by row (fused / eager times and ratios).

    python tools/compare_bench.py A.json B.json [--pass fb]
"""
import json
import sys


def rows(path, pas):
    d = json.load(open(path))
    out = {}
    for r in d["rows"] if isinstance(d, dict) and "rows" in d else d:
        if str(r.get("table", "")).startswith(pas + " "):
            out.setdefault(r["shape"], r)
    return out


def main():
    a, b = sys.argv[1], sys.argv[2]
    for pas in ("fwd", "fb"):
        ra, rb = rows(a, pas), rows(b, pas)
        print(f"\n{pas}: fused_us A -> B, eager_us A -> B, eager/fused A -> B")
        for s in ra:
            if s in rb:
                x, y = ra[s], rb[s]
                print(f"  {s:24s} {x['fused_us']:8.2f} -> {y['fused_us']:8.2f}   {x['eager_us']:8.2f} -> "
                      f"{y['eager_us']:8.2f}   {x['eager/fused']:5.2f} -> {y['eager/fused']:5.2f}")


if __name__ == "__main__":
    main()
