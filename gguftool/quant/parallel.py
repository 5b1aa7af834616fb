"""Row-parallel execution: the kernels release the GIL, so plain threads scale across cores."""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def map_row_ranges(fn: Callable[[int, int], np.ndarray], rows: int, threads: int) -> np.ndarray:
    """fn(r0, r1) over `threads` contiguous ranges of 0..rows, results concatenated in order."""
    threads = max(1, min(int(threads), rows))
    if threads == 1:
        return fn(0, rows)
    bounds = np.linspace(0, rows, threads + 1).astype(int)
    with ThreadPoolExecutor(threads) as pool:
        parts = list(pool.map(lambda i: fn(int(bounds[i]), int(bounds[i + 1])), range(threads)))
    return np.concatenate(parts, axis=0)


def map_rows(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray, threads: int) -> np.ndarray:
    """fn over contiguous row chunks of x, results concatenated in order."""
    return map_row_ranges(lambda r0, r1: fn(x[r0:r1]), x.shape[0], threads)
