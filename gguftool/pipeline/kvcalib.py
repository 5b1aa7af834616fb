"""Offline KV-cache calibration: what `gguftool kv-calibrate` measures, chooses and writes.

llama.cpp's attention reads softmax(q.k) and sum_j p_j v_j. Both are unchanged when every key of a
layer loses the same vector mu (q.mu is a per-query constant), when every value loses nu and the
output gets it back, and when key channel i is divided by s_i while the query channel is multiplied
by it. The quantized cache then holds (k - mu) / s and v - nu: on SmolLM2 and Gemma 3 about half of
the key energy is the common part mu, and Gemma's key channels are far out of balance with its
queries. The runtime half is gguftool/native/patches/gqt_kv_calib.{h,cpp}; docs/kv.md has the figures.

The balance s_i = (K_i / Q_i)^(alpha/4) (K_i, Q_i: mean squares of the centred key and of the
queries on channel i) minimises E|q'|^2 E|k'|^2, the size of the score error a quantizer adds after
llama.cpp's Hadamard rotation; alpha in {0, 1/2, 1} is chosen per layer by the attention KL that
a Q4_0 cache would cause on the calibration text. s is shared by the two channels RoPE rotates
together, so llama.cpp's K shift stays exact.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType
from gguf import quants as gq

from ..errors import GgufToolError
from .kvplan import LAYERS_KEY, LayerPlan

META = "gguftool.kv_calib."
VERSION = 1
ALPHAS = (0.0, 0.5, 1.0)
GAMMAS = (0.0, 0.5, 1.0)   # how much of the mean value the cache subtracts (v_mean stored = gamma * nu)
SELECT_CHUNKS = 4
S_LIMIT = 16.0          # s within [1/16, 16]: a channel seen empty in calibration is not blown up

# llama.cpp's RoPE pairing per architecture (llama_model_rope_type): NORM rotates channels (2i, 2i+1),
# NEOX rotates (i, i + d/2). Architectures not listed get mu and nu only (s = 1), which needs no pairing.
ROPE_NORM = {"llama", "baichuan", "starcoder", "internlm2", "minicpm", "xverse", "command-r", "cohere2",
             "olmo", "arctic", "deepseek", "deepseek2", "granite", "granitemoe", "chatglm", "glm4", "exaone"}
ROPE_NEOX = {"gemma", "gemma2", "gemma3", "qwen", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "phi2", "phi3",
             "stablelm", "starcoder2", "olmo2", "falcon", "gptneox", "nemotron", "exaone4"}


@dataclass
class LayerCalib:
    k_mean: np.ndarray    # (n_head_kv * d_k,) float32
    k_scale: np.ndarray   # (n_head_kv * d_k,) float32, > 0
    v_mean: np.ndarray    # (n_head_kv * d_v,) float32
    alpha: float
    kl: dict[float, float]   # calibration attention KL (Q4_0 proxy) per alpha
    kl_raw: float            # the same without calibration
    gamma: float = 1.0       # v_mean = gamma * the mean value
    v_err: dict[float, float] | None = None   # attention-output error of a simulated q4_0 V cache per gamma


def run_dump(model: Path, text: Path, out_dir: Path, *, chunks: int, ctx: int, threads: int) -> Path:
    """Q, K, V of every layer on `chunks` x `ctx` tokens of `text` (native gguftool-kvdump, f16 cache)."""
    from ..native import tools
    exe = tools.tool("gguftool-kvdump")
    cmd = [str(exe), str(out_dir), "-m", str(model), "-f", str(text), "-c", str(ctx), "--chunks", str(chunks),
           "-t", str(threads), "-ctk", "f16", "-ctv", "f16", "-fa", "on"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not (out_dir / "manifest.json").is_file():
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        raise GgufToolError(f"gguftool-kvdump failed on {model} with {text}: {' | '.join(tail)}",
                            "check that the model loads in llama.cpp and that the text holds at least one chunk")
    return out_dir


def load_dump(d: Path) -> tuple[dict[int, dict[str, np.ndarray]], int]:
    """{layer: {"Q": (T, Hq, d), "K": (T, Hkv, d), "V": (T, Hkv, dv)}}, n_ctx."""
    man = json.loads((d / "manifest.json").read_text())
    layers: dict[int, dict[str, np.ndarray]] = {}
    for name, (t, h, dim) in man["tensors"].items():
        kind, il = name.split("-")
        a = np.fromfile(d / f"{name}.f32", dtype=np.float32)
        if a.size != t * h * dim:
            raise GgufToolError(f"{d / name}.f32 holds {a.size} floats, the manifest says {t}x{h}x{dim}")
        layers.setdefault(int(il), {})[kind[0]] = a.reshape(t, h, dim)
    return layers, int(man["n_ctx"])


def hadamard(n: int) -> np.ndarray:
    """Orthonormal Sylvester Hadamard matrix (n a power of two)."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def upstream_rotation(head_dim: int) -> int:
    """The Hadamard size llama.cpp rotates K with: the largest power of two >= 64 dividing the head."""
    if head_dim % 64:
        return 0
    n = 64
    while head_dim % (2 * n) == 0:
        n *= 2
    return n


