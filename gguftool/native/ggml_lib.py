"""ggml's own quantizers, from the native build's shared library (gguftool-ggml.so), through ctypes.

The stock types that only ggml's C code writes (K-quants, IQ types, TQ1_0/TQ2_0, MXFP4, and any
type with an importance matrix) come from the pinned ggml itself, so the bytes are llama-quantize's.
ctypes releases the GIL around each call: row ranges quantize in parallel threads.
"""
from __future__ import annotations

import ctypes
from functools import lru_cache

import numpy as np
from gguf import GGMLQuantizationType

from .. import types
from ..errors import GgufToolError

_F32P = ctypes.POINTER(ctypes.c_float)
GgmlType = GGMLQuantizationType | types.TensorType   # a TensorType for the types gguf lacks (UPSTREAM_UNKNOWN_TO_GGUF)


def _id(t: GgmlType) -> int:
    return t.id if isinstance(t, types.TensorType) else t.value


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The loaded library, checked to number the types as the installed gguf package does."""
    from . import tools
    path = tools.find_build().tool("gguftool-ggml")
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise GgufToolError(f"{path}: cannot load ggml's quantizers: {e}",
                            hint="rebuild with `gguftool native build`") from None
    lib.gqt_ggml_type_count.restype = ctypes.c_int
    lib.gqt_ggml_type_name.restype = ctypes.c_char_p
    lib.gqt_ggml_type_name.argtypes = [ctypes.c_int]
    lib.gqt_ggml_requires_imatrix.argtypes = [ctypes.c_int]
    lib.gqt_ggml_quantize.restype = ctypes.c_int64
    lib.gqt_ggml_quantize.argtypes = [ctypes.c_int, _F32P, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, _F32P]
    lib.gqt_ggml_validate.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64]
    lib.gqt_ggml_dequantize.argtypes = [ctypes.c_int, ctypes.c_void_p, _F32P, ctypes.c_int64, ctypes.c_int64]
    known = [(t.value, t.name, "the gguf package") for t in GGMLQuantizationType]
    known += [(i, n, "gguftool's table") for n, (i, _, _) in types.UPSTREAM_UNKNOWN_TO_GGUF.items()]
    for value, tname, where in known:
        name = lib.gqt_ggml_type_name(value).decode()
        if name and name.upper() != tname:
            raise GgufToolError(f"{path}: ggml type {value} is {name!r} there but {tname} in {where}",
                                hint="the native build and the gguf package disagree: rebuild, or reinstall gguftool")
    return lib


def require(type_name: str) -> None:
    """Fails with how to get the library when `type_name` cannot be written here."""
    try:
        library()
    except GgufToolError as e:
        raise GgufToolError(f"{type_name} is written by ggml's own quantizer, from the native build: {e.message}",
                            hint=e.hint or "run `gguftool native build`") from None


def requires_imatrix(t: GgmlType) -> bool:
    return bool(library().gqt_ggml_requires_imatrix(_id(t)))


def quantize(t: GgmlType, x: np.ndarray, row_bytes: int, imatrix: np.ndarray | None = None) -> np.ndarray:
    """float32 rows [rows, n] -> uint8 [rows, row_bytes] by ggml_quantize_chunk (imatrix: n weights
    per column, as llama-quantize passes them)."""
    lib = library()
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, n = x.shape
    if imatrix is not None:
        imatrix = np.ascontiguousarray(imatrix, dtype=np.float32)
        if imatrix.shape != (n,):
            raise GgufToolError(f"importance matrix of {imatrix.size} values for rows of {n}")
    out = np.empty((rows, row_bytes), np.uint8)
    got = lib.gqt_ggml_quantize(_id(t), x.ctypes.data_as(_F32P), out.ctypes.data, rows, n,
                                None if imatrix is None else imatrix.ctypes.data_as(_F32P))
    if got == -3:
        raise GgufToolError(f"{t.name} needs an importance matrix", hint="pass --imatrix FILE (make one with `gguftool imatrix`)")
    if got < 0:
        raise GgufToolError(f"ggml cannot quantize rows of {n} values to {t.name} (code {got})")
    if got != out.size:
        raise GgufToolError(f"ggml wrote {got} bytes of {t.name} where {out.size} were expected")
    return out


def validate(t: GgmlType, data: np.ndarray) -> bool:
    """ggml_validate_row_data: what llama.cpp checks when it loads the rows."""
    data = np.ascontiguousarray(data)
    return bool(library().gqt_ggml_validate(_id(t), data.ctypes.data, data.nbytes))


def dequantize(t: GgmlType, data: np.ndarray, n_per_row: int) -> np.ndarray:
    """uint8 rows [rows, row_bytes] -> float32 [rows, n_per_row] by ggml's own to_float."""
    data = np.ascontiguousarray(data, dtype=np.uint8)
    out = np.empty((data.shape[0], n_per_row), np.float32)
    if not library().gqt_ggml_dequantize(_id(t), data.ctypes.data, out.ctypes.data_as(_F32P), out.shape[0], n_per_row):
        raise GgufToolError(f"ggml has no dequantizer for {t.name} rows of {n_per_row}")
    return out
