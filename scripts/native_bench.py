#!/usr/bin/env python
"""Prompt-processing / generation speed of weight files and KV-cache types in the native llama-bench.

Columns are (model, cache type) pairs: every model with the f16 cache, or, with --kv, the first
model with each listed cache configuration: K (= V) or K/V, `cal:` in front for the --calibrated file
(gguftool kv-calibrate), flash attention on, as quantized V needs it.
Columns are interleaved round by round (A B C, A B C, ...) so that load from other processes
hits all of them alike; the table reports medians over rounds and ratios to the first column
(the peer). --depth N measures at a context already holding N tokens (llama-bench -d).

    python scripts/native_bench.py --models q4_1.gguf,q4_hqq.gguf,q4_0.gguf --rounds 5
    python scripts/native_bench.py --models q4_1.gguf --kv f16,q8_0,q4_0,q4_hqq,tq3_0 --depth 4096
    python scripts/native_bench.py --models m.gguf --calibrated m-cal.gguf --kv f16,q4_0,cal:q4_0/tq3_1 --depth 1024
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def bench_once(binary: str, model: str, kv: str | None, a) -> dict:
    cmd = [binary, "-m", model, "-p", str(a.pp), "-n", str(a.tg), "-t", str(a.threads), "-r", str(a.reps),
           "-o", "json", "-fa", "1" if kv or a.fa else "0"]
    if kv:
        k, _, v = kv.partition("/")
        cmd += ["-ctk", k, "-ctv", v or k]
    if a.depth:
        cmd += ["-d", str(a.depth)]
    r = subprocess.run(cmd + a.extra.split(), capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    out = {}
    for t in json.loads(r.stdout):
        out["pp" if t["n_prompt"] > 0 else "tg"] = t["avg_ts"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", required=True, help="comma separated GGUF files; the first is the peer")
    ap.add_argument("--kv", default="", help="comma separated cache configurations K or K/V, run on the first model")
    ap.add_argument("--calibrated", default=None, help="the first model after gguftool kv-calibrate, for cal: columns")
    ap.add_argument("--depth", type=int, default=0, help="tokens already in the context (llama-bench -d)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3, help="llama-bench -r per round")
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fa", action="store_true", help="flash attention on for the weight comparison too")
    ap.add_argument("--binary", default=None, help="llama-bench (default: the gguftool native build)")
    ap.add_argument("--extra", default="", help="more llama-bench arguments, space separated")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    binary = a.binary
    if binary is None:
        from gguftool.native import tools
        binary = str(tools.tool("llama-bench"))
    models = a.models.split(",")
    def kv_col(kv: str) -> tuple[str, str]:
        if kv.startswith("cal:"):
            if not a.calibrated:
                raise SystemExit(f"{kv}: give --calibrated")
            return a.calibrated, kv.removeprefix("cal:")
        return models[0], kv
    cols = [kv_col(kv) for kv in a.kv.split(",")] if a.kv else [(m, None) for m in models]
    name = {c: Path(c[0]).name + (f" KV {c[1]}" if c[1] else "") for c in cols}
    runs: dict = {c: [] for c in cols}
    tests = [k for k, n in (("pp", a.pp), ("tg", a.tg)) if n > 0]   # --pp 0 or --tg 0 leaves that test out
    if not tests:
        raise SystemExit("--pp and --tg are both 0: nothing to measure")
    for rnd in range(a.rounds):
        for c in cols:
            res = bench_once(binary, c[0], c[1], a)
            runs[c].append(res)
            print(f"round {rnd + 1}: {name[c]}: " + ", ".join(f"{k}{getattr(a, k)} {res[k]:.1f} t/s" for k in tests),
                  file=sys.stderr, flush=True)
    med = {c: {k: statistics.median(r[k] for r in runs[c]) for k in tests} for c in cols}
    peer = cols[0]
    load = os.getloadavg()[0]
    print(f"\nllama-bench, {a.threads} threads, depth {a.depth}, median of {a.rounds} interleaved rounds x "
          f"{a.reps} reps (load average {load:.1f} at the end); ratios to {name[peer]}\n")
    print("| column | " + " | ".join(f"{k}{getattr(a, k)} t/s" for k in tests) + " | "
          + " | ".join(f"{k} ratio" for k in tests) + " |")
    print("|---" * (1 + 2 * len(tests)) + "|")
    for c in cols:
        print(f"| {name[c]} | " + " | ".join(f"{med[c][k]:.1f}" for k in tests) + " | "
              + " | ".join(f"{med[c][k] / med[peer][k]:.3f}" for k in tests) + " |")
    result = {"threads": a.threads, "pp": a.pp, "tg": a.tg, "depth": a.depth, "rounds": a.rounds, "reps": a.reps,
              "load_end": load, "columns": [{"column": name[c], "median": med[c], "runs": runs[c]} for c in cols]}
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
