"""tqdm on a terminal, silence otherwise (pipes, CI, tests)."""
from __future__ import annotations

import os
import sys

from tqdm import tqdm


def bar(total: int, desc: str, unit: str = "B") -> tqdm:
    quiet = not sys.stderr.isatty() or os.environ.get("GGUFTOOL_NO_PROGRESS")
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, unit_divisor=1024 if unit == "B" else 1000,
                disable=bool(quiet), leave=False, dynamic_ncols=True)
