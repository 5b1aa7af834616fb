"""Measured per-tensor sensitivity for size targeting (`gguftool sensitivity`, `quantize --sensitivity FILE`).

The size targeting's objective (pipeline/budget.py) adds up each tensor's relative output error, weighted
by role. That misses how much of each tensor's noise reaches the logits: on SmolLM2-135M, blk.11's ffn_down
costs 14x the KLD of blk.26's for the same type step. So this module measures it. For every quantizable
tensor alone, the model is written with that tensor at a probe type (Q4_0 by default; every other tensor as
it is) and scored by the native llama-perplexity against the unchanged model's logits. That KLD, divided by
the tensor's relative error at the probe type, is the tensor's KLD per unit of relative error. The search
then weights each type's error by it, so its objective estimates the KLD of a plan (as the sum of the
tensors' parts: quantizing blk.11's and blk.28's ffn_down together costs 0.0349, alone 0.0291 + 0.0064).

The file is JSON, written whole or not at all; a tensor the probe cannot take (its rows do not divide the
probe's block) is listed under "skipped". A tensor without a measurement (skipped, or left out by --tensors or
--every-block, which measures every n-th block to cut the cost on large models) takes, at planning time, the
value of its role (its name without the block number) interpolated by depth between the nearest measured
blocks, else the median of all.
"""
from __future__ import annotations

import json
import math
import os
import re
import statistics
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import GgufToolError
from ..io.writer import check_output_path, check_replaceable, temporary_path
from ..quant import codec
from .plan import Plan, Step
from .source import ModelSource

FORMAT = "gguftool-sensitivity/1"
DEFAULT_PROBE = "Q4_0"


@dataclass
class Sensitivity:
    """KLD against the unchanged model's logits with each tensor alone at `probe`."""
    path: Path
    probe: str
    kld: dict[str, float]
    skipped: dict[str, str] = field(default_factory=dict)    # tensor -> why it was not measured
    info: dict = field(default_factory=dict)                  # model, text, chunks, ctx, base PPL

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "probe": self.probe, **self.info, "kld": self.kld,
                           "skipped": self.skipped}, indent=1) + "\n"


def role(name: str) -> str:
    """A tensor's role: its name without the block number (blk.11.ffn_down.weight -> ffn_down.weight)."""
    return re.sub(r"^blk\.\d+\.", "", name)


def probe_plan(plan: Plan, probe: str, one: Step) -> Plan:
    """`plan`'s tensors as they are, but `one` at `probe`."""
    out = codec(probe).type
    return Plan([replace(s, out_type=out, action="quantize") if s is one else
                 replace(s, out_type=s.tensor.type, action="copy") for s in plan.steps])


