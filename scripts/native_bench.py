#!/usr/bin/env python
"""Prompt-processing / generation speed of several weight files in the native llama-bench.

Models are interleaved round by round (A B C, A B C, ...) so that load from other processes
on a shared machine hits all of them alike; the table reports medians over rounds and ratios
to the first model (the peer).

    python scripts/native_bench.py --models q4_1.gguf,q4_hqq.gguf,q4_0.gguf --rounds 5
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path


def bench_once(binary: str, model: str, pp: int, tg: int, threads: int, reps: int, extra: list[str]) -> dict:
    cmd = [binary, "-m", model, "-p", str(pp), "-n", str(tg), "-t", str(threads), "-r", str(reps), "-o", "json",
           *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    out = {}
    for t in json.loads(r.stdout):
        kind = "pp" if t["n_prompt"] > 0 else "tg"
        out[kind] = t["avg_ts"]
        out["type"] = t.get("model_type", "")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", required=True, help="comma separated GGUF files; the first is the peer")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3, help="llama-bench -r per round")
    ap.add_argument("--pp", type=int, default=64)
    ap.add_argument("--tg", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--binary", default=None, help="llama-bench (default: the gguftool native build)")
    ap.add_argument("--extra", default="", help="more llama-bench arguments, space separated")
    a = ap.parse_args()
    binary = a.binary
    if binary is None:
        from gguftool.native import tools
        binary = str(tools.tool("llama-bench"))
    models = a.models.split(",")
    runs: dict[str, list[dict]] = {m: [] for m in models}
    for rnd in range(a.rounds):
        for m in models:
            res = bench_once(binary, m, a.pp, a.tg, a.threads, a.reps, a.extra.split())
            runs[m].append(res)
            print(f"round {rnd + 1}: {Path(m).name}: pp{a.pp} {res['pp']:.1f} t/s, tg{a.tg} {res['tg']:.1f} t/s",
                  file=sys.stderr, flush=True)
    med = {m: {k: statistics.median(r[k] for r in runs[m]) for k in ("pp", "tg")} for m in models}
    peer = models[0]
    print(f"\nllama-bench, {a.threads} threads, median of {a.rounds} interleaved rounds x {a.reps} reps; "
          f"ratios to {Path(peer).name}\n")
    print(f"| model | pp{a.pp} t/s | tg{a.tg} t/s | pp ratio | tg ratio |")
    print("|---|---|---|---|---|")
    for m in models:
        print(f"| {Path(m).name} | {med[m]['pp']:.1f} | {med[m]['tg']:.1f} | "
              f"{med[m]['pp'] / med[peer]['pp']:.3f} | {med[m]['tg'] / med[peer]['tg']:.3f} |")
    print(json.dumps({"threads": a.threads, "pp": a.pp, "tg": a.tg, "rounds": a.rounds, "reps": a.reps,
                      "median": med, "runs": runs, "peer": peer}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
