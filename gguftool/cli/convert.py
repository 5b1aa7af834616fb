"""gguftool convert: a Hugging Face checkpoint directory -> GGUF, quantized in the same pass if asked."""
from __future__ import annotations

from pathlib import Path

from .. import types
from ..errors import GgufToolError
from . import formatter
from .planning import add_checkpoint_args, convert

EXAMPLES = """examples:
  gguftool convert ./SmolLM2-135M-Instruct smol-f16.gguf                  # like convert_hf_to_gguf.py
  gguftool convert ./SmolLM2-135M-Instruct smol-q4hqq.gguf --outtype Q4_HQQ   # convert + quantize, one pass
  gguftool convert ./all-MiniLM-L6-v2 minilm-f32.gguf --outtype f32
  gguftool convert ./Qwen2.5-0.5B q.gguf --recipe phone-small
  gguftool convert ./model out.gguf --outtype Q4_HQQ --dry-run           # the per-tensor plan, nothing written

architectures: Llama / SmolLM / Mistral (LlamaForCausalLM, MistralForCausalLM), Qwen2, Qwen3, BERT (BertModel)
input: config.json, tokenizer.json (+ tokenizer_config.json) and *.safetensors (F32, F16, BF16; sharded or not)
"""


def add_parser(sub) -> None:
    p = sub.add_parser("convert", help="convert a Hugging Face checkpoint directory to GGUF (and quantize it)",
                       epilog=EXAMPLES, formatter_class=formatter)
    p.add_argument("model_dir", type=Path, metavar="HF_DIR")
    p.add_argument("output", type=Path, metavar="OUT.gguf")
    p.add_argument("--outtype", dest="type", metavar="TYPE", default=None,
                   help=f"f32, f16 (default), bf16, q8_0, or any gguftool type: {', '.join(types.BY_NAME)}, Q4_1 ...")
    p.add_argument("--name", help="general.name to record (default: from the model card / directory)")
    add_checkpoint_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    if not args.model_dir.is_dir():
        raise GgufToolError(f"{args.model_dir}: not a directory",
                            hint="give the folder holding config.json; for a GGUF file use `gguftool quantize`")
    return convert(args, args.model_dir, args.output, name=args.name)
