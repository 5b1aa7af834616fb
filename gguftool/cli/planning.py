"""What quantize, convert and hub share: the planning options and the plan -> warnings -> write flows
for a GGUF file (requantize) and for a checkpoint directory (convert)."""
from __future__ import annotations

import json
import logging
import math
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from gguf import GGUFValueType

from .. import types
from ..errors import GgufToolError
from ..io.writer import check_output_path, temporary_path
from ..pipeline import plan as planning
from ..pipeline.quantize import ignored_params
from ..pipeline.source import ModelSource
from .args import did_you_mean, positive

HQQ_OURS = ", ".join(t.name for t in types.of_family("hqq"))
HQQ_STOCK = "/".join(types.HQQ_STOCK_TARGETS)
SOLVER_PARAMS = {"hqq_iters": "iters", "hqq_lp_norm": "lp_norm", "hqq_beta": "beta", "hqq_kappa": "kappa",
                 "hqq_scale_search": "scale_search", "hqq_refit": "refit"}


def add_plan_args(p) -> None:
    """The planning options, under the same names in every command that writes a model."""
    p.add_argument("--recipe", metavar="NAME|FILE", help="a named plan from `gguftool recipes list`, or a TOML file")
    p.add_argument("--tensor-type", action="append", default=[], metavar="REGEX=TYPE",
                   help="type for tensors whose GGUF name matches REGEX (repeatable, first match wins)")
    p.add_argument("--tensor-type-file", type=Path, metavar="FILE",
                   help="more REGEX=TYPE rules, separated by white space (after the --tensor-type ones)")
    p.add_argument("--override-kv", action="append", default=[], metavar="KEY=TYPE:VALUE",
                   help="set metadata in the output, TYPE int, float, bool or str (repeatable)")
    p.add_argument("--output-tensor-type", metavar="TYPE", help="type for output.weight")
    p.add_argument("--token-embedding-type", metavar="TYPE", help="type for token_embd.weight")
    p.add_argument("--pure", action="store_true", help="no mixing: every quantizable tensor gets TYPE")
    p.add_argument("--leave-output-tensor", action="store_true", help="keep output.weight as it is")
    p.add_argument("--dry-run", action="store_true", help="print the per-tensor plan and the size; write nothing")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format of --dry-run")
    p.add_argument("--imatrix", type=Path, metavar="FILE",
                   help="importance matrix (GGUF or legacy .dat, from llama-imatrix or `gguftool imatrix`)")
    p.add_argument("--include-weights", action="append", default=[], metavar="NAME",
                   help="use the importance matrix only for tensors whose name contains NAME (repeatable)")
    p.add_argument("--exclude-weights", action="append", default=[], metavar="NAME",
                   help="do not use the importance matrix for tensors whose name contains NAME (repeatable)")
    p.add_argument("--threads", "-t", type=positive, default=os.cpu_count() or 1)
    p.add_argument("--no-kv-calibrate", action="store_true",
                   help="skip the kv-calibrate step of a recipe whose [kv] says calibrate = true")
    s = p.add_argument_group(f"HQQ solver ({HQQ_OURS}; {HQQ_STOCK} with --solver hqq)")
    s.add_argument("--solver", choices=("ref", "hqq"), help=f"for {HQQ_STOCK}: llama.cpp's reference (default) or HQQ; "
                   "for Q4_K/Q5_K/Q6_K (and the K mixes): ggml's blocks re-searched for a lower error (docs/stock-types.md)")
    s.add_argument("--hqq-iters", type=int, help="proximal iterations (default 20)")
    s.add_argument("--hqq-lp-norm", type=float, help="p of the lp-norm shrinkage (default 0.7)")
    s.add_argument("--hqq-beta", type=float, help="initial beta (default 10)")
    s.add_argument("--hqq-kappa", type=float, help="beta growth per iteration (default 1.01)")
    s.add_argument("--hqq-scale-search", type=int,
                   help="0 = the min-max scale only (default without --imatrix); n = also try 2n scales: ~6%% lower "
                        "error, ~2x the time (default 1 with --imatrix)")
    s.add_argument("--hqq-refit", type=int,
                   help="rounds of least-squares refit of scale/zero (default 2); 0 with scale search 0 = plain HQQ")


