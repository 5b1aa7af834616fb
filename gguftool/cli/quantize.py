"""gguftool quantize: requantize a GGUF file, llama-quantize style, to standard or gguftool types."""
from __future__ import annotations

import math
import sys
from pathlib import Path

from .. import types
from ..errors import GgufToolError
from ..io.split import SplitSpec
from ..pipeline.llama_mix import FTYPES
from . import formatter
from .planning import add_plan_args, requantize, size_summary

EXAMPLES = """examples:
  gguftool quantize model-f16.gguf model-q4hqq.gguf Q4_HQQ
  gguftool quantize model-q4_1.gguf out.gguf Q4_HQQ --allow-requantize
  gguftool quantize in.gguf out.gguf Q4_1 --solver hqq          # HQQ-solved Q4_1: runs on stock llama.cpp
  gguftool quantize in.gguf out.gguf Q4_HQQ --tensor-type 'attn_v=Q8_0' --output-tensor-type F16
  gguftool quantize in.gguf out.gguf TQ3_0 --dry-run            # print the plan and size, write nothing
  gguftool quantize in.gguf out.gguf --recipe phone-small        # a named plan (gguftool recipes list)
  gguftool quantize in.gguf out.gguf --recipe phone-small --target-bpw 4.5 --dry-run
  gguftool quantize model-f16.gguf out.gguf Q4_K_M             # llama-quantize's mix, its bytes (native build)
  gguftool quantize model-f16.gguf out.gguf IQ3_S --imatrix model.imatrix.gguf   # (gguftool imatrix MODEL)
  gguftool quantize in.gguf out.gguf Q4_HQQ --split-max-size 2G   # out-00001-of-0000N.gguf (llama-gguf-split's format)
  gguftool quantize in-00001-of-00003.gguf out.gguf Q4_HQQ --keep-split   # a split input: give its first shard

types: {stock} (bit-identical to llama.cpp's reference quantizers),
       with the native build also llama-quantize's file types ({mixes})
       and tensor types {native} (ggml's own quantizers),
       {ours}
""".format(stock=" ".join(types.STOCK_PRODUCIBLE), mixes=" ".join(n for n in FTYPES if n not in types.STOCK_PRODUCIBLE),
           native=" ".join(types.NATIVE_STOCK), ours=" ".join(f"{t.name} ({t.bpw} bpw)" for t in types.CUSTOM_TYPES))


def add_parser(sub) -> None:
    p = sub.add_parser("quantize", help="requantize a GGUF file (llama-quantize options, plus HQQ and TQ3_0)",
                       epilog=EXAMPLES, formatter_class=formatter)
    p.add_argument("input", type=Path)
    p.add_argument("output", type=Path)
    p.add_argument("type", nargs="?", help="target type for the weight tensors (default: the recipe's)")
    p.add_argument("--allow-requantize", action="store_true", help="allow input tensors that are already quantized")
    p.add_argument("--prune-layers", metavar="IDS", help="drop these blocks (e.g. 20,21), renumber the rest (llama-quantize)")
    p.add_argument("--target-bpw", type=float, metavar="X",
                   help="choose per-tensor types from the recipe's allowed set to meet X bits per weight")
    p.add_argument("--target-size", metavar="SIZE", help="like --target-bpw, for a file size such as 1.0GB")
    p.add_argument("--sensitivity", type=Path, metavar="FILE",
                   help="with a target: weight each tensor by its measured KLD (from `gguftool sensitivity`)")
    add_plan_args(p)
    s = p.add_argument_group("split output (llama-gguf-split's shards; llama.cpp loads the first)")
    s.add_argument("--split-max-size", metavar="N[M|G]",
                   help="at most N bytes of tensor data per shard (M = 10^6, G = 10^9 as in llama-gguf-split; MiB, GiB too)")
    s.add_argument("--split-max-tensors", type=int, metavar="N", help="at most N tensors per shard")
    s.add_argument("--keep-split", action="store_true", help="split the output as the (split) input is split")
    p.set_defaults(func=run)


def budget_bytes(args, n_params: int) -> int | None:
    """--target-bpw: bytes of tensor data (bits per weight as size_summary counts them); --target-size: bytes of
    the whole file."""
    if args.target_bpw is not None and args.target_size is not None:
        raise GgufToolError("give --target-bpw or --target-size, not both")
    if args.target_bpw is not None:
        if not args.target_bpw > 0:
            raise GgufToolError(f"--target-bpw must be positive (got {args.target_bpw})")
        return int(args.target_bpw * n_params / 8)
    if args.target_size is not None:
        from .size import parse_size
        size = parse_size(args.target_size)
        if size < 1:
            raise GgufToolError(f"--target-size must be positive (got {args.target_size!r})", hint="e.g. 150M, 1.2G")
        return size
    return None


