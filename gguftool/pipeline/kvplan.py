"""KV-cache sizing and choice: bytes per context per K/V pair, the longest context that fits, and the
measured quality of the pairs we know (gguftool/data/kv_measured.json, written by scripts/kv_frontier.py).

Sizes follow llama.cpp's allocation: n_head_kv * head_dim values of K and of V per layer and cell, each row
in the cache type's blocks; the context is padded to 256 cells; a sliding-window layer (Gemma 3) holds
pad256(min(ctx, window + n_ubatch)) cells unless llama.cpp runs with --swa-full.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..errors import GgufToolError
from ..io.reader import GGUFFile
from ..io.split import SplitGGUF, open_gguf
from ..quant import codec
from ..types import CACHE_TYPES

PAD = 256          # llama.cpp pads n_ctx and the SWA cache to 256 cells
N_UBATCH = 512     # llama.cpp's default micro-batch, part of the SWA cache size
CALIB_KEY = "gguftool.kv_calib."
MEASURED = Path(__file__).resolve().parent.parent / "data" / "kv_measured.json"
# the pairs kv-plan lists when none are asked for: the stock ones and ours
DEFAULT_PAIRS = ("f16/f16", "q8_0/q8_0", "q5_0/q5_0", "q8_0/q4_0", "q4_0/q4_0", "iq4_nl/iq4_nl",
                 "q5_0/tq3_1", "q4_0/tq3_1", "tq3_1/tq3_1")


def _pad(n: int) -> int:
    return -(-n // PAD) * PAD


@dataclass(frozen=True)
class Shape:
    n_layer: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    weights_bytes: int
    swa_layers: int = 0
    swa_window: int = 0
    n_ctx_train: int = 0
    calibrated: bool = False
    n_vocab: int = 0
    n_embd: int = 0

    @property
    def compute_bytes(self) -> int:
        """llama.cpp's CPU compute buffer, approximately: one micro-batch of float logits plus activations
        (98-99 MiB measured for SmolLM2-135M, 514 MiB for Gemma 3 270M; this gives 100 and 517)."""
        return N_UBATCH * (self.n_vocab + 4 * self.n_embd) * 4

    @classmethod
    def from_gguf(cls, f: GGUFFile | SplitGGUF) -> Shape:
        a = f.architecture

        def need(key: str) -> int:
            v = f.get(f"{a}.{key}")
            if v is None:
                raise GgufToolError(f"{f.path}: metadata {a}.{key} is missing; cannot size the KV cache",
                                    hint="give --layers/--kv-heads/--head-dim instead")
            if isinstance(v, list) and v and all(isinstance(x, int) for x in v):
                v = max(v)   # per-layer arrays: the largest
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise GgufToolError(f"{f.path}: metadata {a}.{key} = {v!r} is not a positive integer")
            return v

        n_layer = need("block_count")
        n_head = need("attention.head_count")
        n_kv = need("attention.head_count_kv") if f.get(f"{a}.attention.head_count_kv") is not None else n_head
        n_embd = need("embedding_length")
        k = need("attention.key_length") if f.get(f"{a}.attention.key_length") else n_embd // n_head
        v = need("attention.value_length") if f.get(f"{a}.attention.value_length") else n_embd // n_head
        swa = window = 0
        if f.get(f"{a}.attention.sliding_window"):
            window = need("attention.sliding_window")
            pattern = f.get(f"{a}.attention.sliding_window_pattern")
            if isinstance(pattern, list):
                swa = sum(1 for x in pattern[:n_layer] if x)
            elif a == "gemma3":
                swa = sum(1 for i in range(n_layer) if (i + 1) % 6)   # llama.cpp: every 6th layer is global
        ctx_train = f.get(f"{a}.context_length")
        emb = next((t for t in f.tensors if t.name == "token_embd.weight"), None)
        n_vocab = emb.shape[0] if emb is not None and len(emb.shape) == 2 else 0
        return cls(n_layer, n_kv, k, v, sum(t.n_bytes for t in f.tensors), swa, window,
                   ctx_train if isinstance(ctx_train, int) and ctx_train > 0 else 0,
                   any(key.startswith(CALIB_KEY) for key in f.fields), n_vocab, n_embd)


def _check(shape: Shape, type_k: str, type_v: str):
    ck, cv = codec(type_k), codec(type_v)
    for c, d in ((ck, shape.head_dim_k), (cv, shape.head_dim_v)):
        if d % c.block_size:
            raise GgufToolError(f"cache type {c.name.lower()} needs head dim divisible by {c.block_size}, model has {d}")
    return ck, cv


def bytes_per_token(shape: Shape, type_k: str, type_v: str) -> float:
    """Bytes one cell costs over all layers (what a full-context layer pays per token)."""
    ck, cv = _check(shape, type_k, type_v)
    return shape.n_layer * shape.n_head_kv * (shape.head_dim_k * ck.bpw + shape.head_dim_v * cv.bpw) / 8


def cache_bytes(shape: Shape, type_k: str, type_v: str, ctx: int, *, swa_full: bool = False) -> float:
    """The K/V cache llama.cpp allocates for a context of ctx tokens."""
    per_layer_cell = bytes_per_token(shape, type_k, type_v) / shape.n_layer
    cells = _pad(ctx)
    swa_cells = cells if swa_full else min(cells, _pad(shape.swa_window + N_UBATCH))
    return per_layer_cell * ((shape.n_layer - shape.swa_layers) * cells + shape.swa_layers * swa_cells)


def max_context(shape: Shape, type_k: str, type_v: str, budget: float, *, swa_full: bool = False) -> int:
    """The longest context (a multiple of 256, at most the trained length when known) whose cache fits."""
    cap = shape.n_ctx_train or 1 << 24
    lo, hi = 0, _pad(cap) // PAD   # in units of 256 cells; the size only grows with the context
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cache_bytes(shape, type_k, type_v, mid * PAD, swa_full=swa_full) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return min(lo * PAD, cap)


def parse_pair(spec: str) -> tuple[str, str]:
    """'q4_0/tq3_1' -> ('q4_0', 'tq3_1'); 'q8_0' -> ('q8_0', 'q8_0')."""
    k, _, v = spec.strip().lower().partition("/")
    v = v or k
    for t in (k, v):
        if t not in CACHE_TYPES:
            raise GgufToolError(f"unknown KV cache type {t!r} in {spec!r}", f"choose from {', '.join(CACHE_TYPES)}")
    return k, v


@lru_cache(maxsize=1)
def measured() -> dict:
    """{model: {"f16_ppl", "rows": {config: {"ppl", "kld", "bits"}}}}; config 'cal:K/V' = kv-calibrated file."""
    return json.loads(MEASURED.read_text())


def quality(pair: str, calibrated: bool) -> dict[str, dict]:
    """Measured PPL change and mean KLD of a pair on each model we measured, for a file with or without
    the calibration (llama.cpp applies a file's calibration to every quantized cache type)."""
    k, v = parse_pair(pair)
    quantized = not (k in ("f16", "f32", "bf16") and v in ("f16", "f32", "bf16"))
    key = ("cal:" if calibrated and quantized else "") + f"{k}/{v}"
    out = {}
    for model, m in measured()["models"].items():
        r = m["rows"].get(key)
        if r is None and not quantized:
            r = {"ppl": m["f16_ppl"], "kld": 0.0}
        if r is not None:
            q4 = m["rows"]["q4_0/q4_0"]["kld"]
            out[model] = {"dppl": 100 * (r["ppl"] / m["f16_ppl"] - 1), "kld": r["kld"], "vs_q4_0": r["kld"] / q4}
    return out


def quality_class(q: dict[str, dict]) -> str:
    """One word for the worst model: mean KLD against stock q4_0/q4_0's on the same model and text."""
    if not q:
        return "not measured"
    worst = max(x["vs_q4_0"] for x in q.values())
    kld = max(x["kld"] for x in q.values())
    if kld <= 0.01:
        return "near f16"
    if worst <= 0.8:
        return "better than q4_0"
    if worst <= 1.05:
        return "like q4_0"
    if worst <= 2.0:
        return "lossy"
    return "very lossy"


def plan(shape: Shape, memory: int, *, ctx: int | None = None, kv_only: bool = False,
         pairs: tuple[str, ...] = DEFAULT_PAIRS, swa_full: bool = False) -> list[dict]:
    budget = memory if kv_only else memory - shape.weights_bytes - shape.compute_bytes
    if budget <= 0:
        raise GgufToolError(f"the weights ({shape.weights_bytes / 2**20:.1f} MiB) and compute buffers "
                            f"(~{shape.compute_bytes / 2**20:.0f} MiB) alone need more than the {memory / 2**20:.1f} MiB "
                            "budget", "give a larger --memory, or --kv-only for a cache-only budget")
    rows = []
    for pair in pairs:
        k, v = parse_pair(pair)
        ck, cv = codec(k), codec(v)
        if shape.head_dim_k % ck.block_size or shape.head_dim_v % cv.block_size:
            continue  # llama.cpp refuses a cache type whose block does not divide the head dim
        dk, dv = shape.head_dim_k, shape.head_dim_v
        now, cal = quality(f"{k}/{v}", shape.calibrated), quality(f"{k}/{v}", True)
        row = {"pair": f"{k}/{v}", "bits_per_value": (ck.bpw * dk + cv.bpw * dv) / (dk + dv),
               "bytes_per_token": bytes_per_token(shape, k, v),
               "max_context": max_context(shape, k, v, budget, swa_full=swa_full),
               "vs_f16": bytes_per_token(shape, "f16", "f16") / bytes_per_token(shape, k, v),
               "quality": now, "class": quality_class(now),
               "quality_calibrated": cal, "class_calibrated": quality_class(cal)}
        if ctx:
            row["kv_bytes_at_ctx"] = cache_bytes(shape, k, v, ctx, swa_full=swa_full)
            row["fits"] = row["kv_bytes_at_ctx"] <= budget
        rows.append(row)
    return rows


def _score(q: dict[str, dict]) -> float:
    return max(x["vs_q4_0"] for x in q.values()) if q else float("inf")


def best(rows: list[dict], *, calibrated: bool) -> dict | None:
    """The measured pair of lowest worst-model KLD (relative to q4_0/q4_0) among those that fit."""
    key = "quality_calibrated" if calibrated else "quality"
    fit = [r for r in rows if r.get("fits", r["max_context"] > 0) and r[key]]
    return min(fit, key=lambda r: (_score(r[key]), r["bits_per_value"]), default=None)


def columns(model: Path, k: str, v: str, ctx: int) -> dict:
    """Bits per cached value and KV memory of a K/V cache pair, from the model's own metadata (validate's report)."""
    try:
        shape = Shape.from_gguf(open_gguf(str(model)))
        bpt = bytes_per_token(shape, k, v)
        mib = cache_bytes(shape, k, v, ctx) / 2**20
    except (GgufToolError, OSError, ValueError):
        shape = bpt = mib = None
    ck, cv = codec(k), codec(v)
    dk, dv = (shape.head_dim_k, shape.head_dim_v) if shape else (1, 1)
    return {"bits_per_value": (ck.bpw * dk + cv.bpw * dv) / (dk + dv), "kv_bytes_per_token": bpt,
            "kv_mib_at_ctx": mib}