def add_checkpoint_args(p) -> None:
    """The planning options for a float checkpoint, which is never "already quantized"."""
    add_plan_args(p)
    p.add_argument("--tokenizer-pre", metavar="NAME",
                   help="llama.cpp pre-tokenizer name, when gguftool does not recognise tokenizer.json's")
    p.set_defaults(allow_requantize=True)


def options(args, default_type: str | None = None):
    """(planning options, solver parameters, record entries, recipe) from the shared arguments."""
    from ..pipeline.recipe import load
    recipe = load(args.recipe) if args.recipe else None
    target = args.type or (default_type if recipe is None else None)
    if not target and recipe is None:
        raise GgufToolError("give a TYPE or a --recipe", hint="e.g. `gguftool quantize in.gguf out.gguf Q4_HQQ`")
    if target:
        check_target(target)
    opts = planning.Options(
        target=target.upper() if target else "",
        allow_requantize=args.allow_requantize,
        tensor_types=[planning.parse_tensor_type(s) for s in [*args.tensor_type, *tensor_type_file(args)]],
        output_tensor_type=args.output_tensor_type,
        token_embedding_type=args.token_embedding_type,
        pure=args.pure,
        leave_output_tensor=args.leave_output_tensor,
    )
    if recipe:
        opts = recipe.options(opts)
    params = {v: getattr(args, k) for k, v in SOLVER_PARAMS.items() if getattr(args, k) is not None}
    if args.solver:
        params["solver"] = args.solver
    params = {**(recipe.solver if recipe else {}), **params}
    record = {"quantize.params": json.dumps(params, sort_keys=True)} if params else {}
    if recipe:
        record.update({"recipe.name": recipe.name, "recipe.toml": recipe.text})
    return opts, params, record, recipe


def check_target(name: str) -> None:
    """TYPE names a type gguftool writes or one of llama-quantize's mixes; else the error lists both."""
    from ..pipeline import llama_mix
    from ..quant import all_codecs, codec
    if llama_mix.ftype(name):
        return
    try:
        codec(name)
    except GgufToolError as e:
        if "unknown quantization type" not in e.message:   # a known type whose extension failed to load
            raise
        single = sorted(c.name for c in all_codecs() if c.quantize is not None)
        mixes = [n for n in llama_mix.FTYPES if n not in single]
        raise GgufToolError(f"unknown quantization type {name!r}" + did_you_mean(name.upper(), [*single, *mixes]),
                            hint=f"types: {', '.join(single)}; llama-quantize's mixes: {', '.join(mixes)}") from None


TENSOR_TYPE_FILE_MAX = 16 * 2**20   # far above any real rule list (llama-quantize's are a few KiB)


def tensor_type_file(args) -> list[str]:
    """llama-quantize's --tensor-type-file: REGEX=TYPE entries separated by white space."""
    path = getattr(args, "tensor_type_file", None)
    if path is None:
        return []
    try:
        if path.exists() and not path.is_file():   # a FIFO or /dev/zero would be read without end
            raise GgufToolError(f"{path}: the tensor type file is not a regular file")
        with open(path, "rb") as f:
            data = f.read(TENSOR_TYPE_FILE_MAX + 1)
        if len(data) > TENSOR_TYPE_FILE_MAX:
            raise GgufToolError(f"{path}: the tensor type file is over {TENSOR_TYPE_FILE_MAX // 2**20} MiB",
                                hint="it holds REGEX=TYPE lines; is this the right file?")
        return data.decode().split()
    except (OSError, UnicodeDecodeError) as e:
        raise GgufToolError(f"{path}: cannot read the tensor type file: {getattr(e, 'strerror', None) or e}") from None


