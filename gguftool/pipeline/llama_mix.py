"""llama-quantize's file types (Q4_K_M, IQ3_S, ...) and its per-tensor rules.

A file type is a mix: llama_tensor_get_type (src/llama-quant.cpp) picks each tensor's type from the
architecture, layer, shape and tensor kind. That function changes with every model llama.cpp adds, so
we never port it: the native build's own llama-quantize plans the mix (`--dry-run`, which reads only
the header) and gguftool applies its usual rules (--tensor-type, recipes, HQQ) on top. The small
tables below are llama-quantize's data (pinned source), checked against its dry runs by the tests.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import gguf
import numpy as np

from ..errors import GgufToolError
from .source import ModelSource

# llama-quantize's QUANT_OPTIONS names (pinned tools/quantize/quantize.cpp), all but COPY.
FTYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4_MOE", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S",
          "IQ1_M", "TQ1_0", "TQ2_0", "Q2_K", "Q2_K_S", "IQ3_XXS", "IQ3_S", "IQ3_M", "Q3_K_S", "Q3_K_M", "Q3_K_L",
          "IQ3_XS", "IQ4_NL", "IQ4_XS", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "F16", "BF16", "F32", "Q1_0", "Q2_0")
ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}   # as llama-quantize reads them

# tensor_type_fallback: a type whose block does not divide the row -> the type llama-quantize uses
# (then F16 if that does not divide either).
FALLBACK = {**dict.fromkeys(("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS"), "IQ4_NL"),
            **dict.fromkeys(("Q2_0", "Q2_K", "Q3_K", "TQ1_0", "TQ2_0"), "Q4_0"),
            "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}

# llama_ftype values (pinned include/llama.h) of file types that gguf.LlamaFileType lacks
FILE_TYPE_IDS_GGUF_LACKS = {"Q2_0": 41}

# tensor_requires_imatrix: types that give garbage without an importance matrix
NEEDS_IMATRIX = ("IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_M", "IQ1_S")

_LINE = re.compile(r"^\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[[^\]]*\], type =\s*(\S+), size =[^(]*(?:\((\S+)\))?\s*$")


def ftype(name: str) -> str | None:
    """The llama-quantize file type a target names (aliases resolved), or None."""
    n = ALIASES.get(name.upper(), name.upper())
    return n if n in FTYPES else None


def file_type_id(name: str) -> int | None:
    """general.file_type for llama-quantize's file type `name` (or a plain type name: ALL_F32, MOSTLY_*)."""
    if name == "F32":
        return int(gguf.LlamaFileType.ALL_F32)
    member = getattr(gguf.LlamaFileType, f"MOSTLY_{name}", None)
    return int(member) if member is not None else FILE_TYPE_IDS_GGUF_LACKS.get(name)


def requires_imatrix(tensor: str, type_name: str, file_type: str | None) -> bool:
    """llama-quantize refuses these tensors without an importance matrix."""
    if tensor in ("token_embd.weight", "output.weight"):
        return False
    return type_name in NEEDS_IMATRIX or (type_name == "Q2_K" and file_type == "Q2_K_S")


class PlanError(GgufToolError):
    """llama-quantize ran (or could not be started) and gave no plan: not a fault gguftool found in the input."""


def plan(model: Path, file_type: str, *, pure: bool = False, imatrix: Path | None = None,
         prune: list[int] | None = None) -> dict[str, str]:
    """{tensor name: type name} as the native build's llama-quantize would write `model` as `file_type`
    (prune: --prune-layers; the names are then the renumbered ones)."""
    from ..native import tools
    exe = tools.tool("llama-quantize")
    cmd = [str(exe), "--dry-run", *(["--pure"] if pure else []),
           *(["--prune-layers", ",".join(map(str, prune))] if prune else []),
           *(["--imatrix", str(imatrix)] if imatrix else []), str(model), file_type]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PlanError(f"{exe}: the {file_type} plan failed: {e}") from None
    types: dict[str, str] = {}
    for line in (r.stdout + r.stderr).splitlines():
        m = _LINE.match(line.strip())
        if m:
            name, cur, new = m.groups()
            types[name] = (new or cur).upper()
    if r.returncode != 0 or not types:
        tail = "\n  ".join((r.stderr or r.stdout).strip().splitlines()[-6:])
        raise PlanError(f"{model}: llama-quantize could not plan {file_type} (exit {r.returncode}):\n  {tail}",
                            hint=f"command: {' '.join(cmd)}")
    return types


def plan_model(src: ModelSource, file_type: str, *, pure: bool = False, imatrix: Path | None = None) -> dict[str, str]:
    """plan() for any model source: a GGUF file as it is, a checkpoint through a skeleton GGUF of it."""
    prune = getattr(src, "pruned", None)   # a pipeline.prune.PrunedSource: plan the pruned model
    if Path(src.path).is_file():
        return plan(Path(src.path), file_type, pure=pure, imatrix=imatrix, prune=prune)
    with tempfile.TemporaryDirectory(prefix="gguftool-plan-") as d:
        return plan(skeleton(src, Path(d) / "skeleton.gguf"), file_type, pure=pure, imatrix=imatrix)


class _Collector:
    """StreamingWriter's add(), into a plain GGUFWriter: what a checkpoint's write_metadata calls."""

    def __init__(self, w: gguf.GGUFWriter):
        self.w = w

    def add(self, key, value, vtype, sub_type=None) -> None:
        if key != gguf.Keys.General.ARCHITECTURE:
            self.w.add_key_value(key, value, vtype, sub_type)


def skeleton(src: ModelSource, path: Path) -> Path:
    """`src`'s metadata and tensor table over a data section that is a hole in the file (sparse, no disk
    used): all llama-quantize --dry-run reads, without converting the weights first."""
    w = gguf.GGUFWriter(path, src.architecture)
    src.write_metadata(_Collector(w))
    data = 0
    for t in src.tensors:
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.n_bytes, raw_dtype=t.type.id)
        data += -(-t.n_bytes // w.data_alignment) * w.data_alignment
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    end = w.fout[0].tell()
    w.close()
    os.truncate(path, -(-end // w.data_alignment) * w.data_alignment + data)
    return path
