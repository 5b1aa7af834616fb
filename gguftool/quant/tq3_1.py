"""TQ3_1: 3-bit Lloyd-Max levels per 32-value block, no rotation of its own.

For KV caches: llama.cpp already rotates Q, K and V head-wide (a Walsh-Hadamard matrix in the graph)
whenever the cache type is quantized, so the values a cache row holds are near-Gaussian and TQ3_0's
second, per-block rotation buys nothing but a transform on every read. TQ3_1 keeps TQ3_0's codebook
and scale rule on the values as they come:

    for c in 0.7, 0.8 .. 1.3: idx = nearest level of x / (c d0), d0 = rms(x) / UNIT, then 2 Lloyd
          passes against the fp16 least-squares scale <x, L[idx]> / <L[idx], L[idx]>;
          keep the idx of the smallest least-squares error
    d = ||x|| / ||L[idx]||   (norm-preserving, stored as fp16)
    x_hat = d * L[idx],  L = (-127, -81, -46, -15, 15, 46, 81, 127)

L is TQ3_0's Lloyd-Max codebook times 127 / 2.0719, rounded: the decoder looks levels up in a table
and the dot with a Q8_0 row is an integer dot (one multiply per block). The C kernels
(gguftool/_fast/gqt_tq3_1.c) do the work; the `_ref` functions are numpy twins with identical bytes.
"""
from __future__ import annotations

import numpy as np

from .._fast import _tq3_1
from ..errors import GgufToolError
from ..types import BY_NAME
from . import register
from .rows import block_rows, c_dequantize, c_quantize, c_vec_dot_q8_0, float_rows, nonfinite_error, range_error

TYPE = BY_NAME["TQ3_1"]
QK = TYPE.block_size          # 32
BLOCK_BYTES = TYPE.type_size  # 14
REFINE_PASSES = _tq3_1.REFINE_PASSES
SEARCH = _tq3_1.SEARCH          # starting scales 0.7, 0.8 .. 1.3 times d0
UNIT = _tq3_1.UNIT            # levels per standard deviation: 127 / 2.0719...
LEVELS = np.array(_tq3_1.LEVELS, dtype=np.int8)
FP16_MAX = np.float32(65504.0)
FP16_OVERFLOW = np.float32(65520.0)   # the smallest float32 that rounds to fp16 infinity

_L64 = LEVELS.astype(np.float64)
_L32 = LEVELS.astype(np.float32)
_MID = 0.5 * (_L64[1:] + _L64[:-1])


def _rows_f32(x: np.ndarray) -> np.ndarray:
    return float_rows(x, "TQ3_1", QK)


def _nonfinite_error(x: np.ndarray) -> GgufToolError:
    return nonfinite_error(x, "TQ3_1")


def _blocks_u8(data: np.ndarray) -> np.ndarray:
    return block_rows(data, "TQ3_1", BLOCK_BYTES)


# ---------------------------------------------------------------- C path
def quantize_tq3_1(x: np.ndarray, *, threads: int = 1) -> np.ndarray:
    """float rows [rows, n] (n % 32 == 0) -> uint8 [rows, n / 32 * 14], C kernels, GIL released."""
    return c_quantize(_tq3_1, x, "TQ3_1", QK, BLOCK_BYTES, threads)


def dequantize_tq3_1(data: np.ndarray) -> np.ndarray:
    return c_dequantize(_tq3_1, data, "TQ3_1", QK, BLOCK_BYTES)


