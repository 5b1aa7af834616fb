#!/usr/bin/env python
"""KV-cache perplexity matrix: every K x V cache type through the native llama-perplexity.

Prints a markdown table (rows K, columns V) and JSON. The f16/f16 cell is the peer every
other cell is read against; the same binary, model, text and settings are used for all.

    python scripts/native_kv_matrix.py --model SmolLM2-135M-Instruct.Q4_1.gguf \
        --text /work/shared/data/prideprejudice.txt --chunks 40
    python scripts/native_kv_matrix.py ... --types f16,tq3_0 --no-rot   # LLAMA_ATTN_ROT_DISABLE=1
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

PPL_RE = re.compile(r"Final estimate: PPL = ([0-9.]+|nan|inf) \+/- ([0-9.]+|nan|inf)")


def run_ppl(binary: str, model: str, text: str, k: str, v: str, chunks: int, ctx: int, threads: int,
            rot: bool) -> dict:
    cmd = [binary, "-m", model, "-f", text, "-c", str(ctx), "-b", str(ctx), "--chunks", str(chunks),
           "-t", str(threads), "-fa", "on", "-ctk", k, "-ctv", v]
    env = dict(os.environ)
    if not rot:
        env["LLAMA_ATTN_ROT_DISABLE"] = "1"
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    out = r.stdout + r.stderr
    m = PPL_RE.search(out)
    res = {"k": k, "v": v, "rot": rot, "seconds": round(time.monotonic() - t0, 1), "rc": r.returncode,
           "cmd": " ".join(cmd) + ("" if rot else "  (LLAMA_ATTN_ROT_DISABLE=1)")}
    if m:
        res["ppl"], res["pm"] = float(m.group(1)), float(m.group(2))
    else:
        res["error"] = out[-500:]
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--types", default="f16,q8_0,q4_0,q4_hqq,tq3_0")
    ap.add_argument("--pairs", default="", help="only these K:V pairs, comma separated (default: all)")
    ap.add_argument("--chunks", type=int, default=40)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-rot", action="store_true", help="set LLAMA_ATTN_ROT_DISABLE=1 (upstream Q/K/V rotation off)")
    ap.add_argument("--binary", default=None, help="llama-perplexity (default: the gguftool native build)")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    binary = a.binary
    if binary is None:
        from gguftool.native import tools
        binary = str(tools.tool("llama-perplexity"))
    types = a.types.split(",")
    pairs = [tuple(p.split(":")) for p in a.pairs.split(",")] if a.pairs else [(k, v) for k in types for v in types]
    results = []
    for k, v in pairs:
        r = run_ppl(binary, a.model, a.text, k, v, a.chunks, a.ctx, a.threads, not a.no_rot)
        results.append(r)
        print(f"K={k:7s} V={v:7s} rot={'off' if a.no_rot else 'on '} "
              f"PPL={r.get('ppl', float('nan')):8.4f} +/- {r.get('pm', float('nan')):.4f} ({r['seconds']} s)",
              file=sys.stderr, flush=True)
    cell = {(r["k"], r["v"]): r for r in results}
    ks = list(dict.fromkeys(k for k, _ in pairs))
    vs = list(dict.fromkeys(v for _, v in pairs))
    print(f"\nperplexity, {a.chunks} x {a.ctx} tokens, FA on, rotation {'off' if a.no_rot else 'on (upstream default)'}"
          f" - rows K, columns V\n")
    print("| K \\ V | " + " | ".join(vs) + " |")
    print("|---|" + "---|" * len(vs))
    for k in ks:
        row = []
        for v in vs:
            r = cell.get((k, v))
            row.append("" if r is None else (f"{r['ppl']:.2f}" if "ppl" in r else "FAIL"))
        print(f"| {k} | " + " | ".join(row) + " |")
    base = cell.get(("f16", "f16"))
    if base and "ppl" in base:
        print("\nratio to f16/f16: " + ", ".join(
            f"{r['k']}/{r['v']} {r['ppl'] / base['ppl']:.3f}" for r in results if "ppl" in r))
    doc = {"model": a.model, "text": a.text, "chunks": a.chunks, "ctx": a.ctx, "threads": a.threads,
           "rotation": not a.no_rot, "results": results}
    print(json.dumps(doc))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0 if all("ppl" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
