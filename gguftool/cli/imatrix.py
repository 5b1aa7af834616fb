"""gguftool imatrix: an importance matrix for `quantize --imatrix`, computed by our llama-imatrix."""
from __future__ import annotations

from pathlib import Path

from ..errors import GgufToolError
from ..io.reader import require_gguf_path
from . import formatter
from .args import positive

EXAMPLES = """examples:
  gguftool imatrix model-f16.gguf                               # the packaged Pride and Prejudice, 32 x 512 tokens
  gguftool imatrix model-f16.gguf -o model.imatrix.gguf --text my.txt --chunks 64
  gguftool quantize model-f16.gguf model-iq3_s.gguf IQ3_S --imatrix model.imatrix.gguf

Runs the native build's llama-imatrix (gguftool native build). --format dat writes the legacy format;
quantize reads both, as llama-quantize does.
"""


def add_parser(sub) -> None:
    p = sub.add_parser("imatrix", help="compute an importance matrix (llama-imatrix) for quantize --imatrix",
                       epilog=EXAMPLES, formatter_class=formatter)
    p.add_argument("model", type=Path, help="GGUF file (ideally F16/F32 or a high-precision quantization)")
    p.add_argument("-o", "--output", type=Path, help="file to write (default: MODEL's name + .imatrix.gguf)")
    p.add_argument("--text", type=Path, help="calibration text (default: the packaged Pride and Prejudice)")
    p.add_argument("--chunks", type=positive, default=32, help="chunks of --ctx tokens (default 32)")
    p.add_argument("--ctx", type=positive, default=512, help="tokens per chunk (default 512)")
    p.add_argument("--format", choices=("gguf", "dat"), default="gguf", help="file format (default gguf)")
    p.add_argument("-t", "--threads", type=positive, default=2)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..pipeline import imatrix
    from ..validate.session import default_text
    require_gguf_path(args.model)
    text = args.text or default_text()
    if not text.is_file():
        raise GgufToolError(f"{text}: no such text file")
    suffix = ".imatrix.gguf" if args.format == "gguf" else ".imatrix.dat"
    out = args.output or args.model.with_name(args.model.name.removesuffix(".gguf") + suffix)
    m = imatrix.run(args.model, text, out, chunks=args.chunks, ctx=args.ctx, threads=args.threads, fmt=args.format)
    print(f"wrote {out}: importance of {len(m.entries)} weight tensors from {m.chunk_count} chunks of {text.name}")
    return 0
