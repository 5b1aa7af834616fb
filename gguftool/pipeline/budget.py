"""Size-targeted planning: choose per-tensor types from an allowed set to meet a byte budget with the
least estimated damage to the model's output.

The objective. Each quantized tensor W is a matrix the model multiplies its inputs x by; what quantizing
it does to the model is the noise it adds to y = W x. Measured on a sample of W's rows, for each allowed
type, as the tensor's relative output error (noise-to-signal ratio)

    nsr = sum_ij a_j (w_ij - q(w)_ij)^2 / sum_ij a_j w_ij^2

where a_j = E[x_j^2] is the importance matrix's entry for column j (llama-imatrix measures exactly that;
E||(W - q(W)) x||^2 = sum_ij a_j (w_ij - q(w)_ij)^2 for inputs with uncorrelated columns), or a_j = 1
without one (isotropic inputs). With an importance matrix the sample is also quantized with it, as the
output will be. The relative error makes tensors of different scale comparable (a tensor of small
weights is not "cheap" because its squared error is small) and does not grow with a tensor's size (a
big tensor's output is one signal, like a small one's). The sum over tensors is weighted by role: the
output projection (or a tied token_embd) writes the logits directly, so its noise is weighted as much as
one matmul in every block together (ROLE_WEIGHT); every other matmul counts 1. With a measured sensitivity
(pipeline/sensitivity.py: each tensor's KLD when it alone is quantized) each tensor's error is weighted by
its own KLD per unit of relative error instead, and the objective estimates the plan's KLD.

The search. Starting from the smallest type everywhere, the upgrade that removes the most objective
per extra byte is applied until the next would exceed the budget (the greedy solution of the
multiple-choice knapsack over each tensor's convex hull). Then every uniform plan (one allowed type
for all) and the plan the recipe or TYPE gives are scored by the same objective, and a fitting one
that scores lower wins: the result is never worse than the best uniform plan that fits, by the
objective. --target-size counts the whole file (pipeline.quantize.file_bytes: metadata, tensor infos,
alignment padding, the tensors that are copied).
"""
from __future__ import annotations

import heapq
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import GgufToolError
from ..quant import codec
from ..quant.rows import BlockRangeError
from .plan import OUTPUT, TOKEN_EMBD, Plan, Step
from .quantize import dequantize_rows, importance, solver_params
from .source import ModelSource

SAMPLE_ROWS = 128
ROLE_WEIGHT = "blocks"   # weight of the output projection's error: the number of blocks (see the docstring)


def measure(src: ModelSource, step: Step, types: list[str], params: dict,
            weights: np.ndarray | None = None) -> dict[str, float]:
    """Relative output error (see the module docstring) of `step`'s tensor under each type, on sampled rows;
    weights: importance [n_mat, n_per_row] (pipeline.quantize.importance) or None. A type whose block does
    not divide the rows, or whose scales cannot hold the values, is left out."""
    t = step.tensor
    idx = np.unique(np.linspace(0, t.n_rows - 1, min(SAMPLE_ROWS, t.n_rows)).astype(int))
    x = np.concatenate([dequantize_rows(src, t, int(i), int(i) + 1) for i in idx])
    per_mat = t.n_rows // len(weights) if weights is not None else t.n_rows
    mat = idx // per_mat
    a = np.ones((1, t.n_per_row)) if weights is None else np.asarray(weights, np.float64)[mat]
    x64 = x.astype(np.float64)
    signal = float(np.sum(a * x64 ** 2))
    if not signal > 0:   # an all-zero sample (or importance): unweighted, and a zero tensor costs nothing
        a, signal = np.ones((1, t.n_per_row)), max(float(np.sum(x64 ** 2)), 1e-30)
    err = {}
    for name in types:
        c = codec(name)
        if t.n_per_row % c.block_size or c.quantize is None:
            continue
        p = solver_params(c, {**params, **step.params})
        try:
            if weights is not None and c.importance:   # as the output will be quantized: with its matrix's weights
                q = np.concatenate([c.quantize(x[mat == m], threads=1, imatrix=weights[m], **p) for m in np.unique(mat)])
                order = np.concatenate([np.flatnonzero(mat == m) for m in np.unique(mat)])
                xs, aa = x64[order], a if a.shape[0] == 1 else a[order]
            else:
                q, xs, aa = c.quantize(x, threads=1, **p), x64, a
        except BlockRangeError:
            continue   # its fp16 scale cannot hold these values: not a choice for this tensor
        xh = np.asarray(c.dequantize(q), np.float32).reshape(x.shape)
        err[name] = float(np.sum(aa * (xs - xh) ** 2)) / signal
    return err


