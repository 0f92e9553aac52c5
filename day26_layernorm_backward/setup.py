"""day26_layernorm: LayerNorm forward + backward CUDA kernels as torch ops.

    pip install --no-build-isolation .     (after installing ../common)
"""
import os

from kernel_common.build import setup_day

setup_day("day26_layernorm", os.path.dirname(os.path.abspath(__file__)),
          "LayerNorm forward and backward (dx, dgamma, dbeta) CUDA kernels as torch ops")
