"""`gguftool` command line: one module per noun; modules print, the layers below compute.

Shared by several commands: planning.py (planning options and the write flows), size.py (byte sizes).
"""
from __future__ import annotations

import argparse
import importlib
import os
import select
import signal
import sys
import threading
import traceback
from pathlib import Path

from ..errors import GgufToolError
from .args import Parser

# noun -> module under gguftool.cli exposing add_parser(subparsers)
COMMANDS = ("inspect", "quantize", "convert", "hub", "recipes", "kv_plan", "kv_calibrate", "imatrix", "sensitivity",
            "native", "validate")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
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


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the program is: a KeyboardInterrupt, so that every clean-up that
    runs for Ctrl-C (the writers remove their temporary file) runs for these too."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum, frame):
    raise Terminated(signum)


def _stdout_closed() -> bool:
    """stdout is a pipe whose reader has gone (`gguftool inspect m.gguf | head -1`)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poll.poll(0))
    except (AttributeError, OSError, ValueError):   # no real stdout (tests capture it)
        return False


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    previous = {}
    if threading.current_thread() is threading.main_thread():   # signal handlers can only be set there
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is not signal.SIG_IGN:   # keep nohup's ignored SIGHUP
                previous[sig] = signal.signal(sig, _raise_terminated)
    try:
        rc = int(args.func(args) or 0)
        sys.stdout.flush()   # here, where a closed pipe can still be told apart (below)
        return rc
    except GgufToolError as e:
        if os.environ.get("GGUFTOOL_DEBUG"):
            traceback.print_exc()
        print(f"error: {e.message}", file=sys.stderr)
        if e.hint:
            print(f"hint: {e.hint}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", signal.SIGINT)
        how = "interrupted" if signum == signal.SIGINT else f"terminated by {signal.Signals(signum).name}"
        print(f"{how}; no output file was left behind", file=sys.stderr)
        return 128 + signum
    except BrokenPipeError:
        if not _stdout_closed():
            raise
        # The reader of our output has gone: stop quietly, as a C tool killed by SIGPIPE would. Python's
        # advice (library/signal.html, "Note on SIGPIPE"): point stdout at devnull so that the flush at
        # exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except Exception as e:   # the last resort: a bug of ours, never a traceback for the user
        if os.environ.get("GGUFTOOL_DEBUG"):
            raise
        where = traceback.extract_tb(e.__traceback__)[-1]
        print(f"error: unexpected {type(e).__name__} in gguftool ({Path(where.filename).name}:{where.lineno}): {e}",
              file=sys.stderr)
        print("hint: set GGUFTOOL_DEBUG=1 and report it, with the traceback", file=sys.stderr)
        return 70   # EX_SOFTWARE
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32)
