"""Quantization codecs: one per GGML type, standard (via gguf.quants) and ours.

A codec turns a float32 matrix of rows into a uint8 matrix of blocks and back. Pipeline code
only talks to `codec(name)`; each family module registers its codecs at import.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import types
from ..errors import GgufToolError, did_you_mean

QuantizeFn = Callable[..., np.ndarray]   # (x: float32 [rows, n], *, threads: int, **params) -> uint8 [rows, row_bytes]
DequantizeFn = Callable[[np.ndarray], np.ndarray]  # uint8 [rows, row_bytes] -> float32 [rows, n]


@dataclass(frozen=True)
class Codec:
    """The code that turns rows into a type's blocks and back; the type's facts stay in its record."""
    type: types.TensorType
    quantize: QuantizeFn | None      # None: the type can be read but not produced
    dequantize: DequantizeFn | None
    params: dict[str, Any] = field(default_factory=dict)  # solver parameters it accepts, with defaults
    importance: bool = False         # quantize() takes imatrix= (per-column weights)

    name = property(lambda self: self.type.name)
    id = property(lambda self: self.type.id)
    block_size = property(lambda self: self.type.block_size)
    type_size = property(lambda self: self.type.type_size)
    custom = property(lambda self: self.type.custom)
    bpw = property(lambda self: self.type.bpw)

    def row_bytes(self, n_per_row: int) -> int:
        return n_per_row // self.block_size * self.type_size


_CODECS: dict[str, Codec] = {}
_UNAVAILABLE: dict[str, str] = {}  # family module -> why it could not load


def register(t: types.TensorType, quantize: QuantizeFn | None, dequantize: DequantizeFn | None,
             params: dict[str, Any] | None = None, importance: bool = False) -> Codec:
    """The codec of type `t`; a type has one codec (like gguf-py's one class per qtype)."""
    if t.name in _CODECS:
        raise ValueError(f"a codec for {t.name} is already registered")
    c = _CODECS[t.name] = Codec(t, quantize, dequantize, dict(params or {}), importance)
    return c


_loaded = False


def _load() -> None:
    """Import every family once; a family imported directly first still sees all the others."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    from . import standard  # noqa: F401  (registers the upstream types)
    for module in sorted({t.family for t in types.CUSTOM_TYPES}):
        try:
            __import__(f"{__name__}.{module}")
        except ImportError as e:  # its C extension is not built: the other types still work
            _UNAVAILABLE[module] = str(e)


def codec(name: str) -> Codec:
    _load()
    c = _CODECS.get(name.upper())
    if c is None:
        if types.lookup(name) is not None and _UNAVAILABLE:
            raise GgufToolError(f"{name.upper()} needs gguftool's C extension, which failed to load: "
                                + "; ".join(_UNAVAILABLE.values()),
                                hint="reinstall with `pip install .` (it compiles the extension)")
        writable = sorted(n for n, c in _CODECS.items() if c.quantize is not None)   # what a user may ask for
        raise GgufToolError(f"unknown quantization type {name!r}" + did_you_mean(name.upper(), writable),
                            hint="types gguftool can write: " + ", ".join(writable))
    return c


def all_codecs() -> list[Codec]:
    _load()
    return sorted(_CODECS.values(), key=lambda c: c.id)
