import os

import sys

# kernel_common from this checkout (../common), installed or not: setup_day also
# declares it as a dependency by path, so `pip install --no-build-isolation .` here
# installs both in one command.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from kernel_common.build import setup_day  # noqa: E402

setup_day(
    "day50_attention",
    os.path.dirname(os.path.abspath(__file__)),
    "Attention forward + backward: the step-by-step version (tiled matmul + softmax backward) "
    "and a fused flash-style version (mma.sync, fp16/bf16)",
)
