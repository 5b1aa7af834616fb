"""gguftool convert: a Hugging Face checkpoint directory -> GGUF, quantized in the same pass if asked."""
from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from .. import types
from ..errors import GgufToolError
from . import formatter
from .planning import add_plan_args, execute, options, size_summary

EXAMPLES = """examples:
  gguftool convert ./SmolLM2-135M-Instruct smol-f16.gguf                  # like convert_hf_to_gguf.py
  gguftool convert ./SmolLM2-135M-Instruct smol-q4hqq.gguf --outtype Q4_HQQ   # convert + quantize, one pass
  gguftool convert ./all-MiniLM-L6-v2 minilm-f32.gguf --outtype f32
  gguftool convert ./Qwen2.5-0.5B q.gguf --recipe phone-small
  gguftool convert ./model out.gguf --outtype Q4_HQQ --dry-run           # the per-tensor plan, nothing written

architectures: Llama / SmolLM / Mistral (LlamaForCausalLM, MistralForCausalLM), Qwen2, Qwen3, BERT (BertModel)
input: config.json, tokenizer.json (+ tokenizer_config.json) and *.safetensors (F32, F16, BF16; sharded or not)
"""


def add_quant_args(p: argparse.ArgumentParser) -> None:
    """quantize's planning options; a float checkpoint is never "already quantized"."""
    add_plan_args(p)
    p.add_argument("--tokenizer-pre", metavar="NAME",
                   help="llama.cpp pre-tokenizer name, when gguftool does not recognise tokenizer.json's")
    p.set_defaults(allow_requantize=True)


def add_parser(sub) -> None:
    p = sub.add_parser("convert", help="convert a Hugging Face checkpoint directory to GGUF (and quantize it)",
                       epilog=EXAMPLES, formatter_class=formatter)
    p.add_argument("model_dir", type=Path, metavar="HF_DIR")
    p.add_argument("output", type=Path, metavar="OUT.gguf")
    p.add_argument("--outtype", dest="type", metavar="TYPE", default=None,
                   help=f"f32, f16 (default), bf16, q8_0, or any gguftool type: {', '.join(types.BY_NAME)}, Q4_1 ...")
    p.add_argument("--name", help="general.name to record (default: from the model card / directory)")
    add_quant_args(p)
    p.set_defaults(func=run)


def quiet_gguf_logs() -> None:
    # gguf's SpecialVocab logs each special-token kind llama.cpp has no key for (e.g. BERT's cls); not actionable
    if not os.environ.get("GGUFTOOL_DEBUG"):
        logging.getLogger("gguf").setLevel(logging.ERROR)
        logging.getLogger("gguf.vocab").setLevel(logging.ERROR)


def convert_dir(model_dir: Path, output: Path, args, record: dict[str, str] | None = None, name: str | None = None,
                default_type: str = "F16") -> int:
    from ..convert import open_model
    from ..pipeline.convert import convert, make_plan
    quiet_gguf_logs()
    opts, params, rec, _ = options(args, default_type)
    model = open_model(model_dir, tokenizer_pre=args.tokenizer_pre, name=name)

    def write(plan):
        convert(model, output, opts, threads=args.threads, params=params, record={**rec, **(record or {})}, plan=plan)

    plan = execute(args, model, output, [model_dir], opts, params, write, make_plan=make_plan)
    if plan is not None:
        print(f"{output}: {model.architecture} ({model.hf_arch}), {len(plan.steps)} tensors, {size_summary(plan)} "
              f"(from {model.checkpoint.n_bytes / 2**20:.1f} MiB of safetensors), tokenizer pre {model.tokenizer_pre!r}")
    return 0


def run(args) -> int:
    if not args.model_dir.is_dir():
        raise GgufToolError(f"{args.model_dir}: not a directory",
                            hint="give the folder holding config.json; for a GGUF file use `gguftool quantize`")
    return convert_dir(args.model_dir, args.output, args, name=args.name)