def block_of(name: str) -> int | None:
    m = re.match(r"blk\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def sampled_blocks(n_blocks: int, every: int) -> set[int]:
    """Blocks 0, every, 2*every, ... and the last (the first and last blocks are often the sensitive ones)."""
    return {*range(0, n_blocks, every), n_blocks - 1}


def measure(src: ModelSource, model: Path, out: Path, text: Path, *, probe: str = DEFAULT_PROBE, chunks: int = 2,
            ctx: int = 512, threads: int = 2, select: str | None = None, every_block: int = 1) -> Sensitivity:
    """One native llama-perplexity run per quantizable tensor (select: a regex on the names to measure only
    some; every_block: only the tensors of sampled_blocks() besides those outside the blocks) -> `out`."""
    from . import plan as planning
    from .kvcalib import kld
    from .progress import bar
    from .quantize import run as write_model
    check_output_path(out, [model, text])
    c = codec(probe)
    if c.quantize is None:
        raise GgufToolError(f"--probe {probe}: gguftool cannot write this type", hint="use Q4_0 or Q4_HQQ_128")
    plan = planning.make_plan(src, planning.Options(target="F32", pure=True, allow_requantize=True))
    rule, spent = planning.make_rule(select, probe, {}, "--tensors") if select else None, {}
    free = [s for s in plan.steps if s.quantizable and (rule is None or planning.matches(rule, s.tensor.name, spent))]
    if every_block > 1:
        from .budget import n_blocks
        keep = sampled_blocks(n_blocks(src), every_block)
        free = [s for s in free if block_of(s.tensor.name) is None or block_of(s.tensor.name) in keep]
    if not free:
        raise GgufToolError(f"{model}: no quantizable tensor" + (f" matches {select!r}" if select else ""))
    skipped = {s.tensor.name: f"rows of {s.tensor.n_per_row} do not divide {probe}'s block of {c.block_size}"
               for s in free if s.tensor.n_per_row % c.block_size}
    todo = [s for s in free if s.tensor.name not in skipped]
    result = {}
    with tempfile.TemporaryDirectory(prefix="gguftool-sensitivity-", dir=out.resolve().parent) as tmp, \
            bar(len(todo) + 1, f"sensitivity {model.name}", unit="run") as pb:
        ref, probe_file = Path(tmp) / "base.kld", Path(tmp) / "probe.gguf"
        kw = dict(chunks=chunks, ctx=ctx, threads=threads)
        base = kld(model, text, ref, "f16", "f16", make_ref=True, **kw)
        pb.update()
        for s in todo:
            write_model(src, probe_plan(plan, probe, s), probe_file, target=probe, threads=threads)
            result[s.tensor.name] = kld(probe_file, text, ref, "f16", "f16", **kw)["kld"]
            pb.update()
    info = {"model": model.name, "tensors": len([s for s in plan.steps if s.quantizable]), "text": text.name,
            "chunks": chunks, "ctx": ctx, "base_ppl": base.get("ppl")}
    if every_block > 1:
        info["every_block"] = every_block
    sens = Sensitivity(out, probe, result, skipped, info)
    tmp_out = temporary_path(out, "gguftool-tmp")
    try:
        tmp_out.write_text(sens.to_json())
        check_replaceable(out)
        os.replace(tmp_out, out)
    finally:
        tmp_out.unlink(missing_ok=True)
    return sens


def load(path: Path, src: ModelSource) -> Sensitivity:
    """A `gguftool sensitivity` file, checked: its format, probe type, finite non-negative values, and tensor
    names that `src` has (a file measured on another model is refused)."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise GgufToolError(f"{path}: no such sensitivity file", hint="make one with `gguftool sensitivity MODEL`") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GgufToolError(f"{path}: not a gguftool sensitivity file ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise GgufToolError(f"{path}: not a gguftool sensitivity file (format {got!r}, expected {FORMAT!r})")
    probe, kld, skipped = doc.get("probe"), doc.get("kld"), doc.get("skipped", {})
    try:
        c = codec(probe) if isinstance(probe, str) else None
    except GgufToolError:
        c = None
    if c is None or c.quantize is None:
        raise GgufToolError(f"{path}: probe {probe!r} is not a type gguftool writes")
    if not isinstance(kld, dict) or not isinstance(skipped, dict):
        raise GgufToolError(f"{path}: 'kld' and 'skipped' must be objects of tensor name -> value")
    names = {t.name for t in src.tensors}
    for name, v in kld.items():
        if name not in names:
            raise GgufToolError(f"{path}: tensor {name!r} is not in {src.path}: measured on another model?",
                                hint=f"measure this one: gguftool sensitivity {src.path}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise GgufToolError(f"{path}: tensor {name!r}: KLD {v!r} is not a finite number >= 0")
    if not kld:
        raise GgufToolError(f"{path}: no tensor was measured")
    return Sensitivity(Path(path), probe, {k: float(v) for k, v in kld.items()}, dict(skipped),
                       {k: v for k, v in doc.items() if k not in ("format", "probe", "kld", "skipped")})


def weights(sens: Sensitivity, probe_error: dict[str, float]) -> dict[str, float]:
    """Each tensor's KLD per unit of relative error: its measured KLD over its relative error at the probe type
    (probe_error, as budget.measure gives it). A tensor without both (not measured, or the probe leaves it
    unchanged: it already is on the probe's grid) takes its role's value interpolated linearly by block between
    the nearest measured blocks below and above (the nearest one beyond the ends), else the median of all."""
    own = {n: sens.kld[n] / e for n, e in probe_error.items() if n in sens.kld and e > 1e-12}
    by_role: dict[str, list[tuple[int, float]]] = {}
    for n, w in own.items():
        if block_of(n) is not None:
            by_role.setdefault(role(n), []).append((block_of(n), w))
    overall = statistics.median(own.values()) if own else 1.0

    def guess(n: str) -> float:
        b, known = block_of(n), sorted(by_role.get(role(n), []))
        if b is None or not known:
            return overall
        below = [p for p in known if p[0] <= b]
        above = [p for p in known if p[0] >= b]
        if not above:
            return below[-1][1]
        if not below:
            return above[0][1]
        (b0, w0), (b1, w1) = below[-1], above[0]
        return w0 if b1 == b0 else w0 + (w1 - w0) * (b - b0) / (b1 - b0)
    return {n: own[n] if n in own else guess(n) for n in probe_error}
