"""KV-cache sizing and choice: bytes per context per K/V pair, the longest context that fits, and the
measured quality of the pairs we know (gguftool/data/kv_measured.json, written by scripts/kv_frontier.py).

Sizes follow llama.cpp's allocation: n_head_kv * head_dim values of K and of V per layer and cell, each row
in the cache type's blocks; the context is padded to 256 cells; a sliding-window layer (Gemma 3) holds
pad256(min(ctx, window + n_ubatch)) cells unless llama.cpp runs with --swa-full. A file's per-layer plan
(`gguftool.kv_layers.k` / `.v`, written by `kv-calibrate --k-layers`) gives some layers another type when
the requested cache type is the one the plan is for, as our llama.cpp build does (gqt_kv_calib.h).
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
LAYERS_KEY = "gguftool.kv_layers."   # + "k" / "v" (the rules) and "k.for" / "v.for" (the requested type)
MEASURED = Path(__file__).resolve().parent.parent / "data" / "kv_measured.json"
# the pairs kv-plan lists when none are asked for: the stock ones and ours
DEFAULT_PAIRS = ("f16/f16", "q8_0/q8_0", "q5_0/q5_0", "q8_0/q4_0", "q4_0/q4_0", "iq4_nl/iq4_nl",
                 "q5_0/tq3_3", "iq4_nl/tq3_3", "q5_0/tq3_1", "tq3_1/tq3_1", "tq3_3/tq3_3")


def _pad(n: int) -> int:
    return -(-n // PAD) * PAD


@dataclass(frozen=True)
class LayerPlan:
    """Other cache types for some layers when `base` is the requested type: "tq3_2=8-19:q4_0,3:q8_0"."""
    base: str
    rules: tuple[tuple[int, int, str], ...]

    @property
    def spec(self) -> str:
        return ",".join(f"{lo}-{hi}:{t}" if hi > lo else f"{lo}:{t}" for lo, hi, t in self.rules)

    def type_of(self, il: int, requested: str) -> str:
        if requested != self.base:
            return requested
        return next((t for lo, hi, t in self.rules if lo <= il <= hi), requested)

    @classmethod
    def parse(cls, text: str, n_layer: int | None = None, *, what: str = "--k-layers") -> LayerPlan:
        """'BASE=FIRST[-LAST]:TYPE,...'; every type a quantized cache type, layers below n_layer."""
        base, eq, rules = text.strip().lower().partition("=")
        quantized = [t for t in CACHE_TYPES if t not in ("f32", "f16", "bf16")]
        if not eq or base not in quantized:
            raise GgufToolError(f"{what} {text!r}: expected BASE=FIRST[-LAST]:TYPE,... with BASE the quantized "
                                "cache type the plan is for", f"for example tq3_2=8-19:q4_0; types: {', '.join(quantized)}")
        out = []
        for item in rules.split(","):
            rng, colon, t = item.strip().partition(":")
            lo, dash, hi = rng.partition("-")
            ok = colon and lo.isdigit() and (not dash or hi.isdigit()) and t in quantized
            lo_i, hi_i = (int(lo), int(hi) if dash else int(lo)) if ok else (0, -1)
            if not ok or hi_i < lo_i or (n_layer is not None and hi_i >= n_layer):
                limit = f", layers 0-{n_layer - 1}" if n_layer else ""
                raise GgufToolError(f"{what} {text!r}: cannot use {item.strip()!r}",
                                    f"each item is FIRST[-LAST]:TYPE with a quantized cache type{limit}")
            out.append((lo_i, hi_i, t))
        return cls(base, tuple(out))

    @classmethod
    def from_gguf(cls, f: GGUFFile | SplitGGUF, side: str, n_layer: int) -> LayerPlan | None:
        rules, base = f.get(LAYERS_KEY + side), f.get(LAYERS_KEY + side + ".for")
        if rules is None and base is None:
            return None
        if not isinstance(rules, str) or not isinstance(base, str):
            raise GgufToolError(f"{f.path}: metadata {LAYERS_KEY}{side} and {LAYERS_KEY}{side}.for must both be strings")
        return cls.parse(f"{base}={rules}", n_layer, what=f"{f.path}: metadata {LAYERS_KEY}{side}")


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
    swa_mask: tuple[bool, ...] = ()        # per layer, when swa_layers > 0 (else the first swa_layers)
    k_plan: LayerPlan | None = None
    v_plan: LayerPlan | None = None

    def layer_types(self, type_k: str, type_v: str) -> list[tuple[str, str, bool]]:
        """(K type, V type, sliding window?) of every layer for the requested cache types."""
        mask = self.swa_mask or tuple(i < self.swa_layers for i in range(self.n_layer))
        return [(self.k_plan.type_of(il, type_k) if self.k_plan else type_k,
                 self.v_plan.type_of(il, type_v) if self.v_plan else type_v, mask[il]) for il in range(self.n_layer)]

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
        window, mask = 0, ()
        if f.get(f"{a}.attention.sliding_window"):
            window = need("attention.sliding_window")
            pattern = f.get(f"{a}.attention.sliding_window_pattern")
            if isinstance(pattern, list):
                mask = tuple(bool(pattern[i]) if i < len(pattern) else False for i in range(n_layer))
            elif a == "gemma3":
                mask = tuple(bool((i + 1) % 6) for i in range(n_layer))   # llama.cpp: every 6th layer is global
        ctx_train = f.get(f"{a}.context_length")
        emb = next((t for t in f.tensors if t.name == "token_embd.weight"), None)
        n_vocab = emb.shape[0] if emb is not None and len(emb.shape) == 2 else 0
        return cls(n_layer, n_kv, k, v, sum(t.n_bytes for t in f.tensors), sum(mask), window,
                   ctx_train if isinstance(ctx_train, int) and ctx_train > 0 else 0,
                   any(key.startswith(CALIB_KEY) for key in f.fields), n_vocab, n_embd, mask,
                   LayerPlan.from_gguf(f, "k", n_layer), LayerPlan.from_gguf(f, "v", n_layer))


def _check(shape: Shape, type_k: str, type_v: str):
    ck, cv = codec(type_k), codec(type_v)
    for c, d in ((ck, shape.head_dim_k), (cv, shape.head_dim_v)):
        if d % c.block_size:
            raise GgufToolError(f"cache type {c.name.lower()} needs head dim divisible by {c.block_size}, model has {d}")
    return ck, cv


def _cell_bytes(shape: Shape, type_k: str, type_v: str) -> list[tuple[float, bool]]:
    """(bytes of one cell, sliding window?) per layer."""
    out = []
    for tk, tv, swa in shape.layer_types(type_k, type_v):
        ck, cv = _check(shape, tk, tv)
        out.append((shape.n_head_kv * (shape.head_dim_k * ck.bpw + shape.head_dim_v * cv.bpw) / 8, swa))
    return out


def bytes_per_token(shape: Shape, type_k: str, type_v: str) -> float:
    """Bytes one cell costs over all layers (what a full-context layer pays per token)."""
    return sum(b for b, _ in _cell_bytes(shape, type_k, type_v))


def bits_per_value(shape: Shape, type_k: str, type_v: str, ctx: int | None = None, *, swa_full: bool = False) -> float:
    """The average over every K and V value of every layer, as llama.cpp allocates them: per token of a layer
    that holds the whole context, or at ctx tokens, where sliding-window layers hold fewer (a per-layer plan
    that upgrades full-context layers then costs more than its share of layers)."""
    if ctx:
        return 16 * cache_bytes(shape, type_k, type_v, ctx, swa_full=swa_full) / \
            cache_bytes(shape, "f16", "f16", ctx, swa_full=swa_full)
    values = shape.n_layer * shape.n_head_kv * (shape.head_dim_k + shape.head_dim_v)
    return 8 * bytes_per_token(shape, type_k, type_v) / values


def cache_bytes(shape: Shape, type_k: str, type_v: str, ctx: int, *, swa_full: bool = False) -> float:
    """The K/V cache llama.cpp allocates for a context of ctx tokens."""
    cells = _pad(ctx)
    swa_cells = cells if swa_full else min(cells, _pad(shape.swa_window + N_UBATCH))
    return sum(b * (swa_cells if swa else cells) for b, swa in _cell_bytes(shape, type_k, type_v))


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
    """{model: {"f16_ppl", "rows": {config: {"ppl", "kld", "bits"[, "f16_ppl", "q4_0_kld"]}}}}; config 'cal:K/V'
    = kv-calibrated file, 'K/V k[8-19:q4_0]' = with that per-layer plan (config_name)."""
    return json.loads(MEASURED.read_text())


def config_name(shape: Shape, k: str, v: str) -> str:
    """'k/v', plus ' k[8-19:q4_0]' / ' v[...]' where the file's plan applies (the name kv_measured.json uses)."""
    name = f"{k}/{v}"
    for side, plan_, t in (("k", shape.k_plan, k), ("v", shape.v_plan, v)):
        if plan_ is not None and plan_.base == t:
            name += f" {side}[{plan_.spec.replace(',', ';')}]"
    return name


