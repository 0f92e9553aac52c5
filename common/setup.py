"""kernel_common: shared CUDA headers and build/test/bench helpers for every day.

The metadata is in pyproject.toml; `pip install .` here (no extension to build).
"""
from setuptools import setup

setup()
