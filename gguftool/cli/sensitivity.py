"""gguftool sensitivity: measure how much each tensor's quantization costs the model, for size targeting."""
from __future__ import annotations

from pathlib import Path

from ..errors import GgufToolError
from ..io.reader import require_gguf_path
from . import formatter
from .args import positive

EXAMPLES = """examples:
  gguftool sensitivity model.gguf                              # -> model.sensitivity.json
  gguftool quantize model.gguf out.gguf --recipe phone-small --target-bpw 5 --sensitivity model.sensitivity.json
  gguftool sensitivity model.gguf --tensors 'ffn_down' --chunks 4   # only some tensors, more text
  gguftool sensitivity big.gguf --every-block 4                    # blocks 0, 4, 8, ... and the last: ~4x cheaper

For each quantizable tensor alone, writes the model with that tensor at --probe (every other tensor as it is)
and scores it with the native build's llama-perplexity against the unchanged model's logits: one run per
tensor (SmolLM2-135M: 211 runs, about 20 minutes on 2 cores). quantize --target-bpw/--target-size
--sensitivity then weights each tensor's error by its measured KLD, in place of a fixed weight per role;
a tensor not measured takes its role's value interpolated between the nearest measured blocks
(docs/size-targeting.md).
"""


def add_parser(sub) -> None:
    p = sub.add_parser("sensitivity", help="measure each tensor's KLD cost (llama-perplexity) for quantize --sensitivity",
                       epilog=EXAMPLES, formatter_class=formatter)
    p.add_argument("model", type=Path, help="GGUF file: the model to be quantized, as quantize will read it")
    p.add_argument("-o", "--output", type=Path, help="file to write (default: MODEL's name + .sensitivity.json)")
    p.add_argument("--text", type=Path, help="text to score on (default: the packaged Pride and Prejudice)")
    p.add_argument("--chunks", type=positive, default=2, help="chunks of --ctx tokens per run (default 2)")
    p.add_argument("--ctx", type=positive, default=512, help="tokens per chunk (default 512)")
    p.add_argument("--probe", default="Q4_0", metavar="TYPE", help="the type each tensor is tried at (default Q4_0)")
    p.add_argument("--tensors", metavar="REGEX", help="measure only the tensors whose name matches REGEX")
    p.add_argument("--every-block", type=positive, default=1, metavar="N",
                   help="measure only blocks 0, N, 2N, ... and the last (and the tensors outside the blocks)")
    p.add_argument("-t", "--threads", type=positive, default=2)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..io.split import open_gguf
    from ..pipeline import sensitivity
    from ..validate.session import default_text
    require_gguf_path(args.model)
    text = args.text or default_text()
    if not text.is_file():
        raise GgufToolError(f"{text}: no such text file")
    out = args.output or args.model.with_name(args.model.name.removesuffix(".gguf") + ".sensitivity.json")
    s = sensitivity.measure(open_gguf(args.model), args.model, out, text, probe=args.probe.upper(), chunks=args.chunks,
                            ctx=args.ctx, threads=args.threads, select=args.tensors,
                            every_block=args.every_block)
    top = sorted(s.kld.items(), key=lambda kv: -kv[1])[:3]
    print(f"wrote {out}: KLD of {len(s.kld)} tensors, each alone at {s.probe}, on {args.chunks} x {args.ctx} tokens "
          f"of {text.name}; highest: {', '.join(f'{n} {v:.4f}' for n, v in top)}"
          + (f"; {len(s.skipped)} skipped (rows the probe cannot take)" if s.skipped else ""))
    return 0
