"""gguftool hub: download a model repository and convert / requantize it, in one command."""
from __future__ import annotations

import sys
from pathlib import Path

from ..io import hub as hubio
from ..io.writer import check_output_path
from . import formatter
from .args import number, positive
from .planning import add_checkpoint_args, convert, requantize, size_summary

EXAMPLES = """examples:
  gguftool hub HuggingFaceTB/SmolLM2-135M-Instruct --type Q4_HQQ           # -> SmolLM2-135M-Instruct-Q4_HQQ.gguf
  gguftool hub Qwen/Qwen2.5-0.5B-Instruct --revision 7ae557604adf67be50417f59c2c2f167def9a775 -o qwen.gguf
  gguftool hub bartowski/SomeModel-GGUF --gguf-pattern '*Q8_0.gguf' --type Q4_HQQ   # requantize a GGUF repo
  HF_HUB_OFFLINE=1 gguftool hub HuggingFaceTB/SmolLM2-135M-Instruct --type F16     # from the cache only

Only the files a conversion needs are downloaded (config, tokenizer, safetensors; or one GGUF model, with
every shard of a split one), into the Hugging Face cache (HF_HOME / HF_HUB_CACHE), pinned to the commit the
revision resolves to; that commit is recorded in the output (gguftool.source.*). An interrupted download resumes
with the files it lacks: run the command again (a file cut off midway starts over).
Environment: HF_ENDPOINT (mirror), HF_TOKEN, HF_HUB_OFFLINE, HF_HOME.
"""
DEFAULT_TYPE = "Q4_HQQ"


def add_parser(sub) -> None:
    p = sub.add_parser("hub", help="download a Hugging Face repo (checkpoint or GGUF) and convert/quantize it",
                       epilog=EXAMPLES, formatter_class=formatter)
    p.add_argument("repo_id", metavar="REPO_ID")
    p.add_argument("--revision", help="branch, tag or commit (default: main)")
    p.add_argument("--type", default=None, help=f"target type (default {DEFAULT_TYPE}, or the recipe's)")
    p.add_argument("-o", "--output", type=Path, help="output file (default: ./NAME-TYPE.gguf)")
    p.add_argument("--gguf-pattern", metavar="GLOB", help="for repos of GGUF files: which file to requantize")
    p.add_argument("--token", help="Hub token (default: HF_TOKEN or the saved login)")
    p.add_argument("--offline", action="store_true", help="use the local cache only (same as HF_HUB_OFFLINE=1)")
    p.add_argument("--deadline", type=number(float, above=0), default=hubio.DEADLINE_SECONDS, metavar="SECONDS",
                   help=f"give up on the download after this long (default {hubio.DEADLINE_SECONDS} s; "
                        "finished files stay cached)")
    p.add_argument("--attempts", type=positive, default=hubio.ATTEMPTS, metavar="N",
                   help=f"tries of one file before giving up (default {hubio.ATTEMPTS}); the download gives up after "
                        f"{hubio.RETRIES_PER_ATTEMPT} x N retries in all")
    add_checkpoint_args(p)
    p.set_defaults(func=run)


def _check_before_download(args) -> None:
    """A mistyped TYPE or a broken recipe is an error now, not after a download of gigabytes."""
    from .planning import options
    options(args, default_type=DEFAULT_TYPE)   # TYPE, the recipe, --tensor-type rules, --tensor-type-file


def run(args) -> int:
    label = (args.type or Path(args.recipe).stem).upper() if (args.type or args.recipe) else DEFAULT_TYPE
    out = args.output or Path(f"{args.repo_id.split('/')[-1]}-{label}.gguf")
    check_output_path(out, [])
    _check_before_download(args)
    snap = hubio.fetch(args.repo_id, args.revision, gguf_pattern=args.gguf_pattern, token=args.token,
                       offline=True if args.offline else None, deadline=args.deadline,
                       attempts=args.attempts)
    print(f"{args.repo_id}@{snap.revision}: commit {snap.commit} in {snap.path}", file=sys.stderr)
    record = snap.record(hubio.endpoint())
    if snap.kind == "checkpoint":
        return convert(args, snap.path, out, record=record, name=args.repo_id.split("/")[-1], default_type=DEFAULT_TYPE)
    done = requantize(args, snap.gguf_file, out, default_type=DEFAULT_TYPE, record=record)
    if done:
        plan, opts, _ = done
        print(f"{out}: requantized {snap.gguf_file.name} -> {opts.target}, {size_summary(plan)}")
    return 0
