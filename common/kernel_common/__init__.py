"""kernel_common: what every day of the repo shares.

- include/kc/*.cuh : header-only CUDA helpers (reductions, vector loads, checks, switches)
- build            : the extension builder, the JIT loader and the nvcc compile check
- testing          : float64-reference comparisons, tolerances, devices, NaN-poisoned outputs
- bench            : timing with L2 flush, measured ceilings, floors, table/JSON/PNG reports
"""


def include_dir() -> str:
    """Folder holding the shared headers (#include "kc/reduce.cuh")."""
    from .build import include_dir as _inc

    return _inc()


__version__ = "0.1.0"
