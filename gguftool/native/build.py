"""Configure and build the patched llama.cpp CPU tools, with a cache.

Layout under the cache root (gguftool.native.source.cache_root()):
    downloads/<sdist>                      verified llama-cpp-python source archive
    src/llama.cpp-<version>/               unpacked vendor/llama.cpp, patched in place
    build/llama.cpp-<version>-<machine>/   CMake build dir, bin/ holds the tools
        gguftool-build.json                key + what was built (stamp)
        gguftool-build.log                 full configure/build output

The key hashes the pinned archive, our kernel sources, the integration and this file, the
CMake options and the compiler; an unchanged key reuses the build without running CMake.
A changed key rebuilds incrementally in the same dir (only edited files rewrite).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import GgufToolError
from . import integrate, source

TARGETS = ("llama-completion", "llama-perplexity", "llama-bench", "llama-quantize", "llama-embedding",
           "llama-imatrix", "gguftool-check", "gguftool-kvdump", "gguftool-ggml")
LIBRARIES = {"gguftool-ggml": "gguftool-ggml.so"}   # targets that are shared libraries, not programs
STAMP = "gguftool-build.json"
LOG = "gguftool-build.log"


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


def cmake_options(native: bool = True) -> list[str]:
    """The CMake command-line options (checked against the pinned version's option names)."""
    opts = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_OPENSSL=OFF",          # no HTTPS client; LLAMA_CURL is deprecated in this version
        "-DLLAMA_BUILD_SERVER=OFF",
        "-DLLAMA_BUILD_APP=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=ON",    # llama-embedding lives in examples/
        "-DLLAMA_BUILD_TOOLS=ON",
        "-DGGML_CCACHE=OFF",
        f"-DGGML_NATIVE={'ON' if native else 'OFF'}",
        f"-DLLAMA_BUILD_COMMIT={source.PINNED.llama_commit[:7]}",
        "-DLLAMA_BUILD_NUMBER=0",       # the sdist is a shallow clone: the upstream number is unknown
    ]
    if is_x86():
        # -march=native turns on AMX on these CPUs and ggml's AMX path crashes on quantized
        # models (upstream #20824); explicit -mno-* wins over -march=native in GCC and Clang.
        noamx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        opts += [f"-DCMAKE_C_FLAGS={noamx}", f"-DCMAKE_CXX_FLAGS={noamx}"]
    return opts


@dataclass
class BuildResult:
    build_dir: Path
    bin_dir: Path
    key: str
    reused: bool
    seconds: float
    info: dict = field(default_factory=dict)

    def tool(self, name: str) -> Path:
        return self.bin_dir / target_file(name)


def target_file(target: str) -> str:
    """The file a build target leaves in bin/."""
    return LIBRARIES.get(target, target)


def missing_targets(bins: Path) -> list[str]:
    """The targets missing from `bins`."""
    return [t for t in TARGETS if not (bins / target_file(t)).is_file()]


def _which_any(names: list[str]) -> str | None:
    for n in names:
        p = shutil.which(n)
        if p:
            return p
    return None


def check_prerequisites() -> dict[str, str]:
    """cmake, make/ninja, a C and a C++ compiler - or a GgufToolError saying how to get them."""
    found = {}
    cmake = shutil.which("cmake")
    if not cmake:
        raise GgufToolError("cmake is not installed (needed to build llama.cpp)",
                            "`pip install cmake` or `apt-get install cmake`")
    out = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout.split()
    ver = out[2] if len(out) > 2 else "0"
    if tuple(int(p) for p in ver.split(".")[:2] if p.isdigit()) < (3, 18):
        raise GgufToolError(f"cmake {ver} is too old (need 3.18+)", "`pip install -U cmake`")
    found["cmake"] = f"{cmake} {ver}"
    make = _which_any(["make", "ninja"])
    if not make:
        raise GgufToolError("neither make nor ninja is installed", "`apt-get install make` (or `pip install ninja`)")
    found["make"] = make
    cc = os.environ.get("CC") or _which_any(["cc", "gcc", "clang"])
    cxx = os.environ.get("CXX") or _which_any(["c++", "g++", "clang++"])
    if not cc:
        raise GgufToolError("no C compiler found (cc/gcc/clang)", "`apt-get install build-essential` (gcc, g++, make)")
    if not cxx:
        raise GgufToolError("no C++ compiler found (c++/g++/clang++)", "`apt-get install g++` (or build-essential)")
    for k, exe in (("cc", cc), ("cxx", cxx)):
        r = subprocess.run([exe, "--version"], capture_output=True, text=True)
        if r.returncode != 0:
            raise GgufToolError(f"the compiler {exe} does not run", "install build-essential, or set CC/CXX")
        found[k] = f"{exe}: {r.stdout.splitlines()[0] if r.stdout else '?'}"
    return found


