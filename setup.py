"""Builds gguftool._fast._kernels: the C kernels in gguftool/_fast/*.c behind a thin Cython layer.

Portable flags only: SIMD paths are compiled in the native llama.cpp build, never in the wheel."""
from glob import glob

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

ext = Extension(
    "gguftool._fast._kernels",
    sources=["gguftool/_fast/_kernels.pyx", *sorted(glob("gguftool/_fast/gqt_*.c"))],
    include_dirs=["gguftool/_fast", np.get_include()],
    extra_compile_args=["-O2", "-std=c99", "-fno-fast-math"],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
)
setup(ext_modules=cythonize([ext], language_level=3))
