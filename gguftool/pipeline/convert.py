"""Checkpoint -> GGUF in one pass: the quantize pipeline's plan and writer, fed by a converted checkpoint.

Converting and quantizing is one streaming step (llama.cpp needs two: convert_hf_to_gguf.py to F16,
then llama-quantize): each tensor is read from the safetensors, permuted if needed, quantized by the
same plan rules and codecs as `gguftool quantize`, written, and dropped.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..convert.model import F32_NAMES, HFModel
from . import plan as planning
from .quantize import run as run_pipeline

DEFAULT_OUTTYPE = "F16"  # convert_hf_to_gguf.py's default


def make_plan(model: HFModel, opts: planning.Options) -> planning.Plan:
    """llama-quantize's mixing rules, plus convert_hf_to_gguf.py's F32 tensors (position and token-type
    embeddings) unless a user rule chose their type."""
    opts.allow_requantize = True  # BF16/F16 checkpoints are the input here, not a quantized model
    plan = planning.make_plan(model, opts)
    for i, s in enumerate(plan.steps):
        if s.tensor.name in F32_NAMES and s.action != "copy" and not s.chosen_by:
            plan.steps[i] = planning.Step(s.tensor, s.tensor.type, "copy", "kept F32, as llama.cpp's converter does")
    return plan


def convert(model: HFModel, out: Path, opts: planning.Options, *, threads: int = 1,
            params: dict[str, Any] | None = None, record: dict[str, str] | None = None,
            plan: planning.Plan | None = None, imatrix=None, overrides=None) -> planning.Plan:
    plan = plan or make_plan(model, opts)
    run_pipeline(model, plan, Path(out), target=opts.target, threads=threads, params=params or {},
                 record={"convert.outtype": opts.target, **(record or {})}, imatrix=imatrix, overrides=overrides)
    return plan
