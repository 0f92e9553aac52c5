"""kernel_common: shared CUDA headers and build/test/bench helpers for every day."""
from setuptools import setup

setup(
    name="kernel_common",
    version="0.1.0",
    description="Shared CUDA headers and build/test/bench helpers for the day packages",
    packages=["kernel_common"],
    package_data={"kernel_common": ["include/kc/*.cuh", "include/kc/*.h"]},
    include_package_data=True,
    python_requires=">=3.10",
)
