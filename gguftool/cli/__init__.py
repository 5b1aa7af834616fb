"""`gguftool` command line: one module per noun; modules print, the layers below compute.

Shared by several commands: planning.py (planning options and the write flows), size.py (byte sizes).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

from ..errors import GgufToolError

# noun -> module under gguftool.cli exposing add_parser(subparsers)
COMMANDS = ("inspect", "quantize", "convert", "hub", "recipes", "kv_plan", "kv_calibrate", "imatrix", "native",
            "validate")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gguftool",
        description="Requantize LLMs (GGUF or Hugging Face) to HQQ / TurboQuant types and prove them in llama.cpp.",
        epilog="Run `gguftool COMMAND --help` for worked examples. Set GGUFTOOL_DEBUG=1 for tracebacks.",
    )
    from .. import __version__
    p.add_argument("--version", action="version", version=f"gguftool {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"{__name__}.{name}":
                continue  # command not part of this build
            raise
        mod.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except GgufToolError as e:
        if os.environ.get("GGUFTOOL_DEBUG"):
            traceback.print_exc()
        print(f"error: {e.message}", file=sys.stderr)
        if e.hint:
            print(f"hint: {e.hint}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; no output file was left behind", file=sys.stderr)
        return 130


def formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32)
