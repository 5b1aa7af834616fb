"""Attention-score error of K cache types, measured on the queries and keys of a real run.

The K side is where the article's bug hid and where 3-4 bit caches lose most, so validate --isolate
reports, per K type, what the cache does to q.k: the keys and queries of one chunk are dumped from our
llama.cpp build (gguftool-kvdump, f16 cache), put through what llama.cpp does for a quantized cache
(the file's kv-calibrate transform, upstream's head-wide Hadamard rotation) and through the type's own
quantizer (the same C code as the runtime), then compared with the exact scores.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from ..io.split import open_gguf
from ..pipeline import kvcalib
from ..quant import codec

UNQUANTIZED = ("f32", "f16", "bf16")


def calibration(model: Path) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """{layer: (k_mean, k_scale)} from a kv-calibrated file; empty when it has none."""
    f = open_gguf(model)
    out = {}
    for key in f.fields:
        if key.startswith(kvcalib.META + "blk.") and key.endswith(".k_mean"):
            il = int(key[len(kvcalib.META + "blk."):].split(".")[0])
            scale = f.get(f"{kvcalib.META}blk.{il}.k_scale")
            out[il] = (np.asarray(f.get(key), np.float64), np.asarray(scale, np.float64))
    return out


def _cache_keys(t: str, k: np.ndarray) -> np.ndarray:
    """What a cache of type t gives back for keys k (T, Hkv, d)."""
    rows = k.reshape(k.shape[0], -1).astype(np.float32)
    if t in ("f32",):
        return k
    if t in ("f16",):
        return rows.astype(np.float16).astype(np.float64).reshape(k.shape)
    c = codec(t)
    return c.dequantize(c.quantize(rows, threads=1)).astype(np.float64).reshape(k.shape)


def layer_errors(t: str, q: np.ndarray, k: np.ndarray, n_ctx: int,
                 calib: tuple[np.ndarray, np.ndarray] | None, max_queries: int = 128) -> tuple[float, float]:
    """(relative RMS score error, attention KL) of K type t on one layer's q (T, Hq, d) and k (T, Hkv, d).

    The relative error is |q.k_hat - q.k| in RMS over causal (query, key) pairs of the last max_queries
    queries of each chunk, over the RMS spread of the exact scores of each query (what softmax sees)."""
    t_, hq, d = q.shape
    hkv = k.shape[1]
    q64, k64 = q.astype(np.float64), k.astype(np.float64)
    qs, ks = q64, k64
    if t not in UNQUANTIZED:
        if calib is not None:   # (k - mu) / s in the cache, q * s: q.k changes by q.mu, a per-query constant
            mu, s = (a.reshape(hkv, d) for a in calib)
            ks = (k64 - mu) / s
            qs = (q64.reshape(t_, hkv, hq // hkv, d) * s[None, :, None, :]).reshape(t_, hq, d)
        nrot = kvcalib.upstream_rotation(d)
        qs, ks = kvcalib.rotate(qs, nrot), kvcalib.rotate(ks, nrot)
    kh = _cache_keys(t, ks)
    g = hq // hkv
    err2 = spread2 = 0.0
    rows = slice(n_ctx - min(max_queries, n_ctx), n_ctx)
    for c0 in range(0, t_ - n_ctx + 1, n_ctx):
        for h in range(hq):
            qq = qs[c0:c0 + n_ctx, h][rows]
            exact = qq @ ks[c0:c0 + n_ctx, h // g].T
            got = qq @ kh[c0:c0 + n_ctx, h // g].T
            causal = np.tril(np.ones((n_ctx, n_ctx), bool))[rows]
            e = np.where(causal, got - exact, 0.0)
            m = np.where(causal, exact, 0.0).sum(1, keepdims=True) / causal.sum(1, keepdims=True)
            err2 += float((e ** 2).sum())
            spread2 += float((np.where(causal, exact - m, 0.0) ** 2).sum())
    kl = kvcalib.attention_kl(q64, k64, qs, kh, n_ctx, max_queries=max_queries)
    return float(np.sqrt(err2 / max(spread2, 1e-300))), kl


def score_errors(model: Path, text: Path, types: list[str], *, ctx: int = 512, threads: int = 2) -> dict:
    """{"types": {t: {"rel_rms", "worst_layer", "worst_rel_rms", "attn_kl"}}, "calibrated", "tokens"}"""
    calib = calibration(model)
    with tempfile.TemporaryDirectory(prefix="gguftool-kscore-") as tmp:
        kvcalib.run_dump(model, text, Path(tmp), chunks=1, ctx=ctx, threads=threads)
        layers, n_ctx = kvcalib.load_dump(Path(tmp))
    out = {}
    for t in dict.fromkeys(types):
        if t not in UNQUANTIZED and codec(t).quantize is None:
            out[t] = {"skipped": f"gguftool has no {t} quantizer (gguf-py lacks one)"}
            continue
        per = {il: layer_errors(t, L["Q"], L["K"], n_ctx, calib.get(il)) for il, L in sorted(layers.items())}
        worst = max(per, key=lambda il: per[il][0])
        out[t] = {"rel_rms": float(np.mean([e for e, _ in per.values()])), "worst_layer": worst,
                  "worst_rel_rms": per[worst][0], "attn_kl": float(np.mean([kl for _, kl in per.values()]))}
    return {"types": out, "calibrated": bool(calib), "tokens": n_ctx, "layers": len(layers)}
