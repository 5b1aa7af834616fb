"""TQ3_3: a trellis-coded 3-bit type for KV caches (docs/kv.md, layout in gguftool/_fast/gqt_tcq3.h).

Each value's level is one of 4 of 16 (its subset), the 4 set by its own branch bit and the 3 before it,
so a row's codes form a path through an 8-state trellis; the encoder finds the path of least squared
error by a Viterbi search at a few scales and stores the best with its least-squares fp16 scale:

    for c in 0.85, 0.95, ..: d = c rms(x) / UNIT; (b, idx) = Viterbi(x, d L)
    keep the codes of the least <x - d' l>^2 with d' = <x, l> / <l, l>; store fp16(d')
    x_hat_i = d' L[subset(b_i, b_i-1, b_i-2, b_i-3) + 4 idx_i]

At 3.25 bits per value the squared error of Gaussian rows is 0.021 of the variance where TQ3_2's scalar
Lloyd-Max code gives 0.029. The C kernels (gguftool/_fast/gqt_tcq3.c) do the work; the `_ref` functions
are numpy twins with identical bytes.
"""
from __future__ import annotations

import numpy as np

from .._fast import _tcq3
from ..errors import GgufToolError
from ..types import BY_NAME
from . import register
from .rows import block_rows, c_dequantize, c_quantize, c_vec_dot_q8_0, float_rows, nonfinite_error, range_error
from .tq3_1 import FP16_OVERFLOW, _to_fp16

TYPE = BY_NAME["TQ3_3"]
NAME = TYPE.name
QK = TYPE.block_size           # 64
BLOCK_BYTES = TYPE.type_size   # 26
SEARCH = _tcq3.SEARCH          # starting scales 0.85, 0.95 .. times d0
UNIT = _tcq3.UNIT              # levels per standard deviation: 127 / 2.5451
LEVELS = np.array(_tcq3.LEVELS, dtype=np.int8)
_L64 = LEVELS.astype(np.float64)
_L32 = LEVELS.astype(np.float32)


def subset(w: np.ndarray) -> np.ndarray:
    """The subset (0..3) of window w = b_i << 3 | b_{i-1} << 2 | b_{i-2} << 1 | b_{i-3}."""
    w = np.asarray(w)
    return ((w >> 2) & 1) | (((w >> 3) ^ (w >> 1) ^ w) & 1) << 1


_SUB = subset(np.arange(16))
# per next state ns: the two states it comes from (the bit that leaves: 0, 1) and their subsets
_NS = np.arange(8)
_FROM0 = (_NS << 1) & 7
_SUB0 = _SUB[(_NS >> 2) << 3 | _FROM0]
_SUB1 = _SUB[(_NS >> 2) << 3 | _FROM0 | 1]


class _Ext:
    OK, ERR_NONFINITE, ERR_RANGE = _tcq3.OK, _tcq3.ERR_NONFINITE, _tcq3.ERR_RANGE
    quantize_rows = staticmethod(_tcq3.quantize_rows)
    dequantize_rows = staticmethod(_tcq3.dequantize_rows)
    vec_dot_rows = staticmethod(_tcq3.vec_dot_rows)


# ---------------------------------------------------------------- C path

def quantize(x: np.ndarray, *, threads: int = 1) -> np.ndarray:
    """float rows [rows, n] (n % 64 == 0) -> uint8 blocks, C kernels, GIL released."""
    return c_quantize(_Ext, x, NAME, QK, BLOCK_BYTES, threads)


def dequantize(data: np.ndarray) -> np.ndarray:
    return c_dequantize(_Ext, data, NAME, QK, BLOCK_BYTES)


