#!/usr/bin/env python3
"""Generate TQ3_0's constants: the 3-bit Lloyd-Max codebook and the fixed sign pattern D.

Writes gguftool/quant/tq3_codebook.py and gguftool/_fast/gqt_tq3_codebook.h (the one source for
Python and C); tests/test_tq3_codebook.py regenerates both and compares them with the committed
files. Nothing here runs at import or model-load time.

Codebook. After an orthonormal rotation of a random direction in d dimensions, one coordinate t
(scaled by sqrt(d), so that E t^2 = 1) has the density

    f(t) = (1 - t^2/d)^((d-3)/2) / Z   on |t| < sqrt(d)

(a Beta law, N(0, 1) as d grows). The 8-level Lloyd-Max quantizer for f alternates
"boundaries = midpoints of centroids" and "centroids = E[t | cell]" until nothing moves. The
cell masses and second moments come from Gauss-Legendre quadrature (the integrand is a
polynomial-like smooth function on each cell, so 256 nodes are exact to float64 rounding); the
first moment has the closed form  int t (1-t^2/d)^m dt = -d/(2(m+1)) (1-t^2/d)^(m+1).

Sign pattern. D = diag(s_0..s_31) with s_j = -1 where bit j of a 32-bit word is set. The word is
the first one in the stream  sha256(f"{SEED}:{i}")[:4] (little-endian), i = 0, 1, ...  whose
Walsh spectrum is as flat as five variables allow (max |sum_j s_j (-1)^popcount(a&j)| = 8;
bent patterns, with all magnitudes equal, do not exist for 32 = 2^5). A flat spectrum means a
constant block, or any Walsh function, leaves H*D spread over all 32 coordinates instead of
landing in one, while a single outlier is spread by H whatever D is.

    python scripts/gen_tq3_codebook.py           # rewrite both files
    python scripts/gen_tq3_codebook.py --check   # exit 1 if the committed files differ
"""
from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np

D = 32          # block size = rotation size
BITS = 3
SEED = "gguftool TQ3_0 sign pattern v1"
ROOT = Path(__file__).resolve().parent.parent
PY_OUT = ROOT / "gguftool" / "quant" / "tq3_codebook.py"
C_OUT = ROOT / "gguftool" / "_fast" / "gqt_tq3_codebook.h"

_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(256)


def _density_unnormalised(t: np.ndarray, d: int) -> np.ndarray:
    return np.power(np.maximum(1.0 - t * t / d, 0.0), (d - 3) / 2.0)


def _moment(a: float, b: float, d: int, k: int) -> float:
    """int_a^b t^k (1 - t^2/d)^((d-3)/2) dt."""
    if k == 1:
        m = (d - 3) / 2.0
        g = lambda t: -d / (2.0 * (m + 1.0)) * max(1.0 - t * t / d, 0.0) ** (m + 1.0)  # noqa: E731
        return g(b) - g(a)
    t = 0.5 * (b - a) * _NODES + 0.5 * (b + a)
    return float(0.5 * (b - a) * np.dot(_WEIGHTS, t ** k * _density_unnormalised(t, d)))


def lloyd_max(d: int = D, bits: int = BITS, tol: float = 1e-15, max_iter: int = 100_000):
    """Symmetric Lloyd-Max quantizer for the scaled coordinate law. Returns (centroids ascending,
    boundaries ascending, distortion E(t - Q(t))^2, iterations)."""
    half = 2 ** (bits - 1)
    edge = np.sqrt(d)
    z = 2.0 * _moment(0.0, edge, d, 0)                      # normalisation
    # start from the Gaussian-like uniform grid
    c = (np.arange(half) + 0.5) * (2.0 / half)
    for it in range(1, max_iter + 1):  # noqa: B007 - the count of iterations is returned
        b = np.concatenate(([0.0], 0.5 * (c[:-1] + c[1:]), [edge]))
        new = np.array([_moment(b[i], b[i + 1], d, 1) / _moment(b[i], b[i + 1], d, 0) for i in range(half)])
        if np.max(np.abs(new - c)) <= tol:
            c = new
            break
        c = new
    else:
        raise RuntimeError("Lloyd-Max did not converge")
    b = np.concatenate(([0.0], 0.5 * (c[:-1] + c[1:]), [edge]))
    dist = 0.0
    for i in range(half):
        m0, m1, m2 = (_moment(b[i], b[i + 1], d, k) for k in (0, 1, 2))
        dist += m2 - 2.0 * c[i] * m1 + c[i] * c[i] * m0
    dist = 2.0 * dist / z
    centroids = np.concatenate((-c[::-1], c))
    bounds = 0.5 * (centroids[:-1] + centroids[1:])
    bounds[half - 1] = 0.0
    return centroids, bounds, float(dist), it


def hadamard(n: int) -> np.ndarray:
    """Sylvester Hadamard matrix, H[i, j] = (-1)^popcount(i & j) (unnormalised)."""
    i = np.arange(n)
    bits = np.bitwise_and.outer(i, i)
    pop = np.zeros_like(bits)
    for k in range(n.bit_length()):
        pop += (bits >> k) & 1
    return np.where(pop % 2 == 0, 1, -1).astype(np.int64)


