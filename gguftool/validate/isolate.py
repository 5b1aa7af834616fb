"""The K/V isolation matrix and the rule that names a broken cache side.

For each cache type T the matrix holds three cells against the f16/f16 reference:
K-only (K=T, V=f16), V-only (K=f16, V=T) and both (K=T, V=T). Honest quantization error is
small, grows as bits shrink and adds up roughly across the two sides. A kernel bug looks
different: one side of one type is off by an order of magnitude while its neighbours - the
same type on the other side, and the other types on the same side - are fine. That is the
article's TQ3_0 case: K=tq3_0 gave perplexity in the hundreds, V=tq3_0 was indistinguishable
from f16, so the K path (the Q.K vec_dot) was broken, not the 3-bit precision.

Scores (0 at the reference, larger is worse):
    d_ppl = ln(PPL(cell) / PPL(f16/f16))     from the same text, chunks and binary
    kld   = mean KL divergence to the f16/f16 logits (nats)
A single-side cell is compared with the cells of the same side for the other types, scaled to
its bits (quantization error goes as 4^-bits; the smallest prediction counts), or - with no other
type in the matrix - with its own other side times CROSS_SIDE; the both-sides cell with the sum
of its own two single-side cells (what additivity predicts)."""
from __future__ import annotations

import math
from dataclasses import dataclass

REFERENCE = "f16"

# levels: a cell must be both far above its neighbours (FACTOR x) and bad in absolute terms.
FACTOR = 5.0
FLOOR = {"d_ppl": 0.01, "kld": 0.005}           # neighbours better than this count as this (noise)
SUSPECT = {"d_ppl": math.log(1.10), "kld": 0.05}  # +10 % perplexity / 0.05 nats: worth a look
BUG = {"d_ppl": math.log(1.50), "kld": 0.25}      # +50 % perplexity / 0.25 nats: not precision loss

SIDE_HINT = {
    "K": "the K side: the cache's dot product with Q (vec_dot / flash-attention K path) or K quantization",
    "V": "the V side: V dequantization / accumulation in flash attention",
    "K+V": "only the K+V combination: an interaction (e.g. rotation applied twice, shared scratch buffer)",
}


CROSS_SIDE = 5.0   # K-only error is typically 3-6x V-only error at the same type (measured on SmolLM2)


def _bpw(t: str) -> float:
    from ..quant import codec
    return codec(t).bpw


def cells_for(types: list[str]) -> list[tuple[str, str, str]]:
    """(role, K type, V type) for the matrix: the reference, then K-only, V-only, both per type."""
    out = [("reference", REFERENCE, REFERENCE)]
    for t in types:
        if t == REFERENCE:
            continue
        out += [("K-only", t, REFERENCE), ("V-only", REFERENCE, t), ("both", t, t)]
    return out


@dataclass
class Flag:
    level: str        # "bug" | "suspect"
    k: str
    v: str
    role: str         # K-only | V-only | both
    side: str         # K | V | K+V
    metric: str       # d_ppl | kld | failed
    value: float
    expected: float
    message: str

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _scores(cell: dict, base_ppl: float | None) -> dict[str, float]:
    """d_ppl and kld of a cell; inf for a failed or non-finite run (that is the loudest signal)."""
    out = {}
    ppl = cell.get("ppl")
    if cell.get("failed") or ppl is None or not math.isfinite(ppl) or ppl <= 0:
        return {"d_ppl": math.inf, "kld": math.inf}
    if base_ppl:
        out["d_ppl"] = math.log(ppl / base_ppl)
    kld = cell.get("kld")
    if kld is not None:
        out["kld"] = kld if math.isfinite(kld) else math.inf
    return out


def _fmt(metric: str, x: float) -> str:
    if not math.isfinite(x):
        return "failed/NaN"
    return f"PPL x{math.exp(x):.2f}" if metric == "d_ppl" else f"KLD {x:.4f}"