def rotate(x: np.ndarray, n: int) -> np.ndarray:
    if not n:
        return x
    t, h, d = x.shape
    return (x.reshape(t, h, d // n, n) @ hadamard(n)).reshape(t, h, d)


def _q4_0(x: np.ndarray) -> np.ndarray:
    t = GGMLQuantizationType.Q4_0
    flat = x.reshape(x.shape[0], -1).astype(np.float32)
    return gq.dequantize(gq.quantize(flat, t), t).reshape(x.shape)


def attention_kl(q: np.ndarray, k: np.ndarray, q_hat: np.ndarray, k_hat: np.ndarray, n_ctx: int,
                 max_queries: int = 256) -> float:
    """Mean KL(p || p_hat) of causal attention rows within each chunk of n_ctx tokens: p from the
    exact q.k, p_hat from what the cache gives (q_hat . k_hat)."""
    t, hq, d = q.shape
    g = hq // k.shape[1]
    mask = np.triu(np.full((n_ctx, n_ctx), -np.inf), 1)
    rows = slice(n_ctx - max_queries, n_ctx)  # the longest rows: late queries see most keys
    total, count = 0.0, 0
    for c0 in range(0, t - n_ctx + 1, n_ctx):
        for h in range(hq):
            qq = q[c0:c0 + n_ctx, h][rows].astype(np.float64)
            s = qq @ k[c0:c0 + n_ctx, h // g].T.astype(np.float64) / np.sqrt(d) + mask[rows]
            qh = q_hat[c0:c0 + n_ctx, h][rows].astype(np.float64)
            sh = qh @ k_hat[c0:c0 + n_ctx, h // g].T.astype(np.float64) / np.sqrt(d) + mask[rows]
            s -= s.max(1, keepdims=True)
            sh -= sh.max(1, keepdims=True)
            lp = s - np.log(np.exp(s).sum(1, keepdims=True))
            lph = sh - np.log(np.exp(sh).sum(1, keepdims=True))
            p = np.exp(lp)
            seen = p > 0   # masked keys: p = 0 and both logs -inf
            total += float((p[seen] * (lp[seen] - lph[seen])).sum())
            count += qq.shape[0]
    return total / max(count, 1)


def value_error(q: np.ndarray, k: np.ndarray, v: np.ndarray, v_hat: np.ndarray, n_ctx: int,
                max_queries: int = 256) -> float:
    """Relative squared error of the attention outputs sum_j p_j v_j when the cache gives v_hat,
    p the exact causal attention within each chunk (the last max_queries queries of each)."""
    t, hq, d = q.shape
    g = hq // k.shape[1]
    mask = np.triu(np.full((n_ctx, n_ctx), -np.inf), 1)
    rows = slice(n_ctx - max_queries, n_ctx)
    err = ref = 0.0
    for c0 in range(0, t - n_ctx + 1, n_ctx):
        for h in range(hq):
            s = q[c0:c0 + n_ctx, h][rows] @ k[c0:c0 + n_ctx, h // g].T / np.sqrt(d) + mask[rows]
            p = np.exp(s - s.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            vv, vh = v[c0:c0 + n_ctx, h // g], v_hat[c0:c0 + n_ctx, h // g]
            err += float(((p @ (vh - vv)) ** 2).sum())
            ref += float(((p @ vv) ** 2).sum())
    return err / max(ref, 1e-300)


def _pair_energy(e: np.ndarray, rope: str) -> np.ndarray:
    """Per-channel energies (Hkv, d) summed over RoPE pairs, returned per channel again."""
    d = e.shape[1]
    if rope == "neox":
        p = e[:, : d // 2] + e[:, d // 2:]
        return np.concatenate([p, p], 1)
    p = e[:, 0::2] + e[:, 1::2]
    return np.repeat(p, 2, 1)


def balance(qe: np.ndarray, ke: np.ndarray, rope: str, alpha: float) -> np.ndarray:
    """s (Hkv, d) for query energies qe (Hkv, d, summed over the group) and centred key energies ke."""
    qp, kp = _pair_energy(qe, rope), _pair_energy(ke, rope)
    tiny = 1e-12
    r = (kp + tiny * kp.mean()) / (qp + tiny * qp.mean())
    s = r ** (alpha / 4)
    s /= np.exp(np.log(s).mean(1, keepdims=True))   # geometric mean 1 per head
    return np.clip(s, 1 / S_LIMIT, S_LIMIT)


def calibrate_layer(q: np.ndarray, k: np.ndarray, v: np.ndarray, n_ctx: int, rope: str | None) -> LayerCalib:
    t, hq, d = q.shape
    hkv = k.shape[1]
    q64, k64 = q.astype(np.float64), k.astype(np.float64)
    mu = k64.mean(0)
    nu = v.astype(np.float64).mean(0)
    kc = k64 - mu
    qe = (q64 ** 2).reshape(t, hkv, hq // hkv, d).mean(0).sum(1)
    ke = (kc ** 2).mean(0)
    nrot = upstream_rotation(d)
    # the choice of alpha is judged on the first SELECT_CHUNKS chunks (the statistics use them all)
    sel = slice(0, min(t, SELECT_CHUNKS * n_ctx))
    q64, k64, kc = q64[sel], k64[sel], kc[sel]
    t = q64.shape[0]
    qr, kr = rotate(q64, nrot), rotate(k64, nrot)
    kl_raw = attention_kl(qr, kr, qr, _q4_0(kr), n_ctx)
    kls: dict[float, float] = {}
    scales: dict[float, np.ndarray] = {}
    for alpha in ALPHAS if rope else (0.0,):
        s = balance(qe, ke, rope or "norm", alpha) if alpha else np.ones((hkv, d))
        k_store = rotate(kc / s, nrot)
        q_store = rotate((q64.reshape(t, hkv, hq // hkv, d) * s[None, :, None, :]).reshape(t, hq, d), nrot)
        kls[alpha] = attention_kl(qr, kr, q_store, _q4_0(k_store), n_ctx)
        scales[alpha] = s
    best = min(kls, key=kls.get)
    # the mean value: subtracting it shrinks most rows, but attention sinks hold small values and most
    # of the weight, and v - nu makes them large (SmolLM2: the full nu raises a q4_0 V cache's output
    # error 1.44x); so its strength is chosen per layer on the same simulated cache
    v64 = v.astype(np.float64)[sel]
    nrot_v = upstream_rotation(v.shape[2])
    vr = rotate(v64, nrot_v)
    verr = {}
    for gamma in GAMMAS:   # the cache holds rotate(v - gamma nu); the graph adds gamma nu back exactly
        vs = rotate(v64 - gamma * nu, nrot_v)
        verr[gamma] = value_error(q64, k64, vr, _q4_0(vs) + (vr - vs), n_ctx)
    gamma = min(verr, key=verr.get)
    return LayerCalib(mu.reshape(-1).astype(np.float32), scales[best].reshape(-1).astype(np.float32),
                      (gamma * nu).reshape(-1).astype(np.float32), best, kls, kl_raw, gamma, verr)


def rope_kind(arch: str) -> str | None:
    return "norm" if arch in ROPE_NORM else "neox" if arch in ROPE_NEOX else None


def calibrate(layers: dict[int, dict[str, np.ndarray]], n_ctx: int, arch: str, progress=None) -> dict[int, LayerCalib]:
    rope = rope_kind(arch)
    out = {}
    for il in sorted(layers):
        L = layers[il]
        if not {"Q", "K", "V"} <= L.keys():
            raise GgufToolError(f"the attention dump lacks Q, K or V of layer {il}")
        out[il] = calibrate_layer(L["Q"], L["K"], L["V"], n_ctx, rope)
        if progress:
            progress.update(1)
    return out


MetaItem = tuple[str, object, GGUFValueType, "GGUFValueType | None"]


def metadata(calib: dict[int, LayerCalib], text_name: str, tokens: int) -> list[MetaItem]:
    """(key, value, type, sub_type) of everything the runtime and the record need."""
    A, F = GGUFValueType.ARRAY, GGUFValueType.FLOAT32
    items: list[MetaItem] = [
        (META + "version", VERSION, GGUFValueType.UINT32, None),
        (META + "text", text_name, GGUFValueType.STRING, None),
        (META + "tokens", tokens, GGUFValueType.UINT32, None),
    ]
    for il, c in sorted(calib.items()):
        pre = f"{META}blk.{il}."
        items += [(pre + "k_mean", c.k_mean.tolist(), A, F), (pre + "k_scale", c.k_scale.tolist(), A, F),
                  (pre + "v_mean", c.v_mean.tolist(), A, F)]
    return items


def write(src_path: Path, out_path: Path, items, record: dict[str, str], shard: bool = False) -> None:
    """`src_path` with the calibration keys (and per-layer plans) added, tensors byte for byte, via a temporary file. A split
    model becomes one file; with `shard`, only the first shard (which holds all the metadata) is rewritten."""
    from ..io.reader import GGUFFile
    from ..io.split import open_gguf
    from ..io.writer import StreamingWriter, check_output_path
    src = GGUFFile(src_path) if shard else open_gguf(src_path)
    check_output_path(out_path, src.paths)
    w = StreamingWriter(out_path, src.architecture)
    planned = tuple(key for key, *_ in items if key.startswith(LAYERS_KEY) and not key.endswith(".for"))
    w.copy_metadata(src, skip_prefixes=(META, *planned))   # a plan given anew replaces the file's
    for key, value, vtype, sub in items:
        w.add(key, value, vtype, sub)
    w.add_tool_record(record)
    for t in src.tensors:
        w.add_tensor_info(t.name, t.shape, t.type)
    with w.session():
        w.begin()
        for t in src.tensors:
            w.write(t.raw_rows())
            src.release(t)
        w.commit()


@dataclass(frozen=True)
class AutoPlan:
    """'BASE=auto:TYPE:N' (or N%): measure which N layers gain most from TYPE, then store that plan."""
    side: str
    base: str
    up: str
    n: int


def parse_plan(spec: str, n_layer: int | None, what: str) -> LayerPlan | AutoPlan:
    """'BASE=FIRST[-LAST]:TYPE,...' or 'BASE=auto:TYPE:N[%]'; n_layer None checks the syntax and types only."""
    base, _, rules = spec.strip().lower().partition("=")
    if not rules.startswith("auto"):
        return LayerPlan.parse(spec, n_layer, what=what)
    _, up, count = (rules.split(":") + ["", ""])[:3]
    try:
        LayerPlan.parse(f"{base}=0:{up}", None, what=what)   # the same checks of both types
    except GgufToolError:
        raise GgufToolError(f"{what} {spec!r}: expected BASE=auto:TYPE:N[%] with quantized cache types BASE and TYPE",
                            "for example tq3_2=auto:iq4_nl:40%") from None
    num = count.removesuffix("%")
    ok = num.replace(".", "", 1).isdigit() if count.endswith("%") else num.isdigit()
    # a share of the layers rounds down, so a plan sized for a bit budget stays within it
    n = (int((n_layer or 100) * float(num) / 100 + 1e-9) if count.endswith("%") else int(num)) if ok else -1
    top = (n_layer or 10**6) - 1
    if not 0 < n <= top:
        raise GgufToolError(f"{what} {spec!r}: expected {base}=auto:{up}:N with N layers (or N%) between 1 "
                            f"and {top}" if n_layer else f"{what} {spec!r}: expected {base}=auto:{up}:N or N%",
                            f"for example {base}=auto:{up}:40%")
    return AutoPlan("k", base, up, n)   # the side is set by the caller


def layer_plans(model: Path, *, k: str | None, v: str | None) -> dict[str, LayerPlan | AutoPlan]:
    """--k-layers / --v-layers checked against the model's layer count (before any work)."""
    from ..io.split import open_gguf
    from .kvplan import Shape
    if not k and not v:
        return {}
    n_layer = Shape.from_gguf(open_gguf(model)).n_layer
    out = {side: parse_plan(spec, n_layer, f"--{side}-layers") for side, spec in (("k", k), ("v", v)) if spec}
    return {side: dataclasses.replace(p, side=side) if isinstance(p, AutoPlan) else p for side, p in out.items()}


def kld(model: Path, text: Path, ref: Path, k: str, v: str, *, chunks: int, ctx: int, threads: int,
        env: dict[str, str] | None = None, make_ref: bool = False) -> dict:
    """llama-perplexity of a K/V cache against `ref`'s logits (written when make_ref): parse_kld's summary
    (mean KLD, PPL, ...), or with make_ref parse_ppl's."""
    import os

    from ..native import tools
    from ..validate.metrics import parse_kld, parse_ppl
    cmd = [str(tools.tool("llama-perplexity")), "-m", str(model), "-f", str(text), "-c", str(ctx), "-b", str(ctx),
           "--chunks", str(chunks), "-t", str(threads), "-fa", "on", "-ctk", k, "-ctv", v, "--kl-divergence-base", str(ref)]
    if not make_ref:
        cmd.append("--kl-divergence")
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "GGUFTOOL_KV_LAYERS_K": "off",
                                                                 "GGUFTOOL_KV_LAYERS_V": "off", **(env or {})})
    got = None if r.returncode else (parse_ppl if make_ref else parse_kld)(r.stdout + r.stderr)
    if got is None:
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        raise GgufToolError(f"llama-perplexity failed on {model} with -ctk {k} -ctv {v}: {' | '.join(tail)}")
    return got


def choose_layers(model: Path, text: Path, want: AutoPlan, *, chunks: int, ctx: int, threads: int,
                  groups: int = 6) -> tuple[LayerPlan, dict[str, float]]:
    """Up to want.n layers where want.up instead of want.base lowers the KLD most, measured: the layers in
    `groups` contiguous groups, each group alone at want.up (both caches want.base otherwise), one native
    llama-perplexity run per group on `text`; groups ranked by KLD gained per layer, filled in that order.
    A layer is skipped where it would make the cache at the trained context cost more bits per value than
    want.n layers cost per token: with sliding-window attention a full-context layer holds every token, so
    upgrading it costs far more than its share of layers at long contexts (Gemma 3 at 32k: 29% of the cache)."""
    import dataclasses

    from ..io.split import open_gguf
    from .kvplan import Shape, bits_per_value
    from .progress import bar
    shape = Shape.from_gguf(open_gguf(model))
    n_layer = shape.n_layer
    edges = [round(i * n_layer / groups) for i in range(groups + 1)]
    spans = [(lo, hi - 1) for lo, hi in zip(edges, edges[1:]) if hi > lo]
    var = f"GGUFTOOL_KV_LAYERS_{want.side.upper()}"
    kw = dict(chunks=chunks, ctx=ctx, threads=threads)
    with tempfile.TemporaryDirectory(prefix="gguftool-kvplan-") as tmp, \
            bar(len(spans) + 2, f"kv-calibrate: {want.side.upper()} layers for {want.up}", unit="run") as pb:
        ref = Path(tmp) / "f16.kld"
        kld(model, text, ref, "f16", "f16", make_ref=True, **kw)
        pb.update()
        none = kld(model, text, ref, want.base, want.base, **kw)["kld"]
        pb.update()
        gain = {}
        for lo, hi in spans:
            up = kld(model, text, ref, want.base, want.base, env={var: f"{lo}-{hi}:{want.up}"}, **kw)["kld"]
            gain[(lo, hi)] = (none - up) / (hi - lo + 1)
            pb.update()

    def bits(layers: list[int], ctx: int | None = None) -> float:
        plan = _plan(want, layers)
        return bits_per_value(dataclasses.replace(shape, **{f"{want.side}_plan": plan}), want.base, want.base, ctx)

    limit = bits(list(range(want.n)))      # per token, any want.n layers cost the same
    chosen: list[int] = []
    for lo, hi in sorted(spans, key=lambda sp: -gain[sp]):
        layers = list(range(lo, hi + 1))
        if chosen and lo - 1 not in chosen:
            layers.reverse()           # a partial group keeps to the side that touches what is chosen
        for il in layers:
            # between the per-token figure (short contexts) and the trained length's, the bits move
            # monotonically with the context: holding both ends holds every context
            if len(chosen) < want.n and bits(chosen + [il], shape.n_ctx_train) <= limit + 1e-9:
                chosen.append(il)
    if not chosen:
        raise GgufToolError(f"{model}: no layer of {want.side.upper()} fits {want.n} layers' worth of {want.up} "
                            "at the trained context", "ask for more layers")
    return _plan(want, chosen), {"kld_uniform": none, **{f"{lo}-{hi}": g for (lo, hi), g in gain.items()}}


def _plan(want: AutoPlan, layers: list[int]) -> LayerPlan:
    """The plan giving want.up to these layers, as runs of consecutive layers."""
    chosen = sorted(layers)
    rules, start = [], chosen[0]
    for a, b in zip(chosen, chosen[1:] + [None]):
        if b != a + 1:   # the end of a run of consecutive layers
            rules.append((start, a, want.up))
            start = b
    return LayerPlan(want.base, tuple(rules))


def plan_metadata(layers: dict[str, LayerPlan]) -> list[MetaItem]:
    S = GGUFValueType.STRING
    return [item for side, p in sorted(layers.items())
            for item in ((LAYERS_KEY + side, p.spec, S, None), (LAYERS_KEY + side + ".for", p.base, S, None))]


class Calibrated(NamedTuple):
    layers: dict[int, LayerCalib]
    plans: dict[str, LayerPlan]                  # per-layer cache plans stored, by side ("k", "v")
    searches: dict[str, dict[str, float]]        # for each chosen plan: choose_layers' measurements


def run(model: Path, out: Path, text: Path, *, chunks: int = 8, ctx: int = 512, threads: int = 2,
        shard: bool = False, layers: dict[str, LayerPlan | AutoPlan] | None = None) -> Calibrated:
    """Measure on `text`, choose per layer, write `out`: the whole of `gguftool kv-calibrate` (shard: see write;
    layers: per-layer cache plans to store, see layer_plans; an AutoPlan is measured on the calibrated file
    and replaced by the LayerPlan it chose)."""
    from ..io.split import open_gguf
    from .progress import bar
    arch = open_gguf(model).architecture
    with tempfile.TemporaryDirectory(prefix="gguftool-kvdump-") as tmp:
        run_dump(model, text, Path(tmp), chunks=chunks, ctx=ctx, threads=threads)
        layers_, n_ctx = load_dump(Path(tmp))
    tokens = next(iter(layers_.values()))["K"].shape[0]
    with bar(len(layers_), f"kv-calibrate {model.name}", unit="layer") as pb:
        calib = calibrate(layers_, n_ctx, arch, pb)
    items = metadata(calib, text.name, tokens)
    record = {"kv_calib.source": model.name}
    layers, searches = dict(layers or {}), {}
    if any(isinstance(p, AutoPlan) for p in layers.values()):
        # the search runs on the calibrated file: the calibration changes which layers are sensitive
        with tempfile.TemporaryDirectory(prefix="gguftool-kvcal-", dir=out.resolve().parent) as tmp:
            staged = Path(tmp) / "calibrated.gguf"
            write(model, staged, items, record, shard=shard)
            for side, want in layers.items():
                if isinstance(want, AutoPlan):
                    layers[side], searches[side] = choose_layers(staged, text, want, chunks=chunks, ctx=ctx,
                                                                 threads=threads)
            write(model, out, items + plan_metadata(layers), record, shard=shard)
    else:
        write(model, out, items + plan_metadata(layers), record, shard=shard)
    return Calibrated(calib, layers, searches)
