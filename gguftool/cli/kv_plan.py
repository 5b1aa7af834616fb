"""gguftool kv-plan: KV-cache bytes per token and the longest context that fits, per cache type."""
from __future__ import annotations

import json

from ..io.reader import GGUFFile
from ..pipeline.kvplan import Shape, plan
from . import formatter
from .size import parse_size

EXAMPLES = """examples:
  gguftool kv-plan model.gguf --memory 2GiB            # weights + KV must fit in 2 GiB
  gguftool kv-plan model.gguf --memory 1GiB --kv-only  # 1 GiB for the cache alone
  gguftool kv-plan --layers 28 --kv-heads 8 --head-dim 128 --memory 3.4GiB --kv-only --format json
"""


def add_parser(sub) -> None:
    p = sub.add_parser("kv-plan", help="KV-cache size per token and longest context per cache type",
                       epilog=EXAMPLES, formatter_class=formatter)
    p.add_argument("model", nargs="?", help="GGUF file (its metadata gives layers, KV heads, head dims)")
    p.add_argument("--memory", required=True, help="budget, e.g. 2GiB")
    p.add_argument("--kv-only", action="store_true", help="the budget is for the cache alone (default: weights + cache)")
    p.add_argument("--layers", type=int)
    p.add_argument("--kv-heads", type=int)
    p.add_argument("--head-dim", type=int)
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.model:
        shape = Shape.from_gguf(GGUFFile(args.model))
    else:
        from ..errors import GgufToolError
        if not (args.layers and args.kv_heads and args.head_dim):
            raise GgufToolError("give a MODEL.gguf, or all of --layers, --kv-heads and --head-dim")
        shape = Shape(args.layers, args.kv_heads, args.head_dim, args.head_dim, 0)
    rows = plan(shape, parse_size(args.memory), kv_only=args.kv_only or not args.model)
    if args.format == "json":
        print(json.dumps({"shape": shape.__dict__, "memory": parse_size(args.memory), "rows": rows}, indent=2))
        return 0
    print(f"{shape.n_layer} layers x {shape.n_head_kv} KV heads x head dim {shape.head_dim_k}/{shape.head_dim_v}"
          + (f", weights {shape.weights_bytes / 2**20:.1f} MiB" if shape.weights_bytes else "")
          + (f"; {shape.swa_layers} sliding-window layers counted in full (--swa-full)" if shape.swa_layers else ""))
    print(f"{'cache':<12}{'KiB/token':>10}{'max context':>14}{'vs f16':>8}")
    for r in rows:
        print(f"{r['type']:<12}{r['bytes_per_token'] / 1024:>10.2f}{r['max_context']:>14,}{r['vs_f16']:>7.2f}x")
    return 0