def quality(config: str, calibrated: bool) -> dict[str, dict]:
    """Measured PPL change and mean KLD of a configuration ('k/v', or config_name's) on each model we
    measured, for a file with or without the calibration (llama.cpp applies a file's calibration to every
    quantized cache type)."""
    pair, _, layers = config.partition(" ")
    k, v = parse_pair(pair)
    quantized = not (k in ("f16", "f32", "bf16") and v in ("f16", "f32", "bf16"))
    key = ("cal:" if calibrated and quantized else "") + f"{k}/{v}" + (f" {layers}" if layers else "")
    out = {}
    for model, m in measured()["models"].items():
        r = m["rows"].get(key)
        if r is None and not quantized:
            r = {"ppl": m["f16_ppl"], "kld": 0.0}
        if r is not None:   # a row measured in a later run carries that run's own f16 and q4_0/q4_0 peers
            q4 = r.get("q4_0_kld", m["rows"]["q4_0/q4_0"]["kld"])
            out[model] = {"dppl": 100 * (r["ppl"] / r.get("f16_ppl", m["f16_ppl"]) - 1), "kld": r["kld"],
                          "vs_q4_0": r["kld"] / q4}
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
        name = config_name(shape, k, v)
        now, cal = quality(name, shape.calibrated), quality(name, True)
        row = {"pair": name, "bits_per_value": bits_per_value(shape, k, v, ctx, swa_full=swa_full),
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
        return {"bits_per_value": bits_per_value(shape, k, v, ctx), "kv_bytes_per_token": bytes_per_token(shape, k, v),
                "kv_mib_at_ctx": cache_bytes(shape, k, v, ctx) / 2**20}
    except (GgufToolError, OSError, ValueError):
        ck, cv = codec(k), codec(v)
        return {"bits_per_value": (ck.bpw + cv.bpw) / 2, "kv_bytes_per_token": None, "kv_mib_at_ctx": None}
