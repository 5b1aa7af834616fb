"""gguftool recipes: the named quantization plans."""
from __future__ import annotations

import json

from ..pipeline.recipe import available, load
from . import formatter

EXAMPLES = """examples:
  gguftool recipes list
  gguftool recipes show phone-small
  gguftool quantize model.gguf out.gguf --recipe phone-small
"""


def add_parser(sub) -> None:
    p = sub.add_parser("recipes", help="list and show named quantization plans", epilog=EXAMPLES,
                       formatter_class=formatter)
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    ls = verbs.add_parser("list", help="the recipes shipped with gguftool")
    ls.add_argument("--format", choices=("text", "json"), default="text")
    ls.set_defaults(func=run_list)
    show = verbs.add_parser("show", help="a recipe's TOML")
    show.add_argument("name", help="recipe name or TOML file")
    show.set_defaults(func=run_show)


def run_list(args) -> int:
    rows = []
    for name in available():
        r = load(name)
        rows.append({"name": r.name, "type": r.type, "kv": r.kv, "kv_calibrate": r.kv_calibrate,
                     "description": r.description, "path": str(r.path)})
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        kv = f"K {r['kv'].get('k', '-')} / V {r['kv'].get('v', '-')}" if r["kv"] else ""
        kv += " (calibrated)" if r["kv_calibrate"] else ""
        print(f"{r['name']:<18}{r['type']:<12}{kv:<36}{r['description']}")
    return 0


def run_show(args) -> int:
    print(load(args.name).text, end="")
    return 0