def n_blocks(src: ModelSource) -> int:
    ids = {int(m.group(1)) for t in src.tensors if (m := re.match(r"blk\.(\d+)\.", t.name))}
    return max(ids) + 1 if ids else 1


def role_weight(name: str, src: ModelSource) -> float:
    """How much a tensor's relative output error counts: the logits' projection as much as one matmul of
    every block together, everything else 1."""
    if name == OUTPUT or (name == TOKEN_EMBD and OUTPUT not in src):
        return float(n_blocks(src)) if ROLE_WEIGHT == "blocks" else 1.0
    return 1.0


@dataclass
class Fit:
    """What fit() chose and what it compared (for --dry-run, the notes and the benchmark)."""
    plan: Plan
    chosen: str                                    # "mix", "uniform Q4_HQQ", "as planned"
    objective: float
    data_budget: int                               # bytes of tensor data allowed
    candidates: dict[str, tuple[int, float]] = field(default_factory=dict)   # name -> (tensor bytes, objective)
    plan_of: Callable[[str], Plan] | None = None   # a candidate's name -> its plan

    def _best_uniform(self, keep) -> tuple[str, int, float] | None:
        """(name, bytes, objective) of the lowest-scoring uniform candidate whose (bytes, objective) `keep` takes."""
        got = [(o, n) for n, (b, o) in self.candidates.items() if n.startswith("uniform") and keep(b, o)]
        return (min(got)[1], *self.candidates[min(got)[1]]) if got else None

    @property
    def best_uniform(self) -> tuple[str, int, float] | None:
        """The best uniform plan that fits, if any."""
        return self._best_uniform(lambda b, o: b <= self.data_budget)

    def near_uniform(self, margin: float = 0.005) -> tuple[str, int, float] | None:
        """The best uniform plan that does not fit but is at most `margin` over the budget and scores below the
        choice: a budget a hair under a uniform plan (its F32 norms put uniform Q4_HQQ at 5.006 bpw) forces a
        loss the user may not want."""
        return self._best_uniform(lambda b, o: self.data_budget < b <= self.data_budget * (1 + margin)
                                  and o < self.objective)


def fit(src: ModelSource, plan: Plan, allowed: list[str], budget_bytes: int, params: dict | None = None, *,
        imatrix=None, file_bytes: Callable[[Plan], int] | None = None, sensitivity=None) -> Plan:
    """`plan` with its quantizable tensors' types chosen from `allowed` to meet `budget_bytes` (tensor data,
    or with file_bytes(plan) -> bytes, the whole file) with the least objective; see search()."""
    return search(src, plan, allowed, budget_bytes, params, imatrix=imatrix, file_bytes=file_bytes,
                  sensitivity=sensitivity).plan


