"""TQ3_1 and TQ3_2: 3-bit Lloyd-Max levels, no rotation of their own.

For KV caches: llama.cpp already rotates Q, K and V head-wide (a Walsh-Hadamard matrix in the graph)
whenever the cache type is quantized, so the values a cache row holds are near-Gaussian and TQ3_0's
second, per-block rotation buys nothing but a transform on every read. TQ3_1 keeps TQ3_0's codebook
and scale rule on the values as they come, 32 at a time:

    for c in 0.7, 0.8 .. 1.3: idx = nearest level of x / (c d0), d0 = rms(x) / UNIT, then 2 Lloyd
          passes against the fp16 least-squares scale <x, L[idx]> / <L[idx], L[idx]>;
          keep the idx of the smallest least-squares error
    d = ||x|| / ||L[idx]||   (norm-preserving, stored as fp16)
    x_hat = d * L[idx],  L = (-127, -81, -46, -15, 15, 46, 81, 127)

TQ3_2 runs the same rule over 64 values under one scale (3.25 bits instead of 3.5): after the head-wide
rotation a head's coordinates are near-iid, so the second scale bought little.

L is TQ3_0's Lloyd-Max codebook times 127 / 2.0719, rounded: the decoder looks levels up in a table
and the dot with a Q8_0 row is an integer dot (one multiply per 32 values). The C kernels
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
TYPE2 = BY_NAME["TQ3_2"]
QK = 32                        # values per code group: a TQ3_1 block, half a TQ3_2 block
BLOCK_BYTES = TYPE.type_size   # 14
GROUP_BYTES = 12               # the codes of one group
REFINE_PASSES = _tq3_1.REFINE_PASSES
SEARCH = _tq3_1.SEARCH          # starting scales 0.7, 0.8 .. 1.3 times d0
UNIT = _tq3_1.UNIT            # levels per standard deviation: 127 / 2.0719...
LEVELS = np.array(_tq3_1.LEVELS, dtype=np.int8)
FP16_MAX = np.float32(65504.0)
FP16_OVERFLOW = np.float32(65520.0)   # the smallest float32 that rounds to fp16 infinity

_L64 = LEVELS.astype(np.float64)
_L32 = LEVELS.astype(np.float32)
_MID = 0.5 * (_L64[1:] + _L64[:-1])
_PER = {"TQ3_1": 1, "TQ3_2": 2}   # code groups per block


def _shape(name: str) -> tuple[int, int, int]:
    """(groups per block, values per block, bytes per block) of TQ3_1 or TQ3_2."""
    per = _PER[name]
    return per, QK * per, 2 + GROUP_BYTES * per


class _Ext:
    """_tq3_1's row functions bound to one type, in the shape gguftool.quant.rows expects."""

    def __init__(self, name: str):
        self.per = _PER[name]
        self.OK, self.ERR_NONFINITE, self.ERR_RANGE = _tq3_1.OK, _tq3_1.ERR_NONFINITE, _tq3_1.ERR_RANGE

    def quantize_rows(self, src, dst):
        return _tq3_1.quantize_rows(src, dst, self.per)

    def dequantize_rows(self, src, dst):
        return _tq3_1.dequantize_rows(src, dst, self.per)

    def vec_dot_rows(self, x, y, out):
        return _tq3_1.vec_dot_rows(x, y, out, self.per)


_EXT = {name: _Ext(name) for name in _PER}


# ---------------------------------------------------------------- C path
def quantize(x: np.ndarray, name: str = "TQ3_1", *, threads: int = 1) -> np.ndarray:
    """float rows [rows, n] (n % block == 0) -> uint8 blocks, C kernels, GIL released."""
    _, qk, nbytes = _shape(name)
    return c_quantize(_EXT[name], x, name, qk, nbytes, threads)


def dequantize(data: np.ndarray, name: str = "TQ3_1") -> np.ndarray:
    _, qk, nbytes = _shape(name)
    return c_dequantize(_EXT[name], data, name, qk, nbytes)


