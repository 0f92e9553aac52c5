"""day26_layernorm: LayerNorm forward + backward CUDA kernels as torch ops.

    pip install --no-build-isolation .     (installs ../common too)
"""
import os
import sys

# kernel_common from this checkout (../common), installed or not: setup_day also
# declares it as a dependency by path, so `pip install --no-build-isolation .` here
# installs both in one command.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from kernel_common.build import setup_day  # noqa: E402

setup_day("day26_layernorm", os.path.dirname(os.path.abspath(__file__)),
          "LayerNorm forward and backward (dx, dgamma, dbeta) CUDA kernels as torch ops")
