"""Upstream ggml types through gguf.quants: its numpy code is a bit-exact port of ggml's reference
quantizers (`quantize_row_*_ref`), so our standard outputs equal llama-quantize's reference path."""
from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from ..errors import GgufToolError
from . import Codec, register
from .parallel import map_rows

# Types gguftool can produce; every other type gguf.quants knows is read-only (dequantize).
PRODUCIBLE = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
HQQ_SOLVABLE = ("Q4_1", "Q5_1")  # stock layouts the HQQ solver can also fill


def _quantizer(t: GGMLQuantizationType):
    def quantize(x: np.ndarray, *, threads: int = 1, solver: str = "ref", **params: Any) -> np.ndarray:
        if solver == "hqq":
            if t.name not in HQQ_SOLVABLE:
                raise GgufToolError(f"solver 'hqq' cannot produce {t.name}", hint="use it with Q4_1, Q5_1, Q4_HQQ or Q4_HQQ_128")
            from .hqq import quantize_hqq
            return quantize_hqq(x, t.name, threads=threads, **params)
        if solver != "ref":
            raise GgufToolError(f"unknown solver {solver!r}", hint="choose 'ref' (llama.cpp's reference) or 'hqq'")
        if params:
            raise GgufToolError(f"{t.name} with the reference solver takes no parameters (got {sorted(params)})")
        out = map_rows(lambda rows: quants.quantize(rows, t), x, threads)
        return out.view(np.uint8).reshape(x.shape[0], -1)
    return quantize


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


def _dequantizer(t: GGMLQuantizationType):
    def dequantize(data: np.ndarray) -> np.ndarray:
        if t == GGMLQuantizationType.F32:
            return data.view(np.float32)
        if t == GGMLQuantizationType.F16:
            return _f16_to_f32(data.view(np.uint16))
        return quants.dequantize(data.view(np.uint8), t).astype(np.float32, copy=False)
    return dequantize


def _readable(t: GGMLQuantizationType) -> bool:
    return t in (GGMLQuantizationType.F32, GGMLQuantizationType.F16) or t in quants._type_traits


for _t in GGMLQuantizationType:
    if not _readable(_t):
        continue
    _block, _size = GGML_QUANT_SIZES[_t]
    register(Codec(
        name=_t.name, id=int(_t), block_size=_block, type_size=_size,
        quantize=_quantizer(_t) if _t.name in PRODUCIBLE else None,
        dequantize=_dequantizer(_t),
        params={"solver": "ref"} if _t.name in HQQ_SOLVABLE else {},
    ))
