"""Turn a validation record into report.json (the machine-readable record), report.md and PNG plots.

Plots use matplotlib's Agg backend (PyPI wheels for every platform, no display needed, and the
de-facto standard a reviewer can re-plot from report.json with). It is optional: without it the
Markdown and JSON are written and the report says the plots were skipped and why.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

from ..errors import GgufToolError
from ..io.writer import check_replaceable

REPORT_FILES = ("report.json", "report.md", "ppl_vs_bits.png", "tokens_per_s.png", "tokens_per_s_over_time.png")


def check_out(out: Path) -> None:
    """Before a validation run (it can take hours): the report folder and the files it will hold can be written."""
    if out.exists() and not out.is_dir():
        raise GgufToolError(f"{out}: the report folder is not a directory", hint="give a folder name for --out")
    for name in REPORT_FILES:
        check_replaceable(out / name)


def _atomic_write(path: Path, data: bytes) -> None:
    check_replaceable(path)   # a FIFO or device node there is refused, never replaced
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _clean(x):
    """JSON has no NaN/Infinity: write them as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _n(x, fmt="{:.4f}", dash="-") -> str:
    return fmt.format(x) if isinstance(x, (int, float)) and math.isfinite(x) else dash


def _verdict(iso: dict, ty: str) -> str:
    if ty in iso["verdicts"]:
        return f"bug: {iso['verdicts'][ty]} side"
    sides = sorted({f["side"] for f in iso["flags"] if ty in (f["k"], f["v"])})
    return f"suspect: {' and '.join(sides)} side" if sides else "ok"


def _label(c: dict) -> str:
    return f"{c['k']}/{c['v']}"


# ------------------------------------------------------------------------------------------- plots

def _save_png(fig, path: Path) -> None:
    """Through _atomic_write: savefig into an existing FIFO would block, into a device node would write to it."""
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    _atomic_write(path, buf.getvalue())


