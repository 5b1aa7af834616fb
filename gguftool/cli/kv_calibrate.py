"""gguftool kv-calibrate: measure a model's attention inputs on text, store the KV-cache calibration."""
from __future__ import annotations

import json
from pathlib import Path

from . import formatter
from .args import positive

EXAMPLES = """examples:
  gguftool kv-calibrate model.gguf model-kv.gguf                 # the packaged Pride and Prejudice, 8 x 512 tokens
  gguftool kv-calibrate model.gguf model-kv.gguf --text my.txt --chunks 16
  gguftool kv-calibrate model.gguf model-kv.gguf --k-layers tq3_2=8-19:q4_0   # -ctk tq3_2 keeps layers 8-19 at q4_0
  gguftool kv-calibrate model.gguf model-kv.gguf --k-layers tq3_2=auto:q4_0:40%   # measure which 40% of layers
  llama-perplexity -m model-kv.gguf -ctk q4_0 -ctv q4_0 ...     # our llama.cpp build applies it (gguftool native build)

The output is the input with gguftool.kv_calib.* arrays added (tensors unchanged). Our llama.cpp
build stores (k - mean) / scale and v - mean in a quantized cache, which gives the same attention
from less error; stock llama.cpp ignores the arrays. See docs/kv.md.
"""


def add_parser(sub) -> None:
    p = sub.add_parser("kv-calibrate", help="calibrate the KV cache offline (stored in the GGUF)",
                       epilog=EXAMPLES, formatter_class=formatter)
    p.add_argument("model", type=Path, help="GGUF file")
    p.add_argument("output", type=Path, help="GGUF file to write (the input plus the calibration)")
    p.add_argument("--text", type=Path, default=None, help="calibration text (default: the packaged Pride and Prejudice)")
    p.add_argument("--chunks", type=positive, default=8, help="chunks of --ctx tokens to measure (default 8)")
    p.add_argument("--ctx", type=positive, default=512, help="tokens per chunk (default 512)")
    p.add_argument("-t", "--threads", type=positive, default=2)
    p.add_argument("--k-layers", metavar="BASE=FIRST[-LAST]:TYPE,...", default=None,
                   help="store a per-layer K cache plan: when llama.cpp runs with -ctk BASE, the named layers use "
                        "TYPE (our build; docs/kv.md, per-layer plans). BASE=auto:TYPE:N (or N%%) measures which N "
                        "layers gain most (native llama-perplexity runs on the calibration text, ~7 runs)")
    p.add_argument("--v-layers", metavar="BASE=FIRST[-LAST]:TYPE,...", default=None,
                   help="the same for the V cache (-ctv BASE)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..errors import GgufToolError
    from ..pipeline import kvcalib
    from ..validate.session import default_text
    for name, v in (("--chunks", args.chunks), ("--ctx", args.ctx), ("--threads", args.threads)):
        if v < 1:
            raise GgufToolError(f"{name} must be at least 1 (got {v})")
    if not args.model.is_file():
        from ..io.reader import GGUFFile
        GGUFFile(args.model)   # raises, saying what the path is instead (a folder, a FIFO, nothing)
    text = args.text or default_text()
    if not text.is_file():
        raise GgufToolError(f"{text}: no such text file")
    layers = kvcalib.layer_plans(args.model, k=args.k_layers, v=args.v_layers)
    done = kvcalib.run(args.model, args.output, text, chunks=args.chunks, ctx=args.ctx, threads=args.threads,
                       layers=layers)
    calib = done.layers
    rows = [{"layer": il, "alpha": c.alpha, "proxy_kl_q4_0": {"raw": c.kl_raw, **{str(a): v for a, v in c.kl.items()}},
             "gamma": c.gamma, "proxy_v_error_q4_0": {str(g): v for g, v in c.v_err.items()}}
            for il, c in sorted(calib.items())]
    if args.format == "json":
        print(json.dumps({"output": str(args.output), "layers": rows,
                          "plans": {side: {"for": p.base, "layers": p.spec, "search": done.searches.get(side)}
                                    for side, p in done.plans.items()}}, indent=1))
        return 0
    bal = sum(1 for r in rows if r["alpha"] > 0)
    raw = sum(c.kl_raw for c in calib.values())
    cal = sum(c.kl[c.alpha] for c in calib.values())
    print(f"wrote {args.output}: {len(rows)} layers calibrated on {text.name} ({args.chunks} x {args.ctx} tokens), "
          f"key balance on {bal} of them; attention KL of a simulated q4_0 K cache on that text: "
          f"{raw / len(rows):.2e} -> {cal / len(rows):.2e} ({raw / cal:.2f}x lower); mean value removed on "
          f"{sum(1 for c in calib.values() if c.gamma > 0)} layers, V output error of a simulated q4_0 cache "
          f"{sum(c.v_err[0.0] for c in calib.values()) / len(rows):.2e} -> "
          f"{sum(c.v_err[c.gamma] for c in calib.values()) / len(rows):.2e}")
    for side, plan in done.plans.items():
        print(f"per-layer {side.upper()} plan stored: with -ct{side} {plan.base}, layers {plan.spec}")
        if side in done.searches:
            m = done.searches[side]
            print(f"  chosen by KLD on {text.name} ({plan.base} everywhere: {m['kld_uniform']:.4f}); KLD gained per "
                  "layer by group: " + ", ".join(f"{g} {v:+.4f}" for g, v in m.items() if g != "kld_uniform"))
    return 0
