"""Upstream ggml types. Without an importance matrix, the legacy types go through gguf.quants, whose numpy
code is a bit-exact port of ggml's reference quantizers (`quantize_row_*_ref`). The types it has no
quantizer for (K-quants, IQ, TQ, MXFP4) and any type given an importance matrix go through ggml's own
C code from the native build (native/ggml_lib.py): both give llama-quantize's bytes."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, quants

from .. import types
from ..errors import GgufToolError
from . import register
from .parallel import map_rows
from .rows import range_error

KQ_SEARCH = ("Q4_K", "Q5_K", "Q6_K")   # stock K types that solver "hqq" fills with gguftool's search (kquant.py)


@lru_cache(maxsize=1)
def _ggml_available() -> bool:
    """ggml's C quantizers are here (native build): the same bytes as gguf.quants' numpy, 5-10x faster."""
    from ..native import ggml_lib
    try:
        ggml_lib.library()
    except GgufToolError:
        return False
    return True


# scales that saturate instead of overflowing, so ggml clips what is beyond them with no error (llama-quantize
# writes such files): values per scale, the largest magnitude it encodes, its name
_SATURATING = {"NVFP4": (16, 6.0 * 448.0, "UE4M3 scale (at most 6 x 448)")}


def _ggml(t: GGMLQuantizationType, x: np.ndarray, threads: int, imatrix: np.ndarray | None) -> np.ndarray:
    from ..native import ggml_lib
    tt = types.stock(t.name)
    if t.name in _SATURATING:
        sub, top, scale = _SATURATING[t.name]
        over = np.flatnonzero(np.abs(x).reshape(-1, sub).max(axis=1) > top)
        if over.size:
            raise range_error(t.name, x, int(over[0]), sub, scale)
    q = map_rows(lambda rows: ggml_lib.quantize(t, rows, x.shape[1] // tt.block_size * tt.type_size, imatrix), x, threads)
    if not ggml_lib.validate(t, q):   # llama-quantize refuses such rows too (inf/NaN scales beyond fp16)
        blocks = q.reshape(-1, tt.type_size)
        bad = next(i for i in range(len(blocks)) if not ggml_lib.validate(t, blocks[i]))
        raise range_error(t.name, x, bad, tt.block_size)
    return q


def _native_quantizer(t: GGMLQuantizationType):
    def quantize(x: np.ndarray, *, threads: int = 1, imatrix: np.ndarray | None = None, solver: str = "ref",
                 **params: Any) -> np.ndarray:
        if solver == "ref":
            return _ggml(t, x, threads, imatrix)
        if solver == "hqq" and t.name in KQ_SEARCH:   # ggml's blocks, then gguftool's search (quant/kquant.py)
            from .kquant import refine_parallel
            q = _ggml(t, x, threads, imatrix)
            refine_parallel(q, x, t.name, threads=threads, imatrix=imatrix, **params)
            return q
        if solver == "hqq":
            raise GgufToolError(f"solver 'hqq' cannot produce {t.name}",
                                hint="use it with " + ", ".join([*types.hqq_targets(), *KQ_SEARCH]))
        raise GgufToolError(f"unknown solver {solver!r}", hint="choose 'ref' (llama.cpp's reference) or 'hqq'")
    return quantize


def _quantizer(t: GGMLQuantizationType):
    def quantize(x: np.ndarray, *, threads: int = 1, solver: str = "ref", imatrix: np.ndarray | None = None,
                 **params: Any) -> np.ndarray:
        if solver == "ref" and (imatrix is not None or (_ggml_available() and types.stock(t.name).block_size > 1)):
            return _ggml(t, x, threads, imatrix)   # with imatrix: ggml's weighted search, as llama-quantize
        if solver == "hqq":
            if t.name not in types.HQQ_STOCK_TARGETS:
                raise GgufToolError(f"solver 'hqq' cannot produce {t.name}",
                                    hint="use it with " + ", ".join(types.hqq_targets()))
            from .hqq import quantize_hqq
            q = quantize_hqq(x, t.name, threads=threads, imatrix=imatrix, **params)
            if imatrix is not None and _ggml_available():   # weighted HQQ alone loses to ggml's 37-scale
                # weighted search on some blocks: per block the better by the weighted error (docs/hqq.md)
                return _weighted_best(t, x, q, _ggml(t, x, threads, imatrix), imatrix)
            return q
        if solver != "ref":
            raise GgufToolError(f"unknown solver {solver!r}", hint="choose 'ref' (llama.cpp's reference) or 'hqq'")
        if params:
            raise GgufToolError(f"{t.name} with the reference solver takes no parameters (got {sorted(params)})")
        out = map_rows(lambda rows: _quiet_quantize(rows, t), x, threads)
        _refuse_beyond_fp16(t, x, out)
        return out.view(np.uint8).reshape(x.shape[0], -1)
    return quantize


# numpy's twin of ggml_validate_row_data for what gguf.quants writes: the fp16 fields of each block (d; Q4_1 and
# Q5_1: d and m at bytes 0..3), every value of F16; beyond fp16 they turn to inf, which llama-quantize refuses.
_FP16_FIELDS = {"Q4_0": 1, "Q5_0": 1, "Q8_0": 1, "Q4_1": 2, "Q5_1": 2}


def _quiet_quantize(rows: np.ndarray, t: GGMLQuantizationType) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):   # overflows are refused below, not warned about
        return quants.quantize(rows, t)


def _refuse_beyond_fp16(t: GGMLQuantizationType, x: np.ndarray, out: np.ndarray) -> None:
    if t.name == "F16":
        fields = np.asarray(out).view(np.uint16).reshape(-1, 1)
        block = 1
    elif t.name in _FP16_FIELDS:
        tt = types.stock(t.name)
        fields = np.asarray(out).view(np.uint8).reshape(-1, tt.type_size)[:, :2 * _FP16_FIELDS[t.name]].copy().view("<u2")
        block = tt.block_size
    else:
        return
    exp_ones = (fields & 0x7FFF) >= 0x7C00 if block > 1 else (fields & 0x7FFF) == 0x7C00   # F16: inf (NaN was NaN)
    bad = exp_ones.any(axis=1)
    if bad.any():
        raise range_error(t.name, np.asarray(x).reshape(x.shape[0], -1), int(np.argmax(bad)), block)


def _weighted_best(t: GGMLQuantizationType, x: np.ndarray, a: np.ndarray, b: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per block, the one of the two encodings a, b (same layout) with the lower imatrix-weighted squared error."""
    from ..native import ggml_lib
    tt = types.stock(t.name)
    n = x.shape[1]
    err = [(((x - ggml_lib.dequantize(t, q, n)) ** 2) * w).reshape(-1, tt.block_size).sum(axis=1) for q in (a, b)]
    out = a.reshape(-1, tt.type_size).copy()
    take = err[1] < err[0]
    out[take] = b.reshape(-1, tt.type_size)[take]
    return out.reshape(a.shape)


