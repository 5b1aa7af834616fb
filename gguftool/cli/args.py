"""The argparse pieces every command shares: the parser class and checked number types."""
from __future__ import annotations

import argparse
import math
import re
import sys

from ..errors import did_you_mean


class Parser(argparse.ArgumentParser):
    """Checked numbers, no prefix abbreviations (`--thr` must not silently mean `--threads`: a later
    option starting the same way would change its meaning), and "did you mean" for a misspelt option or
    choice. Sub-command parsers are made by add_subparsers with the parent's class: all are Parsers."""

    def __init__(self, *a, **kw):
        kw.setdefault("allow_abbrev", False)
        super().__init__(*a, **kw)
        # Numbers typed on a command line are checked in every command: a plain type=int is a count
        # (`--threads -1` refused), a plain type=float a finite number >= 0 (`--timeout nan` refused).
        # An option that needs more (at least 1) or less (a negative seed) names its own type (below).
        self.register("type", int, count)
        self.register("type", float, amount)

    def parse_known_args(self, args=None, namespace=None):
        # A sub-command parser is called through parse_known_args and hands what it does not know up to
        # the top parser, which no longer knows the sub-command's options: report it here, with them.
        self._given = list(sys.argv[1:] if args is None else args)
        ns, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._hint(extras)}")
        return ns, extras

    def _hint(self, words) -> str:
        unknown = next((a for a in words if a.startswith("-") and len(a) > 1), None)
        options = [s for act in self._actions for s in act.option_strings if s.startswith("--")]
        return did_you_mean(unknown.split("=", 1)[0], options) if unknown else ""

    def _unknown_options(self) -> list[str]:
        """Options given to this parser that it does not know (`gguftool --verison`), up to its sub-command."""
        known = {s for act in self._actions for s in act.option_strings}
        commands = {c for act in self._actions if isinstance(act, argparse._SubParsersAction) for c in act.choices}
        out = []
        for a in getattr(self, "_given", []):
            if a == "--" or a in commands:
                break
            if a.startswith("-") and len(a) > 1 and not self._negative_number_matcher.match(a) \
                    and a.split("=", 1)[0] not in known:
                out.append(a)
        return out

    def error(self, message: str):
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if m:
            message += did_you_mean(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
        elif message.startswith("the following arguments are required") and (unknown := self._unknown_options()):
            # `gguftool --verison`: the misspelt option is the user's mistake, not the missing command
            message = f"unrecognized arguments: {' '.join(unknown)}{self._hint(unknown)}"
        super().error(message)


def number(kind=int, *, lo=None, above=None):
    """An argparse type: a `kind` (int or float) that is finite, >= lo and > above (when given)."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not math.isfinite(v):   # float() takes 'nan', 'inf', '1e999'
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if (lo is not None and v < lo) or (above is not None and v <= above):
            raise argparse.ArgumentTypeError(f"{text!r}: must be {f'at least {lo}' if lo is not None else f'above {above}'}")
        return v
    parse.__name__ = kind.__name__
    return parse


count = number(int, lo=0)      # 0, 1, 2, ...: what a plain type=int means in gguftool's parsers
positive = number(int, lo=1)   # 1, 2, ...: threads, chunks, context lengths
integer = number(int)           # any integer, for the few options where a negative one means something
amount = number(float, lo=0)    # 0.0 or more, finite: what a plain type=float means in gguftool's parsers
