"""Input checks shared by the block codecs: float rows in, uint8 block rows back, errors that name the type."""
from __future__ import annotations

import numpy as np

from ..errors import GgufToolError


def float_rows(x: np.ndarray, name: str, block: int) -> np.ndarray:
    """A C-contiguous float32 matrix of rows whose length is a multiple of `block` (1-d: one row)."""
    x = np.asarray(x)
    if x.ndim == 1:
        x = x.reshape(1, -1)
    if x.ndim != 2:
        raise GgufToolError(f"{name} quantizes a matrix of rows, got a {x.ndim}-d input")
    if x.shape[1] % block:
        raise GgufToolError(f"{name} rows must hold a multiple of {block} values, got {x.shape[1]}",
                            hint="pad the row or pick a type whose block fits")
    if not np.issubdtype(x.dtype, np.floating):
        raise GgufToolError(f"{name} quantizes floating-point data, got {x.dtype}")
    return np.ascontiguousarray(x, dtype=np.float32)


def nonfinite_error(x: np.ndarray, name: str) -> GgufToolError:
    r, c = np.argwhere(~np.isfinite(x))[0]
    return GgufToolError(f"{name} input holds NaN or Inf (first at row {r}, column {c}: {x[r, c]})",
                         hint="check the source tensor; NaN/Inf cannot be quantized")


def block_rows(data: np.ndarray, name: str, block_bytes: int) -> np.ndarray:
    """A C-contiguous uint8 matrix of rows of whole blocks (1-d: one row)."""
    data = np.asarray(data)
    if data.dtype != np.uint8:
        data = data.view(np.uint8)
    if data.ndim == 1:
        data = data.reshape(1, -1)
    if data.ndim != 2 or data.shape[1] % block_bytes:
        raise GgufToolError(f"{name} data rows must be a multiple of {block_bytes} bytes, got shape {data.shape}")
    return np.ascontiguousarray(data)
