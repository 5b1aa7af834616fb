"""gguftool native: build and describe the patched llama.cpp (CPU tools with our types)."""
from __future__ import annotations

import json
import sys

from ..errors import GgufToolError
from . import formatter
from .args import positive

EXAMPLES = """examples:
  gguftool native build                 # fetch pinned llama.cpp, add our types, build (~4 min, cached)
  gguftool native build -j 2 --force    # rebuild even when the cache key matches
  gguftool native info                  # where the tools are, pinned version, kernel hashes
  gguftool native info --format json

The cache lives in ~/.cache/gguftool/native (override with GGUFTOOL_NATIVE_DIR).
Offline: download the pinned sdist elsewhere and set GGUFTOOL_NATIVE_SDIST=/path/to/it.
"""


def add_parser(sub) -> None:
    p = sub.add_parser("native", help="build the pinned llama.cpp with gguftool's types (CPU tools)",
                       epilog=EXAMPLES, formatter_class=formatter)
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    b = verbs.add_parser("build", help="fetch, integrate and build (reuses the cache when nothing changed)",
                         epilog=EXAMPLES, formatter_class=formatter)
    b.add_argument("-j", "--jobs", type=positive, default=2, help="parallel compile jobs (default 2)")
    b.add_argument("--portable", action="store_true", help="GGML_NATIVE=OFF (no -march=native)")
    b.add_argument("--force", action="store_true", help="rebuild even if the cache key matches")
    b.add_argument("--format", choices=("text", "json"), default="text")
    b.set_defaults(func=run_build)
    i = verbs.add_parser("info", help="show the pinned source and the cached build",
                         epilog=EXAMPLES, formatter_class=formatter)
    i.add_argument("--portable", action="store_true", help="describe the portable build")
    i.add_argument("--format", choices=("text", "json"), default="text")
    i.set_defaults(func=run_info)


def _say(args):
    return (lambda *a: print(*a, file=sys.stderr)) if args.format == "json" else print


def run_build(args) -> int:
    from ..native import build
    if args.jobs < 1:
        raise GgufToolError(f"--jobs must be >= 1, got {args.jobs}")
    r = build.build(jobs=args.jobs, native=not args.portable, force=args.force, log=_say(args))
    out = {"build_dir": str(r.build_dir), "bin_dir": str(r.bin_dir), "reused": r.reused,
           "seconds": round(r.seconds, 1), "key": r.key, "tools": {t: str(r.tool(t)) for t in build.TARGETS}}
    if args.format == "json":
        print(json.dumps(out, indent=1))
    else:
        print(f"{'reused cached build' if r.reused else 'built'} in {r.seconds:.1f} s: {r.bin_dir}")
        for t in build.TARGETS:
            print(f"  {r.tool(t)}")
    return 0


def run_info(args) -> int:
    from ..native import build, source, tools
    pin = source.PINNED
    out = {
        "cache_root": str(source.cache_root()),
        "source": {"package": f"{pin.package}=={pin.version}", "sha256": pin.sha256, "url": pin.url,
                   "llama_commit": pin.llama_commit, "llama_commit_date": pin.llama_commit_date,
                   "ggml_version": pin.ggml_version},
        "cmake_options": build.cmake_options(not args.portable),
        "build": None,
    }
    try:
        r = tools.find_build(native=not args.portable)
        out["build"] = {"dir": str(r.build_dir), **r.info}
    except GgufToolError as e:
        out["build_missing"] = f"{e.message}; {e.hint}"
    if args.format == "json":
        print(json.dumps(out, indent=1))
        return 0
    print(f"cache:   {out['cache_root']}")
    print(f"source:  {out['source']['package']} (sha256 {pin.sha256[:16]}...), "
          f"llama.cpp {pin.llama_commit[:7]} ({pin.llama_commit_date}), ggml {pin.ggml_version}")
    print(f"options: {' '.join(out['cmake_options'])}")
    if out["build"]:
        b = out["build"]
        print(f"build:   {b['dir']} (built {b.get('built_at')}, {b.get('seconds')} s)")
        for name, h in sorted(b.get("kernels", {}).items()):
            print(f"  kernel {name} sha256 {h[:16]}")
    else:
        print(f"build:   none ({out['build_missing']})")
    return 0
