"""Builds one extension per kernel family: gguftool/_fast/_NAME.pyx + gguftool/_fast/gqt_NAME.c (+ gqt_NAME_simd.c).

The C files are the same ones the native llama.cpp build compiles. Portable flags only: SIMD
paths are compiled in the native build, never in the wheel (no -march=native here)."""
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

FAST = Path("gguftool/_fast")
# Python-only kernels (kq_*.c), outside the gqt_* set that the native build also compiles into llama.cpp
PYTHON_ONLY = {"_kquant": ["kq_search.c"]}
extensions = [
    Extension(
        f"gguftool._fast.{pyx.stem}",
        # gqt_NAME.c and its gqt_NAME_simd.c, not another family's gqt_NAME_*.c (tq3 vs tq3_1)
        sources=[str(pyx), *(str(p) for p in (FAST / f"gqt{pyx.stem}.c", FAST / f"gqt{pyx.stem}_simd.c") if p.is_file()),
                 *(str(FAST / c) for c in PYTHON_ONLY.get(pyx.stem, ()))],
        include_dirs=[str(FAST), np.get_include()],
        extra_compile_args=["-O2", "-std=c99", "-fno-fast-math", "-ffp-contract=off"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
    for pyx in sorted(FAST.glob("_*.pyx"))
]
setup(
    ext_modules=cythonize(extensions, language_level=3),
    # recipes/*.toml live at the top of the repository and install as the package gguftool.recipes
    packages=[*find_packages(include=["gguftool", "gguftool.*"]), "gguftool.recipes"],
    package_dir={"gguftool.recipes": "recipes"},
    package_data={
        "gguftool": ["_fast/*.h", "_fast/gqt_*.c", "_fast/kq_*.c", "_fast/*.pyx", "native/patches/*", "data/*"],
        "gguftool.recipes": ["*.toml"],
    },
)
