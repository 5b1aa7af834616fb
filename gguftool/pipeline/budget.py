"""Size-targeted planning: choose per-tensor types from an allowed set to meet a byte budget with the
least estimated error.

Each quantized tensor's error for each allowed type is measured on a sample of its rows (squared
error, scaled to the whole tensor). Starting from the smallest type everywhere, the tensor upgrade
that removes the most error per extra byte is applied until the next one would exceed the budget
(the greedy solution of the multiple-choice knapsack, optimal for convex error-vs-size curves).
"""
from __future__ import annotations

import heapq
from dataclasses import replace

import numpy as np

from ..errors import GgufToolError
from ..quant import codec
from ..quant.rows import BlockRangeError
from .plan import Plan, Step
from .quantize import dequantize_rows, solver_params
from .source import ModelSource

SAMPLE_ROWS = 64


def measure(src: ModelSource, step: Step, types: list[str], params: dict) -> dict[str, float]:
    """Estimated total squared error of `step`'s tensor under each type (sampled rows)."""
    t = step.tensor
    idx = np.unique(np.linspace(0, t.n_rows - 1, min(SAMPLE_ROWS, t.n_rows)).astype(int))
    x = np.concatenate([dequantize_rows(src, t, int(i), int(i) + 1) for i in idx])
    scale = t.n_rows / len(idx)
    err = {}
    for name in types:
        c = codec(name)
        if t.n_per_row % c.block_size:
            continue
        try:
            q = c.quantize(x, threads=1, **solver_params(c, {**params, **step.params}))
        except BlockRangeError:
            continue   # its fp16 scale cannot hold these values: not a choice for this tensor
        xh = np.asarray(c.dequantize(q), np.float32).reshape(x.shape)
        err[name] = float(np.sum((x.astype(np.float64) - xh) ** 2)) * scale
    return err


def fit(src: ModelSource, plan: Plan, allowed: list[str], budget_bytes: int, params: dict | None = None) -> Plan:
    params = params or {}
    if not allowed:
        raise GgufToolError("size targeting needs a set of allowed types", hint="use a recipe with `allowed = [...]`")
    fixed = [s for s in plan.steps if not s.quantizable]
    free = [s for s in plan.steps if s.quantizable]
    fixed_bytes = sum(s.out_bytes for s in fixed)
    options: list[list[tuple[int, float, str]]] = []  # per free step: (bytes, error, type) by size
    for s in free:
        err = measure(src, s, allowed, params)
        if not err:
            raise GgufToolError(f"tensor {s.tensor.name!r}: no allowed type fits its rows of {s.tensor.n_per_row} "
                                "and holds its values")
        opts = sorted((s.tensor.n_elements // codec(n).block_size * codec(n).type_size, e, n) for n, e in err.items())
        # keep the lower convex hull: a bigger type that is not better is never worth its bytes
        hull: list[tuple[int, float, str]] = []
        for o in opts:
            if hull and o[1] >= hull[-1][1]:
                continue
            while len(hull) >= 2 and _slope(hull[-2], hull[-1]) <= _slope(hull[-1], o):
                hull.pop()
            hull.append(o)
        options.append(hull)
    choice = [0] * len(free)
    total = fixed_bytes + sum(o[0][0] for o in options)
    if total > budget_bytes:
        raise GgufToolError(f"the budget of {budget_bytes / 2**20:.1f} MiB is below the smallest plan "
                            f"({total / 2**20:.1f} MiB with the smallest allowed types)")
    heap = [(-_slope(o[0], o[1]), i) for i, o in enumerate(options) if len(o) > 1]
    heapq.heapify(heap)
    while heap:
        _, i = heapq.heappop(heap)
        cur, nxt = options[i][choice[i]], options[i][choice[i] + 1]
        if total + nxt[0] - cur[0] > budget_bytes:
            continue  # this upgrade does not fit; smaller ones elsewhere still may
        total += nxt[0] - cur[0]
        choice[i] += 1
        if choice[i] + 1 < len(options[i]):
            heapq.heappush(heap, (-_slope(options[i][choice[i]], options[i][choice[i] + 1]), i))
    chosen = {id(s): options[i][choice[i]][2] for i, s in enumerate(free)}
    steps = []
    for s in plan.steps:
        if id(s) not in chosen:
            steps.append(s)
            continue
        out = codec(chosen[id(s)]).type
        action = "copy" if out.id == s.tensor.type.id else "quantize"
        steps.append(replace(s, out_type=out, action=action, note=f"budget: {out.name}"))
    return Plan(steps)


def _slope(a: tuple[int, float, str], b: tuple[int, float, str]) -> float:
    """Error removed per extra byte going from option a to the bigger option b."""
    return (a[1] - b[1]) / max(1, b[0] - a[0])