def vec_dot_q8_0(x: np.ndarray, y: np.ndarray, name: str = "TQ3_1") -> np.ndarray:
    """Row-wise gqt_vec_dot_<name>_q8_0: x rows of `name`, y ggml Q8_0 rows of the same length -> float32 [rows]."""
    _, qk, nbytes = _shape(name)
    return c_vec_dot_q8_0(_EXT[name], x, y, name, qk, nbytes)


def mad(x: np.ndarray, acc: np.ndarray, s: np.ndarray, name: str = "TQ3_1") -> np.ndarray:
    """acc + s[r] * row r of x, by gqt_mad_<name> (flash attention's fused V accumulation); returns a new array."""
    per, _, nbytes = _shape(name)
    x = block_rows(x, name, nbytes)
    out = np.array(acc, dtype=np.float32, order="C", copy=True).reshape(len(x), -1)
    _tq3_1.mad_rows(np.ascontiguousarray(x), out, np.ascontiguousarray(s, dtype=np.float32).reshape(-1), per)
    return out


def quantize_tq3_1(x: np.ndarray, *, threads: int = 1) -> np.ndarray:
    return quantize(x, "TQ3_1", threads=threads)


def dequantize_tq3_1(data: np.ndarray) -> np.ndarray:
    return dequantize(data, "TQ3_1")


