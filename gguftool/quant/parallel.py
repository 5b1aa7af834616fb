"""Row-parallel execution: the kernels release the GIL, so plain threads scale across cores."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np


def map_rows(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray, threads: int) -> np.ndarray:
    """fn over contiguous row chunks of x, results concatenated in order."""
    rows = x.shape[0]
    threads = max(1, min(int(threads), rows))
    if threads == 1:
        return fn(x)
    bounds = np.linspace(0, rows, threads + 1).astype(int)
    with ThreadPoolExecutor(threads) as pool:
        parts = list(pool.map(lambda i: fn(x[bounds[i]:bounds[i + 1]]), range(threads)))
    return np.concatenate(parts, axis=0)