def plots(rec: dict, out: Path) -> dict[str, str]:
    """Write the PNGs; returns name -> file (or {'skipped': reason})."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {"skipped": "matplotlib is not installed (`pip install matplotlib`)"}
    files = {}
    title = f"{Path(rec['model']['path']).name} - {rec['target']['target']}"
    cells = [c for c in rec["cells"] if not c.get("failed") and c.get("ppl") is not None and math.isfinite(c["ppl"])]
    if cells:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        style = {"reference": ("k", "*"), "config": ("C0", "o"), "both": ("C0", "o"), "K-only": ("C3", "^"),
                 "V-only": ("C2", "v")}
        seen = set()
        for c in cells:
            col, mk = style.get(c["role"], ("C0", "o"))
            lab = c["role"] if c["role"] not in seen else None
            seen.add(c["role"])
            # no error bars: every cell reads the same text, so their +/- (text sampling) is shared;
            # the KLD column is the paired comparison
            ax.plot(c["bits_per_value"], c["ppl"], mk, color=col, label=lab)
            ax.annotate(_label(c), (c["bits_per_value"], c["ppl"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
        if any(c["ppl"] > 3 * rec["reference"]["ppl"] for c in cells):
            ax.set_yscale("log")
        ax.set_xlabel("KV cache bits per value (K and V averaged over head dims)")
        ax.set_ylabel("perplexity (lower is better)")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        files["ppl_vs_bits"] = "ppl_vs_bits.png"
        _save_png(fig, out / files["ppl_vs_bits"])
        plt.close(fig)
    bench = [(p, p["bench"]) for p in rec.get("perf", []) if p.get("bench") and not p["bench"].get("failed")]
    if bench:
        fig, ax = plt.subplots(figsize=(7, 4))
        xs = range(len(bench))
        for off, key, col in ((-0.2, "pp", "C0"), (0.2, "tg", "C1")):
            vals = [b.get(key, {}).get("avg_ts", 0) for _, b in bench]
            errs = [b.get(key, {}).get("stddev_ts", 0) for _, b in bench]
            name = next((b[key]["test"] for _, b in bench if key in b), key)
            ax.bar([x + off for x in xs], vals, 0.4, yerr=errs, color=col, label=name, capsize=2)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([f"{p['k']}/{p['v']}" for p, _ in bench], rotation=20, fontsize=8)
        ax.set_ylabel("tokens / s (llama-bench)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        files["tokens_per_s"] = "tokens_per_s.png"
        _save_png(fig, out / files["tokens_per_s"])
        plt.close(fig)
    sus = [p for p in rec.get("perf", []) if p.get("sustained") and p["sustained"].get("points")]
    if sus:
        fig, ax = plt.subplots(figsize=(7, 4))
        for p in sus:
            pts = p["sustained"]["points"]
            ax.plot([q["t"] for q in pts], [q["tps"] for q in pts], marker=".", label=f"{p['k']}/{p['v']}")
        ax.set_xlabel("seconds since start")
        ax.set_ylabel("generation tokens / s")
        ax.set_title(f"sustained generation - {title}", fontsize=9)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        files["sustained"] = "tokens_per_s_over_time.png"
        _save_png(fig, out / files["sustained"])
        plt.close(fig)
    return files


# ---------------------------------------------------------------------------------------- markdown

def markdown(rec: dict, images: dict) -> str:
    s = rec["settings"]
    t = rec["target"]
    ref = rec["reference"]
    L = [f"# gguftool validate: {Path(rec['model']['path']).name} on {t['target']}", ""]
    n_sus = sum(1 for f in (rec.get("isolate") or {}).get("flags", []) if f["level"] == "suspect")
    verdict = ("PASS" if rec.get("ok") else "CHECK") + (f" ({n_sus} suspect cell{'s' if n_sus > 1 else ''})" if n_sus else "")
    L += [f"**{verdict}** - {rec['created']}, {rec['seconds']} s", ""]
    L += ["| | |", "|---|---|",
          f"| model | `{rec['model']['path']}` ({rec['model']['bytes'] / 2**20:.1f} MiB, "
          f"sha256 `{rec['model']['sha256'][:16]}`) |",
          f"| text | `{rec['text']['path']}` ({rec['text']['bytes']:,} bytes, sha256 `{rec['text']['sha256'][:16]}`) |",
          f"| target | {t['target']}" + (" (emulated: peak RSS includes qemu)" if t.get("emulated") else "")
          + (f", serial {t.get('serial')}" if t.get("serial") else "") + f", tools in `{t['bin_dir']}` |",
          f"| perplexity | {s['chunks']} chunks x {s['ctx']} tokens, {s['threads']} threads, flash attention on, "
          f"rotation {'on (upstream default)' if s['rotation'] else 'off (LLAMA_ATTN_ROT_DISABLE=1)'} |",
          f"| reference | {('model `' + Path(ref['model']).name + '`, ') if ref.get('model') else ''}K=f16 V=f16: "
          f"PPL {ref['ppl']:.4f} +/- {ref['ppl_err']:.4f}; KLD of every row is against its logits |",
          ""]
    L += ["## Quality", "",
          "| K | V | role | bits/value | KV KiB/token | PPL | +/- | PPL ratio | mean KLD | KLD 99% | same top-1 % "
          "| peak RSS MiB |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in rec["cells"]:
        if c.get("failed"):
            L.append(f"| {c['k']} | {c['v']} | {c['role']} | {_n(c.get('bits_per_value'), '{:.2f}')} | | FAILED | | | | | | |")
            continue
        kib = c.get("kv_bytes_per_token")
        L.append(f"| {c['k']} | {c['v']} | {c['role']} | {_n(c.get('bits_per_value'), '{:.2f}')} | "
                 f"{_n(kib / 1024 if kib else None, '{:.2f}')} | {_n(c.get('ppl'))} | {_n(c.get('ppl_err'))} | "
                 f"{_n(c['ppl'] / ref['ppl'] if c.get('ppl') else None, '{:.3f}')} | {_n(c.get('kld'), '{:.5f}')} | "
                 f"{_n(c.get('kld_p99'), '{:.4f}')} | {_n(c.get('same_top_p_pct'), '{:.2f}')} | "
                 f"{_n(c['peak_rss_kib'] / 1024 if c.get('peak_rss_kib') else None, '{:.1f}')} |")
    fails = [c for c in rec["cells"] if c.get("failed")]
    for c in fails:
        L.append(f"\n- K={c['k']} V={c['v']} failed: `{c.get('error', '')[:300]}`"
                 + (f" ({c['hint']})" if c.get("hint") else ""))
    L.append("")
    if images.get("ppl_vs_bits"):
        L += [f"![perplexity vs bits per value]({images['ppl_vs_bits']})", ""]
    iso = rec.get("isolate")
    if iso:
        L += ["## K/V isolation", ""]
        by = {(c["k"], c["v"]): c for c in rec["cells"]}
        types = sorted({t for k, v in by for t in (k, v) if t != "f16" and ((t, "f16") in by or ("f16", t) in by)})
        L += ["| type | K-only PPL | V-only PPL | both PPL | K-only KLD | V-only KLD | both KLD | verdict |",
              "|---|---|---|---|---|---|---|---|"]
        for ty in types:
            row = [by.get((ty, "f16"), {}), by.get(("f16", ty), {}), by.get((ty, ty), {})]
            L.append(f"| {ty} | " + " | ".join(_n(c.get("ppl"), "{:.3f}", "FAILED" if c.get("failed") else "-") for c in row)
                     + " | " + " | ".join(_n(c.get("kld"), "{:.4f}") for c in row)
                     + f" | {_verdict(iso, ty)} |")
        L.append("")
        if iso["flags"]:
            for f in iso["flags"]:
                L.append(f"- **{f['level']}** {f['message']}")
        else:
            L.append("No cell is far from its neighbours: differences look like quantization error, not a kernel bug.")
        r = iso.get("rule", {})
        L += ["", f"Rule: a single-side cell is flagged when its score (ln PPL ratio, KLD) is >= {r.get('factor')}x what "
              "the same side of the other types predicts at its bits (error ~ 4^-bits; with no other type, 5x its own "
              "other side) and above an absolute level (suspect: PPL +10 % or KLD 0.05; bug: PPL +50 % or KLD 0.25), "
              "or when its run failed; a both-sides cell is compared with the sum of its two single-side cells.", ""]
    ks = rec.get("k_score_error")
    if ks:
        L += ["## Attention-score error of the K cache", ""]
        if ks.get("skipped"):
            L += [f"Not measured: {ks['skipped']}", ""]
        else:
            cal = "the file's kv-calibrate transform, " if ks["calibrated"] else ""
            L += [f"Keys and queries of {ks['tokens']} tokens from a real run (f16 cache), put through what the cache "
                  f"does ({cal}upstream's rotation, "
                  "the type's quantizer); relative error = RMS of q.k_hat - q.k over the RMS spread of each query's "
                  f"exact scores, mean over {ks['layers']} layers.", "",
                  "| K type | relative score error | worst layer | its error | attention KL |", "|---|---|---|---|---|"]
            for t, e in ks["types"].items():
                if e.get("skipped"):
                    L.append(f"| {t} | not measured: {e['skipped']} | | | |")
                    continue
                L.append(f"| {t} | {e['rel_rms']:.4f} | {e['worst_layer']} | {e['worst_rel_rms']:.4f} | {e['attn_kl']:.2e} |")
            L.append("")
    perf = rec.get("perf", [])
    if any(p.get("bench") for p in perf):
        L += ["## Speed (llama-bench)", "", "| K | V | test | t/s | +/- | test | t/s | +/- |",
              "|---|---|---|---|---|---|---|---|"]
        for p in perf:
            b = p.get("bench") or {}
            if b.get("failed"):
                L.append(f"| {p['k']} | {p['v']} | FAILED | | | | | |")
                continue
            pp, tg = b.get("pp", {}), b.get("tg", {})
            L.append(f"| {p['k']} | {p['v']} | {pp.get('test', '')} | {_n(pp.get('avg_ts'), '{:.1f}')} | "
                     f"{_n(pp.get('stddev_ts'), '{:.1f}')} | {tg.get('test', '')} | {_n(tg.get('avg_ts'), '{:.1f}')} | "
                     f"{_n(tg.get('stddev_ts'), '{:.1f}')} |")
        L.append("")
        if images.get("tokens_per_s"):
            L += [f"![tokens per second]({images['tokens_per_s']})", ""]
    if any(p.get("sample") for p in perf):
        L += ["## Generation sample", "", f"Prompt: *{s['prompt']}* ({s['gen_tokens']} tokens, greedy, seed {s['seed']})", ""]
        for p in perf:
            sm = p.get("sample")
            if not sm:
                continue
            body = ("FAILED: " + sm.get("error", "")[:200]) if sm.get("failed") else sm.get("text", "").replace("\n", " ")
            L.append(f"- **{p['k']}/{p['v']}** ({_n(sm.get('gen_tps'), '{:.1f}')} t/s): {body}")
        L.append("")
    if any(p.get("sustained") for p in perf):
        L += ["## Sustained generation", "", "| K | V | calls | first quarter t/s | last quarter t/s | retained |",
              "|---|---|---|---|---|---|"]
        for p in perf:
            su = p.get("sustained")
            if su:
                L.append(f"| {p['k']} | {p['v']} | {su.get('calls')} | {_n(su.get('first_quarter_tps'), '{:.1f}')} | "
                         f"{_n(su.get('last_quarter_tps'), '{:.1f}')} | {_n(su.get('retained'), '{:.2f}')} |")
        L.append("")
        if images.get("sustained"):
            L += [f"![tokens per second over time]({images['sustained']})", ""]
    if images.get("skipped"):
        L += [f"Plots skipped: {images['skipped']}.", ""]
    if rec.get("pushes"):
        sk = sum(1 for p in rec["pushes"] if p["skipped"])
        L += [f"Pushed {len(rec['pushes']) - sk} file(s), skipped {sk} already on the device (same sha256).", ""]
    L += ["## Commands", "", "Every number above comes from one of these runs (repeat any by hand):", "", "```"]
    L += [f"{r['command']}    # rc={r['rc']} {r['seconds']} s" for r in rec.get("runs", [])]
    L += ["```", ""]
    return "\n".join(L)


def write(rec: dict, out: Path) -> dict[str, Path]:
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GgufToolError(f"cannot create the report folder {out}: {e.strerror}") from e
    images = plots(rec, out)
    rec["images"] = images
    paths = {"json": out / "report.json", "md": out / "report.md"}
    _atomic_write(paths["json"], (json.dumps(_clean(rec), indent=1) + "\n").encode())
    _atomic_write(paths["md"], markdown(rec, images).encode())
    for k, v in images.items():
        if k != "skipped":
            paths[k] = out / v
    return paths
