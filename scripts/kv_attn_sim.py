#!/usr/bin/env python
"""Exploration: attention KL of K-cache quantizers on Q/K dumped by gguftool-kvdump (f16 cache).

    python scripts/kv_attn_sim.py DUMPDIR --rot 64 --types q4_0,q5_0,lm4b32,lm3b32
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy.linalg import hadamard

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def load(d: Path):
    man = json.loads((d / "manifest.json").read_text())
    out = {}
    for name, (t, h, dim) in man["tensors"].items():
        out[name] = np.fromfile(d / f"{name}.f32", dtype=np.float32).reshape(t, h, dim)
    return out, man["n_ctx"]


def lloyd_max_gauss(bits: int, iters: int = 300) -> np.ndarray:
    from scipy.stats import norm
    n = 1 << bits
    c = norm.ppf((np.arange(n) + 0.5) / n)
    for _ in range(iters):
        b = np.concatenate([[-np.inf], (c[1:] + c[:-1]) / 2, [np.inf]])
        lo, hi = b[:-1], b[1:]
        mass = norm.cdf(hi) - norm.cdf(lo)
        c = (norm.pdf(lo) - norm.pdf(hi)) / mass
    return c


def q_codebook(x: np.ndarray, block: int, cb: np.ndarray, passes: int = 2) -> np.ndarray:
    """blocks of `block` values: x ~ s * cb[idx], s least squares (fp16), Lloyd passes on the scale."""
    sh = x.shape
    xb = x.reshape(-1, block).astype(np.float64)
    rms = np.sqrt((xb ** 2).mean(1, keepdims=True))
    s = np.where(rms > 0, rms, 1.0)
    bounds = (cb[1:] + cb[:-1]) / 2
    for _ in range(passes + 1):
        idx = np.searchsorted(bounds, xb / s)
        c = cb[idx]
        s = (xb * c).sum(1, keepdims=True) / np.maximum((c * c).sum(1, keepdims=True), 1e-30)
        s = np.where(s > 0, s, 1.0)
        s = s.astype(np.float16).astype(np.float64)
    return (s * cb[idx]).reshape(sh).astype(np.float32)


def q_stock(x: np.ndarray, name: str) -> np.ndarray:
    import gguf
    import gguf.quants as gq
    t = gguf.GGMLQuantizationType[name.upper()]
    return gq.dequantize(gq.quantize(x.reshape(-1, x.shape[-1]), t), t).reshape(x.shape)


def quantizer(name: str):
    if name.startswith("lm"):
        bits, block = name[2:].split("b")
        cb = lloyd_max_gauss(int(bits))
        return lambda x: q_codebook(x, int(block), cb)
    if name == "f16":
        return lambda x: x.astype(np.float16).astype(np.float32)
    return lambda x: q_stock(x, name)


def softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def attn_kl(q, k, kh, n_ctx):
    """mean KL(p || p_hat) over queries; q (T, Hq, d), k/kh (T, Hkv, d); causal within chunks."""
    T, Hq, d = q.shape
    Hkv = k.shape[1]
    g = Hq // Hkv
    kls = []
    mask = np.triu(np.full((n_ctx, n_ctx), -np.inf), 1)
    for c0 in range(0, T, n_ctx):
        for h in range(Hq):
            qq = q[c0:c0 + n_ctx, h].astype(np.float64)
            kk = k[c0:c0 + n_ctx, h // g].astype(np.float64)
            kq = kh[c0:c0 + n_ctx, h // g].astype(np.float64)
            s = qq @ kk.T / np.sqrt(d) + mask
            sh = qq @ kq.T / np.sqrt(d) + mask
            p, ph = softmax(s), softmax(sh)
            with np.errstate(divide="ignore", invalid="ignore"):
                kl = np.where(p > 0, p * (np.log(p) - np.log(np.maximum(ph, 1e-300))), 0).sum(-1)
            kls.append(kl[1:].mean())
    return float(np.mean(kls))


def rotate(x, n):
    H = hadamard(n).astype(np.float64) / np.sqrt(n)
    T, h, d = x.shape
    return (x.reshape(T, h, d // n, n).astype(np.float64) @ H).reshape(T, h, d).astype(np.float32)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dump")
    ap.add_argument("--rot", type=int, default=64)
    ap.add_argument("--types", default="q8_0,q5_0,q4_0,lm4b32,lm3b32")
    ap.add_argument("--layers", default="")
    ap.add_argument("--tokens", type=int, default=1024)
    a = ap.parse_args()
    data, n_ctx = load(Path(a.dump))
    layers = sorted(int(n.split("-")[1]) for n in data if n.startswith("Kcur-"))
    if a.layers:
        layers = [int(x) for x in a.layers.split(",")]
    types = a.types.split(",")
    res = {t: [] for t in types}
    for il in layers:
        q = data[f"Qcur-{il}"][: a.tokens]
        k = data[f"Kcur-{il}"][: a.tokens]
        qr, kr = rotate(q, a.rot), rotate(k, a.rot)
        T, h, d = kr.shape
        row = kr.reshape(T, h * d)
        line = [f"L{il:2d}"]
        for t in types:
            kh = quantizer(t)(row).reshape(T, h, d)
            kl = attn_kl(qr, kr, kh, n_ctx)
            res[t].append(kl)
            line.append(f"{t}={kl:.2e}")
        print(" ".join(line), flush=True)
    print("mean:", " ".join(f"{t}={np.mean(v):.3e}" for t, v in res.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
