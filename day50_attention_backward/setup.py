import os

from kernel_common.build import setup_day

setup_day(
    "day50_attention",
    os.path.dirname(os.path.abspath(__file__)),
    "Attention forward + backward: the step-by-step version (tiled matmul + softmax backward) "
    "and a fused flash-style version (mma.sync, fp16/bf16)",
)
