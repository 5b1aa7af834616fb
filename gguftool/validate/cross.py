"""Static aarch64 build of the pinned, patched llama.cpp for phones (adb) and qemu-user.

Reuses the native side's verified source tree and integration (gguftool.native.source /
integrate) and builds only the three tools validate runs, statically linked so the same files
run on Android (bionic never sees them: glibc is linked in) and under qemu-aarch64 here.

Needs Debian's cross toolchain: `apt-get install gcc-aarch64-linux-gnu g++-aarch64-linux-gnu`
(libc6-dev-arm64-cross comes with them). OpenMP is off: static libgomp is the usual breakage.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

from ..errors import GgufToolError
from ..native import build as nbuild
from ..native import integrate, source

TOOLS = ("llama-perplexity", "llama-bench", "llama-completion")
PREFIX = "aarch64-linux-gnu-"
# armv8.2-a + dotprod + fp16: every 64-bit Snapdragon / Dimensity / Exynos since ~2018, and
# qemu's "max" CPU; older phones (Cortex-A53/A73 only) need --arm-arch armv8-a.
DEFAULT_ARCH = "armv8.2-a+dotprod+fp16"


def toolchain(prefix: str = PREFIX) -> dict[str, str]:
    cc, cxx = shutil.which(prefix + "gcc"), shutil.which(prefix + "g++")
    if not cc or not cxx:
        raise GgufToolError(f"the aarch64 cross compiler ({prefix}gcc / {prefix}g++) is not installed",
                            "`apt-get install gcc-aarch64-linux-gnu g++-aarch64-linux-gnu`")
    return {"cc": cc, "cxx": cxx}


def cmake_options(tc: dict[str, str], arch: str = DEFAULT_ARCH) -> list[str]:
    opts = [o for o in nbuild.cmake_options(native=False)
            if not o.startswith(("-DCMAKE_C_FLAGS", "-DCMAKE_CXX_FLAGS"))]   # x86 -mno-amx flags
    return opts + [
        "-DCMAKE_SYSTEM_NAME=Linux", "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
        f"-DCMAKE_C_COMPILER={tc['cc']}", f"-DCMAKE_CXX_COMPILER={tc['cxx']}",
        "-DCMAKE_FIND_ROOT_PATH_MODE_PROGRAM=NEVER", "-DCMAKE_FIND_ROOT_PATH_MODE_LIBRARY=ONLY",
        "-DCMAKE_EXE_LINKER_FLAGS=-static", "-DGGML_OPENMP=OFF", "-DGGML_LLAMAFILE=OFF",
        f"-DGGML_CPU_ARM_ARCH={arch}",
    ]


def build_dir(root: Path | None = None, arch: str = DEFAULT_ARCH) -> Path:
    tag = arch.replace("+", "_").replace(".", "")
    return (root or source.cache_root()) / "build" / f"llama.cpp-{source.PINNED.version}-aarch64-static-{tag}"


def _key(opts: list[str]) -> str:
    parts = {"inputs": integrate.inputs_digest(integrate.KERNEL_DIR), "options": opts, "tools": TOOLS,
             "cross.py": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def find_cross_build(root: Path | None = None, arch: str = DEFAULT_ARCH) -> nbuild.BuildResult:
    bdir = build_dir(root, arch)
    stamp = nbuild.read_stamp(bdir)
    if not stamp or not all((bdir / "bin" / t).is_file() for t in TOOLS):
        raise GgufToolError(f"no static aarch64 llama.cpp build in {bdir}",
                            "run `gguftool validate --build-arm64` (needs g++-aarch64-linux-gnu; "
                            "~25 min on 2 cores)")
    return nbuild.BuildResult(bdir, bdir / "bin", stamp.get("key", ""), True, 0.0, stamp)


def build(jobs: int = 2, root: Path | None = None, arch: str = DEFAULT_ARCH, log=print) -> nbuild.BuildResult:
    t0 = time.monotonic()
    tc = toolchain()
    nbuild.check_prerequisites()   # cmake + make
    opts = cmake_options(tc, arch)
    key = _key(opts)
    bdir = build_dir(root, arch)
    stamp = nbuild.read_stamp(bdir)
    if stamp and stamp.get("key") == key and all((bdir / "bin" / t).is_file() for t in TOOLS):
        return nbuild.BuildResult(bdir, bdir / "bin", key, True, time.monotonic() - t0, stamp)
    tree = source.unpack(root, log=log)
    integrate.integrate(tree, integrate.KERNEL_DIR, log=log)
    bdir.mkdir(parents=True, exist_ok=True)
    (bdir / nbuild.STAMP).unlink(missing_ok=True)
    cmake = shutil.which("cmake")
    with open(bdir / nbuild.LOG, "a") as logf:
        log(f"configuring static aarch64 llama.cpp in {bdir} ...")
        nbuild._run_logged([cmake, "-S", str(tree), "-B", str(bdir), *opts], logf, log, "cmake configure (aarch64)")
        log(f"building {', '.join(TOOLS)} with -j{jobs} (log: {bdir / nbuild.LOG}) ...")
        nbuild._run_logged([cmake, "--build", str(bdir), "-j", str(jobs), "--target", *TOOLS],
                           logf, log, "cmake build (aarch64)")
    info = {"key": key, "arch": arch, "options": opts, "toolchain": tc, "tools": list(TOOLS),
            "llama_commit": source.PINNED.llama_commit, "seconds": round(time.monotonic() - t0, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (bdir / nbuild.STAMP).write_text(json.dumps(info, indent=1) + "\n")
    return nbuild.BuildResult(bdir, bdir / "bin", key, False, time.monotonic() - t0, info)