def parse_override_kv(spec: str) -> tuple[str, tuple[object, GGUFValueType]]:
    """KEY=TYPE:VALUE as llama-quantize reads it (an int is written as the uint32 of its magnitude, as there),
    but a value that does not parse is an error, not a zero."""
    key, sep, rest = spec.partition("=")
    kind, colon, text = rest.partition(":")
    if not sep or not key or len(key) >= 128 or not colon:
        raise GgufToolError(f"--override-kv {spec!r}: expected KEY=TYPE:VALUE", hint="e.g. --override-kv general.name=str:tiny")
    try:
        if kind == "int":
            v = abs(int(text))
            if v >= 2**32:
                raise ValueError("beyond uint32")
            return key, (v, GGUFValueType.UINT32)
        if kind == "float":
            f = float(text)
            if not math.isfinite(f):
                raise ValueError("not finite")
            return key, (f, GGUFValueType.FLOAT32)
        if kind == "bool" and text in ("true", "false"):
            return key, (text == "true", GGUFValueType.BOOL)
        if kind == "str" and len(text) <= 127:
            return key, (text, GGUFValueType.STRING)
    except ValueError as e:
        raise GgufToolError(f"--override-kv {spec!r}: {text!r} is not a valid {kind} ({e})") from None
    raise GgufToolError(f"--override-kv {spec!r}: TYPE must be int, float, bool (true/false) or str (up to 127 chars)")


def check_overrides(overrides: dict[str, tuple[object, GGUFValueType]], arch: str) -> None:
    """--override-kv of a key gguftool or llama.cpp reads must give it the type and range they read:
    an output with `llama.block_count=str:x` is a file neither can load."""
    from ..io.reader import value_problem
    for key, (value, vtype) in overrides.items():
        if (problem := value_problem(key, arch, vtype, value)) is not None:
            raise GgufToolError(f"--override-kv {key}: {problem}")


def side_inputs(args) -> list[Path]:
    """Files the run reads besides the model: never an output."""
    return [p for p in (args.imatrix, getattr(args, "tensor_type_file", None), getattr(args, "sensitivity", None))
            if p is not None]


def load_imatrix(args):
    """--imatrix with --include-weights / --exclude-weights (llama-quantize's options), or None."""
    if args.include_weights and args.exclude_weights:
        raise GgufToolError("--include-weights and --exclude-weights cannot be used together (as in llama-quantize)")
    if args.imatrix is None:
        if args.include_weights or args.exclude_weights:
            raise GgufToolError("--include-weights / --exclude-weights select from an importance matrix: add --imatrix FILE")
        return None
    from ..io.imatrix import load
    return load(args.imatrix).select(args.include_weights, args.exclude_weights)


def llama_file_type(opts: planning.Options, src: ModelSource, imatrix_path: Path | None) -> None:
    """A llama-quantize file type as target (Q4_K_M, IQ3_S, also Q4_0): its own per-tensor mix, planned by
    the native build's llama-quantize. Without the build, the K/IQ mixes cannot be made; the legacy
    types keep gguftool's rules (the same but for a Q6_K output on rows of 256)."""
    from ..native import tools
    from ..pipeline import llama_mix
    ft = llama_mix.ftype(opts.target)
    if ft is None:
        return
    legacy = ft in types.STOCK_PRODUCIBLE
    try:
        tools.find_build()
    except GgufToolError as e:
        if legacy:
            return
        raise GgufToolError(f"{opts.target} is a llama-quantize mix of ggml's own quantizers: it needs the native "
                            f"build ({e.message})", hint="run `gguftool native build` (~5 min on 2 cores)") from None
    try:
        opts.mix = llama_mix.plan_model(src, ft, pure=opts.pure, imatrix=imatrix_path)
    except llama_mix.PlanError as e:   # llama-quantize could not plan it (an architecture it does not know):
        if not legacy:                 # gguftool's rules still make the legacy types; input errors go through
            raise
        warn(f"{e.message.splitlines()[0]}; using gguftool's rules for {ft}")
        return
    opts.target = ft


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def execute(args, src: ModelSource, out: Path, inputs: list[Path], opts: planning.Options, params: dict,
            write: Callable[[planning.Plan], None], *, make_plan=planning.make_plan,
            refine: Callable[[planning.Plan], planning.Plan] | None = None) -> planning.Plan | None:
    """Plan, warn, then print the plan (--dry-run: returns None) or write the output with `write`."""
    plan = make_plan(src, opts)
    for rule in planning.unused_rules(plan, opts):
        warn(f"{rule.origin}: pattern {rule.pattern.pattern!r} matches no tensor")
    if refine is not None:
        plan = refine(plan)
    if args.dry_run:
        print_plan(plan, args.format)
        return None
    check_output_path(out, inputs)
    for message in ignored_params(plan, params):
        warn(message)
    for note in plan.notes:
        print(f"note: {note}", file=sys.stderr)
    write(plan)
    return plan


