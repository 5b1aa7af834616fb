"""Find the built llama.cpp tools without building anything."""
from __future__ import annotations

from pathlib import Path

from ..errors import GgufToolError
from . import build as _build
from . import integrate, source


def find_build(native: bool = True, root: Path | None = None, require_current: bool = False) -> _build.BuildResult:
    """The finished build in the cache, or GgufToolError saying how to make one.

    require_current: also refuse a build whose key no longer matches the sources (e.g. the
    kernels changed since it was built)."""
    bdir = _build.build_dir(root or source.cache_root(), native)
    stamp = _build.read_stamp(bdir)
    bins = bdir / "bin"
    if not stamp or _build.missing_targets(bins):
        raise GgufToolError(f"no native llama.cpp build in {bdir}",
                            "run `gguftool native build` (or scripts/build_native.sh), ~4 min on 2 cores")
    if require_current:
        key, _ = _build.compute_key(native, _build.check_prerequisites(), integrate.KERNEL_DIR)
        if key != stamp.get("key"):
            raise GgufToolError(f"the native build in {bdir} is out of date (sources changed since)",
                                "rerun `gguftool native build` (incremental)")
    return _build.BuildResult(bdir, bins, stamp.get("key", ""), True, 0.0, stamp)


def tool(name: str, native: bool = True, root: Path | None = None) -> Path:
    """Path of one built tool, e.g. tool('llama-perplexity')."""
    if name not in _build.TARGETS:
        raise GgufToolError(f"{name} is not one of the built tools", f"choose from {', '.join(_build.TARGETS)}")
    return find_build(native, root).tool(name)