def vec_dot_q8_0(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Row-wise gqt_vec_dot_tq3_3_q8_0: x rows of TQ3_3, y ggml Q8_0 rows of the same length -> float32 [rows]."""
    return c_vec_dot_q8_0(_Ext, x, y, NAME, QK, BLOCK_BYTES)


def mad(x: np.ndarray, acc: np.ndarray, s: np.ndarray) -> np.ndarray:
    """acc + s[r] * row r of x, by gqt_mad_tq3_3 (flash attention's fused V accumulation); returns a new array."""
    x = block_rows(x, NAME, BLOCK_BYTES)
    out = np.array(acc, dtype=np.float32, order="C", copy=True).reshape(len(x), -1)
    _tcq3.mad_rows(np.ascontiguousarray(x), out, np.ascontiguousarray(s, dtype=np.float32).reshape(-1))
    return out


# ---------------------------------------------------------------- numpy twins

def _viterbi(x: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Blocks x [nb, 64] at scales d [nb] -> branch bits [nb, 64] and indices [nb, 64] (gqt_tcq3.c viterbi)."""
    nb = len(x)
    lev = d[:, None] * _L64[None, :]                                         # [nb, 16]
    thr = np.stack([np.stack([0.5 * (_L64[s + 4 * k] + _L64[s + 4 * k + 4]) * d for k in range(3)], 1)
                    for s in range(4)], 1)                                   # [nb, 4 subsets, 3]
    cost = np.full((nb, 8), 1e300)
    cost[:, 0] = 0.0
    frm = np.zeros((QK, nb, 8), np.uint8)
    qat = np.zeros((QK, nb, 8), np.uint8)
    rows = np.arange(nb)
    for i in range(QK):
        v = x[:, i]
        k = (v[:, None] >= thr[:, :, 1]).astype(np.int64) << 1                # [nb, 4]
        k += v[:, None] >= np.take_along_axis(thr, k[:, :, None], 2)[:, :, 0]
        e = v[:, None] - lev[rows[:, None], np.arange(4)[None, :] + 4 * k]
        err = e * e
        c0 = cost[:, _FROM0] + err[:, _SUB0]
        c1 = cost[:, _FROM0 | 1] + err[:, _SUB1]
        one = c1 < c0
        cost = np.where(one, c1, c0)
        frm[i] = one
        qat[i] = np.where(one, k[:, _SUB1], k[:, _SUB0])
    st = np.argmin(cost, axis=1)    # the first of equal costs, like the C loop
    bits = np.zeros((nb, QK), np.uint8)
    idx = np.zeros((nb, QK), np.uint8)
    for i in range(QK - 1, -1, -1):
        bits[:, i] = st >> 2
        idx[:, i] = qat[i, rows, st]
        st = ((st << 1) & 7) | frm[i, rows, st]
    return bits, idx


def _windows(bits: np.ndarray) -> np.ndarray:
    """[nb, 64] branch bits -> each value's window b_i << 3 | b_{i-1} << 2 | b_{i-2} << 1 | b_{i-3}."""
    p = np.concatenate([np.zeros((len(bits), 3), np.uint8), bits], axis=1).astype(np.int64)
    return p[:, 3:] << 3 | p[:, 2:-1] << 2 | p[:, 1:-2] << 1 | p[:, :-3]


def quantize_ref(x: np.ndarray, *, saturate: bool = False) -> np.ndarray:
    """numpy twin of quantize: identical bytes, and the same refusal of a block whose scale is beyond fp16
    (saturate=True twins ggml's entry points, which keep the largest fp16 scale instead)."""
    x = float_rows(x, NAME, QK)
    if not np.isfinite(x).all():
        raise nonfinite_error(x, NAME)
    rows = x.shape[0]
    b = x.reshape(-1, QK).astype(np.float64)
    n2 = np.zeros(len(b))
    for j in range(QK):
        n2 = n2 + b[:, j] * b[:, j]
    nz = n2 != 0
    keep_bits = np.zeros(b.shape, np.uint8)
    keep_idx = np.zeros(b.shape, np.uint8)
    best = bxl = bll = np.zeros(len(b))
    with np.errstate(divide="ignore", invalid="ignore"):   # zero blocks (n2 == 0) are dropped below
        d0 = np.sqrt(n2 / QK) / UNIT
        for c in range(SEARCH):
            bits, idx = _viterbi(b, d0 * (0.85 + 0.1 * c))
            lv = _L64[_SUB[_windows(bits)] + 4 * idx.astype(np.int64)]
            xl = np.zeros(len(b))
            ll = np.zeros(len(b))
            for i in range(QK):   # sequential, like the C loop
                xl = xl + b[:, i] * lv[:, i]
                ll = ll + lv[:, i] * lv[:, i]
            err = n2 - xl * xl / ll
            better = np.ones(len(b), bool) if c == 0 else err < best   # the first of equal errors
            best, bxl, bll = (np.where(better, new, old) for new, old in ((err, best), (xl, bxl), (ll, bll)))
            keep_bits = np.where(better[:, None], bits, keep_bits)
            keep_idx = np.where(better[:, None], idx, keep_idx)
        ds = bxl / bll
        beyond = nz & ~(ds.astype(np.float32) < FP16_OVERFLOW)
    if beyond.any() and not saturate:   # the C kernel's checked entry point refuses these blocks too
        raise range_error(NAME, x, int(np.flatnonzero(beyond)[0]), QK)
    d = _to_fp16(ds)
    keep = nz & (bxl > 0) & ((d & 0x7FFF) != 0)
    out = np.zeros((len(b), BLOCK_BYTES), dtype=np.uint8)
    out[:, 0:2] = d.astype("<u2").view(np.uint8).reshape(-1, 2)
    out[:, 2:10] = np.packbits(keep_bits, axis=1, bitorder="little")
    k = keep_idx
    out[:, 10:26] = k[:, 0:16] | k[:, 16:32] << 2 | k[:, 32:48] << 4 | k[:, 48:64] << 6
    out[~keep] = 0
    return out.reshape(rows, -1)


def _unpack(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[nb, 26] -> (fp16 scale as float32 [nb], int8 levels [nb, 64])."""
    d = blocks[:, 0:2].copy().view("<f2").reshape(-1).astype(np.float32)
    bits = np.unpackbits(blocks[:, 2:10], axis=1, bitorder="little")
    qs = blocks[:, 10:26]
    idx = np.concatenate([(qs >> (2 * m)) & 3 for m in range(4)], axis=1).astype(np.int64)
    return d, LEVELS[_SUB[_windows(bits)] + 4 * idx]


def dequantize_ref(data: np.ndarray) -> np.ndarray:
    """numpy twin of dequantize: identical float32 values."""
    data = block_rows(data, NAME, BLOCK_BYTES)
    d, lv = _unpack(data.reshape(-1, BLOCK_BYTES))
    with np.errstate(invalid="ignore", over="ignore"):
        x = d[:, None] * lv.astype(np.float32)
    x[d == 0] = 0.0
    return x.reshape(data.shape[0], -1)


def vec_dot_q8_0_ref(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """numpy twin of gqt_vec_dot_tq3_3_q8_0, one dot per row: identical float32 results."""
    x = block_rows(x, NAME, BLOCK_BYTES)
    nb = x.shape[1] // BLOCK_BYTES
    y = np.asarray(y).view(np.uint8).reshape(len(x), nb * 2, 34)
    d, lv = _unpack(x.reshape(-1, BLOCK_BYTES))
    d, lv = d.reshape(len(x), nb), lv.reshape(len(x), nb * 2, 32)
    sumf = np.zeros(len(x), dtype=np.float32)
    for g in range(nb * 2):                 # 32-value groups in order, like the C loop
        dx = d[:, g // 2]
        dy = y[:, g, 0:2].copy().view("<f2").reshape(-1).astype(np.float32)
        isum = (lv[:, g].astype(np.int32) * y[:, g, 2:].view(np.int8).astype(np.int32)).sum(axis=1)
        sumf = np.where(dx == 0, sumf, sumf + (dx * dy) * isum.astype(np.float32))
    return sumf


def mad_ref(x: np.ndarray, acc: np.ndarray, s: np.ndarray) -> np.ndarray:
    """numpy twin of gqt_mad_tq3_3: acc + (s * d) * level in float32, in that order: identical values."""
    x = block_rows(x, NAME, BLOCK_BYTES)
    d, lv = _unpack(x.reshape(-1, BLOCK_BYTES))
    m = (np.asarray(s, np.float32).reshape(-1, 1) * d.reshape(len(x), -1)).reshape(-1, 1)
    with np.errstate(invalid="ignore", over="ignore"):
        v = (m * lv.astype(np.float32)).reshape(len(x), -1)
    return np.asarray(acc, np.float32).reshape(len(x), -1) + v


def _quantize_codec(x: np.ndarray, *, threads: int = 1, **params) -> np.ndarray:
    if params:
        raise GgufToolError(f"{NAME} takes no parameters (got {sorted(params)})")
    return quantize(x, threads=threads)


CODEC = register(TYPE, _quantize_codec, dequantize)
