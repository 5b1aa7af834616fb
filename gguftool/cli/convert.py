"""gguftool convert: a Hugging Face checkpoint directory -> GGUF, quantized in the same pass if asked."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from ..errors import GgufToolError
from ..io.writer import check_output_path
from ..pipeline import plan as planning
from . import formatter
from .quantize import add_plan_args

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
                   help="f32, f16 (default), bf16, q8_0, or any gguftool type: Q4_HQQ, Q4_HQQ_128, TQ3_0, Q4_1 ...")
    p.add_argument("--name", help="general.name to record (default: from the model card / directory)")
    add_quant_args(p)
    p.set_defaults(func=run)


def plan_options(args) -> tuple[planning.Options, dict, dict]:
    """Options, solver parameters and record entries from the shared quantize arguments."""
    from .quantize import make_options, solver_params
    if args.type is None and not args.recipe:
        from ..pipeline.convert import DEFAULT_OUTTYPE
        args.type = DEFAULT_OUTTYPE
    opts, recipe = make_options(args)
    params = {**(recipe.solver if recipe else {}), **solver_params(args)}
    record = {"quantize.params": json.dumps(params, sort_keys=True)} if params else {}
    if recipe:
        record.update({"recipe.name": recipe.name, "recipe.toml": recipe.text})
    return opts, params, record


def quiet_gguf_logs() -> None:
    # gguf's SpecialVocab logs each special-token kind llama.cpp has no key for (e.g. BERT's cls); not actionable
    if not os.environ.get("GGUFTOOL_DEBUG"):
        logging.getLogger("gguf").setLevel(logging.ERROR)
        logging.getLogger("gguf.vocab").setLevel(logging.ERROR)


def convert_dir(model_dir: Path, output: Path, args, record: dict[str, str] | None = None, name: str | None = None) -> int:
    from ..convert import open_model
    from ..pipeline.convert import convert, make_plan
    from .quantize import print_plan
    quiet_gguf_logs()
    opts, params, rec = plan_options(args)
    model = open_model(model_dir, tokenizer_pre=args.tokenizer_pre, name=name)
    plan = make_plan(model, opts)
    for rule in planning.unused_rules(plan, opts):
        print(f"warning: {rule.origin}: pattern {rule.pattern.pattern!r} matches no tensor", file=sys.stderr)
    if args.dry_run:
        print_plan(plan, args.format)
        return 0
    check_output_path(output, [model_dir])
    for note in plan.notes:
        print(f"note: {note}", file=sys.stderr)
    convert(model, output, opts, threads=args.threads, params=params, record={**rec, **(record or {})}, plan=plan)
    print(f"{output}: {model.architecture} ({model.hf_arch}), {len(plan.steps)} tensors, "
          f"{plan.out_bytes / 2**20:.1f} MiB, {8 * plan.out_bytes / plan.n_params:.3f} bpw "
          f"(from {model.checkpoint.n_bytes / 2**20:.1f} MiB of safetensors), tokenizer pre {model.tokenizer_pre!r}")
    return 0


def run(args) -> int:
    if not args.model_dir.is_dir():
        raise GgufToolError(f"{args.model_dir}: not a directory",
                            hint="give the folder holding config.json; for a GGUF file use `gguftool quantize`")
    return convert_dir(args.model_dir, args.output, args, name=args.name)
