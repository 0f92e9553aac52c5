"""Root pytest setup: each package folder goes on sys.path, as `python test.py` puts
its own folder there, so a test.py imports its package (and kernel_common) the same
way whether it runs alone or with every package from the root. The package's compiled
extension (<pkg>_C) is the installed one, or JIT-built with KC_JIT=1."""
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent
for _d in sorted(_ROOT.iterdir()):
    if (_d / "test.py").is_file() and str(_d) not in sys.path:
        sys.path.insert(0, str(_d))