def _f16_to_f32(h: np.ndarray) -> np.ndarray:
    """numpy's float16 cast is scalar (~3 ns a value); the C one is exact and ~4x faster."""
    try:
        from .._fast._convert import f16_to_f32
    except ImportError:   # extension not built: numpy gives the same values
        return h.view(np.float16).astype(np.float32)
    h = np.ascontiguousarray(h)
    out = np.empty(h.shape, np.float32)
    f16_to_f32(h.reshape(-1), out.reshape(-1))
    return out


def _dequantizer(t: GGMLQuantizationType | types.TensorType):
    def dequantize(data: np.ndarray) -> np.ndarray:
        if t == GGMLQuantizationType.F32:
            return data.view(np.float32)
        if t == GGMLQuantizationType.F16:
            return _f16_to_f32(data.view(np.uint16))
        if (_ggml_available() and t.name in types.STOCK_PRODUCIBLE + types.NATIVE_STOCK and data.ndim == 2
                and types.stock(t.name).block_size > 1):
            from ..native import ggml_lib
            tt = types.stock(t.name)
            return ggml_lib.dequantize(t, data, data.shape[1] // tt.type_size * tt.block_size)
        if t.name in _OWN_DEQUANTIZERS:
            return _OWN_DEQUANTIZERS[t.name](data)
        return quants.dequantize(data.view(np.uint8), t).astype(np.float32, copy=False)
    return dequantize


def _q1_0_dequantize(data: np.ndarray) -> np.ndarray:
    """ggml's dequantize_row_q1_0: per 128 values an fp16 d, then one bit each (set: +d, clear: -d)."""
    b = data.view(np.uint8).reshape(-1, 18)
    d = _f16_to_f32(b[:, :2].copy().view(np.uint16))
    bits = np.unpackbits(b[:, 2:], axis=1, bitorder="little").astype(bool)
    return np.where(bits, d, -d).reshape(*data.shape[:-1], -1)


def _q2_0_dequantize(data: np.ndarray) -> np.ndarray:
    """ggml's dequantize_row_q2_0: per 64 values an fp16 d, then 2-bit codes q (four a byte, low bits
    first); x = (q - 1) * d."""
    b = data.view(np.uint8).reshape(-1, 18)
    d = _f16_to_f32(b[:, :2].copy().view(np.uint16))
    q = (b[:, 2:, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3
    return ((q.reshape(len(b), 64).astype(np.float32) - 1) * d).reshape(*data.shape[:-1], -1)


# upstream types that gguf.quants cannot read: their numpy twins of ggml's dequantizers
_OWN_DEQUANTIZERS = {"Q1_0": _q1_0_dequantize, "Q2_0": _q2_0_dequantize}


def _readable(t: GGMLQuantizationType) -> bool:
    return t in (GGMLQuantizationType.F32, GGMLQuantizationType.F16) or t in quants._type_traits


for _t in GGMLQuantizationType:   # every type gguf.quants reads; those gguftool writes can be produced
    if _readable(_t):
        q = (_quantizer(_t) if _t.name in types.STOCK_PRODUCIBLE else
             _native_quantizer(_t) if _t.name in types.NATIVE_STOCK else None)
        register(types.stock(_t.name), q, _dequantizer(_t),
                 {"solver": "ref"} if _t.name in (*types.HQQ_STOCK_TARGETS, *KQ_SEARCH) else {}, importance=q is not None)
for _name in _OWN_DEQUANTIZERS:   # written by ggml's C code (native build), read by their numpy twins anywhere
    _tt = types.stock(_name)
    register(_tt, _native_quantizer(_tt), _dequantizer(_tt), importance=True)
