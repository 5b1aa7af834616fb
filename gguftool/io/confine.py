"""Paths named by a file or a server (a checkpoint's index, modules.json, a revision, a commit id) stay
inside the folder they are relative to, or are refused: a downloaded model must not make us read or
write elsewhere."""
from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from ..errors import GgufToolError

COMMIT = re.compile(r"[0-9a-f]{40}")


def inside(base: Path, rel: object, what: str) -> Path:
    """base / rel, where rel is a relative path that stays under base by its name. Symlinks are not
    followed for the check: the Hub cache's snapshot files are links into its blobs/ folder."""
    if not isinstance(rel, str) or not rel or "\0" in rel or "\\" in rel or PurePosixPath(rel).is_absolute():
        raise GgufToolError(f"{what}: {rel!r} is not a relative path inside {base}")
    if os.path.normpath(rel).split(os.sep)[0] == "..":
        raise GgufToolError(f"{what}: {rel!r} points outside {base}")
    return base / rel


def revision(rev: str) -> str:
    """A branch, tag or commit name that is safe as a path under the hub cache's refs/ folder."""
    parts = rev.split("/")
    if not rev or "\0" in rev or "\\" in rev or rev.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise GgufToolError(f"revision {rev!r} is not a branch, tag or commit name")
    return rev


def commit(sha: object, where: str) -> str:
    """A commit id as the Hub gives it (40 hex digits), before it becomes a folder name."""
    if not isinstance(sha, str) or not COMMIT.fullmatch(sha):
        raise GgufToolError(f"{where}: {sha!r} is not a commit id (40 hex digits)")
    return sha