def requantize(args, src_path: Path, out: Path, *, default_type: str | None = None, record: dict | None = None,
               refine=None, split=None):
    """A GGUF file (or the first shard of a split one) -> `out` by the shared options; refine(src, plan, opts,
    params, recipe, imatrix=, file_bytes=) may change the plan (size targets; file_bytes(plan): the size of
    the one-file output that plan writes); split: a gguftool.io.split.SplitSpec (an empty layout:
    the input's). Returns (plan, opts, files written), or None after --dry-run."""
    from ..io.split import SplitGGUF, open_gguf
    from ..pipeline.quantize import run as run_quantize
    src, pruned = open_gguf(src_path), None
    if getattr(args, "prune_layers", None):
        from ..pipeline.prune import PrunedSource, parse_layers
        if split is not None and split.layout == {}:
            raise GgufToolError("--prune-layers with --keep-split is not supported: give --split-max-size/-tensors")
        src = pruned = PrunedSource(src, parse_layers(args.prune_layers))
    if split is not None and split.layout == {}:   # --keep-split
        if not isinstance(src, SplitGGUF):
            warn(f"--keep-split: {src_path} is not split, so neither is the output")
            split = None
        else:
            split = replace(split, layout={t.name: src.shard_of(t.name) for t in src.tensors})
    written = []
    opts, params, rec, recipe = options(args, default_type)
    imatrix = load_imatrix(args)
    if imatrix is not None and pruned is not None:   # made on the whole model: follow the renumbering
        imatrix = pruned.follow(imatrix)
    overrides = dict(parse_override_kv(o) for o in args.override_kv)
    check_overrides(overrides, src.architecture)
    llama_file_type(opts, src, args.imatrix)

    def write(plan):
        written[:] = run_quantize(src, plan, out, target=opts.target, threads=args.threads, params=params,
                                  record={**rec, **(record or {})}, imatrix=imatrix, split=split,
                                  overrides=overrides)

    def file_bytes(plan):
        from ..pipeline.quantize import file_bytes
        return file_bytes(src, plan, out, target=opts.target, params=params, record={**rec, **(record or {})},
                          imatrix=imatrix, overrides=overrides)

    plan = execute(args, src, out, [*src.paths, *side_inputs(args)], opts, params, write,
                   refine=(lambda p: refine(src, p, opts, params, recipe, imatrix=imatrix, file_bytes=file_bytes))
                   if refine else None)
    if plan is not None:
        kv_calibrate(args, recipe, written[0], shard=split is not None)
    return None if plan is None else (plan, opts, written)