def sign_pattern(n: int = D, seed: str = SEED) -> tuple[int, int]:
    """(32-bit word, stream index) of the first hash word whose sign pattern has max |Walsh| == 8."""
    h = hadamard(n)
    for i in range(1_000_000):
        word = int.from_bytes(hashlib.sha256(f"{seed}:{i}".encode()).digest()[:4], "little")
        s = np.where((word >> np.arange(n)) & 1, -1, 1)
        if np.abs(h @ s).max() == 8:
            return word, i
    raise RuntimeError("no flat sign pattern found")


def _f32_hex(v: float) -> str:
    """C99 hex literal of the float32 nearest to v (exact: no decimal parsing involved)."""
    return float(np.float32(v)).hex() + "f"


def render(centroids, bounds, dist, word, index) -> tuple[str, str]:
    signs = [(-1 if (word >> j) & 1 else 1) for j in range(D)]
    head = (f"Generated by scripts/gen_tq3_codebook.py (d={D}, b={BITS}, sign seed {SEED!r}, "
            f"stream index {index}). Do not edit.")
    py = [f'"""{head}', "",
          "3-bit Lloyd-Max codebook for one coordinate of a rotated 32-dim direction, scaled to unit",
          "variance (density (1 - t^2/32)^(29/2) on |t| < sqrt(32)), and TQ3_0's fixed sign pattern.",
          '"""', "",
          f"BLOCK = {D}",
          f"BITS = {BITS}",
          "# index k -> centroid, ascending",
          "CENTROIDS = (" + ", ".join(repr(float(v)) for v in centroids) + ")",
          "# nearest-centroid boundaries, ascending (midpoints; the middle one is exactly 0)",
          "BOUNDARIES = (" + ", ".join(repr(float(v)) for v in bounds) + ")",
          f"DISTORTION = {dist!r}  # E(t - Q(t))^2 for the law above",
          f"SIGN_WORD = 0x{word:08X}  # bit j set: coordinate j is negated before the Hadamard transform",
          "SIGNS = (" + ", ".join(str(s) for s in signs) + ")",
          f"SQRT_BLOCK = {float(np.sqrt(np.float64(D)))!r}  # sqrt(32), correctly rounded",
          f"INV_SQRT_BLOCK_F32 = float.fromhex({float(np.float32(1.0 / np.sqrt(np.float64(D)))).hex()!r})"
          "  # float32(1/sqrt(32)), used by decode and vec_dot",
          ""]
    c = [f"/* {head} */",
         "/* 3-bit Lloyd-Max codebook of a rotated 32-dim direction's coordinate (unit variance), and the",
         " * fixed sign pattern D of TQ3_0 (see docs/tq3.md). Python twin: gguftool/quant/tq3_codebook.py. */",
         "#pragma once",
         "#include <stdint.h>",
         "",
         f"#define GQT_TQ3_DISTORTION {dist!r}",
         f"#define GQT_TQ3_SIGN_WORD UINT32_C(0x{word:08X}) /* bit j set: x[j] is negated */",
         f"#define GQT_TQ3_SQRT32 {float(np.sqrt(np.float64(D)))!r} /* sqrt(32) as a double */",
         f"#define GQT_TQ3_INV_SQRT32F {_f32_hex(1.0 / np.sqrt(np.float64(D)))} /* float(1/sqrt(32)) */",
         "",
         "/* index k -> centroid (double: the quantizer; float: decode and vec_dot) */",
         "static const double gqt_tq3_centroids_d[8] = {",
         *[f"    {float(v)!r}," for v in centroids],
         "};",
         "static const float gqt_tq3_centroids_f[8] = {",
         *[f"    {_f32_hex(v)}, /* {float(np.float32(v))!r} */" for v in centroids],
         "};",
         "/* boundary k separates index k and k+1 */",
         "static const double gqt_tq3_bounds_d[7] = {",
         *[f"    {float(v)!r}," for v in bounds],
         "};",
         ""]
    return "\n".join(py), "\n".join(c)


def generate() -> tuple[str, str]:
    centroids, bounds, dist, _ = lloyd_max()
    word, index = sign_pattern()
    return render(centroids, bounds, dist, word, index)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    args = ap.parse_args(argv)
    py, c = generate()
    if args.check:
        stale = [str(p) for p, text in ((PY_OUT, py), (C_OUT, c)) if not p.exists() or p.read_text() != text]
        for p in stale:
            print(f"stale: {p}", file=sys.stderr)
        return 1 if stale else 0
    PY_OUT.write_text(py)
    C_OUT.write_text(c)
    centroids, bounds, dist, it = lloyd_max()
    print("centroids", np.array2string(centroids, precision=6))
    print("boundaries", np.array2string(bounds, precision=6))
    print(f"distortion {dist:.6f} after {it} Lloyd iterations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
