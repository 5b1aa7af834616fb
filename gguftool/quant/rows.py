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


class BlockRangeError(GgufToolError):
    """A block whose values the type's fp16 scale (or offset) cannot encode: refused, never written
    saturated or as zeros. `row` counts from the first row given to the codec; the pipeline, which
    knows where that row sits in the tensor, shifts it with at()."""

    def __init__(self, name: str, row: int, col: int, block: int, lo: float, hi: float, scale: str = "fp16 scale"):
        self.name, self.row, self.col, self.block, self.lo, self.hi, self.scale = name, row, col, block, lo, hi, scale
        super().__init__(f"cannot quantize to {name}: row {row}, columns {col}..{col + block - 1} hold values "
                         f"{lo:.6g}..{hi:.6g}, beyond what its {scale} can encode",
                         hint="keep this tensor in BF16 or F32 (--tensor-type 'NAME=BF16'); the weights may be broken")

    def at(self, offset: int) -> BlockRangeError:
        return BlockRangeError(self.name, self.row + offset, self.col, self.block, self.lo, self.hi, self.scale)


def range_error(name: str, x: np.ndarray, flat_block: int, block: int, scale: str = "fp16 scale") -> BlockRangeError:
    """The error for block `flat_block` (counted over all rows) of the float rows x."""
    row, b = divmod(flat_block, x.shape[1] // block)
    v = x[row, b * block:(b + 1) * block]
    return BlockRangeError(name, row, b * block, block, float(v.min()), float(v.max()), scale)


def first_marked_block(out: np.ndarray, block_bytes: int) -> int:
    """The first block of uint8 rows `out` whose fp16 scale (bytes 0..1) is the C kernels' NaN marker
    of a refused block."""
    d = np.ascontiguousarray(out).reshape(-1, block_bytes)[:, :2].copy().view("<u2").reshape(-1)
    return int(np.flatnonzero((d & 0x7FFF) > 0x7C00)[0])


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


# The C extensions of the 14-byte-block families (_tq3, _tq3_1) share one API: quantize_rows,
# dequantize_rows, vec_dot_rows, OK, ERR_NONFINITE. These run any of them on checked rows.
Q8_0_BLOCK_BYTES = 34


def c_quantize(ext, x: np.ndarray, name: str, block: int, block_bytes: int, threads: int) -> np.ndarray:
    """float rows [rows, n] -> uint8 [rows, n / block * block_bytes] by `ext`, GIL released, row-parallel."""
    from .parallel import map_row_ranges
    x = float_rows(x, name, block)

    def chunk(r0: int, r1: int) -> np.ndarray:
        out = np.empty((r1 - r0, x.shape[1] // block * block_bytes), dtype=np.uint8)
        rc = ext.quantize_rows(x[r0:r1], out)
        if rc == ext.ERR_NONFINITE:
            raise nonfinite_error(x, name)
        if rc == ext.ERR_RANGE:
            raise range_error(name, x[r0:r1], first_marked_block(out, block_bytes), block).at(r0)
        if rc != ext.OK:
            raise GgufToolError(f"{name} quantization failed with code {rc}")
        return out

    return map_row_ranges(chunk, x.shape[0], threads)


def c_dequantize(ext, data: np.ndarray, name: str, block: int, block_bytes: int) -> np.ndarray:
    data = block_rows(data, name, block_bytes)
    out = np.empty((data.shape[0], data.shape[1] // block_bytes * block), dtype=np.float32)
    ext.dequantize_rows(data, out)
    return out


def c_vec_dot_q8_0(ext, x: np.ndarray, y: np.ndarray, name: str, block: int, block_bytes: int) -> np.ndarray:
    """Row-wise vec_dot of `name` rows x with ggml Q8_0 rows y of the same length -> float32 [rows]."""
    x = block_rows(x, name, block_bytes)
    y = np.ascontiguousarray(np.asarray(y).view(np.uint8)).reshape(len(x), -1)
    nb = x.shape[1] // block_bytes
    need = nb * block // 32 * Q8_0_BLOCK_BYTES
    if y.shape[1] != need:
        raise GgufToolError(f"vec_dot: {nb} {name} blocks per row need {need} bytes of Q8_0 "
                            f"per row, got {y.shape[1]}")
    out = np.empty(x.shape[0], dtype=np.float32)
    ext.vec_dot_rows(x, y, out)
    return out
