"""gguftool validate: perplexity, KLD, speed, a sample and peak memory of a model per KV-cache type, on a target."""
from __future__ import annotations

import sys
from pathlib import Path

from ..errors import GgufToolError
from . import formatter
from .args import integer, number, positive

EXAMPLES = """examples:
  gguftool validate model.gguf --target local                       # default K/V set, report in validate-out/
  gguftool validate model.gguf --target local --isolate --chunks 4  # K-only / V-only / both per cache type
  gguftool validate model.gguf --kv f16 --kv q5_0/tq3_3 --text book.txt --out run1
  gguftool validate model.gguf --target qemu-arm64 --ctx 128 --chunks 2 --kv q4_hqq
  gguftool validate model.gguf --target adb --sustained 120 --kv q4_0 --kv tq3_1   # a phone over USB
  gguftool validate --build-arm64                                    # cross-build the static aarch64 tools

targets: local uses `gguftool native build`; adb[:SERIAL] and qemu-arm64 use the static aarch64 build
(`--build-arm64`, needs g++-aarch64-linux-gnu; qemu-arm64 also needs qemu-user). Quantized V caches
run with flash attention on. Output: OUT/report.md, OUT/report.json, OUT/*.png, OUT/runs/ (raw logs).
Exit status 1 when a run failed or the isolation rule flags a probable kernel bug.
"""


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="perplexity / KLD / speed / memory per KV-cache type, with a report",
                       epilog=EXAMPLES, formatter_class=formatter)
    p.add_argument("model", nargs="?", help="GGUF model file")
    p.add_argument("--target", default="local", help="local | qemu-arm64 | adb | adb:SERIAL (default local)")
    p.add_argument("--kv", action="append", metavar="K[/V]",
                   help="a KV cache configuration, repeatable (default: f16, q8_0, q4_0, q5_0/tq3_3, tq3_3; "
                        "a file's per-layer plan applies to its type)")
    p.add_argument("--isolate", action="store_true", help="K-only, V-only and both for each --types cache type")
    p.add_argument("--types", default="f16,q8_0,q4_0,q5_0,tq3_3",
                   help="cache types of the --isolate matrix (default: %(default)s)")
    p.add_argument("--reference-model", metavar="GGUF",
                   help="KL divergence against this model's logits (e.g. the f16/Q8_0 original) instead of MODEL with f16 KV")
    p.add_argument("--text", help="perplexity text (default: Pride and Prejudice, shipped with gguftool)")
    p.add_argument("--chunks", type=positive, default=8, help="perplexity chunks (default 8)")
    p.add_argument("--ctx", type=positive, default=512, help="context per chunk (default 512)")
    p.add_argument("--threads", "-t", type=positive, default=2)
    p.add_argument("--no-rot", action="store_true", help="disable upstream's Q/K/V rotation (LLAMA_ATTN_ROT_DISABLE=1)")
    p.add_argument("--no-bench", action="store_true", help="skip llama-bench")
    p.add_argument("--no-sample", action="store_true", help="skip the generation sample")
    p.add_argument("--bench-p", type=int, default=64, help="llama-bench prompt tokens (default 64)")
    p.add_argument("--bench-n", type=int, default=16, help="llama-bench generated tokens (default 16)")
    p.add_argument("--reps", type=positive, default=3, help="llama-bench repetitions (default 3)")
    p.add_argument("--gen", type=int, default=32, help="tokens of the generation sample (default 32)")
    p.add_argument("--seed", type=integer, default=42)
    p.add_argument("--sustained", type=float, default=0, metavar="SECONDS",
                   help="repeat generation this long per configuration and plot tokens/s over time")
    p.add_argument("--out", default="validate-out", help="report folder (default validate-out)")
    p.add_argument("--bin-dir", help="use the llama.cpp tools in this folder instead of the managed build")
    p.add_argument("--build-arm64", action="store_true", help="build the static aarch64 tools (adb / qemu-arm64)")
    p.add_argument("--arm-arch", default=None, help="-march of the aarch64 build (default armv8.2-a+dotprod+fp16)")
    p.add_argument("--rerender", metavar="DIR", help="rewrite DIR/report.md and plots from DIR/report.json "
                   "(re-running the isolation analysis), without running anything")
    p.add_argument("--timeout", type=number(float, above=0), default=3600, help="seconds per tool run (default 3600)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..validate import report, runners, session
    if args.rerender:
        return _rerender(Path(args.rerender))
    if args.build_arm64:
        from ..validate import cross
        kw = {"arch": args.arm_arch} if args.arm_arch else {}
        res = cross.build(jobs=2, **kw)
        print(f"aarch64 tools {'(cached) ' if res.reused else ''}in {res.bin_dir}")
        if not args.model:
            return 0
    if not args.model:
        raise GgufToolError("give a MODEL.gguf to validate", "see `gguftool validate --help`")
    for name, val, lo in (("--chunks", args.chunks, 1), ("--ctx", args.ctx, 16), ("--threads", args.threads, 1)):
        if val < lo:
            raise GgufToolError(f"{name} must be at least {lo}, got {val}")
    if args.arm_arch and args.target != "local" and not args.bin_dir:
        from ..validate import cross
        args.bin_dir = str(cross.find_cross_build(arch=args.arm_arch).bin_dir)
    kv = [session.parse_kv(s) for s in (args.kv or session.DEFAULT_KV)]
    types = None
    if args.isolate:
        types = [session.parse_kv(t)[0] for t in args.types.split(",") if t.strip()]
    text = Path(args.text) if args.text else session.default_text()
    out = Path(args.out)
    report.check_out(out)   # refuse a bad --out now, not after the runs
    settings = session.Settings(ctx=args.ctx, chunks=args.chunks, threads=args.threads, bench_p=args.bench_p,
                                bench_n=args.bench_n, bench_reps=args.reps, gen_tokens=args.gen, seed=args.seed,
                                rotation=not args.no_rot, bench=not args.no_bench, sample=not args.no_sample,
                                sustained_s=args.sustained, timeout_s=args.timeout)
    runner = runners.make_runner(args.target, out / "runs", args.threads,
                                 Path(args.bin_dir) if args.bin_dir else None)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    rec = session.run_validation(runner, Path(args.model), text, settings, kv, types, log=log,
                                 reference_model=Path(args.reference_model) if args.reference_model else None)
    paths = report.write(rec, out)
    print(f"report: {paths['md']}  (JSON: {paths['json']})")
    iso = rec.get("isolate")
    if iso:
        for f in iso["flags"]:
            print(f"{f['level']}: {f['message']}")
    return 0 if rec["ok"] else 1


def _rerender(out: Path) -> int:
    import json

    from ..validate import report, session
    try:
        rec = json.loads((out / "report.json").read_text())
    except (OSError, ValueError) as e:
        raise GgufToolError(f"cannot read {out / 'report.json'}: {e}") from e
    rec = session.reanalyse(rec)
    paths = report.write(rec, out)
    print(f"report: {paths['md']}  (JSON: {paths['json']})")
    return 0 if rec["ok"] else 1
