"""Byte sizes as users type them (--memory, --target-size)."""
from __future__ import annotations

import math

from ..errors import GgufToolError

UNITS = {"": 1, "B": 1, "K": 1e3, "KB": 1e3, "KIB": 2**10, "M": 1e6, "MB": 1e6, "MIB": 2**20,
         "G": 1e9, "GB": 1e9, "GIB": 2**30, "T": 1e12, "TB": 1e12, "TIB": 2**40}


def parse_size(text: str) -> int:
    s = text.strip().upper().replace(" ", "")
    num = s.rstrip("KMGTIB")
    try:
        v = float(num) * UNITS[s[len(num):]]
        if not math.isfinite(v) or v < 0:   # 'nan', 'inf', '1e999G', '-1G'
            raise ValueError
        return int(v)
    except (ValueError, KeyError):
        raise GgufToolError(f"cannot read size {text!r}", hint="e.g. 2GiB, 1.5GB, 512MiB") from None
