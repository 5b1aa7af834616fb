"""The one error class users see: a clean message and the next step."""
from __future__ import annotations


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