def allowed_types(plan, opts, recipe) -> list[str]:
    """The types size targeting chooses from: the recipe's `allowed`, else TYPE and the types the plan gives
    (a llama-quantize mix such as Q4_K_M: the types of its own mix, e.g. Q4_K, Q6_K)."""
    if recipe and recipe.allowed:
        return list(recipe.allowed)
    from ..quant import codec
    planned = [s.out_type.name for s in plan.steps if s.quantizable]
    target = [opts.target] if opts.mix is None and opts.target in types.PRODUCIBLE else []
    return sorted(set(target + planned), key=lambda n: (codec(n).bpw, n))


def fit_budget(args):
    """--target-bpw / --target-size: per-tensor types from the recipe's allowed set (or TYPE and the plan's types)
    to meet it, never worse by the objective than the best uniform plan that fits (pipeline/budget.py)."""
    def refine(src, plan, opts, params, recipe, imatrix=None, file_bytes=None):
        budget = target = budget_bytes(args, plan.n_params)
        if budget is None:
            return plan
        from ..pipeline.budget import calibration_bytes, search
        whole = args.target_size is not None
        if whole and split_spec(args) is not None:
            raise GgufToolError("--target-size counts one output file: not with --split-max-size/-tensors/--keep-split",
                                hint="use --target-bpw with a split output")
        if whole and recipe is not None and recipe.kv_calibrate and not args.no_kv_calibrate:
            budget -= calibration_bytes(src, args.output.name)   # kv-calibrate adds its keys to the file afterwards
        allowed = allowed_types(plan, opts, recipe)
        sens = None
        if args.sensitivity is not None:
            from ..pipeline.sensitivity import load
            sens = load(args.sensitivity, src)
        fit = search(src, plan, allowed, budget, params, imatrix=imatrix, file_bytes=file_bytes if whole else None,
                     sensitivity=sens)
        uni = fit.best_uniform
        what = f"--target-size {args.target_size}" if whole else f"--target-bpw {args.target_bpw:g}"
        against = f"; the best uniform plan that fits, {uni[0]}, scores {uni[2]:.4g}" if uni else \
            "; no uniform plan fits"
        near = fit.near_uniform()
        if near:
            over = near[1] - fit.data_budget
            take = f"--target-size {file_bytes(fit.plan_of(near[0])) + target - budget}" if whole else \
                f"--target-bpw {math.ceil(near[1] * 8000 / plan.n_params) / 1000:g}"
            against += f"; {near[0]}, {100 * over / fit.data_budget:.2g}% over the budget, scores {near[2]:.4g} ({take} takes it)"
        by = [w for w, on in (("the importance matrix", imatrix is not None), ("measured sensitivity", sens)) if on]
        print(f"note: {what}: {fit.chosen} of {', '.join(allowed)}{' with ' + ' and '.join(by) if by else ''}, "
              f"estimated {'KLD' if sens else 'error'} {fit.objective:.4g}{against}", file=sys.stderr)
        return fit.plan
    return refine


def split_spec(args) -> SplitSpec | None:
    """--split-max-size / --split-max-tensors / --keep-split (one of them, as in llama-gguf-split), or None."""
    given = [o for o, v in (("--split-max-size", args.split_max_size), ("--split-max-tensors", args.split_max_tensors),
                            ("--keep-split", args.keep_split)) if v]
    if len(given) > 1:
        raise GgufToolError(f"give one of {' / '.join(given)}, not both")
    if args.split_max_tensors is not None and args.split_max_tensors < 1:
        raise GgufToolError(f"--split-max-tensors must be at least 1 (got {args.split_max_tensors})")
    if args.split_max_size is not None:
        from .size import parse_size
        size = parse_size(args.split_max_size)
        if size < 1:
            raise GgufToolError(f"--split-max-size must be positive (got {args.split_max_size!r})", hint="e.g. 2G, 500M")
        return SplitSpec(max_size=size)
    if args.split_max_tensors:
        return SplitSpec(max_tensors=args.split_max_tensors)
    return SplitSpec(layout={}) if args.keep_split else None   # planning fills the input's layout


def run(args) -> int:
    if args.sensitivity is not None and args.target_bpw is None and args.target_size is None:
        raise GgufToolError("--sensitivity weights size targeting: give --target-bpw or --target-size with it")
    done = requantize(args, args.input, args.output, refine=fit_budget(args), split=split_spec(args))
    if done:
        plan, _, paths = done
        where = args.output if len(paths) == 1 else f"{paths[0]} (first of {len(paths)} shards)"
        print(f"{where}: {size_summary(plan)} (from {plan.in_bytes / 2**20:.1f} MiB)")
    return 0