def vec_dot_tq3_1_q8_0(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return vec_dot_q8_0(x, y, "TQ3_1")


def mad_tq3_1(x: np.ndarray, acc: np.ndarray, s: np.ndarray) -> np.ndarray:
    return mad(x, acc, s, "TQ3_1")


# ---------------------------------------------------------------- numpy twins
def _pick(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    q = np.zeros(x.shape, dtype=np.uint8)
    for k in range(7):
        q += x >= (_MID[k] * d)[:, None]
    return q


def _moments(x: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    num = np.zeros(len(x))
    den = np.zeros(len(x))
    for j in range(x.shape[1]):          # sequential, like the C loop
        lv = _L64[idx[:, j]]
        num = num + x[:, j] * lv
        den = den + lv * lv
    return num, den


def _to_fp16(d: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        s = d.astype(np.float32)
    return np.minimum(s, FP16_MAX).astype(np.float16).view(np.uint16)


def quantize_ref(x: np.ndarray, name: str = "TQ3_1", *, saturate: bool = False) -> np.ndarray:
    """numpy twin of quantize: identical bytes, and the same refusal of a block whose scale is
    beyond fp16; saturate=True twins ggml's entry points instead (gqt_quantize_<name>, which keeps the
    largest fp16 scale for such a block: a KV-cache row cannot fail)."""
    per, qk, nbytes = _shape(name)
    x = float_rows(x, name, qk)
    if not np.isfinite(x).all():
        raise nonfinite_error(x, name)
    rows = x.shape[0]
    b = x.reshape(-1, qk).astype(np.float64)
    n2 = np.zeros(len(b))
    for j in range(qk):
        n2 = n2 + b[:, j] * b[:, j]
    nz = n2 != 0
    with np.errstate(divide="ignore", invalid="ignore"):   # zero blocks (n2 == 0) are dropped below
        d0 = np.sqrt(n2 / qk) / UNIT
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
        raise range_error(name, x, int(np.flatnonzero(beyond)[0]), qk)
    d = _to_fp16(sd)
    keep = nz & ((d & 0x7FFF) != 0)
    out = np.zeros((len(b), nbytes), dtype=np.uint8)
    out[:, 0:2] = d.astype("<u2").view(np.uint8).reshape(-1, 2)
    for g in range(per):
        gi = idx[:, QK * g:QK * (g + 1)]
        o = 2 + GROUP_BYTES * g
        h = ((gi >> 2).astype(np.uint32) << np.arange(QK, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
        out[:, o:o + 4] = h.astype("<u4").view(np.uint8).reshape(-1, 4)
        lo = (gi & 3).astype(np.uint8)
        out[:, o + 4:o + 12] = lo[:, 0:8] | lo[:, 8:16] << 2 | lo[:, 16:24] << 4 | lo[:, 24:32] << 6
    out[~keep] = 0
    return out.reshape(rows, -1)


def _unpack(blocks: np.ndarray, per: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """[nb, block bytes] -> (fp16 scale as float32 [nb], indices uint8 [nb, 32 * per])."""
    d = blocks[:, 0:2].copy().view("<f2").reshape(-1).astype(np.float32)
    groups = []
    for g in range(per):
        o = 2 + GROUP_BYTES * g
        h = blocks[:, o:o + 4].copy().view("<u4").reshape(-1, 1)
        hi = ((h >> np.arange(QK, dtype=np.uint32)) & 1).astype(np.uint8)
        qs = blocks[:, o + 4:o + 12]
        groups.append(np.concatenate([(qs >> (2 * k)) & 3 for k in range(4)], axis=1) | hi << 2)
    return d, np.concatenate(groups, axis=1)


def dequantize_ref(data: np.ndarray, name: str = "TQ3_1") -> np.ndarray:
    """numpy twin of dequantize: identical float32 values."""
    per, _, nbytes = _shape(name)
    data = block_rows(data, name, nbytes)
    d, idx = _unpack(data.reshape(-1, nbytes), per)
    with np.errstate(invalid="ignore", over="ignore"):
        x = d[:, None] * _L32[idx]
    x[d == 0] = 0.0
    return x.reshape(data.shape[0], -1)


def vec_dot_q8_0_ref(x: np.ndarray, y: np.ndarray, name: str = "TQ3_1") -> np.ndarray:
    """numpy twin of gqt_vec_dot_<name>_q8_0, one dot per row: identical float32 results."""
    per, _, nbytes = _shape(name)
    x = block_rows(x, name, nbytes)
    nb = x.shape[1] // nbytes
    y = np.asarray(y).view(np.uint8).reshape(len(x), nb * per, 34)
    d, idx = _unpack(x.reshape(-1, nbytes), per)
    d, idx = d.reshape(len(x), nb), idx.reshape(len(x), nb * per, QK)
    sumf = np.zeros(len(x), dtype=np.float32)
    for g in range(nb * per):                 # groups in order, like the C loop
        dx = d[:, g // per]
        dy = y[:, g, 0:2].copy().view("<f2").reshape(-1).astype(np.float32)
        isum = (LEVELS[idx[:, g]].astype(np.int32) * y[:, g, 2:].view(np.int8).astype(np.int32)).sum(axis=1)
        sumf = np.where(dx == 0, sumf, sumf + (dx * dy) * isum.astype(np.float32))
    return sumf


def mad_ref(x: np.ndarray, acc: np.ndarray, s: np.ndarray, name: str = "TQ3_1") -> np.ndarray:
    """numpy twin of gqt_mad_<name>: acc + (s * d) * L[idx] in float32, in that order: identical values."""
    per, _, nbytes = _shape(name)
    x = block_rows(x, name, nbytes)
    d, idx = _unpack(x.reshape(-1, nbytes), per)
    m = (np.asarray(s, np.float32).reshape(-1, 1) * d.reshape(len(x), -1)).reshape(-1, 1)
    with np.errstate(invalid="ignore", over="ignore"):
        v = (m * _L32[idx]).reshape(len(x), -1)
    return np.asarray(acc, np.float32).reshape(len(x), -1) + v


def quantize_tq3_1_ref(x: np.ndarray, *, saturate: bool = False) -> np.ndarray:
    return quantize_ref(x, "TQ3_1", saturate=saturate)


def dequantize_tq3_1_ref(data: np.ndarray) -> np.ndarray:
    return dequantize_ref(data, "TQ3_1")


def vec_dot_tq3_1_q8_0_ref(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return vec_dot_q8_0_ref(x, y, "TQ3_1")


def mad_tq3_1_ref(x: np.ndarray, acc: np.ndarray, s: np.ndarray) -> np.ndarray:
    return mad_ref(x, acc, s, "TQ3_1")


def _codec(name: str):
    def quantize_codec(x: np.ndarray, *, threads: int = 1, **params) -> np.ndarray:
        if params:
            raise GgufToolError(f"{name} takes no parameters (got {sorted(params)})")
        return quantize(x, name, threads=threads)
    return register(BY_NAME[name], quantize_codec, lambda data: dequantize(data, name))


CODEC = _codec("TQ3_1")
CODEC2 = _codec("TQ3_2")
