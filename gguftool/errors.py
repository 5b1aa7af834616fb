"""The one error class users see: a clean message and the next step."""
from __future__ import annotations

import difflib


class GgufToolError(Exception):
    """An error caused by the input or the environment, not by a bug in gguftool.

    The CLI prints `error: <message>` and, when given, `hint: <hint>`; the traceback only
    with GGUFTOOL_DEBUG=1."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} (hint: {self.hint})"


def did_you_mean(word: str, candidates) -> str:
    """' (did you mean X?)' for the closest candidate, or ''."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""
