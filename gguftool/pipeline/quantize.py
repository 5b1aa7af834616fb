"""Requantize a GGUF file by a plan, streaming tensor by tensor (row chunks for big tensors)."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType

from .. import types
from ..errors import GgufToolError
from ..io.imatrix import Imatrix
from ..io.split import SplitSpec, SplitWriter
from ..io.writer import StreamingWriter
from ..quant import Codec, codec
from ..quant.parallel import map_row_ranges
from ..quant.rows import BlockRangeError
from . import llama_mix
from .plan import Plan
from .progress import bar
from .source import ModelSource, TensorSource

CHUNK_VALUES = 1 << 24  # ~64 MiB of float32 per step: memory stays flat for any model size


def solver_params(c: Codec, params: dict[str, Any]) -> dict[str, Any]:
    """The subset of user solver parameters that codec `c` takes."""
    if "solver" in c.params:  # a stock layout: parameters apply only with the hqq solver
        return dict(params) if params.get("solver", "ref") != "ref" else {}
    return {k: v for k, v in params.items() if k in c.params}


def _uses_hqq(type_name: str, params: dict[str, Any]) -> bool:
    """One of our hqq-family types, or a stock layout the solver fills when asked (solver "hqq")."""
    t = types.lookup(type_name)
    if t is not None:
        return t.family == "hqq"
    return type_name in types.HQQ_STOCK_TARGETS and params.get("solver") == "hqq"


def _hqq_steps(plan: Plan, params: dict[str, Any]) -> list:
    return [s for s in plan.steps if s.action == "quantize" and _uses_hqq(s.out_type.name, {**params, **s.params})]


def ignored_params(plan: Plan, params: dict[str, Any]) -> list[str]:
    """A warning naming the HQQ parameters that no tensor of `plan` uses (none when some tensor does)."""
    ignored = sorted(k for k, v in params.items() if k != "solver" or v == "hqq")
    if not ignored or _hqq_steps(plan, params):
        return []
    from ..quant.standard import KQ_SEARCH  # solver "hqq" also runs gguftool's search for these K types
    if ignored == ["solver"] and any(s.action == "quantize" and s.out_type.name in KQ_SEARCH
                                     and {**params, **s.params}.get("solver") == "hqq" for s in plan.steps):
        return []
    ours = ", ".join(t.name for t in types.of_family("hqq"))
    return [f"HQQ parameters {ignored} ignored: no tensor uses the HQQ solver "
            f"(it fills {ours}, and {'/'.join([*types.HQQ_STOCK_TARGETS, *KQ_SEARCH])} with --solver hqq)"]


def dequantize_rows(src: ModelSource, t: TensorSource, r0: int, r1: int) -> np.ndarray:
    rows = t.raw_rows()[r0:r1]
    return np.asarray(codec(t.type.name).dequantize(rows), dtype=np.float32).reshape(r1 - r0, t.n_per_row)


def importance(imatrix: Imatrix | None, t: TensorSource) -> np.ndarray | None:
    """The tensor's importance weights [n_mat, n_per_row], as llama-quantize picks them (none found: None)."""
    vec = imatrix.entries.get(t.name) if imatrix else None
    if vec is None:
        return None
    n_mat = t.n_rows // t.shape[-2] if len(t.shape) > 2 else 1
    if vec.size != n_mat * t.n_per_row:
        if t.name.startswith("token_embd."):   # llama-quantize ignores a mismatch here only
            return None
        raise GgufToolError(f"{imatrix.path}: {t.name} has {vec.size} importance values, the tensor needs "
                            f"{n_mat * t.n_per_row} ({n_mat} x {t.n_per_row})", hint="was it made for another model?")
    return vec.reshape(n_mat, t.n_per_row)


