"""The pinned llama.cpp source: fetched from PyPI, verified, unpacked into the cache.

llama.cpp comes from the `llama-cpp-python` source distribution, which vendors it under
`vendor/llama.cpp`. Version and sha256 are pinned here; a download that does not match is
refused. The archive's git metadata does not survive unpacking (the vendored tree is a
shallow submodule), so the upstream commit is recorded here and passed to CMake.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..errors import GgufToolError
from ..types import UPSTREAM_TYPE_COUNT


@dataclass(frozen=True)
class PinnedSource:
    package: str
    version: str
    filename: str
    url: str
    sha256: str
    vendor_prefix: str        # path of llama.cpp inside the archive
    llama_commit: str         # vendored llama.cpp commit (from the sdist's git metadata)
    llama_commit_date: str
    ggml_version: str
    ggml_type_count: int      # upstream GGML_TYPE_COUNT in this version


PINNED = PinnedSource(
    package="llama-cpp-python",
    version="0.3.36",
    filename="llama_cpp_python-0.3.36.tar.gz",
    url=("https://files.pythonhosted.org/packages/ec/e9/"
         "e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-0.3.36.tar.gz"),
    sha256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
    vendor_prefix="llama_cpp_python-0.3.36/vendor/llama.cpp/",
    llama_commit="0c1e57098bba43ac29e6e3b677cdceebdd22334f",
    llama_commit_date="2026-10-01",
    ggml_version="0.25.3",
    ggml_type_count=UPSTREAM_TYPE_COUNT,
)


def cache_root() -> Path:
    """Where sources, patched trees and builds live (GGUFTOOL_NATIVE_DIR overrides)."""
    env = os.environ.get("GGUFTOOL_NATIVE_DIR")
    if env:
        return Path(env).expanduser().resolve()
    return Path("~/.cache/gguftool/native").expanduser()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sdist_path(root: Path | None = None, pin: PinnedSource = PINNED) -> Path:
    return (root or cache_root()) / "downloads" / pin.filename


def fetch_sdist(root: Path | None = None, pin: PinnedSource = PINNED, log=print) -> Path:
    """Return the verified sdist, downloading it once.

    GGUFTOOL_NATIVE_SDIST may name a local copy of the archive (offline machines); it is
    verified against the pinned sha256 like a download."""
    dest = sdist_path(root, pin)
    local = os.environ.get("GGUFTOOL_NATIVE_SDIST")
    if dest.is_file() and sha256_file(dest) == pin.sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    if local:
        src = Path(local).expanduser()
        if not src.is_file():
            raise GgufToolError(f"GGUFTOOL_NATIVE_SDIST points to {src}, which is not a file",
                                f"download {pin.url} there, or unset the variable")
        shutil.copyfile(src, tmp)
    else:
        log(f"downloading {pin.package}=={pin.version} sdist from PyPI ...")
        try:
            with urllib.request.urlopen(pin.url, timeout=120) as r, open(tmp, "wb") as f:
                shutil.copyfileobj(r, f, 1 << 20)
        except (urllib.error.URLError, OSError) as e:
            tmp.unlink(missing_ok=True)
            raise GgufToolError(
                f"cannot download the llama.cpp source ({pin.package}=={pin.version}) from PyPI: {e}",
                f"check network access to files.pythonhosted.org, or fetch {pin.filename} elsewhere "
                f"(`pip download --no-deps --no-binary :all: --no-build-isolation {pin.package}=={pin.version}`) "
                f"and set GGUFTOOL_NATIVE_SDIST=/path/to/{pin.filename}") from None
    got = sha256_file(tmp)
    if got != pin.sha256:
        tmp.unlink(missing_ok=True)
        raise GgufToolError(f"{pin.filename} has sha256 {got}, expected the pinned {pin.sha256}",
                            "the file is corrupt or not the pinned release; delete it and retry")
    os.replace(tmp, dest)
    return dest


def _vendor_members(tar: tarfile.TarFile, pin: PinnedSource):
    for m in tar:
        if m.name.startswith(pin.vendor_prefix) and m.name != pin.vendor_prefix:
            rel = m.name[len(pin.vendor_prefix):]
            # the gitlink points into the sdist's .git, which we do not unpack
            if rel == ".git":
                continue
            yield m, rel


def unpack(root: Path | None = None, pin: PinnedSource = PINNED, log=print) -> Path:
    """Unpack vendor/llama.cpp into <root>/src/llama.cpp-<version>/ once; return that path.

    The tree is patched in place by the integration step, which restores edited files from
    the archive (read_pristine) before it edits, so the tree never needs re-unpacking."""
    root = root or cache_root()
    tree = root / "src" / f"llama.cpp-{pin.version}"
    marker = tree / ".gguftool-unpacked"
    if marker.is_file() and marker.read_text().strip() == pin.sha256:
        return tree
    archive = fetch_sdist(root, pin, log)
    log(f"unpacking llama.cpp {pin.llama_commit[:7]} into {tree} ...")
    if tree.exists():
        shutil.rmtree(tree)
    tmp = tree.with_name(tree.name + ".part")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    with tarfile.open(archive, "r:gz") as tar:
        for m, rel in _vendor_members(tar, pin):
            if m.issym() or m.islnk():
                continue  # none in the pinned tree that the CPU build needs
            m = m.replace(name=rel)
            tar.extract(m, tmp, filter="data")
    (tmp / ".gguftool-unpacked").write_text(pin.sha256 + "\n")
    os.replace(tmp, tree)
    return tree


def read_pristine(relpaths: list[str], root: Path | None = None, pin: PinnedSource = PINNED) -> dict[str, str]:
    """The unmodified text of some llama.cpp files, read from the verified archive."""
    archive = fetch_sdist(root, pin)
    wanted = set(relpaths)
    out: dict[str, str] = {}
    with tarfile.open(archive, "r:gz") as tar:
        for m, rel in _vendor_members(tar, pin):
            if rel in wanted:
                out[rel] = tar.extractfile(m).read().decode("utf-8")
                if len(out) == len(wanted):
                    break
    missing = wanted - set(out)
    if missing:
        raise GgufToolError(f"{pin.filename} lacks {sorted(missing)}",
                            "the pinned source changed layout; the integration needs updating")
    return out