def analyse(cells: list[dict], factor: float = FACTOR) -> dict:
    """cells: dicts with k, v, ppl, (kld), (failed). Returns {'flags': [...], 'verdicts': {type: side},
    'scores': [...]}. The reference cell (f16/f16) must be present."""
    by = {(c["k"], c["v"]): c for c in cells}
    base = by.get((REFERENCE, REFERENCE))
    if base is None or base.get("failed") or not base.get("ppl"):
        return {"flags": [], "verdicts": {}, "scores": [], "error": "no f16/f16 reference cell"}
    base_ppl = base["ppl"]
    sc = {key: _scores(c, base_ppl) for key, c in by.items()}
    types = sorted({t for k, v in by for t in (k, v) if t != REFERENCE})
    single = {}   # (side, type) -> scores
    for t in types:
        if (t, REFERENCE) in sc:
            single[("K", t)] = sc[(t, REFERENCE)]
        if (REFERENCE, t) in sc:
            single[("V", t)] = sc[(REFERENCE, t)]
    flags: list[Flag] = []
    flagged_sides: dict[str, set[str]] = {t: set() for t in types}

    def judge(metric, value, expected, k, v, role, side, what):
        if value is None:
            return
        ref = max(expected, FLOOR[metric])
        if not math.isfinite(value):
            level = "bug"
        elif value >= factor * ref and value >= BUG[metric]:
            level = "bug"
        elif value >= factor * ref and value >= SUSPECT[metric]:
            level = "suspect"
        else:
            return
        t = k if side == "K" else (v if side == "V" else k)
        flagged_sides.setdefault(t, set()).add(side)
        verb = "probable kernel bug in" if level == "bug" else "suspicious result in"
        flags.append(Flag(level, k, v, role, side, metric if math.isfinite(value) else "failed", value, expected,
                          f"K={k} V={v}: {_fmt(metric, value)} vs {_fmt(metric, expected)} expected from {what} "
                          f"-> {verb} {SIDE_HINT[side]}"))

    for (side, t), s in single.items():
        k, v = (t, REFERENCE) if side == "K" else (REFERENCE, t)
        other_side = single.get(("V" if side == "K" else "K", t), {})
        for metric in ("d_ppl", "kld"):
            if metric not in s:
                continue
            # same side, other types, scaled to this type's bits (error ~ 4^-bits); the smallest
            # such prediction, so one broken or noise-level neighbour cannot excuse this cell
            pred = [o[metric] * 4.0 ** (_bpw(u) - _bpw(t)) for (sd, u), o in single.items()
                    if sd == side and u != t and metric in o and math.isfinite(o[metric])
                    and o[metric] >= FLOOR[metric]]
            if pred:
                judge(metric, s[metric], min(pred), k, v, f"{side}-only", side,
                      f"the other {side}-side cells scaled to its bits")
            elif metric in other_side and math.isfinite(other_side[metric]):
                # no same-side neighbour: the other side of the same type, allowing for K being
                # naturally several times more sensitive than V
                judge(metric, s[metric], CROSS_SIDE * other_side[metric], k, v, f"{side}-only", side,
                      f"{CROSS_SIDE:g}x its other side")
            elif not math.isfinite(s[metric]):
                judge(metric, s[metric], 0.0, k, v, f"{side}-only", side, "a working run")
    for t in types:
        both = sc.get((t, t))
        sk, sv = single.get(("K", t)), single.get(("V", t))
        if both is None or sk is None or sv is None or flagged_sides.get(t):
            continue   # a flagged side already explains the both-sides cell
        for metric in ("d_ppl", "kld"):
            if metric in both and metric in sk and metric in sv:
                judge(metric, both[metric], sk[metric] + sv[metric], t, t, "both", "K+V",
                      f"K-only + V-only of {t}")
    # one flag per cell and side: keep the stronger metric's
    best: dict[tuple, Flag] = {}
    rank = {"bug": 2, "suspect": 1}
    for f in flags:
        key = (f.k, f.v, f.side)
        if key not in best or rank[f.level] > rank[best[key].level]:
            best[key] = f
    flags = list(best.values())
    verdicts = {}
    for t in types:
        sides = sorted({f.side for f in flags if t in (f.k, f.v) and f.level == "bug"})
        if sides:
            verdicts[t] = " and ".join(sides)
    scores = [{"k": k, "v": v, **{m: (x if math.isfinite(x) else None) for m, x in s.items()}}
              for (k, v), s in sc.items()]
    return {"flags": [f.as_dict() for f in flags], "verdicts": verdicts, "scores": scores,
            "rule": {"factor": factor, "floor": FLOOR, "suspect": SUSPECT, "bug": BUG}}
