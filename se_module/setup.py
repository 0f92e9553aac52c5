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
          # torchvision: bench.py compares with its SqueezeExcitation (pinned to the torch installed)
          extras={"test": ["pytest"], "bench": ["matplotlib", "torchvision"]})
