"""gguftool inspect: what a GGUF file holds."""
from __future__ import annotations

import json
from collections import defaultdict

from ..io.reader import GGUFFile
from ..io.split import SplitGGUF, open_gguf
from . import formatter

EXAMPLES = """examples:
  gguftool inspect model.gguf
  gguftool inspect model.gguf --tensors
  gguftool inspect model.gguf --format json | jq .types
  gguftool inspect model.gguf --json [--json-array] [--no-tensors]   # gguf-dump --json's output, for our types too
  gguftool inspect model-00001-of-00003.gguf --tensors     # a split model: all shards, as llama.cpp loads them

Upstream's gguf-dump and gguf.GGUFReader stop with a traceback on files that use gguftool's types
(ids 512 and up: "512 is not a valid GGMLQuantizationType"); `gguftool inspect --metadata --tensors`
reads those and every file they read.
"""


def add_parser(sub) -> None:
    p = sub.add_parser("inspect", help="show architecture, size, bits per weight and tensor types of a GGUF file",
                       epilog=EXAMPLES, formatter_class=formatter)
    p.add_argument("file", help="GGUF file")
    p.add_argument("--tensors", action="store_true", help="list every tensor (name, shape, type, bytes)")
    p.add_argument("--metadata", action="store_true", help="list metadata keys (long arrays abbreviated)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    g = p.add_argument_group("gguf-dump's options (the same output, of the file named)")
    g.add_argument("--json", action="store_true", help="the header, metadata and tensor table in gguf-dump's JSON")
    g.add_argument("--json-array", action="store_true", help="with --json: the values of arrays too")
    g.add_argument("--no-tensors", action="store_true", help="with --json: leave the tensors out")
    g.add_argument("--data-offset", action="store_true", help="print where this file's tensor data starts")
    g.add_argument("--data-alignment", action="store_true", help="print this file's data alignment")
    p.set_defaults(func=run)


def summarize(f: GGUFFile | SplitGGUF) -> dict:
    by_type: dict[str, dict[str, float]] = defaultdict(lambda: {"tensors": 0, "params": 0, "bytes": 0})
    for t in f.tensors:
        d = by_type[t.type.name]
        d["tensors"] += 1
        d["params"] += t.n_elements
        d["bytes"] += t.n_bytes
    n_params = sum(t.n_elements for t in f.tensors)
    n_bytes = sum(t.n_bytes for t in f.tensors)
    return {
        "file": str(f.path),
        "architecture": f.architecture,
        "name": f.get("general.name"),
        "parameters": n_params,
        "tensor_bytes": n_bytes,
        "file_bytes": sum(p.stat().st_size for p in f.paths),
        "shards": [str(p) for p in f.paths] if isinstance(f, SplitGGUF) else None,
        "bits_per_weight": 8.0 * n_bytes / n_params if n_params else 0.0,
        "types": {k: {**v, "bpw": 8.0 * v["bytes"] / v["params"]} for k, v in sorted(by_type.items())},
        "gguftool_types": sorted({t.type.name for t in f.tensors if t.type.custom}),
    }


def _short(v):
    if isinstance(v, list) and len(v) > 8:
        return f"[{', '.join(map(repr, v[:4]))}, ... {len(v)} items]"
    return v


def run(args) -> int:
    if args.data_offset or args.data_alignment:   # of the file named, as gguf-dump prints them (a shard's own)
        one = GGUFFile(args.file)
        print(one.data_offset if args.data_offset else one.alignment)
        return 0
    if args.json:
        print(json.dumps(GGUFFile(args.file).dump(args.file, args.json_array, not args.no_tensors)))
        return 0
    f = open_gguf(args.file)
    info = summarize(f)
    if args.tensors:
        info["tensors"] = [{"name": t.name, "shape": list(t.shape), "type": t.type.name, "bytes": t.n_bytes}
                           for t in f.tensors]
    if args.metadata:
        info["metadata"] = {k: _short(v) for k, v in f.metadata.items()}
    if args.format == "json":
        print(json.dumps(info, indent=2, default=str))
        return 0
    print(f"{info['file']}")
    print(f"  architecture  {info['architecture']}" + (f"  ({info['name']})" if info["name"] else ""))
    if info["shards"]:
        print(f"  split         {len(info['shards'])} shards")
    print(f"  parameters    {info['parameters'] / 1e6:.1f} M")
    print(f"  size          {info['tensor_bytes'] / 2**20:.1f} MiB of tensors, {info['file_bytes'] / 2**20:.1f} MiB file")
    print(f"  bits/weight   {info['bits_per_weight']:.3f}")
    print(f"  {'type':<12}{'tensors':>8}{'params':>14}{'MiB':>10}{'bpw':>8}")
    for k, v in info["types"].items():
        print(f"  {k:<12}{v['tensors']:>8}{v['params']:>14,}{v['bytes'] / 2**20:>10.1f}{v['bpw']:>8.3f}")
    if args.metadata:
        for k, v in info["metadata"].items():
            print(f"  {k} = {v}")
    if args.tensors:
        for t in info["tensors"]:
            print(f"  {t['name']:<48}{str(t['shape']):<20}{t['type']:<12}{t['bytes']:>12,}")
    return 0
