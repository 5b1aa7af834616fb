#!/usr/bin/env python
"""KV-cache frontier: PPL and mean KLD against the f16-cache logits, per K/V configuration.

Every configuration runs through the same native llama-perplexity, model, text and settings; the
peer is the f16/f16 cache of the same run (its logits are the KLD base). A configuration is
K/V cache types, `cal:` in front runs the calibrated file (`gguftool kv-calibrate`) instead, and
` k[8-19:q4_0;3:q8_0]` / ` v[...]` after it gives those layers other types (GGUFTOOL_KV_LAYERS_K/_V).

    python scripts/kv_frontier.py --model smol.gguf --calibrated smol-cal.gguf \\
        --text /work/shared/data/emma.txt --chunks 40 \\
        --configs q8_0/q8_0,q4_0/q4_0,cal:q4_0/q4_0,cal:tq3_0/tq3_0 --json out.json [--plot out.png]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

FLOAT = r"([0-9.]+|nan|inf)"
PPL_RE = re.compile(rf"Mean PPL\(Q\)\s*:\s*{FLOAT}")
PPL_BASE_RE = re.compile(rf"Final estimate: PPL = {FLOAT}")
KLD_RE = re.compile(rf"Mean\s+KLD:\s*{FLOAT}")


def bits(name: str) -> float:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    from gguftool import types
    t = types.lookup(name)
    if t is not None:
        return t.bpw
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[name.upper()]]
    return 8.0 * size / block


def plan_bits(model: str, k: str, v: str, layers: dict[str, str], ctx: int | None) -> float:
    """Bits per value of a per-layer configuration as llama.cpp allocates it at ctx tokens (kv-plan's
    accounting; None: the trained context, where full-context layers outweigh sliding-window ones)."""
    import dataclasses

    from gguftool.io.split import open_gguf
    from gguftool.pipeline import kvplan
    shape = kvplan.Shape.from_gguf(open_gguf(model))
    ctx = ctx or shape.n_ctx_train
    plans = {f"{side}_plan": kvplan.LayerPlan.parse(f"{base}={layers[side]}", shape.n_layer) if side in layers else None
             for side, base in (("k", k), ("v", v))}
    return kvplan.bits_per_value(dataclasses.replace(shape, **plans), k, v, ctx)


def perplexity(binary: str, model: str, text: str, k: str, v: str, a, extra: list[str],
               layers: dict[str, str] | None = None) -> tuple[str, float]:
    cmd = [binary, "-m", model, "-f", text, "-c", str(a.ctx), "-b", str(a.ctx), "--chunks", str(a.chunks),
           "-t", str(a.threads), "-fa", "on", "-ctk", k, "-ctv", v, *extra]
    t0 = time.monotonic()
    # per-layer types only where the configuration names them (a file's own plan is off otherwise)
    env = {**os.environ, **{f"GGUFTOOL_KV_LAYERS_{side.upper()}": (layers or {}).get(side, "off") for side in "kv"}}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-800:]}")
    return r.stdout + r.stderr, time.monotonic() - t0


def is_ours(config: str) -> bool:
    from gguftool import types
    return config.startswith("cal:") or any(types.lookup(t) for t in config.removeprefix("cal:").split("/"))


def markdown(rows: list[dict], f16_ppl: float) -> str:
    """Rows by size; for each of ours, a stock configuration that is no larger and no worse in KLD, if any."""
    stock = [r for r in rows if not is_ours(r["config"])]
    out = ["| K/V | bits/value | PPL | dPPL | mean KLD | stock no larger and no worse |", "|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (-r["bits"], r["kld"])):
        name = f"**{r['config']}**" if is_ours(r["config"]) else r["config"]
        beat = ""
        if is_ours(r["config"]):
            better = [s for s in stock if s["bits"] <= r["bits"] and s["kld"] <= r["kld"]]
            beat = ", ".join(s["config"] for s in better) or "none"
        out.append(f"| {name} | {r['bits']:.2f} | {r['ppl']:.3f} | {100 * (r['ppl'] / f16_ppl - 1):+.2f}% | "
                   f"{r['kld']:.4f} | {beat} |")
    return "\n".join(out) + "\n"


def record(a, rows: list[dict], f16_ppl: float) -> None:
    """Store the rows in kv_measured.json. Rows of another run (its f16 PPL differs) are added beside the
    stored ones with that run's own peers (f16 PPL, stock q4_0/q4_0 KLD), never replacing a stored row."""
    from gguftool.pipeline import kvplan
    data = json.loads(kvplan.MEASURED.read_text()) if kvplan.MEASURED.is_file() else {"models": {}}
    data["how"] = (f"scripts/kv_frontier.py, {a.chunks} x {a.ctx} tokens of {Path(a.text).name}, flash attention, "
                   "upstream rotation on; cal: = the file after gguftool kv-calibrate (Pride and Prejudice)")
    entry = data["models"].setdefault(a.record, {"f16_ppl": f16_ppl, "rows": {}})
    own = abs(entry["f16_ppl"] - f16_ppl) > 1e-9
    q4 = {r["config"]: r["kld"] for r in rows}.get("q4_0/q4_0")
    if own and q4 is None:
        raise SystemExit(f"{a.record}: stored rows come from another run; measure q4_0/q4_0 too (the peer)")
    for r in rows:
        if r["config"] == "f16/f16" or (own and r["config"] in entry["rows"]):
            continue
        entry["rows"][r["config"]] = {"bits": r["bits"], "ppl": r["ppl"], "kld": r["kld"],
                                      **({"f16_ppl": f16_ppl, "q4_0_kld": q4} if own else {})}
    kvplan.MEASURED.write_text(json.dumps(data, indent=1) + "\n")


