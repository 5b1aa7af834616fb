"""Searched stock K-quants: Q4_K, Q5_K and Q6_K blocks in ggml's exact layouts (any stock llama.cpp reads
them) whose integer sub-block scales/mins and fp16 super-block scales are searched for a lower squared
error than ggml's own search (weighted by the importance matrix when there is one).

ggml's quantizer (the native build's, llama-quantize's bytes) gives the starting blocks; the C kernel
(`gguftool/_fast/kq_search.c`) refines each super-block and keeps a change only where the block's error
falls, so no block is worse than llama-quantize's under the objective sum_i w_i (x_i - xhat_i)^2, with
w = the imatrix's per-column weights, or 1 without one. Solver name: "hqq" (`--solver hqq`), as for the
other stock layouts gguftool solves better than ggml (Q4_1, Q5_1)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import GgufToolError
from .rows import float_rows, nonfinite_error

TYPES = ("Q4_K", "Q5_K", "Q6_K")
DEFAULT_ROUNDS = 3
# HQQ parameters a mix may carry for its Q4_1/Q5_1/Q4_HQQ tensors: not used by the K-quant search
HQQ_ONLY = {"lp_norm", "beta", "kappa", "iters", "scale_search", "refit", "early_stop", "solver"}

try:
    from .._fast import _kquant
except ImportError as e:   # the extension is not built: a clear error when the solver is asked for
    _kquant, _IMPORT_ERROR = None, str(e)

_ERRORS = {1: "not a K type this solver writes", 2: "rows must hold a multiple of 256 values",
           3: "NaN or Inf in the input or the importance weights (or a negative weight)", 4: "rounds out of range"}


def _lib():
    if _kquant is None:
        raise GgufToolError(f"the K-quant search needs gguftool's C extension, which failed to load: {_IMPORT_ERROR}",
                            hint="reinstall with `pip install .` (it compiles the extension)")
    return _kquant


def _check(x: np.ndarray, name: str, imatrix: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    if name not in TYPES:
        raise GgufToolError(f"the K-quant search writes {', '.join(TYPES)}, not {name}")
    x = float_rows(x, name, 256)
    if not np.isfinite(x).all():
        raise nonfinite_error(x, name)
    if imatrix is not None:
        imatrix = np.ascontiguousarray(imatrix, dtype=np.float32).reshape(-1)
        if imatrix.size != x.shape[1]:
            raise GgufToolError(f"importance matrix of {imatrix.size} values for {name} rows of {x.shape[1]}")
        if not np.isfinite(imatrix).all() or (imatrix < 0).any():
            raise GgufToolError(f"the importance weights for {name} hold NaN, Inf or negative values",
                                hint="remake the imatrix (`gguftool imatrix MODEL`)")
    return x, imatrix


def refine(blocks: np.ndarray, x: np.ndarray, name: str, *, imatrix: np.ndarray | None = None,
           rounds: int = DEFAULT_ROUNDS) -> tuple[float, float]:
    """Refines ggml's `blocks` (uint8 [rows, row_bytes], written for float rows x) in place; returns the
    summed weighted squared error (before, after)."""
    lib = _lib()
    x, imatrix = _check(x, name, imatrix)
    if not 1 <= int(rounds) <= lib.ROUNDS_MAX:
        raise GgufToolError(f"K-quant search rounds must be 1..{lib.ROUNDS_MAX}, got {rounds}")
    rc, before, after = lib.refine_rows(lib.TYPES[name], x, imatrix, blocks, int(rounds))
    if rc:
        raise GgufToolError(f"cannot refine {name} blocks: {_ERRORS.get(rc, f'error {rc}')}")
    return before, after


def refine_parallel(blocks: np.ndarray, x: np.ndarray, name: str, *, threads: int = 1,
                    imatrix: np.ndarray | None = None, rounds: int = DEFAULT_ROUNDS, **params: Any) -> tuple[float, float]:
    """refine() over row ranges in `threads` threads (the kernel releases the GIL). params: the HQQ
    parameters a plan gives every tensor (for its Q4_1/Q5_1/Q4_HQQ ones), not used here; anything else
    is an error."""
    from .parallel import map_row_ranges
    unknown = sorted(set(params) - HQQ_ONLY)
    if unknown:
        raise GgufToolError(f"the {name} search takes no parameters {unknown}")
    x, imatrix = _check(x, name, imatrix)
    if blocks.shape[0] == 0:
        return 0.0, 0.0
    errs = map_row_ranges(lambda r0, r1: np.array([refine(blocks[r0:r1], x[r0:r1], name, imatrix=imatrix,
                                                          rounds=rounds)]), x.shape[0], threads)
    return float(errs[:, 0].sum()), float(errs[:, 1].sum())


def quantize_kquant(x: np.ndarray, name: str, *, threads: int = 1, imatrix: np.ndarray | None = None,
                    rounds: int = DEFAULT_ROUNDS) -> np.ndarray:
    """float32 [rows, n] -> uint8 [rows, row_bytes] of stock `name` blocks: ggml's (native build), then searched."""
    from . import codec
    return codec(name).quantize(x, threads=threads, imatrix=imatrix, solver="hqq", rounds=rounds)


def block_errors(blocks: np.ndarray, x: np.ndarray, name: str, imatrix: np.ndarray | None = None) -> np.ndarray:
    """Weighted squared error per super-block of 256 values [rows * n/256], float64."""
    lib = _lib()
    x, imatrix = _check(x, name, imatrix)
    blocks = np.ascontiguousarray(blocks, np.uint8)
    out = np.empty(x.shape[0] * (x.shape[1] // 256), np.float64)
    rc = lib.block_errors(lib.TYPES[name], x, imatrix, blocks, out)
    if rc:
        raise GgufToolError(f"cannot score {name} blocks: {_ERRORS.get(rc, f'error {rc}')}")
    return out


def dequantize(blocks: np.ndarray, name: str, n_per_row: int) -> np.ndarray:
    """Our decoder of the stock layout (the tests hold it to ggml's dequantize)."""
    lib = _lib()
    blocks = np.ascontiguousarray(blocks, np.uint8)
    y = np.empty((blocks.shape[0], n_per_row), np.float32)
    rc = lib.dequantize_rows(lib.TYPES[name], blocks, y)
    if rc:
        raise GgufToolError(f"cannot decode {name} blocks: {_ERRORS.get(rc, f'error {rc}')}")
    return y
