"""Which type each tensor gets: llama.cpp's default mixing rules, user overrides, and fallbacks.

Rules follow llama-quantize (src/llama-quant.cpp): only 2-D+ `*.weight` tensors are quantized;
norms and other 1-D tensors keep their type. For llama-quantize's file types (Q4_K_M, ...), the
mix is its own (Options.mix, planned by the native build: pipeline/llama_mix.py). Without it,
`output.weight` (or a tied `token_embd.weight`) stays at Q8_0 where llama.cpp would pick Q6_K on
rows of 256; a tensor whose rows do not divide the block size falls back to a type that fits.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import regex

from ..errors import GgufToolError
from ..quant import codec
from ..types import CUSTOM_TYPES, NATIVE_STOCK, PRODUCIBLE, TensorType
from . import llama_mix
from .source import ModelSource, TensorSource

OUTPUT = "output.weight"
TOKEN_EMBD = "token_embd.weight"
HIGH_PRECISION = "Q8_0"
# Never quantized, whatever the target (llama-quant.cpp's exclusions that apply to 2-D tensors).
# llama-quantize's tensor_allows_quantization (pinned source): these stay as they are, whatever the rules say
KEEP_PATTERNS = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "ssm_conv1d", "altup", "laurel",
                 "per_layer_model_proj", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight")
KEEP_NAMES = ("position_embd.weight", "token_types.weight")
# Fallback chains when the row length does not divide the block size (then Q8_0 or F16, as llama-quantize).
FALLBACK = {**llama_mix.FALLBACK, **{t.name: t.fallback for t in CUSTOM_TYPES if t.fallback}}


@dataclass(frozen=True)
class Rule:
    """`pattern -> type (+ solver parameters)`; the first rule whose regex matches a tensor name wins."""
    pattern: Any   # a compiled `regex` pattern: like re's, but its search can time out
    type: str
    params: dict = field(default_factory=dict)
    origin: str = "--tensor-type"


@dataclass
class Options:
    target: str
    allow_requantize: bool = False
    tensor_types: list[Rule] = field(default_factory=list)  # first match wins
    output_tensor_type: str | None = None
    token_embedding_type: str | None = None
    pure: bool = False
    leave_output_tensor: bool = False
    mix: dict[str, str] | None = None   # llama-quantize's type per tensor for a file type (llama_mix.plan)


@dataclass
class Step:
    tensor: TensorSource
    out_type: TensorType
    action: str          # "copy" (bytes unchanged) or "quantize"
    note: str = ""
    params: dict = field(default_factory=dict)  # solver parameters from the rule that chose the type
    chosen_by: str = ""                          # the rule's pattern, when a rule chose the type
    quantizable: bool = True                     # False: norms, 1-D and excluded tensors, always copied

    @property
    def out_bytes(self) -> int:
        return self.tensor.n_elements // self.out_type.block_size * self.out_type.type_size


@dataclass
class Plan:
    steps: list[Step]

    @property
    def in_bytes(self) -> int:
        return sum(s.tensor.n_bytes for s in self.steps)

    @property
    def out_bytes(self) -> int:
        return sum(s.out_bytes for s in self.steps)

    @property
    def n_params(self) -> int:
        return sum(s.tensor.n_elements for s in self.steps)

    @property
    def notes(self) -> list[str]:
        return [f"{s.tensor.name}: {s.note}" for s in self.steps if s.note]


def parse_tensor_type(spec: str) -> Rule:
    pattern, sep, tname = spec.rpartition("=")
    if not sep or not pattern:
        raise GgufToolError(f"--tensor-type {spec!r}: expected REGEX=TYPE", hint="e.g. --tensor-type 'attn_v=Q8_0'")
    return make_rule(pattern, tname, {}, f"--tensor-type {spec}")


def make_rule(pattern: str, tname: str, params: dict, origin: str) -> Rule:
    try:
        rx = regex.compile(pattern)
    except regex.error as e:
        raise GgufToolError(f"{origin}: bad regular expression {pattern!r}: {e}") from None
    try:
        return Rule(rx, _producible(tname).name, dict(params), origin)
    except GgufToolError as e:
        raise GgufToolError(f"{origin}: {e.message}", e.hint) from None


def _producible(name: str):
    c = codec(name)
    if c.quantize is None:
        raise GgufToolError(f"gguftool cannot produce {c.name} (it can read it)",
                            hint="targets: " + " ".join(PRODUCIBLE))
    if c.name in NATIVE_STOCK:   # before anything is planned or written
        from ..native import ggml_lib
        ggml_lib.require(c.name)
    return c


def _fit(tname: str, n_per_row: int) -> tuple[str, str]:
    """The type itself if its block divides the row, else the first fallback that does."""
    wanted = tname
    while n_per_row % codec(tname).block_size:
        tname = FALLBACK.get(tname) or ("Q8_0" if n_per_row % 32 == 0 else "F16")
    note = f"row of {n_per_row} does not divide {wanted}'s block: using {tname}" if tname != wanted else ""
    return tname, note


def make_plan(src: ModelSource, opts: Options) -> Plan:
    if opts.mix is None:
        _producible(opts.target)
    has_output = OUTPUT in src
    steps, spent = [], {}
    for t in src.tensors:
        tname, note, rule = _choose(t, opts, has_output, spent)
        if tname is None:
            steps.append(Step(t, t.type, "copy", quantizable=False))
            continue
        params, chosen_by = (rule.params, rule.pattern.pattern) if rule else ({}, "")
        tname, fit_note = _fit(tname, t.n_per_row)
        out = codec(tname).type
        if out.id == t.type.id:
            steps.append(Step(t, out, "copy", note, chosen_by=chosen_by))
            continue
        if t.type.quantized and not opts.allow_requantize:
            raise GgufToolError(f"{src.path}: tensor {t.name!r} is already quantized ({t.type.name})",
                                hint="pass --allow-requantize to requantize it (quality is lost twice)")
        if codec(t.type.name).dequantize is None:
            raise GgufToolError(f"{src.path}: tensor {t.name!r} has type {t.type.name}, which gguftool cannot dequantize")
        steps.append(Step(t, out, "quantize", "; ".join(n for n in (note, fit_note) if n), params, chosen_by))
    return Plan(steps)


def unused_rules(plan: Plan, opts: Options) -> list[Rule]:
    """Rules that chose no tensor: a typo in a pattern should not pass silently."""
    used = {s.chosen_by for s in plan.steps}
    return [r for r in opts.tensor_types if r.pattern.pattern not in used]


MATCH_SECONDS = 1.0   # one pattern over all of a plan's tensor names: only catastrophic backtracking takes this long


def matches(rule: Rule, name: str, spent: dict[str, float]) -> bool:
    """rule's pattern found in `name`. A pattern that backtracks without end (a shared recipe can hold one)
    is an error naming it, not a hung run; `spent` holds each pattern's search time so far in this plan, so
    a pattern slow on every name of a large model is stopped too, not only one slow on a single name."""
    key = rule.pattern.pattern
    t0 = time.perf_counter()
    try:
        return rule.pattern.search(name, timeout=max(MATCH_SECONDS - spent.get(key, 0.0), 1e-3)) is not None
    except TimeoutError:
        raise GgufToolError(f"{rule.origin}: the pattern {key!r} took over {MATCH_SECONDS:g} s on the tensor names "
                            f"(at {name!r}: catastrophic backtracking)", hint="simplify it, e.g. (a+)+ -> a+") from None
    finally:
        spent[key] = spent.get(key, 0.0) + time.perf_counter() - t0


def _choose(t: TensorSource, opts: Options, has_output: bool,
            spent: dict[str, float]) -> tuple[str | None, str, Rule | None]:
    """Target type name for one tensor (None: keep it as it is), a note, and the rule that chose it."""
    # the order is llama-quantize's (llama_tensor_get_type): kept tensors, then --token-embedding-type,
    # --output-tensor-type on output.weight, then the --tensor-type rules, then a tied embedding's output type
    name = t.name
    if len(t.shape) < 2 or not name.endswith(".weight"):
        return None, "", None
    if any(p in name for p in KEEP_PATTERNS) or name in KEEP_NAMES:
        return None, "", None
    if name == OUTPUT and opts.leave_output_tensor:
        return None, "", None
    if name == TOKEN_EMBD and opts.token_embedding_type:
        return _producible(opts.token_embedding_type).name, "", None
    if name == OUTPUT and opts.output_tensor_type:
        return _producible(opts.output_tensor_type).name, "", None
    for rule in opts.tensor_types:
        if matches(rule, name, spent):
            return rule.type, f"{rule.origin}", rule
    is_output = name == OUTPUT or (not has_output and name == TOKEN_EMBD)
    if is_output and opts.output_tensor_type:
        return _producible(opts.output_tensor_type).name, "", None
    if opts.mix is not None:   # llama-quantize's own choice (output and fallbacks included)
        if name not in opts.mix:
            raise GgufToolError(f"llama-quantize's {opts.target} plan has no tensor {name!r}")
        return _producible(opts.mix[name]).name, "", None
    if is_output and not opts.pure:
        hp = HIGH_PRECISION if codec(opts.target).bpw < codec(HIGH_PRECISION).bpw else opts.target
        return hp, ("output tensor kept at higher precision" if hp != opts.target else ""), None
    return opts.target, "", None
