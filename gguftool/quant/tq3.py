"""TQ3_0: 3-bit Lloyd-Max codebook on a sign-flipped Walsh-Hadamard rotation of each 32-value block.

    y = H D x             (H: orthonormal 32x32 Hadamard, D: the committed sign pattern)
    idx = nearest centroid of y * sqrt(32) / ||y||, then 2 Lloyd passes against the fp16
          least-squares scale <y, c[idx]> / <c[idx], c[idx]>
    s = ||y|| / ||c[idx]||   (norm-preserving: ||x_hat|| = ||x||; stored as fp16)
    x_hat = D H (s c[idx])

The C kernels (gguftool/_fast/gqt_tq3.c) do the work; the `_ref` functions here are numpy twins
that produce identical bytes / floats (same operations in the same order), for tests and as the
executable specification. Layout and rationale: docs/tq3.md.
"""
from __future__ import annotations

import numpy as np

from .._fast import _tq3
from ..errors import GgufToolError
from ..types import BY_NAME
from . import register
from .rows import block_rows, c_dequantize, c_quantize, c_vec_dot_q8_0, float_rows, nonfinite_error, range_error
from .tq3_codebook import BOUNDARIES, CENTROIDS, INV_SQRT_BLOCK_F32, SIGN_WORD, SQRT_BLOCK

TYPE = BY_NAME["TQ3_0"]
QK = TYPE.block_size          # 32
BLOCK_BYTES = TYPE.type_size  # 14
REFINE_PASSES = _tq3.REFINE_PASSES  # Lloyd passes (gqt_tq3.h)
FP16_MAX = np.float32(65504.0)
FP16_OVERFLOW = np.float32(65520.0)   # the smallest float32 that rounds to fp16 infinity

_C64 = np.array(CENTROIDS, dtype=np.float64)
_C32 = _C64.astype(np.float32)
_B64 = np.array(BOUNDARIES, dtype=np.float64)
_NEG = ((SIGN_WORD >> np.arange(QK)) & 1).astype(bool)   # D[j] = -1 where set
_SQRT32 = np.float64(SQRT_BLOCK)
_INV_SQRT32F = np.float32(INV_SQRT_BLOCK_F32)


# ---------------------------------------------------------------- input checks
def _rows_f32(x: np.ndarray) -> np.ndarray:
    return float_rows(x, "TQ3_0", QK)


def _nonfinite_error(x: np.ndarray) -> GgufToolError:
    return nonfinite_error(x, "TQ3_0")


def _blocks_u8(data: np.ndarray) -> np.ndarray:
    return block_rows(data, "TQ3_0", BLOCK_BYTES)


# ---------------------------------------------------------------- C path
def quantize_tq3(x: np.ndarray, *, threads: int = 1) -> np.ndarray:
    """float rows [rows, n] (n % 32 == 0) -> uint8 [rows, n / 32 * 14], C kernels, GIL released."""
    return c_quantize(_tq3, x, "TQ3_0", QK, BLOCK_BYTES, threads)


def dequantize_tq3(data: np.ndarray) -> np.ndarray:
    """uint8 [rows, nb * 14] -> float32 [rows, nb * 32] (C kernel)."""
    return c_dequantize(_tq3, data, "TQ3_0", QK, BLOCK_BYTES)