def vec_dot_tq3_1_q8_0(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Row-wise gqt_vec_dot_tq3_1_q8_0: x TQ3_1 rows, y ggml Q8_0 rows of the same length -> float32 [rows]."""
    return c_vec_dot_q8_0(_tq3_1, x, y, "TQ3_1", BLOCK_BYTES)


def mad_tq3_1(x: np.ndarray, acc: np.ndarray, s: np.ndarray) -> np.ndarray:
    """acc + s[r] * row r of x, by gqt_mad_tq3_1 (flash attention's fused V accumulation); returns a new array."""
    x = _blocks_u8(x)
    out = np.array(acc, dtype=np.float32, order="C", copy=True).reshape(len(x), -1)
    _tq3_1.mad_rows(np.ascontiguousarray(x), out, np.ascontiguousarray(s, dtype=np.float32).reshape(-1))
    return out


# ---------------------------------------------------------------- numpy twins
def _pick(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    q = np.zeros(x.shape, dtype=np.uint8)
    for k in range(7):
        q += x >= (_MID[k] * d)[:, None]
    return q


def _moments(x: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    num = np.zeros(len(x))
    den = np.zeros(len(x))
    for j in range(QK):          # sequential, like the C loop
        lv = _L64[idx[:, j]]
        num = num + x[:, j] * lv
        den = den + lv * lv
    return num, den


def _to_fp16(d: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        s = d.astype(np.float32)
    return np.minimum(s, FP16_MAX).astype(np.float16).view(np.uint16)


def quantize_tq3_1_ref(x: np.ndarray, *, saturate: bool = False) -> np.ndarray:
    """numpy twin of quantize_tq3_1: identical bytes, and the same refusal of a block whose scale is
    beyond fp16; saturate=True twins ggml's entry points instead (gqt_quantize_tq3_1, which keeps the
    largest fp16 scale for such a block: a KV-cache row cannot fail)."""
    x = _rows_f32(x)
    if not np.isfinite(x).all():
        raise _nonfinite_error(x)
    rows = x.shape[0]
    b = x.reshape(-1, QK).astype(np.float64)
    n2 = np.zeros(len(b))
    for j in range(QK):
        n2 = n2 + b[:, j] * b[:, j]
    nz = n2 != 0
    with np.errstate(divide="ignore", invalid="ignore"):   # zero blocks (n2 == 0) are dropped below
        d0 = np.sqrt(n2 / QK) / UNIT
        for c in range(SEARCH):
            cand = _pick(b, d0 * (0.7 + 0.1 * c))
            num, den = _moments(b, cand)
            d = _to_fp16(num / den)
            for _ in range(REFINE_PASSES):
                s = d.view(np.float16).astype(np.float64)
                active = s > 0
                cand = np.where(active[:, None], _pick(b, s), cand)
                num, den = _moments(b, cand)
                d = np.where(active, _to_fp16(num / den), d)
            num, den = _moments(b, cand)
            err = n2 - num * num / den
            if c == 0:
                idx, best = cand, err
            else:
                better = err < best
                idx, best = np.where(better[:, None], cand, idx), np.where(better, err, best)
        num, den = _moments(b, idx)
        sd = np.sqrt(n2 / den)
        beyond = nz & ~(sd.astype(np.float32) < FP16_OVERFLOW)
    if beyond.any() and not saturate:   # the C kernel's checked entry point refuses these blocks too
        raise range_error("TQ3_1", x, int(np.flatnonzero(beyond)[0]), QK)
    d = _to_fp16(sd)
    keep = nz & ((d & 0x7FFF) != 0)
    out = np.zeros((len(b), BLOCK_BYTES), dtype=np.uint8)
    out[:, 0:2] = d.astype("<u2").view(np.uint8).reshape(-1, 2)
    h = ((idx >> 2).astype(np.uint32) << np.arange(QK, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
    out[:, 2:6] = h.astype("<u4").view(np.uint8).reshape(-1, 4)
    lo = (idx & 3).astype(np.uint8)
    out[:, 6:14] = lo[:, 0:8] | lo[:, 8:16] << 2 | lo[:, 16:24] << 4 | lo[:, 24:32] << 6
    out[~keep] = 0
    return out.reshape(rows, -1)


def _unpack(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[nb, 14] -> (fp16 scale as float32 [nb], indices uint8 [nb, 32])."""
    d = blocks[:, 0:2].copy().view("<f2").reshape(-1).astype(np.float32)
    h = blocks[:, 2:6].copy().view("<u4").reshape(-1, 1)
    hi = ((h >> np.arange(QK, dtype=np.uint32)) & 1).astype(np.uint8)
    qs = blocks[:, 6:14]
    lo = np.concatenate([(qs >> (2 * g)) & 3 for g in range(4)], axis=1)
    return d, lo | hi << 2


def dequantize_tq3_1_ref(data: np.ndarray) -> np.ndarray:
    """numpy twin of dequantize_tq3_1: identical float32 values."""
    data = _blocks_u8(data)
    d, idx = _unpack(data.reshape(-1, BLOCK_BYTES))
    with np.errstate(invalid="ignore", over="ignore"):
        x = d[:, None] * _L32[idx]
    x[d == 0] = 0.0
    return x.reshape(data.shape[0], -1)


def vec_dot_tq3_1_q8_0_ref(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """numpy twin of gqt_vec_dot_tq3_1_q8_0, one dot per row: identical float32 results."""
    x = _blocks_u8(x)
    nb = x.shape[1] // BLOCK_BYTES
    y = np.asarray(y).view(np.uint8).reshape(len(x), nb, 34)
    xb = x.reshape(len(x), nb, BLOCK_BYTES)
    sumf = np.zeros(len(x), dtype=np.float32)
    for b in range(nb):                       # blocks in order, like the C loop
        dx, idx = _unpack(np.ascontiguousarray(xb[:, b]))
        dy = y[:, b, 0:2].copy().view("<f2").reshape(-1).astype(np.float32)
        isum = (LEVELS[idx].astype(np.int32) * y[:, b, 2:].view(np.int8).astype(np.int32)).sum(axis=1)
        sumf = np.where(dx == 0, sumf, sumf + (dx * dy) * isum.astype(np.float32))
    return sumf


def mad_tq3_1_ref(x: np.ndarray, acc: np.ndarray, s: np.ndarray) -> np.ndarray:
    """numpy twin of gqt_mad_tq3_1: acc + (s * d) * L[idx] in float32, in that order: identical values."""
    x = _blocks_u8(x)
    d, idx = _unpack(x.reshape(-1, BLOCK_BYTES))
    m = (np.asarray(s, np.float32).reshape(-1, 1) * d.reshape(len(x), -1)).reshape(-1, 1)
    with np.errstate(invalid="ignore", over="ignore"):
        v = (m * _L32[idx]).reshape(len(x), -1)
    return np.asarray(acc, np.float32).reshape(len(x), -1) + v


def _quantize_codec(x: np.ndarray, *, threads: int = 1, **params) -> np.ndarray:
    if params:
        raise GgufToolError(f"TQ3_1 takes no parameters (got {sorted(params)})")
    return quantize_tq3_1(x, threads=threads)


CODEC = register(TYPE, _quantize_codec, dequantize_tq3_1)
