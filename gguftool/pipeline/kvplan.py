"""KV-cache sizing from a model's own metadata: bytes per token per cache type, longest context that fits.

llama.cpp stores, per layer and token, n_head_kv * head_dim_k values of K and n_head_kv * head_dim_v of V,
each row in the cache type's blocks. Sliding-window layers (Gemma 3) are counted in full, as llama.cpp
allocates them with --swa-full; `swa_layers` reports how many could be smaller.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import GgufToolError
from ..io.reader import GGUFFile
from ..quant import codec
from ..types import CACHE_TYPES


@dataclass(frozen=True)
class Shape:
    n_layer: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    weights_bytes: int
    swa_layers: int = 0

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Shape:
        a = f.architecture

        def need(key: str) -> int:
            v = f.get(f"{a}.{key}")
            if v is None:
                raise GgufToolError(f"{f.path}: metadata {a}.{key} is missing; cannot size the KV cache",
                                    hint="give --layers/--kv-heads/--head-dim instead")
            return v if isinstance(v, int) else max(v)  # per-layer arrays: the largest

        n_head = need("attention.head_count")
        n_kv = f.get(f"{a}.attention.head_count_kv", n_head)
        n_kv = n_kv if isinstance(n_kv, int) else max(n_kv)
        n_embd = need("embedding_length")
        k = f.get(f"{a}.attention.key_length") or n_embd // n_head
        v = f.get(f"{a}.attention.value_length") or n_embd // n_head
        swa = 0
        if f.get(f"{a}.attention.sliding_window"):
            pattern = f.get(f"{a}.attention.sliding_window_pattern")
            n_layer = need("block_count")
            swa = sum(1 for i in range(n_layer) if (pattern and pattern[i]) or (not pattern and a == "gemma3" and (i + 1) % 6))
        return cls(need("block_count"), n_kv, k, v, sum(t.n_bytes for t in f.tensors), swa)


def bytes_per_token(shape: Shape, type_k: str, type_v: str) -> float:
    ck, cv = codec(type_k), codec(type_v)
    for c, d in ((ck, shape.head_dim_k), (cv, shape.head_dim_v)):
        if d % c.block_size:
            raise GgufToolError(f"cache type {c.name.lower()} needs head dim divisible by {c.block_size}, model has {d}")
    per_layer = shape.n_head_kv * (shape.head_dim_k * ck.bpw + shape.head_dim_v * cv.bpw) / 8
    return shape.n_layer * per_layer


def plan(shape: Shape, memory: int, *, kv_only: bool = False, types: tuple[str, ...] = CACHE_TYPES) -> list[dict]:
    budget = memory if kv_only else memory - shape.weights_bytes
    rows = []
    for t in types:
        c = codec(t)
        if shape.head_dim_k % c.block_size or shape.head_dim_v % c.block_size:
            continue  # llama.cpp refuses a cache type whose block does not divide the head dim
        bpt = bytes_per_token(shape, t, t)
        rows.append({"type": t, "bytes_per_token": bpt, "max_context": max(0, int(budget // bpt)),
                     "vs_f16": bytes_per_token(shape, "f16", "f16") / bpt})
    return rows


def columns(model: Path, k: str, v: str, ctx: int) -> dict:
    """Bits per cached value and KV memory of a K/V cache pair, from the model's own metadata (validate's report)."""
    try:
        shape = Shape.from_gguf(GGUFFile(str(model)))
        bpt = bytes_per_token(shape, k, v)
    except (GgufToolError, OSError, ValueError):
        bpt = None
        shape = None
    ck, cv = codec(k), codec(v)
    if shape:
        dk, dv = shape.head_dim_k, shape.head_dim_v
    else:
        dk = dv = 1
    bpv = (ck.bpw * dk + cv.bpw * dv) / (dk + dv)
    return {"bits_per_value": bpv, "kv_bytes_per_token": bpt,
            "kv_mib_at_ctx": (bpt * ctx / 2**20) if bpt else None}
