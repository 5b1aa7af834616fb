"""gguftool kv-plan: KV-cache size, longest context and measured quality per K/V pair; the best pair for a budget."""
from __future__ import annotations

import dataclasses
import json

from ..errors import GgufToolError
from ..io.split import open_gguf
from ..pipeline import kvplan
from ..pipeline.kvplan import DEFAULT_PAIRS, Shape
from . import formatter
from .args import positive
from .size import parse_size

EXAMPLES = """examples:
  gguftool kv-plan model.gguf --memory 2GiB                  # weights + KV must fit in 2 GiB
  gguftool kv-plan model.gguf --memory 1GiB --ctx 16384      # which pair holds 16k tokens best
  gguftool kv-plan model.gguf --memory 1GiB --kv q8_0/tq3_1 --kv q4_0   # just these pairs
  gguftool kv-plan --layers 28 --kv-heads 8 --head-dim 128 --memory 3.4GiB --kv-only --format json

Quality is measured, not modelled: PPL change and mean KLD against the f16 cache on SmolLM2-135M and
Gemma 3 270M (40 x 512 tokens of a text not used for calibration; docs/kv.md). A file carries
gguftool kv-calibrate's calibration or not; llama.cpp (our build) applies it to every quantized cache.
Counted besides the cache: the weights and llama.cpp's CPU compute buffer, estimated as one micro-batch of
float logits plus activations (100 MiB for SmolLM2-135M, 517 MiB for Gemma 3 270M; measured 98-99 / 514).
"""


def add_parser(sub) -> None:
    p = sub.add_parser("kv-plan", help="KV-cache size, longest context and measured quality per K/V pair",
                       epilog=EXAMPLES, formatter_class=formatter)
    p.add_argument("model", nargs="?", help="GGUF file (its metadata gives layers, KV heads, head dims, window)")
    p.add_argument("--memory", required=True, help="budget, e.g. 2GiB")
    p.add_argument("--ctx", type=positive, default=None, help="the context to plan for (default: the trained length)")
    p.add_argument("--kv", action="append", default=None, metavar="K/V",
                   help=f"a K/V pair to size, repeatable (default: {', '.join(DEFAULT_PAIRS)})")
    p.add_argument("--kv-only", action="store_true", help="the budget is for the cache alone (default: weights + cache)")
    p.add_argument("--swa-full", action="store_true", help="size sliding-window layers in full, as llama.cpp's --swa-full")
    p.add_argument("--layers", type=positive)
    p.add_argument("--kv-heads", type=positive)
    p.add_argument("--head-dim", type=positive)
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=run)


def _q(q: dict) -> str:
    return " ".join(f"{x['kld']:.3f}" for x in q.values()) if q else "-"


def run(args) -> int:
    if args.model:
        shape = Shape.from_gguf(open_gguf(args.model))
    else:
        if not (args.layers and args.kv_heads and args.head_dim) or min(args.layers, args.kv_heads, args.head_dim) < 1:
            raise GgufToolError("give a MODEL.gguf, or all of --layers, --kv-heads and --head-dim (positive)")
        shape = Shape(args.layers, args.kv_heads, args.head_dim, args.head_dim, 0)
    if args.ctx is not None and args.ctx < 1:
        raise GgufToolError(f"--ctx must be at least 1 (got {args.ctx})")
    memory = parse_size(args.memory)
    ctx = args.ctx or shape.n_ctx_train or None
    pairs = tuple(args.kv) if args.kv else DEFAULT_PAIRS
    rows = kvplan.plan(shape, memory, ctx=ctx, kv_only=args.kv_only or not args.model, pairs=pairs,
                       swa_full=args.swa_full)
    if not rows:
        raise GgufToolError(f"no cache type of {', '.join(pairs)} divides head dim {shape.head_dim_k}/{shape.head_dim_v}")
    now = kvplan.best(rows, calibrated=shape.calibrated)
    cal = None if shape.calibrated else kvplan.best(rows, calibrated=True)
    if args.format == "json":
        print(json.dumps({"shape": dataclasses.asdict(shape), "memory": memory, "ctx": ctx, "rows": rows,
                          "best": now and now["pair"], "best_after_kv_calibrate": cal and cal["pair"]}, indent=2))
        return 0
    models = list(kvplan.measured()["models"])
    print(f"{shape.n_layer} layers x {shape.n_head_kv} KV heads x head dim {shape.head_dim_k}/{shape.head_dim_v}"
          + (f", weights {shape.weights_bytes / 2**20:.1f} MiB" if shape.weights_bytes else "")
          + (f", trained context {shape.n_ctx_train:,}" if shape.n_ctx_train else "")
          + (f"; {shape.swa_layers} sliding-window layers ({shape.swa_window} tokens"
             + (", sized in full)" if args.swa_full else ")") if shape.swa_layers else "")
          + ("; kv-calibrated" if shape.calibrated else "; not kv-calibrated"))
    for side, lp in (("k", shape.k_plan), ("v", shape.v_plan)):
        if lp is not None:
            print(f"the file plans {side.upper()} cache types: with -ct{side} {lp.base}, layers {lp.spec} "
                  f"(GGUFTOOL_KV_LAYERS_{side.upper()}=off runs {lp.base} on every layer)")
    w = max(14, *(len(r["pair"]) + 2 for r in rows))
    head = f"{'K/V':<{w}}{'bits':>6}{'KiB/token':>10}{'max ctx':>10}"
    if ctx:
        head += f"{f'MiB@{ctx}':>12}"
    head += f"  {'KLD ' + '/'.join(m.split('-')[0].split()[0] for m in models):<18}{'class':<18}"
    if not shape.calibrated:
        head += "after kv-calibrate"
    print(head)
    for r in rows:
        line = f"{r['pair']:<{w}}{r['bits_per_value']:>6.2f}{r['bytes_per_token'] / 1024:>10.2f}{r['max_context']:>10,}"
        if ctx:
            line += f"{r['kv_bytes_at_ctx'] / 2**20:>11.1f}{'' if r['fits'] else '!'}"
            line += " " if r["fits"] else ""
        line += f"  {_q(r['quality']):<18}{r['class']:<18}"
        if not shape.calibrated:
            line += f"{_q(r['quality_calibrated'])} {r['class_calibrated']}"
        print(line.rstrip())
    where = f"at {ctx:,} tokens" if ctx else "in the budget"
    if shape.n_ctx_train and ctx and ctx > shape.n_ctx_train:
        print(f"note: {ctx:,} tokens is beyond the model's trained context ({shape.n_ctx_train:,})")
    if now:
        print(f"best measured pair {where}: {now['pair']} ({now['class']})")
    elif any(r.get("fits", r["max_context"] > 0) for r in rows):
        print(f"none of the pairs that fit {where} is measured on a file "
              f"{'with' if shape.calibrated else 'without'} kv-calibrate")
    else:
        print(f"no pair fits {where}; '!' marks the caches over budget")
    if cal and (not now or cal["pair"] != now["pair"] or cal["class_calibrated"] != now["class"]):
        print(f"after gguftool kv-calibrate: {cal['pair']} ({cal['class_calibrated']})")
    return 0
