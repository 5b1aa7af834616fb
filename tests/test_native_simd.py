"""gqt_hqq_simd.c (AVX2 / NEON vec_dot) against the scalar reference, outside llama.cpp.

Compiles gguftool/native/patches/gqt_simd_check.c with the kernel sources for the host, with
and without the SIMD flags, and - when an aarch64 cross compiler and qemu-aarch64 are installed
(`apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user`) - for arm64 NEON with
and without dot-product instructions, run under emulation."""
from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.native

ROOT = Path(__file__).resolve().parent.parent
FAST = ROOT / "gguftool" / "_fast"
HARNESS = ROOT / "gguftool" / "native" / "patches" / "gqt_simd_check.c"
SOURCES = [str(HARNESS), str(FAST / "gqt_hqq.c"), str(FAST / "gqt_hqq_simd.c")]


def _build_and_run(cc: str, flags: list[str], out: Path, runner: list[str]) -> str:
    r = subprocess.run([cc, "-O2", "-std=c99", "-ffp-contract=off", *flags, "-I", str(FAST), *SOURCES, "-lm",
                        "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([*runner, str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-1000:]
    return r.stdout.strip().splitlines()[-1]


X86_FLAGS = {"scalar": [], "avx2": ["-mavx2", "-mfma", "-mf16c"], "avx2-nofma": ["-mavx2", "-mno-fma", "-mno-f16c"]}


@pytest.mark.parametrize("variant", sorted(X86_FLAGS))
def test_host_simd_matches_reference(variant, tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("x86 flags on a non-x86 host")
    line = _build_and_run(cc, X86_FLAGS[variant], tmp_path / "chk", [])
    assert line.startswith(f"path={'scalar' if variant == 'scalar' else 'avx2'} ") and line.endswith("failures=0")


@pytest.mark.parametrize("march,path", [("armv8-a", "neon"), ("armv8.2-a+dotprod", "neon+dotprod")])
def test_arm64_neon_matches_reference(march, path, tmp_path):
    cc, qemu = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
    if not cc or not qemu:
        pytest.skip("aarch64 cross compiler or qemu-aarch64 missing "
                    "(apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)")
    line = _build_and_run(cc, [f"-march={march}", "-static"], tmp_path / "chk", [qemu])
    assert line.startswith(f"path={path} ") and line.endswith("failures=0")