def quantize_tensor(src: ModelSource, t: TensorSource, out: Codec, threads: int, params: dict[str, Any], progress=None,
                    weights: np.ndarray | None = None):
    """Yields the output bytes of `t` chunk by chunk, as uint8 [rows, row_bytes]. Each thread
    decodes its own rows to float32 and quantizes them, so decoding runs in parallel too.
    weights: importance [n_mat, n_per_row]; row r of the tensor uses matrix r // (rows per matrix)."""
    step = max(1, CHUNK_VALUES // t.n_per_row)
    p = solver_params(out, params)
    per_mat = t.n_rows // len(weights) if weights is not None else t.n_rows

    def encode(x: np.ndarray, r0: int) -> np.ndarray:
        if weights is None or not out.importance:
            return out.quantize(x, threads=1, **p)
        parts, r = [], r0   # split at matrix (expert) boundaries: each has its own weights
        while r < r0 + len(x):
            m = r // per_mat
            r1 = min(r0 + len(x), (m + 1) * per_mat)
            try:
                parts.append(out.quantize(x[r - r0:r1 - r0], threads=1, imatrix=weights[m], **p))
            except BlockRangeError as e:
                raise e.at(r - r0) from None
            r = r1
        return np.concatenate(parts)

    def rows(r0: int, r1: int) -> np.ndarray:
        x = dequantize_rows(src, t, r0, r1)
        with np.errstate(over="ignore", invalid="ignore"):   # a NaN or Inf anywhere makes the sum non-finite
            suspect = not np.isfinite(x.sum())
        if suspect and not np.isfinite(x).all():
            r, c = np.argwhere(~np.isfinite(x))[0]
            raise GgufToolError(f"{src.path}: tensor {t.name!r} holds {x[r, c]} at row {r0 + r}, column {c}",
                                hint="the model is broken; fix the source weights (no type can encode NaN/Inf)")
        try:
            return encode(x, r0)
        except BlockRangeError as e:   # its row counts from x's first: name the tensor's row
            e = e.at(r0)
            raise GgufToolError(f"tensor {t.name!r}: {e.message}", e.hint) from None
        except GgufToolError as e:
            raise GgufToolError(f"tensor {t.name!r}: {e.message}", e.hint) from None

    for r0 in range(0, t.n_rows, step):
        r1 = min(t.n_rows, r0 + step)
        q = map_row_ranges(lambda a, b, r0=r0: rows(r0 + a, r0 + b), r1 - r0, threads)
        if progress is not None:
            progress.update((r1 - r0) * t.n_per_row * t.type.type_size // t.type.block_size)
        yield q


def check_importance(plan: Plan, imatrix: Imatrix | None, file_type: str | None) -> None:
    """Before anything is written: the tensors llama-quantize would refuse without importance data."""
    for s in plan.steps:
        if s.action == "quantize" and llama_mix.requires_imatrix(s.tensor.name, s.out_type.name, file_type):
            if imatrix is None or s.tensor.name not in imatrix.entries:
                raise GgufToolError(f"{s.tensor.name} -> {s.out_type.name} needs an importance matrix"
                                    + (f" ({imatrix.path} has no entry for it)" if imatrix else ""),
                                    hint="pass --imatrix FILE (make one with `gguftool imatrix MODEL --text FILE`)")
            importance(imatrix, s.tensor)   # a size mismatch fails here too


def imatrix_record(imatrix: Imatrix) -> dict[str, Any]:
    """llama-quantize's quantize.imatrix.* keys (tools/quantize/quantize.cpp)."""
    rec = {"quantize.imatrix.file": (str(imatrix.path), GGUFValueType.STRING),
           "quantize.imatrix.entries_count": (len(imatrix.entries), GGUFValueType.INT32),
           "quantize.imatrix.chunks_count": (imatrix.chunk_count, GGUFValueType.INT32)}
    if imatrix.datasets:
        rec["quantize.imatrix.dataset"] = (imatrix.datasets[0], GGUFValueType.STRING)
    return rec


def run(src: ModelSource, plan: Plan, out_path: Path, *, target: str, threads: int = 1,
        params: dict[str, Any] | None = None, record: dict[str, str] | None = None,
        imatrix: Imatrix | None = None, split: SplitSpec | None = None,
        overrides: dict[str, tuple[Any, GGUFValueType]] | None = None) -> list[Path]:
    """Writes `out_path` (split: its shards, llama-gguf-split's format); returns the files written.
    overrides: metadata set last, as llama-quantize's --override-kv."""
    params = params or {}
    check_importance(plan, imatrix, llama_mix.ftype(target))
    w = StreamingWriter(out_path, src.architecture) if split is None else \
        SplitWriter(out_path, src.architecture, split, getattr(src, "paths", [src.path]))
    declare(w, src, plan, target=target, params=params, record=record, imatrix=imatrix, overrides=overrides)
    with w.session(), bar(plan.in_bytes, f"quantize {Path(out_path).name}") as pb:
        w.begin()
        for s in plan.steps:
            t = s.tensor
            if s.action == "copy":
                w.write(t.raw_rows())
                pb.update(t.n_bytes)
            else:
                w.write_chunks(quantize_tensor(src, t, codec(s.out_type.name), threads, {**params, **s.params}, pb,
                                               importance(imatrix, t)))
            src.release(t)
        w.commit()
    return w.paths if isinstance(w, SplitWriter) else [Path(out_path)]


def file_bytes(src: ModelSource, plan: Plan, out_path: Path, **kw) -> int:
    """The size of the one-file output run() writes for `plan` (same keyword arguments, no split), exactly."""
    w = StreamingWriter(out_path, src.architecture)
    declare(w, src, plan, **kw)
    return w.planned_bytes()


def declare(w, src: ModelSource, plan: Plan, *, target: str, params: dict[str, Any] | None = None,
            record: dict[str, str] | None = None, imatrix: Imatrix | None = None,
            overrides: dict[str, tuple[Any, GGUFValueType]] | None = None) -> None:
    """Everything of run()'s output but the tensor data: metadata, records, tensor infos."""
    params = params or {}
    file_type = llama_mix.ftype(target)
    src.write_metadata(w)
    custom = types.lookup(target)
    # our llama.cpp build numbers a custom type's file type by its type id (what its llama-quantize writes)
    ftype = custom.id if custom else llama_mix.file_type_id(file_type or target)
    if ftype is not None:
        w.add("general.file_type", ftype, GGUFValueType.UINT32)
    else:
        w.remove("general.file_type")
    for key, (value, vtype) in {**(imatrix_record(imatrix) if imatrix else {}), **(overrides or {})}.items():
        w.add(key, value, vtype)
    record = {"quantize.target": target, **(record or {})}
    hqq_steps = _hqq_steps(plan, params)
    if hqq_steps:
        from ..quant.hqq import DEFAULTS, WEIGHTED_SCALE_SEARCH, HQQParams
        for s in hqq_steps:   # a bad parameter fails here, before anything is written
            HQQParams.make(**solver_params(codec(s.out_type.name), {**params, **s.params}))
        record["hqq.defaults"] = json.dumps(asdict(DEFAULTS), sort_keys=True)   # they change between versions
        if imatrix is not None:   # what the weighted solves used where --hqq-scale-search was not given
            record["hqq.weighted_defaults"] = json.dumps({"scale_search": WEIGHTED_SCALE_SEARCH})
    w.add_tool_record(record)
    for s in plan.steps:
        w.add_tensor_info(s.tensor.name, s.tensor.shape, s.out_type)
