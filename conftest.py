"""Root pytest setup: each package folder goes on sys.path, as `python test.py` puts
its own folder there, so a test.py imports its package (and kernel_common) the same
way whether it runs alone or with every package from the root. The package's compiled
extension (<pkg>_C) is the installed one, or JIT-built when KC_JIT=1 is set for the run
(the test runner reads it; kernel_common.build.use_jit switches the loader)."""
import os
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent
for _d in sorted(_ROOT.iterdir()):
    if (_d / "test.py").is_file() and str(_d) not in sys.path:
        sys.path.insert(0, str(_d))

# A package named like its folder (se_module/se_module): importlib mode names that
# folder's test.py "se_module.test" and would stand an empty module in for the parent
# "se_module" unless the real package is imported first. A package that cannot load
# (not built) is left for its test.py to report.
import importlib  # noqa: E402

import pytest  # noqa: E402

from kernel_common import testing  # noqa: E402
from kernel_common.build import use_jit  # noqa: E402

if os.environ.get("KC_JIT", "0") == "1":
    use_jit(verbose=os.environ.get("KC_VERBOSE", "0") == "1")

for _d in sorted(_ROOT.iterdir()):
    if (_d / "test.py").is_file() and (_d / _d.name / "__init__.py").is_file():
        try:
            importlib.import_module(_d.name)
        except Exception:  # noqa: BLE001
            pass
testing.poison_outputs(True)  # before any fixture of any scope runs a kernel


@pytest.fixture(autouse=True)
def _poison_outputs():
    """Every test runs with NaN-filled outputs in every day extension loaded so far
    (one a test.py imports late included): kernel_common.testing.poison_outputs."""
    testing.poison_outputs(True)
    yield