def search(src: ModelSource, plan: Plan, allowed: list[str], budget_bytes: int, params: dict | None = None, *,
           imatrix=None, file_bytes: Callable[[Plan], int] | None = None, sensitivity=None) -> Fit:
    """sensitivity: a pipeline.sensitivity.Sensitivity (measured KLD per tensor) to weight each tensor's error by,
    in place of its role's weight."""
    params = params or {}
    if not allowed:
        raise GgufToolError("size targeting needs a set of allowed types", hint="use a recipe with `allowed = [...]`")
    free = [s for s in plan.steps if s.quantizable]
    fixed_bytes = sum(s.out_bytes for s in plan.steps if not s.quantizable)
    errors = []
    for s in free:
        names = list(dict.fromkeys([*allowed, s.out_type.name]))   # also the planned type: the plan is a candidate
        probe = [sensitivity.probe] if sensitivity is not None else []
        err = measure(src, s, list(dict.fromkeys(names + probe)), params,
                      importance(imatrix, s.tensor) if imatrix is not None else None)
        if not any(n in err for n in allowed):
            raise GgufToolError(f"tensor {s.tensor.name!r}: no allowed type ({', '.join(allowed)}) fits its rows of "
                                f"{s.tensor.n_per_row} and holds its values")
        errors.append(err)
    if sensitivity is None:
        weight = {s.tensor.name: role_weight(s.tensor.name, src) for s in free}
    else:   # KLD per unit of relative error, measured: the objective estimates the plan's KLD
        from .sensitivity import weights
        weight = weights(sensitivity, {s.tensor.name: e.get(sensitivity.probe, 0.0) for s, e in zip(free, errors)})
    table = [{n: (_bytes(s, n), weight[s.tensor.name] * e) for n, e in err.items() if n in allowed or n == s.out_type.name}
             for s, err in zip(free, errors)]   # per free step: {type: (bytes, weighted error)}
    data_budget = budget_bytes
    if file_bytes is not None:   # the whole file: what the tensors may take is the target less the rest
        data_budget = budget_bytes - (file_bytes(plan) - plan.out_bytes)
    for _ in range(8):
        result = _search(plan, free, table, allowed, data_budget, fixed_bytes, budget_bytes, file_bytes is not None)
        if file_bytes is None:
            return result
        over = file_bytes(result.plan) - budget_bytes   # padding and type records differ between plans
        if over <= 0:
            return result
        data_budget -= over
    raise GgufToolError(f"internal error: no plan under {budget_bytes} bytes after 8 rounds")   # pragma: no cover


def _search(plan, free, table, allowed, data_budget, fixed_bytes, budget_bytes, whole_file) -> Fit:
    options = []
    for tab in table:
        opts = sorted((tab[n][0], tab[n][1], n) for n in allowed if n in tab)
        hull: list[tuple[int, float, str]] = []   # the lower convex hull: a bigger type that is not better never pays
        for o in opts:
            if hull and o[1] >= hull[-1][1]:
                continue
            while len(hull) >= 2 and _slope(hull[-2], hull[-1]) <= _slope(hull[-1], o):
                hull.pop()
            hull.append(o)
        options.append(hull)
    choice = [0] * len(free)
    total = fixed_bytes + sum(o[0][0] for o in options)
    if total > data_budget:
        what = "file" if whole_file else "tensor data"
        extra = budget_bytes - data_budget
        raise GgufToolError(f"the budget of {budget_bytes / 2**20:.2f} MiB is below the smallest plan: "
                            f"{(total + (extra if whole_file else 0)) / 2**20:.2f} MiB of {what} with the smallest "
                            f"allowed types ({', '.join(allowed)})",
                            hint="raise the target or allow a smaller type (a recipe's `allowed`)")
    heap = [(-_slope(o[0], o[1]), i) for i, o in enumerate(options) if len(o) > 1]
    heapq.heapify(heap)
    while heap:
        _, i = heapq.heappop(heap)
        cur, nxt = options[i][choice[i]], options[i][choice[i] + 1]
        if total + nxt[0] - cur[0] > data_budget:
            continue  # this upgrade does not fit; smaller ones elsewhere still may
        total += nxt[0] - cur[0]
        choice[i] += 1
        if choice[i] + 1 < len(options[i]):
            heapq.heappush(heap, (-_slope(options[i][choice[i]], options[i][choice[i] + 1]), i))
    candidates = {"mix": [o[c][2] for o, c in zip(options, choice)]}
    for name in allowed:   # uniform: `name` wherever it can go, else the tensor's nearest allowed type by size
        candidates[f"uniform {name}"] = [name if name in tab else _nearest(tab, allowed, name) for tab in table]
    planned = [s.out_type.name for s in free]
    if all(n in tab for n, tab in zip(planned, table)):
        candidates["as planned"] = planned
    scored = {k: (fixed_bytes + sum(tab[n][0] for n, tab in zip(v, table)), sum(tab[n][1] for n, tab in zip(v, table)))
              for k, v in candidates.items()}
    fits = [k for k, (b, _) in scored.items() if b <= data_budget]
    best = min(fits, key=lambda k: (scored[k][1], scored[k][0], k != "mix"))
    return Fit(_with_types(plan, free, candidates[best], best == "as planned"), best, scored[best][1], data_budget,
               scored, lambda k: _with_types(plan, free, candidates[k], k == "as planned"))