def build_dir(root: Path | None = None, native: bool = True) -> Path:
    root = root or source.cache_root()
    flavour = platform.machine().lower() + ("" if native else "-portable")
    return root / "build" / f"llama.cpp-{source.PINNED.version}-{flavour}"


def compute_key(native: bool, tools: dict[str, str], kernel_dir: Path) -> tuple[str, dict]:
    parts = {
        "inputs": integrate.inputs_digest(kernel_dir),
        "build.py": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        "options": cmake_options(native),
        "targets": list(TARGETS),
        "compilers": [tools.get("cc"), tools.get("cxx")],
    }
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    return key, parts


def read_stamp(bdir: Path) -> dict | None:
    p = bdir / STAMP
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def _run_logged(cmd: list[str], logf, log, what: str, cwd: Path | None = None) -> None:
    logf.write(f"\n$ {' '.join(cmd)}\n")
    logf.flush()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd)
    tail: list[str] = []
    last_pct = ""
    for line in p.stdout:
        logf.write(line)
        logf.flush()   # the log is what a user reads while a long build runs
        tail = (tail + [line.rstrip()])[-40:]
        if line.startswith("[") and "%]" in line[:8]:
            pct = line[:6]
            if pct != last_pct and pct.strip("[ %]").isdigit() and int(pct.strip("[ %]")) % 10 == 0:
                log(f"  {line.rstrip()[:100]}")
                last_pct = pct
    rc = p.wait()
    logf.flush()
    if rc != 0:
        errs = [l for l in tail if "error" in l.lower()] or tail[-15:]
        raise GgufToolError(f"{what} failed (exit {rc}):\n  " + "\n  ".join(errs[-15:]),
                            f"full log: {logf.name}")


def build(jobs: int = 2, native: bool = True, force: bool = False, root: Path | None = None,
          kernel_dir: Path = integrate.KERNEL_DIR, log=print) -> BuildResult:
    """Fetch, integrate and build; return where the tools are. Cheap when nothing changed."""
    t0 = time.monotonic()
    root = root or source.cache_root()
    tools = check_prerequisites()
    bdir = build_dir(root, native)
    key, parts = compute_key(native, tools, kernel_dir)
    stamp = read_stamp(bdir)
    bins = bdir / "bin"
    if (not force and stamp and stamp.get("key") == key
            and not missing_targets(bins)):
        return BuildResult(bdir, bins, key, True, time.monotonic() - t0, stamp)

    tree = source.unpack(root, log=log)
    manifest = integrate.integrate(tree, kernel_dir, log=log)
    bdir.mkdir(parents=True, exist_ok=True)
    (bdir / STAMP).unlink(missing_ok=True)   # a failed build must not look finished
    cmake = shutil.which("cmake")
    with open(bdir / LOG, "a") as logf:
        logf.write(f"\n===== gguftool native build {time.strftime('%Y-%m-%d %H:%M:%S')} key {key[:16]}\n")
        log(f"configuring llama.cpp {source.PINNED.llama_commit[:7]} in {bdir} ...")
        _run_logged([cmake, "-S", str(tree), "-B", str(bdir), *cmake_options(native)], logf, log, "cmake configure")
        log(f"building {', '.join(TARGETS)} with -j{jobs} (log: {bdir / LOG}) ...")
        _run_logged([cmake, "--build", str(bdir), "--config", "Release", "-j", str(jobs), "--target", *TARGETS],
                    logf, log, "cmake build")
    missing = missing_targets(bins)
    if missing:
        raise GgufToolError(f"build finished but {missing} are missing from {bins}", f"see {bdir / LOG}")
    info = {
        "key": key,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(time.monotonic() - t0, 1),
        "sdist": f"{source.PINNED.package}=={source.PINNED.version}",
        "sdist_sha256": source.PINNED.sha256,
        "llama_commit": source.PINNED.llama_commit,
        "llama_build_number": "unknown (shallow vendored clone; built with LLAMA_BUILD_NUMBER=0)",
        "ggml_version": source.PINNED.ggml_version,
        "options": cmake_options(native),
        "targets": list(TARGETS),
        "tree": str(tree),
        "toolchain": tools,
        "kernels": manifest["kernels"],
        "edited": manifest["edited"],
        "jobs": jobs,
    }
    (bdir / STAMP).write_text(json.dumps(info, indent=1) + "\n")
    return BuildResult(bdir, bins, key, False, time.monotonic() - t0, info)
