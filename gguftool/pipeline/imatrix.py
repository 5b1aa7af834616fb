"""Compute an importance matrix with the native build's llama-imatrix (the tool llama.cpp users know)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ..errors import GgufToolError
from ..io import imatrix as imatrix_io
from ..io.writer import check_output_path, check_replaceable, temporary_path


def run(model: Path, text: Path, out: Path, *, chunks: int = 32, ctx: int = 512, threads: int = 2,
        fmt: str = "gguf") -> imatrix_io.Imatrix:
    """llama-imatrix over `chunks` x `ctx` tokens of `text` -> `out` (written whole or not at all)."""
    from ..native import tools
    check_output_path(out, [model, text])   # before the run: not an input, not a FIFO or device node
    exe = tools.tool("llama-imatrix")
    tmp = temporary_path(out, "gguftool-tmp")
    cmd = [str(exe), "-m", str(model), "-f", str(text), "-o", str(tmp), "--chunks", str(chunks), "-c", str(ctx),
           "-b", str(ctx), "-t", str(threads), "--output-format", fmt, "--no-ppl"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0 or not tmp.is_file():
            tail = "\n  ".join(r.stderr.strip().splitlines()[-8:])
            raise GgufToolError(f"{model}: llama-imatrix failed (exit {r.returncode}):\n  {tail}",
                                hint=f"command: {' '.join(cmd)}")
        result = imatrix_io.load(tmp)   # what we write must be what llama-quantize and we read
        check_replaceable(out)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    result.path = out
    return result
