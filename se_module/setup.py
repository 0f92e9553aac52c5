from pathlib import Path

import os
import sys

# kernel_common from this checkout (../common), installed or not: setup_day also
# declares it as a dependency by path, so `pip install --no-build-isolation .` here
# installs both in one command.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from kernel_common.build import setup_day  # noqa: E402

setup_day("se_module", Path(__file__).resolve().parent,
          "Squeeze-and-Excitation: the seed's stage kernels and a fused block, forward + backward",
          # bench.py compares with torchvision's SqueezeExcitation when torchvision is there.
          # Its own extra, pinned to the release made for the installed torch: right after a
          # torch release there is none yet, and that must not stop `.[bench]` installing.
          extras={"test": ["pytest"], "bench": ["matplotlib"], "torchvision": ["torchvision"]})
