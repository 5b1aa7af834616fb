"""gguftool quantize: requantize a GGUF file, llama-quantize style, to standard or gguftool types."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..errors import GgufToolError
from ..io.reader import GGUFFile
from ..io.writer import check_output_path
from ..pipeline import plan as planning
from ..pipeline.quantize import run as run_quantize
from . import formatter

EXAMPLES = """examples:
  gguftool quantize model-f16.gguf model-q4hqq.gguf Q4_HQQ
  gguftool quantize model-q4_1.gguf out.gguf Q4_HQQ --allow-requantize
  gguftool quantize in.gguf out.gguf Q4_1 --solver hqq          # HQQ-solved Q4_1: runs on stock llama.cpp
  gguftool quantize in.gguf out.gguf Q4_HQQ --tensor-type 'attn_v=Q8_0' --output-tensor-type F16
  gguftool quantize in.gguf out.gguf TQ3_0 --dry-run            # print the plan and size, write nothing
  gguftool quantize in.gguf out.gguf --recipe phone-small        # a named plan (gguftool recipes list)
  gguftool quantize in.gguf out.gguf --recipe phone-small --target-bpw 4.5 --dry-run

types: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 (bit-identical to llama.cpp's reference quantizers),
       Q4_HQQ (5.0 bpw) Q4_HQQ_128 (4.25 bpw) TQ3_0 (3.5 bpw)
"""


def add_parser(sub) -> None:
    p = sub.add_parser("quantize", help="requantize a GGUF file (llama-quantize options, plus HQQ and TQ3_0)",
                       epilog=EXAMPLES, formatter_class=formatter)
    p.add_argument("input", type=Path)
    p.add_argument("output", type=Path)
    p.add_argument("type", nargs="?", help="target type for the weight tensors (default: the recipe's)")
    p.add_argument("--allow-requantize", action="store_true", help="allow input tensors that are already quantized")
    p.add_argument("--target-bpw", type=float, metavar="X",
                   help="choose per-tensor types from the recipe's allowed set to meet X bits per weight")
    p.add_argument("--target-size", metavar="SIZE", help="like --target-bpw, for a file size such as 1.0GB")
    add_plan_args(p)
    p.set_defaults(func=run)


def add_plan_args(p) -> None:
    """The planning options of quantize, shared by convert and hub under the same names."""
    p.add_argument("--recipe", metavar="NAME|FILE", help="a named plan from `gguftool recipes list`, or a TOML file")
    p.add_argument("--tensor-type", action="append", default=[], metavar="REGEX=TYPE",
                   help="type for tensors whose GGUF name matches REGEX (repeatable, first match wins)")
    p.add_argument("--output-tensor-type", metavar="TYPE", help="type for output.weight")
    p.add_argument("--token-embedding-type", metavar="TYPE", help="type for token_embd.weight")
    p.add_argument("--pure", action="store_true", help="no mixing: every quantizable tensor gets TYPE")
    p.add_argument("--leave-output-tensor", action="store_true", help="keep output.weight as it is")
    p.add_argument("--dry-run", action="store_true", help="print the per-tensor plan and the size; write nothing")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format of --dry-run")
    p.add_argument("--threads", "-t", type=int, default=os.cpu_count() or 1)
    s = p.add_argument_group("HQQ solver (Q4_HQQ, Q4_HQQ_128; Q4_1/Q5_1 with --solver hqq)")
    s.add_argument("--solver", choices=("ref", "hqq"), help="for Q4_1/Q5_1: llama.cpp's reference (default) or HQQ")
    s.add_argument("--hqq-iters", type=int, help="proximal iterations (default 20)")
    s.add_argument("--hqq-lp-norm", type=float, help="p of the lp-norm shrinkage (default 0.7)")
    s.add_argument("--hqq-beta", type=float, help="initial beta (default 10)")
    s.add_argument("--hqq-kappa", type=float, help="beta growth per iteration (default 1.01)")
    s.add_argument("--hqq-scale-search", type=int,
                   help="0 = the min-max scale only (default); n = also try 2n scales: ~6%% lower error, ~2x the time")
    s.add_argument("--hqq-refit", type=int,
                   help="rounds of least-squares refit of scale/zero (default 2); 0 with scale search 0 = plain HQQ")


def solver_params(args) -> dict:
    names = {"hqq_iters": "iters", "hqq_lp_norm": "lp_norm", "hqq_beta": "beta", "hqq_kappa": "kappa",
             "hqq_scale_search": "scale_search", "hqq_refit": "refit"}
    params = {v: getattr(args, k) for k, v in names.items() if getattr(args, k) is not None}
    if args.solver:
        params["solver"] = args.solver
    return params


def make_options(args) -> tuple[planning.Options, "Recipe | None"]:
    from ..pipeline.recipe import load
    recipe = load(args.recipe) if args.recipe else None
    if not args.type and recipe is None:
        raise GgufToolError("give a TYPE or a --recipe", hint="e.g. `gguftool quantize in.gguf out.gguf Q4_HQQ`")
    opts = planning.Options(
        target=args.type.upper() if args.type else "",
        allow_requantize=args.allow_requantize,
        tensor_types=[planning.parse_tensor_type(s) for s in args.tensor_type],
        output_tensor_type=args.output_tensor_type,
        token_embedding_type=args.token_embedding_type,
        pure=args.pure,
        leave_output_tensor=args.leave_output_tensor,
    )
    return (recipe.options(opts) if recipe else opts), recipe


def budget_bytes(args, plan: planning.Plan) -> int | None:
    if args.target_bpw is not None and args.target_size is not None:
        raise GgufToolError("give --target-bpw or --target-size, not both")
    if args.target_bpw is not None:
        return int(args.target_bpw * plan.n_params / 8)
    if args.target_size is not None:
        from ..pipeline.kvplan import parse_size
        return parse_size(args.target_size)
    return None


def run(args) -> int:
    src = GGUFFile(args.input)
    opts, recipe = make_options(args)
    plan = planning.make_plan(src, opts)
    for rule in planning.unused_rules(plan, opts):
        print(f"warning: {rule.origin}: pattern {rule.pattern.pattern!r} matches no tensor", file=sys.stderr)
    params = {**(recipe.solver if recipe else {}), **solver_params(args)}
    budget = budget_bytes(args, plan)
    if budget is not None:
        from ..pipeline.budget import fit
        allowed = recipe.allowed if recipe and recipe.allowed else [opts.target]
        plan = fit(src, plan, allowed, budget, params)
    if args.dry_run:
        print_plan(plan, args.format)
        return 0
    check_output_path(args.output, [args.input])
    for note in plan.notes:
        print(f"note: {note}", file=sys.stderr)
    record = {"quantize.params": json.dumps(params, sort_keys=True)} if params else {}
    if recipe:
        record.update({"recipe.name": recipe.name, "recipe.toml": recipe.text})
    run_quantize(src, plan, args.output, target=opts.target, threads=args.threads, params=params, record=record)
    print(f"{args.output}: {plan.out_bytes / 2**20:.1f} MiB, {8 * plan.out_bytes / plan.n_params:.3f} bpw "
          f"(from {plan.in_bytes / 2**20:.1f} MiB)")
    return 0


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
