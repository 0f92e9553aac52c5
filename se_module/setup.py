from pathlib import Path

from kernel_common.build import setup_day

setup_day("se_module", Path(__file__).resolve().parent,
          "Squeeze-and-Excitation: the seed's stage kernels and a fused block, forward + backward")