def plot(rows: list[dict], path: str, title: str) -> None:
    """PNG of mean KLD against bits per value, ours against stock, with the stock frontier."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        ours = is_ours(r["config"])
        ax.scatter(r["bits"], r["kld"], c="tab:red" if ours else "tab:blue", marker="o" if ours else "s")
        ax.annotate(r["config"], (r["bits"], r["kld"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    # the stock frontier: the best KLD any stock configuration reaches at or below each size
    stock = sorted((r["bits"], r["kld"]) for r in rows if not is_ours(r["config"]))
    front, best = [], float("inf")
    for b, k in stock:
        if k < best:
            best = k
            front.append((b, k))
    if front:
        ax.step([b for b, _ in front], [k for _, k in front], where="post", c="tab:blue", lw=0.8,
                label="stock frontier")
    ax.scatter([], [], c="tab:blue", marker="s", label="stock llama.cpp")
    ax.scatter([], [], c="tab:red", marker="o", label="gguftool (cal: = kv-calibrate)")
    ax.legend(fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("bits per value (mean of K and V)")
    ax.set_ylabel("mean KLD vs f16 cache")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--calibrated", default=None, help="the same model after gguftool kv-calibrate")
    ap.add_argument("--text", required=True)
    ap.add_argument("--configs", default="q8_0/q8_0,q4_0/q4_0")
    ap.add_argument("--chunks", type=int, default=40)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--base", default=None, help="KLD base file (default: <json or model>.f16.kld, made if absent)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None, help="PNG of mean KLD against bits per value")
    ap.add_argument("--markdown", default=None, help="also write the table as markdown (docs/kv.md)")
    ap.add_argument("--record", default=None, metavar="NAME",
                    help="also store the rows under NAME in gguftool/data/kv_measured.json (what kv-plan shows)")
    a = ap.parse_args()
    # rows already in --json (same model, text, chunks) are kept and not re-run: sweeps resume and grow
    old = {}
    if a.json and Path(a.json).is_file():
        prev = json.loads(Path(a.json).read_text())
        if (prev["text"], prev["chunks"], prev["ctx"]) == (a.text, a.chunks, a.ctx):
            old = {r["config"]: r for r in prev["rows"]}
    from gguftool.native import tools
    binary = str(tools.tool("llama-perplexity"))
    base = a.base or (str(a.json or a.model) + f".{Path(a.text).stem}.{a.chunks}x{a.ctx}.f16.kld")
    rows = []
    side = Path(base + ".json")   # the f16 run's perplexity, kept beside its logits
    if Path(base).is_file() and side.is_file():
        f16 = json.loads(side.read_text())
        f16_ppl, sec = f16["ppl"], f16["seconds"]
    else:
        out, sec = perplexity(binary, a.model, a.text, "f16", "f16", a, ["--kl-divergence-base", base + ".tmp"])
        os.replace(base + ".tmp", base)
        f16_ppl = float(PPL_BASE_RE.search(out).group(1))
        side.write_text(json.dumps({"ppl": f16_ppl, "seconds": round(sec, 1)}))
    rows.append({"config": "f16/f16", "bits": 16.0, "ppl": f16_ppl, "kld": 0.0, "seconds": round(sec, 1)})
    print(f"{'config':24s} {'bits/value':>10s} {'PPL':>9s} {'dPPL':>8s} {'mean KLD':>10s}", flush=True)
    print(f"{'f16/f16':24s} {16.0:10.3f} {f16_ppl:9.4f} {0.0:+7.2f}% {0.0:10.6f}", flush=True)
    def save():
        if a.json:
            res = {"model": a.model, "calibrated": a.calibrated, "text": a.text, "chunks": a.chunks, "ctx": a.ctx,
                   "rows": rows}
            Path(a.json).write_text(json.dumps(res, indent=1))

    configs = [c for c in a.configs.split(",") if c] + [c for c in old if c not in a.configs.split(",")]
    for cfg in configs:
        if cfg == "f16/f16":
            continue
        if cfg in old:
            row = old[cfg]
            rows.append(row)
            print(f"{cfg:24s} {row['bits']:10.3f} {row['ppl']:9.4f} {100 * (row['ppl'] / f16_ppl - 1):+7.2f}% "
                  f"{row['kld']:10.6f}  (kept)", flush=True)
            continue
        cal = cfg.startswith("cal:")
        pair, *plans = cfg.removeprefix("cal:").split(" ")
        k, v = pair.split("/")
        layers = {p[0]: p[2:-1].replace(";", ",") for p in plans}   # 'k[8-19:q4_0;3:q8_0]' -> k: 8-19:q4_0,3:q8_0
        model = a.calibrated if cal else a.model
        if cal and not model:
            raise SystemExit(f"{cfg}: give --calibrated")
        out, sec = perplexity(binary, model, a.text, k, v, a, ["--kl-divergence-base", base, "--kl-divergence"], layers)
        ppl, kld = PPL_RE.search(out), KLD_RE.search(out)
        if not ppl or not kld:
            raise SystemExit(f"{cfg}: no PPL/KLD in the output:\n{out[-800:]}")
        row = {"config": cfg, "bits": plan_bits(model, k, v, layers, a.ctx) if layers else (bits(k) + bits(v)) / 2,
               **({"bits_trained_ctx": round(plan_bits(model, k, v, layers, None), 3)} if layers else {}),
               "ppl": float(ppl.group(1)),
               "kld": float(kld.group(1)), "seconds": round(sec, 1)}
        rows.append(row)
        save()
        print(f"{cfg:24s} {row['bits']:10.3f} {row['ppl']:9.4f} {100 * (row['ppl'] / f16_ppl - 1):+7.2f}% "
              f"{row['kld']:10.6f}", flush=True)
    save()
    if a.record:
        record(a, rows, f16_ppl)
    if a.markdown:
        Path(a.markdown).write_text(markdown(rows, f16_ppl))
    if a.plot:
        plot(rows[1:], a.plot, f"{Path(a.model).name}: {Path(a.text).name}, {a.chunks} x {a.ctx}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