def kv_calibrate(args, recipe, out: Path, shard: bool = False) -> None:
    """A recipe whose KV cache types were measured on a kv-calibrated file gets the calibration in its
    output (needs the native build; without it, a warning says how to add it later). shard: `out` is the
    first shard of a split output, which alone holds the metadata, so only it is rewritten."""
    if recipe is None or not recipe.kv_calibrate or args.no_kv_calibrate:
        return
    from ..native import tools
    from ..pipeline import kvcalib
    from ..validate.session import default_text
    try:
        tools.tool("gguftool-kvdump")
    except GgufToolError as e:
        warn(f"recipe {recipe.name}'s KV cache ({recipe.kv.get('k')}/{recipe.kv.get('v')}) wants kv-calibrate, "
             f"which needs the native build ({e.message}); later: gguftool native build && "
             f"gguftool kv-calibrate {out} {out.with_suffix('')}-kv.gguf")
        return
    tmp = temporary_path(out, "kv-calibrate")
    try:
        layers = kvcalib.layer_plans(out, k=recipe.kv_layers.get("k"), v=recipe.kv_layers.get("v"))
        done = kvcalib.run(out, tmp, default_text(), threads=args.threads, shard=shard, layers=layers)
        os.replace(tmp, out)
    except GgufToolError as e:   # e.g. an encoder-only model: the weights are written, only the cache step fails
        warn(f"{out} is written without the KV calibration of recipe {recipe.name}: {e.message}")
        return
    finally:
        tmp.unlink(missing_ok=True)
    plans = "".join(f"; with -ct{side} {p.base}, layers {p.spec}" for side, p in done.plans.items())
    print(f"{out}: kv-calibrated on {default_text().name} for its K/V cache "
          f"{recipe.kv.get('k')}/{recipe.kv.get('v')} (recipe {recipe.name}){plans}")


def quiet_gguf_logs() -> None:
    # gguf's SpecialVocab logs each special-token kind llama.cpp has no key for (e.g. BERT's cls); not actionable
    if not os.environ.get("GGUFTOOL_DEBUG"):
        logging.getLogger("gguf").setLevel(logging.ERROR)
        logging.getLogger("gguf.vocab").setLevel(logging.ERROR)


def convert(args, model_dir: Path, out: Path, *, record: dict | None = None, name: str | None = None,
            default_type: str | None = None) -> int:
    """A Hugging Face checkpoint directory -> `out`, converted and quantized in one pass."""
    from ..convert import open_model
    from ..pipeline.convert import DEFAULT_OUTTYPE, make_plan
    from ..pipeline.convert import convert as run_convert
    quiet_gguf_logs()
    opts, params, rec, recipe = options(args, default_type or DEFAULT_OUTTYPE)
    model = open_model(model_dir, tokenizer_pre=args.tokenizer_pre, name=name)
    imatrix = load_imatrix(args)
    overrides = dict(parse_override_kv(o) for o in args.override_kv)
    check_overrides(overrides, model.architecture)
    llama_file_type(opts, model, args.imatrix)

    def write(plan):
        run_convert(model, out, opts, threads=args.threads, params=params, record={**rec, **(record or {})}, plan=plan,
                    imatrix=imatrix, overrides=overrides)

    plan = execute(args, model, out, [model_dir, *side_inputs(args)], opts, params, write, make_plan=make_plan)
    if plan is not None:
        kv_calibrate(args, recipe, out)
        print(f"{out}: {model.architecture} ({model.hf_arch}), {len(plan.steps)} tensors, {size_summary(plan)} "
              f"(from {model.checkpoint.n_bytes / 2**20:.1f} MiB of safetensors), tokenizer pre {model.tokenizer_pre!r}")
    return 0


def size_summary(plan: planning.Plan) -> str:
    return f"{plan.out_bytes / 2**20:.1f} MiB, {8 * plan.out_bytes / plan.n_params:.3f} bpw"


def print_plan(plan: planning.Plan, fmt: str) -> None:
    rows = [{"name": s.tensor.name, "shape": list(s.tensor.shape), "from": s.tensor.type.name,
             "to": s.out_type.name, "action": s.action, "bytes": s.out_bytes, "note": s.note} for s in plan.steps]
    summary = {"tensors": rows, "input_bytes": plan.in_bytes, "output_bytes": plan.out_bytes,
               "bits_per_weight": 8 * plan.out_bytes / plan.n_params}
    if fmt == "json":
        print(json.dumps(summary, indent=2))
        return
    for r in rows:
        print(f"{r['name']:<44}{r['from']:>8} -> {r['to']:<11}{r['action']:<9}{r['bytes']:>12,}  {r['note']}")
    print(f"total: {plan.in_bytes / 2**20:.1f} MiB -> {plan.out_bytes / 2**20:.1f} MiB, "
          f"{summary['bits_per_weight']:.3f} bpw")