def _with_types(plan: Plan, free: list, names: list[str], as_planned: bool) -> Plan:
    """`plan` with free step i at type names[i]."""
    chosen = dict(zip((id(s) for s in free), names))
    steps = []
    for s in plan.steps:
        if id(s) not in chosen:
            steps.append(s)
            continue
        out = codec(chosen[id(s)]).type
        if out.id == s.out_type.id and as_planned:
            steps.append(s)
            continue
        action = "copy" if out.id == s.tensor.type.id else "quantize"
        steps.append(replace(s, out_type=out, action=action, note=""))   # (a note per tensor would flood stderr)
    return Plan(steps)


def _nearest(tab: dict[str, tuple[int, float]], allowed: list[str], name: str) -> str:
    """The allowed type this tensor can take whose size is nearest above `name`'s (else the largest)."""
    want = codec(name).type_size / codec(name).block_size
    have = sorted((codec(n).type_size / codec(n).block_size, n) for n in allowed if n in tab)
    return next((n for bpw, n in have if bpw >= want), have[-1][1])


def _bytes(s: Step, name: str) -> int:
    c = codec(name)
    return s.tensor.n_elements // c.block_size * c.type_size


def _slope(a: tuple[int, float, str], b: tuple[int, float, str]) -> float:
    """Objective removed per extra byte going from option a to the bigger option b."""
    return (a[1] - b[1]) / max(1, b[0] - a[0])


def calibration_bytes(src: ModelSource, out_name: str) -> int:
    """An upper bound on what `gguftool kv-calibrate` adds to a file of `src` (its keys per block, sized by the
    K/V projections' rows, the record of the source name and the header's new padding), for --target-size."""
    from gguf import GGUFValueType, GGUFWriter

    from ..validate.session import default_text
    from .kvcalib import LayerCalib, metadata
    rows = {}
    for t in src.tensors:
        if m := re.match(r"blk\.(\d+)\.attn_([kv])\.weight$", t.name):
            rows.setdefault(int(m.group(1)), {})[m.group(2)] = t.shape[-2]
    calib = {il: LayerCalib(np.zeros(r.get("k", 0), np.float32), np.ones(r.get("k", 0), np.float32),
                            np.zeros(r.get("v", 0), np.float32), 0.0, {}, 0.0) for il, r in rows.items()}
    w = GGUFWriter(None, "probe")
    items = [*metadata(calib, default_text().name, 2**31), ("gguftool.kv_calib.source", out_name, GGUFValueType.STRING, None)]
    n = sum(len(w._pack_val(k, GGUFValueType.STRING, add_vtype=False)) + len(w._pack_val(v, t, add_vtype=True, sub_type=s))
            for k, v, t, s in items)
    get = getattr(src, "get", None)
    alignment = int((get("general.alignment", 32) if get else 32) or 32)
    return n + alignment   # the padding after the header grows by less than the alignment