def vec_dot_tq3_q8_0(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Row-wise gqt_vec_dot_tq3_0_q8_0: x TQ3_0 rows, y ggml Q8_0 rows of the same length -> float32 [rows]."""
    return c_vec_dot_q8_0(_tq3, x, y, "TQ3_0", QK, BLOCK_BYTES)


# ---------------------------------------------------------------- numpy twins
def fwht(v: np.ndarray) -> np.ndarray:
    """Unnormalised Walsh-Hadamard transform of each 32-vector (last axis), in the C kernel's
    butterfly order: the result equals sqrt(32) * H v in exact arithmetic, and bit for bit the C
    result in float32, float64 or integers."""
    v = np.array(v, copy=True).reshape(-1, QK)
    h = 1
    while h < QK:
        w = v.reshape(-1, QK // (2 * h), 2, h)
        a, b = w[:, :, 0, :].copy(), w[:, :, 1, :].copy()
        w[:, :, 0, :] = a + b
        w[:, :, 1, :] = a - b
        h *= 2
    return v


def _pick(z: np.ndarray, r: np.ndarray) -> np.ndarray:
    q = np.zeros(z.shape, dtype=np.uint8)
    for k in range(7):
        q += z >= (_B64[k] * r)[:, None]
    return q


def _moments(z: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    num = np.zeros(len(z))
    den = np.zeros(len(z))
    for j in range(QK):          # sequential, like the C loop
        c = _C64[idx[:, j]]
        num = num + z[:, j] * c
        den = den + c * c
    return num, den


def _to_fp16_scale(sz: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        s = (sz / _SQRT32).astype(np.float32)
    return np.minimum(s, FP16_MAX).astype(np.float16).view(np.uint16)


def _ls_scale(z: np.ndarray, idx: np.ndarray) -> np.ndarray:
    num, den = _moments(z, idx)
    with np.errstate(divide="ignore", invalid="ignore"):
        return _to_fp16_scale(num / den)


SCALE_RULES = ("norm", "ls", "unbiased")   # stored scale; the format uses "norm", the others are for tests


def quantize_tq3_ref(x: np.ndarray, *, refine_passes: int = REFINE_PASSES, scale: str = "norm",
                     saturate: bool = False) -> np.ndarray:
    """numpy twin of quantize_tq3: identical bytes, and the same refusal of a block whose scale is beyond
    fp16; saturate=True twins ggml's entry points instead (gqt_quantize_tq3_0: a KV-cache row cannot
    fail, so such a block keeps the largest fp16 scale). `refine_passes` and `scale` (the rule for the
    stored scale on the chosen indices: "norm", the format's ||y|| / ||c[idx]||; "ls", least squares,
    the format before; "unbiased", ||y||^2 / <y, c[idx]>) exist to measure the design choice
    (tests, scripts/bench_tq3.py); only the defaults match the C kernel."""
    if scale not in SCALE_RULES:
        raise GgufToolError(f"unknown TQ3_0 scale rule {scale!r}")
    x = _rows_f32(x)
    if not np.isfinite(x).all():
        raise _nonfinite_error(x)
    rows = x.shape[0]
    z = fwht(np.where(_NEG, -x.reshape(-1, QK).astype(np.float64), x.reshape(-1, QK).astype(np.float64)))
    n2 = np.zeros(len(z))
    for j in range(QK):
        n2 = n2 + z[:, j] * z[:, j]
    nz = n2 != 0
    idx = _pick(z, np.sqrt(n2 / QK))
    d = _ls_scale(z, idx)
    for _ in range(refine_passes):
        s = d.view(np.float16).astype(np.float64)
        active = s > 0
        idx = np.where(active[:, None], _pick(z, s * _SQRT32), idx)
        d = np.where(active, _ls_scale(z, idx), d)
    num, den = _moments(z, idx)
    with np.errstate(divide="ignore", invalid="ignore"):   # zero blocks (n2 == 0) are dropped below
        sz = {"norm": np.sqrt(n2 / den), "ls": num / den, "unbiased": n2 / num}[scale]
        beyond = nz & ~((sz / _SQRT32).astype(np.float32) < FP16_OVERFLOW)
    if beyond.any() and not saturate:   # the C kernel's checked entry point refuses these blocks too
        raise range_error("TQ3_0", x, int(np.flatnonzero(beyond)[0]), QK)
    d = _to_fp16_scale(sz)
    keep = nz & ((d & 0x7FFF) != 0)
    out = np.zeros((len(z), BLOCK_BYTES), dtype=np.uint8)
    out[:, 0:2] = d.astype("<u2").view(np.uint8).reshape(-1, 2)
    w = np.zeros((len(z), 4), dtype=np.uint32)
    for i in range(8):
        w |= idx[:, i::8].astype(np.uint32) << np.uint32(3 * i)   # value 8g+i -> group g, bits 3i..3i+2
    for k in range(3):
        out[:, 2 + k:BLOCK_BYTES:3] = (w >> np.uint32(8 * k)).astype(np.uint8)
    out[~keep] = 0
    return out.reshape(rows, -1)


def _unpack(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[nb, 14] -> (fp16 scale as float32 [nb], indices uint8 [nb, 32])."""
    s = blocks[:, 0:2].copy().view("<f2").reshape(-1).astype(np.float32)
    w = np.zeros((len(blocks), 4), dtype=np.uint32)
    for k in range(3):
        w |= blocks[:, 2 + k:BLOCK_BYTES:3].astype(np.uint32) << np.uint32(8 * k)
    idx = np.empty((len(blocks), QK), dtype=np.uint8)
    for i in range(8):
        idx[:, i::8] = (w >> np.uint32(3 * i)) & 7
    return s, idx


def dequantize_tq3_ref(data: np.ndarray) -> np.ndarray:
    """numpy twin of dequantize_tq3: identical float32 values."""
    data = _blocks_u8(data)
    s, idx = _unpack(data.reshape(-1, BLOCK_BYTES))
    v = fwht(_C32[idx])
    with np.errstate(invalid="ignore", over="ignore"):
        t = v * (s * _INV_SQRT32F)[:, None]
    x = np.where(_NEG, -t, t)
    x[s == 0] = 0.0
    return x.reshape(data.shape[0], -1)


def quantize_q8_0_ref(x: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q8_0_ref (gguf.quants' bit-exact port): the activation side of vec_dot."""
    from gguf import GGMLQuantizationType, quants
    return quants.quantize(np.ascontiguousarray(x, dtype=np.float32), GGMLQuantizationType.Q8_0)


def vec_dot_tq3_q8_0_ref(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """numpy twin of gqt_vec_dot_tq3_0_q8_0, one dot per row: identical float32 results."""
    x = _blocks_u8(x)
    nb = x.shape[1] // BLOCK_BYTES
    y = np.asarray(y).view(np.uint8).reshape(len(x), nb, 34)
    xb = x.reshape(len(x), nb, BLOCK_BYTES)
    sumf = np.zeros(len(x), dtype=np.float32)
    for b in range(nb):                       # blocks in order, like the C loop
        sx, idx = _unpack(np.ascontiguousarray(xb[:, b]))
        sy = y[:, b, 0:2].copy().view("<f2").reshape(-1).astype(np.float32)
        q = y[:, b, 2:].view(np.int8).astype(np.int32)
        w = fwht(np.where(_NEG, -q, q)).astype(np.float32)
        p = _C32[idx] * w                     # canonical 8-lane order, see block_dot in gqt_tq3.c
        a = ((p[:, 0:8] + p[:, 8:16]) + p[:, 16:24]) + p[:, 24:32]
        dot = ((a[:, 0] + a[:, 4]) + (a[:, 2] + a[:, 6])) + ((a[:, 1] + a[:, 5]) + (a[:, 3] + a[:, 7]))
        sumf = np.where(sx == 0, sumf, sumf + (sx * sy) * dot)
    return sumf * _INV_SQRT32F


def _quantize_codec(x: np.ndarray, *, threads: int = 1, **params) -> np.ndarray:
    if params:
        raise GgufToolError(f"TQ3_0 takes no parameters (got {sorted(params)})")
    return quantize_tq3(x, threads=threads)


CODEC = register(TYPE, _quantize_codec, dequantize_tq3)
