"""HQQ (half-quadratic quantization) for Q4_HQQ, Q4_HQQ_128 and the stock Q4_1 / Q5_1 layouts.

Per group of G values: the scale comes from min-max and stays fixed; the zero point is refined by
hqq's proximal loop (hqq 0.2.8 `optimize_weights_proximal_legacy`), written here in the paper's names:

    W_q = clamp(round(W_f * s + z), 0, qmax)        s = inverse scale, z = zero in code units
    W_r = (W_q - z) / s                              the reconstruction
    W_e = shrink_lp(W_f - W_r, beta, p)              sparse error (p < 1 "norm")
    z   = mean(W_q - (W_f - W_e) * s)
    beta *= kappa;  stop when mean|W_f - W_r| stops falling

Decode: x = (q - zero) * scale with scale = 1/s and zero both stored as fp16 (the zero is NOT
rounded to an integer). Q4_1 / Q5_1 store the same solution as d = scale, m = -scale * zero.

Differences from hqq, on purpose:
* hqq stops early per tensor (its error is a mean over the whole tensor, so every group runs the
  same number of steps); here every block stops on its own block error. Blocks are independent,
  which is what lets rows run in parallel and makes each block's result depend on that block only.
  The early-stop rule itself is hqq's: when a step does not lower the error the loop breaks,
  keeping the zero that step produced (one update past the last improving one).
* The shrink is hqq 0.2.8's |x| - |x|^(p-1)/beta (older releases added 1e-8 inside the pow; both
  give 0 at x = 0, the only place it matters).
* The loop runs on s = 1 / fp16(scale) - the scale the block will store - and the final codes are
  chosen as the nearest grid point of the fp16 scale/zero read back from the block.
* hqq 0.2.8's legacy loop never applies kappa (its v2 loop and the paper do); we apply it, and
  kappa=1 reproduces the legacy loop exactly. On weight-sized data the shrink is 0 anyway
  (|W_f - W_r| stays below beta^(-1/(2-p)) ~ 0.17).
* hqq's guards for half precision (scale=1 when max-min <= 1e-4, scale clamped to 2e4) are absolute
  and would wreck small-magnitude blocks; instead the inverse scale is capped at 2^24 (fp16's
  smallest step) and at 60000/max|x| (so the fp16 zero stays finite).
* Least-squares refit (`refit=n`, default 2; refit=0 with scale_search=0 is plain HQQ): after the
  zero loop, refit scale and zero to the chosen codes by least squares (x ~ A*q + C, the inner step
  of llama.cpp's make_qkx2_quants) and choose the codes again; n rounds at most, each kept only if
  the block's squared error falls.
* Scale search (`scale_search=n`, default 0): also try inverse scales (qmax + r)/(max - min) for r
  in SCALE_STEPS[:2n], run the zero loop for each, keep the candidate with the lowest block squared
  error (the plain min-max candidate first; ties keep the earlier), then refit as above.
  Measured relative MSE as a fraction of llama.cpp's Q4_1 (gguf.quants), N(0, 0.02^2) data: plain
  HQQ 0.898 (the hqq package: 0.894), refit=2 (the default) 0.852, scale_search=1 0.799, at about
  1.25x and 2.2x plain's solver time (scripts/bench_hqq_quality.py, docs/hqq.md).
* With importance weights (an imatrix) the scale search is on by default (`WEIGHTED_SCALE_SEARCH`,
  one C constant, so llama-quantize's Q4_HQQ makes the same bytes): Gemma 3's weighted Q4_HQQ KLD
  0.0637 without it, 0.0465 with it, level with llama-quantize's imatrix Q4_1 (docs/hqq.md). An
  explicit scale_search wins; uniform weights with the same parameters give the unweighted bytes.
* Per-block vs per-tensor early stop, measured: with hqq's per-tensor rule the g32 MSE is ~0.4%
  lower (Gaussian: 0.894 vs 0.898 of Q4_1; the hqq package itself gives 0.894), because some blocks
  stop one or two steps early on their own noisy error; early_stop=0 (all 20 steps) recovers it.
* Q4_HQQ's zero is an fp16 in code units, so blocks far from 0 relative to their spread lose a
  little against Q4_1's m (measured: N(7, 0.02^2) data, +4% squared error vs the same solver
  writing Q4_1; N(0, 0.02^2) data: identical).
* A constant block c is stored exactly as scale = fp16(c), zero = -1, codes 0 (exact when c is an
  fp16 value; an all-zero block decodes to exact zeros).
* Importance weights (`imatrix=`, the tensor's imatrix row: w_j >= 0 per column; hqq has none): each
  block's weights are divided by their maximum (a block whose weights are all 0 is solved unweighted),
  and every mean and squared error of the solver is weighted - the zero update
  z = sum w (W_q - (W_f - W_e) s) / sum w, the early-stop error sum w |W_f - W_r| / sum w, the refit's
  least squares (n -> sum w), the scale search's and the refit's acceptance (sum w (x - x_hat)^2). The
  scale candidates (min-max) and the final codes (nearest grid point) do not depend on the weights.
  Weights equal within a block give exactly the unweighted bytes (w = 1: every product is exact).
  How an imatrix row becomes per-value weights: WEIGHTING (measured in docs/hqq.md).

`quantize_hqq` runs the C kernels (gguftool/_fast/gqt_hqq.c); `quantize_hqq_ref` is this module's
numpy reference. Both give identical bytes: every float operation happens in float32 in the same
order (sums run sequentially over a block, never numpy's pairwise sum), rounding is half-to-even on
the clamped value, and the only transcendental, |x|^(p-1) in the shrink, is computed in double with
the C library's pow (math.pow here), only for the few |x| large enough to survive the shrink.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from .. import types
from .._fast import _hqq  # the codecs need the extension: quant._load reports the ImportError
from ..errors import GgufToolError
from .rows import BlockRangeError, first_marked_block, range_error

# name -> (ggml type id, values per block, bytes per block, qmax), from the type table
TARGETS: dict[str, tuple[int, int, int, int]] = {
    n: (t.id, t.block_size, t.type_size, 2 ** types.code_bits(t) - 1) for n, t in types.hqq_targets().items()}
_BY_ID = {v[0]: k for k, v in TARGETS.items()}
STOCK = tuple(types.HQQ_STOCK_TARGETS)   # layouts with ggml's (d, m) pair: x = d*q + m

# Offsets r of the scale search, in search order: inverse scale (qmax + r) / (max - min); limits (gqt_hqq.h).
SCALE_STEPS = _hqq.SCALE_STEPS
SCALE_SEARCH_MAX = _hqq.SCALE_SEARCH_MAX
REFIT_MAX = _hqq.REFIT_MAX
WEIGHTED_SCALE_SEARCH = _hqq.WEIGHTED_SCALE_SEARCH   # the default scale_search with importance weights
ITERS_MAX = _hqq.ITERS_MAX

F32 = np.float32
_S_INV_CAP = F32(_hqq.S_INV_CAP)   # 2^24: 1/2^24 is fp16's smallest step
_ZERO_CAP = F32(_hqq.ZERO_CAP)     # |zero| stays below fp16's max (65504)


@dataclass(frozen=True)
class HQQParams:
    """Solver parameters. lp_norm..iters are hqq's defaults. The refit is on by default: it lowers the
    squared error ~5% below plain HQQ for ~1.25x the solver's time; the scale search lowers it ~6%
    further for ~2x more (see the module docstring). refit=0, scale_search=0 is plain HQQ."""
    lp_norm: float = 0.7     # p of the sparse-error "norm", 0 < p <= 1
    beta: float = 10.0       # initial penalty; the shrink threshold is |x|^(p-1) / beta
    kappa: float = 1.01      # beta *= kappa after every step (1.0 = hqq 0.2.8's legacy loop)
    iters: int = 20          # proximal steps at most (0 = plain min-max scale and zero)
    early_stop: int = 1      # 1: stop when the block error stops falling (hqq's rule), 0: run all steps
    scale_search: int = 0    # 0: min-max scale only; n: also try 2n more scales, each with its zero loop
    refit: int = 2           # rounds of least-squares refit of scale and zero to the codes (0: none)

    def validate(self) -> HQQParams:
        if not (0.0 < self.lp_norm <= 1.0):
            raise GgufToolError(f"HQQ lp_norm must be in (0, 1], got {self.lp_norm}")
        if not (self.beta > 0.0 and math.isfinite(self.beta)):
            raise GgufToolError(f"HQQ beta must be a positive number, got {self.beta}")
        if not (self.kappa >= 1.0 and math.isfinite(self.kappa)):
            raise GgufToolError(f"HQQ kappa must be >= 1, got {self.kappa}")
        if not (0 <= self.iters <= ITERS_MAX):
            raise GgufToolError(f"HQQ iters must be in 0..{ITERS_MAX}, got {self.iters}")
        if self.early_stop not in (0, 1):
            raise GgufToolError(f"HQQ early_stop must be 0 or 1, got {self.early_stop}")
        if not (0 <= self.scale_search <= SCALE_SEARCH_MAX):
            raise GgufToolError(f"HQQ scale_search must be in 0..{SCALE_SEARCH_MAX}, got {self.scale_search}")
        if not (0 <= self.refit <= REFIT_MAX):
            raise GgufToolError(f"HQQ refit must be in 0..{REFIT_MAX}, got {self.refit}")
        return self

    @classmethod
    def make(cls, **params: Any) -> HQQParams:
        solver = params.pop("solver", "hqq")
        if solver != "hqq":
            raise GgufToolError(f"solver {solver!r} cannot produce HQQ types", hint="use solver 'hqq'")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise GgufToolError(f"unknown HQQ parameter(s) {unknown}", hint="known: " + ", ".join(sorted(known)))
        try:
            p = cls(**{k: (int(v) if k in ("iters", "early_stop", "scale_search", "refit") else float(v))
                       for k, v in params.items()})
        except (TypeError, ValueError) as e:
            raise GgufToolError(f"bad HQQ parameter value: {e}") from None
        return p.validate()


DEFAULTS = HQQParams()


def _with_weight_defaults(params: dict[str, Any], imatrix) -> dict[str, Any]:
    """The parameters in effect: with importance weights the scale search defaults to WEIGHTED_SCALE_SEARCH."""
    return params if imatrix is None else {"scale_search": WEIGHTED_SCALE_SEARCH, **params}


def _target(target: str | int) -> tuple[str, int, int, int, int]:
    name = _BY_ID.get(target) if isinstance(target, (int, np.integer)) else str(target).upper()
    if name not in TARGETS:
        raise GgufToolError(f"HQQ cannot produce type {target!r}", hint="targets: " + ", ".join(TARGETS))
    return (name, *TARGETS[name])


def _check_input(x: np.ndarray, block: int, name: str, finite: bool = True) -> np.ndarray:
    """Shape and dtype checks; and NaN/Inf unless `finite=False` (the C path finds those itself:
    `_raise_nonfinite` then names the value)."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise GgufToolError(f"{name} quantization needs a 2-D array of rows, got shape {x.shape}")
    if x.dtype != np.float32:
        raise GgufToolError(f"{name} quantization needs float32 input, got {x.dtype}")
    if x.shape[1] % block:
        raise GgufToolError(f"{name} needs rows of a multiple of {block} values, got {x.shape[1]}",
                            hint="keep this tensor in another type (e.g. F16 or Q8_0)")
    if finite and not np.isfinite(x).all():
        _raise_nonfinite(x, name)
    return np.ascontiguousarray(x)


# How a per-column importance matrix becomes the solver's per-value weights (measured, docs/hqq.md):
# "raw": w_ij = imatrix_j; "ggml": w_ij = imatrix_j * sqrt(sigma2_i + x_ij^2), sigma2_i the row's mean x^2
# (ggml's quantize_row_q4_1_impl / q5_1_impl with an imatrix).
WEIGHTING = "raw"


def ggml_weights(x: np.ndarray, imatrix: np.ndarray) -> np.ndarray:
    """ggml's per-value weights for Q4_1/Q5_1 with an imatrix: qw_j * sqrt(sigma2 + x_j^2), sigma2 = sum x^2 / n
    over the row (float32 [rows, n])."""
    x = np.asarray(x, F32)
    sigma2 = ((x.astype(np.float64) ** 2).sum(axis=1) / x.shape[1]).astype(F32)[:, None]
    return (np.asarray(imatrix, F32).reshape(1, -1) * np.sqrt(sigma2 + x * x)).astype(F32)


def importance_weights(x: np.ndarray, imatrix: np.ndarray | None, name: str = "HQQ",
                       weighting: str | None = None) -> np.ndarray | None:
    """The solver's weights for the rows x [rows, n]: None (no imatrix), float32 [1, n] (one row for every
    row) or [rows, n]. imatrix: the tensor's importance matrix row [n] (per column), turned into weights
    as `weighting` (default WEIGHTING) says; or per-value weights, 2-D [rows, n], taken as they are."""
    if imatrix is None:
        return None
    w = np.asarray(imatrix, dtype=F32)
    rows, n = x.shape
    if w.ndim == 2 and w.shape == x.shape:   # per value: as given
        mode = "raw"
    elif w.size == n:
        w = w.reshape(1, n)
        mode = weighting or WEIGHTING
        if mode not in ("raw", "ggml"):
            raise GgufToolError(f"unknown importance weighting {mode!r}", hint="'raw' or 'ggml'")
    else:
        raise GgufToolError(f"importance matrix of {w.size} values for {name} rows of {n}",
                            hint="was it made for another model?")
    if not np.isfinite(w).all() or (w < 0).any():
        raise GgufToolError(f"the importance weights for {name} hold NaN, Inf or negative values",
                            hint="remake the imatrix (`gguftool imatrix MODEL`)")
    if mode == "ggml" and w.shape[0] == 1:
        with np.errstate(over="ignore", invalid="ignore"):   # non-finite x: refused by the solver, naming it
            w = ggml_weights(x, w)
    return np.ascontiguousarray(w)


def _raise_nonfinite(x: np.ndarray, name: str) -> None:
    bad = ~np.isfinite(x)
    r, c = np.argwhere(bad)[0]
    raise GgufToolError(f"cannot quantize to {name}: non-finite value {x[r, c]} at row {r}, column {c} "
                        f"({int(bad.sum())} non-finite values in all)",
                        hint="the source tensor holds NaN/Inf; fix the model first")


# ----------------------------------------------------------------------------- numpy reference

def _seqsum(a: np.ndarray) -> np.ndarray:
    """Row sums in float32, left to right (the C order; np.sum would sum pairwise)."""
    acc = np.zeros(a.shape[0], F32)
    for j in range(a.shape[1]):
        acc += a[:, j]
    return acc


def _round_clamped(v: np.ndarray, qmax: int) -> np.ndarray:
    return np.rint(np.clip(v, F32(0), F32(qmax)))   # clamp first: same as clamp(rint(v))


def _shrink_lp(x: np.ndarray, beta: float, pm1: float) -> np.ndarray:
    """sign(x) * relu(|x| - |x|^(p-1) / beta). Nonzero only for |x| > beta^(-1/(2-p)); the pow runs
    in double through libm (math.pow, the same pow the C kernel calls) for those elements only."""
    ax = np.abs(x)
    W_e = np.zeros_like(x)
    live = ax.astype(np.float64) > _shrink_floor(beta, pm1)
    if live.any():
        a = ax[live]
        t = np.array([math.pow(float(v), pm1) / beta for v in a], np.float64).astype(F32)
        d = a - t
        W_e[live] = np.where(d > 0, np.copysign(d, x[live]), F32(0))
    return W_e


def _shrink_floor(beta: float, pm1: float) -> float:
    # below this |x| the shrink is exactly 0 (margin 1e-4 >> float rounding); must match the C code
    return math.pow(1.0 / beta, 1.0 / (1.0 - pm1)) * (1.0 - 1e-4)


def _solve_zero(W_f: np.ndarray, s: np.ndarray, z: np.ndarray, qmax: int, prm: HQQParams,
                w: np.ndarray | None = None, sw: np.ndarray | None = None) -> np.ndarray:
    """hqq's proximal loop for the zero, every block (row of W_f) on its own; w [nb, G] (normalized
    importance weights, sums sw): the zero update and the early-stop error become weighted means."""
    s, z = s[:, None], z.copy()
    beta = float(F32(prm.beta))
    kappa = float(F32(prm.kappa))
    pm1 = float(F32(prm.lp_norm)) - 1.0
    best = np.full(W_f.shape[0], np.inf, F32)
    live = np.ones(W_f.shape[0], bool)
    G = F32(W_f.shape[1])
    for _ in range(prm.iters):
        zc = z[:, None]
        W_q = _round_clamped(W_f * s + zc, qmax)
        W_r = (W_q - zc) / s
        W_e = _shrink_lp(W_f - W_r, beta, pm1)
        if w is None:
            z_new = _seqsum(W_q - (W_f - W_e) * s) / G
            err = _seqsum(np.abs(W_f - W_r)) / G
        else:
            z_new = _seqsum(w * (W_q - (W_f - W_e) * s)) / sw
            err = _seqsum(w * np.abs(W_f - W_r)) / sw
        z = np.where(live, z_new, z)          # hqq keeps the zero of the step that did not improve
        if prm.early_stop:
            improved = err < best
            best = np.where(live & improved, err, best)
            live &= improved
            if not live.any():
                break
        beta *= kappa
    return z


def _fp16(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).astype(F32)


def _encode(W_f: np.ndarray, a: np.ndarray, b: np.ndarray, qmax: int, stock: bool, w: np.ndarray | None = None):
    """Codes nearest to each value on the grid of the stored fp16 pair a/b - (scale, zero), or (d, m)
    for Q4_1/Q5_1 - and each block's squared error (w: weighted): (codes uint8 [nb, G], sq_err [nb])."""
    sc = a.astype(F32)[:, None]
    bb = b.astype(F32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        if stock:
            W_q = np.where(sc != 0, _round_clamped((W_f - bb) / sc, qmax), F32(0))
            W_r = sc * W_q + bb
        else:
            W_q = np.where(sc != 0, _round_clamped(W_f / sc + bb, qmax), F32(0))
            W_r = (W_q - bb) * sc
    d = W_f - W_r
    return W_q.astype(np.uint8), _seqsum(d * d if w is None else w * (d * d))


def _normalized(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per block (row), the weights over their maximum - all 1 where they are all 0 - and their sums."""
    wmax = w.max(axis=1)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        wn = np.where(wmax > 0, w / wmax, F32(1)).astype(F32)
    return wn, _seqsum(wn)


def _solve_blocks(W_f: np.ndarray, qmax: int, stock: bool, prm: HQQParams, name: str = "HQQ",
                  wts: np.ndarray | None = None):
    """All blocks (rows of W_f, float32 [nb, G]) -> (a fp16 [nb], b fp16 [nb], codes uint8 [nb, G]).
    wts: importance weights [nb, G] (or None), normalized per block (_normalized) and weighting every
    mean and squared error of the solver.
    If blocks have no fp16 pair that encodes them, the first raises range_error (as the C kernel marks
    each and the caller names the first; W_f is one long row here, quantize_hqq_ref names the real row)."""
    nb, G = W_f.shape
    blocks = W_f   # all of them (W_f is cut to the non-constant ones below)
    a, b, q = np.zeros(nb, np.float16), np.zeros(nb, np.float16), np.zeros((nb, G), np.uint8)
    failed = np.zeros(nb, bool)
    mn = W_f.min(axis=1) + F32(0)   # -0 -> +0: which zero numpy's min returns is unspecified
    mx = W_f.max(axis=1) + F32(0)
    const = mn == mx
    if const.any():   # x == c: scale = c, zero = -1, codes 0  (Q4_1/Q5_1: d = c, m = c)
        with np.errstate(over="ignore"):
            c = mn[const].astype(np.float16)
        failed[np.flatnonzero(const)[~np.isfinite(c)]] = True
        a[const], b[const] = c, (c if stock else np.float16(-1))
    live = np.flatnonzero(~const)
    W_f, mn, mx = W_f[live], mn[live], mx[live]
    w = sw = None
    if wts is not None:
        w, sw = _normalized(wts[live])
    with np.errstate(divide="ignore", over="ignore"):   # maxabs 0 or denormal: cap stays 2^24
        cap = np.minimum(_S_INV_CAP, _ZERO_CAP / np.maximum(np.abs(mn), np.abs(mx)))
    best = np.full(len(live), np.inf, F32)
    for r in (0.0, *SCALE_STEPS[:2 * prm.scale_search]):
        with np.errstate(over="ignore", divide="ignore"):
            s_inv = np.minimum((F32(qmax) + F32(r)) / (mx - mn), cap)
            sh = _fp16(F32(1) / s_inv)                     # the scale the block stores
        failed[live[~np.isfinite(sh)]] = True              # too far apart for an fp16 scale
        sh = np.where(np.isfinite(sh), sh, F32(1))         # a stand-in: the block is refused below
        s = F32(1) / sh
        with np.errstate(over="ignore", invalid="ignore"):   # only blocks refused below overflow here
            z = _solve_zero(W_f, s, -mn * s, qmax, prm, w, sw)
            ca = sh.astype(np.float16)
            cb = (-(sh * z) if stock else z).astype(np.float16)   # Q4_1/Q5_1: m = -scale * zero
            cq, sq = _encode(W_f, ca, cb, qmax, stock, w)
        take = sq < best
        best[take] = sq[take]
        a[live[take]], b[live[take]], q[live[take]] = ca[take], cb[take], cq[take]
    # Q4_1/Q5_1: m = -scale * zero overflows fp16 for every candidate (the block's minimum is beyond
    # +-65504): no encoding, refused - never left as the zero block it was initialised to
    failed[live[~np.isfinite(best)]] = True
    if failed.any():
        raise range_error(name, blocks.reshape(1, -1), int(np.flatnonzero(failed)[0]), G)
    if prm.refit:
        a[live], b[live], q[live] = _ls_refit(W_f, a[live], b[live], q[live], best, qmax, stock, prm.refit, w, sw)
    return a, b, q


def _ls_refit(W_f, a, b, q, best, qmax: int, stock: bool, rounds: int, w=None, sw=None):
    """Least-squares refit of the stored pair to the chosen codes (x ~ A*q + C, as in llama.cpp's
    make_qkx2_quants), codes chosen again; kept only while the block error falls. w: weighted least
    squares (the count n becomes the sum of the weights, sw)."""
    n = F32(W_f.shape[1]) if w is None else sw
    live = np.ones(len(a), bool)
    for _ in range(rounds):
        Q = q.astype(F32)
        if w is None:
            sq, sqq, sx, sqx = _seqsum(Q), _seqsum(Q * Q), _seqsum(W_f), _seqsum(Q * W_f)
        else:
            sq, sqq, sx, sqx = _seqsum(w * Q), _seqsum(w * (Q * Q)), _seqsum(w * W_f), _seqsum(w * (Q * W_f))
        D = n * sqq - sq * sq
        live &= D > 0
        with np.errstate(all="ignore"):
            A = (n * sqx - sq * sx) / D
            C = (sx - A * sq) / n
            na = A.astype(np.float16)
            live &= (na > 0) & np.isfinite(na)
            nb = (C if stock else -C / na.astype(F32)).astype(np.float16)
        live &= np.isfinite(nb)
        if not live.any():
            break
        idx = np.flatnonzero(live)
        nq, sqe = _encode(W_f[idx], na[idx], nb[idx], qmax, stock, None if w is None else w[idx])
        better = sqe < best[idx]
        live[idx[~better]] = False
        k = idx[better]
        a[k], b[k], q[k], best[k] = na[k], nb[k], nq[better], sqe[better]
    return a, b, q


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """[nb, 32k] codes -> [nb, 16k] bytes: per 32-value sub-block, byte j = code j | code j+16 << 4."""
    nb, G = q.shape
    q = q.reshape(nb, G // 32, 2, 16) & np.uint8(0x0F)
    return (q[:, :, 0, :] | (q[:, :, 1, :] << np.uint8(4))).reshape(nb, G // 2)


def _pack(name: str, a: np.ndarray, b: np.ndarray, q: np.ndarray) -> np.ndarray:
    parts = [a.view(np.uint8).reshape(-1, 2), b.view(np.uint8).reshape(-1, 2)]
    if name == "Q5_1":
        qh = np.packbits((q >> 4).astype(np.uint8), axis=1, bitorder="little")  # bit j = bit 4 of code j
        parts.append(qh)
    parts.append(_pack_nibbles(q))
    return np.concatenate(parts, axis=1)


def quantize_hqq_ref(x: np.ndarray, target: str | int, *, imatrix: np.ndarray | None = None,
                     **params: Any) -> np.ndarray:
    """numpy reference: float32 [rows, n] -> uint8 [rows, row_bytes]; bytes equal `quantize_hqq`'s."""
    name, _, G, nbytes, qmax = _target(target)
    x = _check_input(x, G, name)
    prm = HQQParams.make(**_with_weight_defaults(params, imatrix))
    w = importance_weights(x, imatrix, name)
    rows, n = x.shape
    wts = None if w is None else np.ascontiguousarray(np.broadcast_to(w, x.shape)).reshape(-1, G)
    try:
        a, b, q = _solve_blocks(x.reshape(-1, G), qmax, name in STOCK, prm, name, wts)
    except BlockRangeError as e:
        raise range_error(name, x, e.col // G, G) from None   # col counted over all blocks: name the row
    return _pack(name, a, b, q).reshape(rows, n // G * nbytes)


def _unpack(name: str, data: np.ndarray, n_blocks: int):
    _, _, G, nbytes, _ = _target(name)
    blk = np.ascontiguousarray(data).view(np.uint8).reshape(n_blocks, nbytes)
    a = blk[:, 0:2].copy().view(np.float16).astype(F32).reshape(-1)
    b = blk[:, 2:4].copy().view(np.float16).astype(F32).reshape(-1)
    qs = blk[:, 8:] if name == "Q5_1" else blk[:, 4:]
    qs = qs.reshape(n_blocks, G // 32, 1, 16) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    q = (qs & np.uint8(0x0F)).reshape(n_blocks, G)
    if name == "Q5_1":
        qh = np.unpackbits(blk[:, 4:8], axis=1, bitorder="little")
        q = q | (qh << np.uint8(4))
    return a, b, q.astype(F32)


def dequantize_hqq_ref(data: np.ndarray, target: str | int) -> np.ndarray:
    """numpy decode: uint8 [rows, row_bytes] -> float32 [rows, n]."""
    name, _, G, nbytes, _ = _target(target)
    data = np.asarray(data, np.uint8)
    if data.ndim != 2 or data.shape[1] % nbytes:
        raise GgufToolError(f"{name} data must be [rows, k*{nbytes}] bytes, got shape {data.shape}")
    rows, nb = data.shape[0], data.shape[1] // nbytes
    a, b, q = _unpack(name, data, rows * nb)
    if name in STOCK:
        y = a[:, None] * q + b[:, None]
    else:
        y = (q - b[:, None]) * a[:, None]
    return y.reshape(rows, nb * G)


# ----------------------------------------------------------------------------- C path

_C_ERRORS = {
    _hqq.ERR_NONFINITE: "the input holds NaN or Inf",
    _hqq.ERR_SHAPE: "the row length does not fit the block size",
    _hqq.ERR_RANGE: "a block's values are too large or too far apart for an fp16 scale/zero",
    _hqq.ERR_PARAM: "an HQQ parameter is out of range",
}


def quantize_hqq(x: np.ndarray, target: str | int, *, threads: int = 1, imatrix: np.ndarray | None = None,
                 **params: Any) -> np.ndarray:
    """float32 [rows, n] -> uint8 [rows, row_bytes] with the C kernels, rows split over `threads`.

    target: "Q4_HQQ", "Q4_HQQ_128", "Q4_1" or "Q5_1" (or their ggml ids). params: HQQParams fields.
    imatrix: importance weights, per column [n] (an imatrix row) or per value [rows, n] (importance_weights);
    None: unweighted (the bytes of every earlier release)."""
    from .parallel import map_row_ranges
    name, tid, G, nbytes, _ = _target(target)
    x = _check_input(x, G, name, finite=False)
    prm = HQQParams.make(**_with_weight_defaults(params, imatrix))
    w = importance_weights(x, imatrix, name)

    def run(r0: int, r1: int) -> np.ndarray:
        out = np.empty((r1 - r0, x.shape[1] // G * nbytes), np.uint8)
        wr = None if w is None else (w if w.shape[0] == 1 else w[r0:r1])
        rc = _hqq.quantize_rows(tid, x[r0:r1], out, prm.lp_norm, prm.beta, prm.kappa, prm.iters,
                                prm.early_stop, prm.scale_search, prm.refit, wr)
        if rc == _hqq.ERR_RANGE:   # the kernel marked the block (NaN scale): name its row
            raise range_error(name, x[r0:r1], first_marked_block(out, nbytes), G).at(r0)
        if rc:
            raise GgufToolError(f"cannot quantize to {name}: {_C_ERRORS.get(rc, f'error {rc}')}")
        return out

    if x.shape[0] == 0:
        return np.empty((0, x.shape[1] // G * nbytes), np.uint8)
    try:
        return map_row_ranges(run, x.shape[0], threads)
    except GgufToolError:
        if not np.isfinite(x).all():   # name the first bad value, as the numpy path does
            _raise_nonfinite(x, name)
        raise


def dequantize_hqq(data: np.ndarray, target: str | int, *, impl: str = "c") -> np.ndarray:
    """uint8 [rows, row_bytes] -> float32 [rows, n]; impl "c" (gqt_hqq.c) or "numpy"."""
    if impl == "numpy":
        return dequantize_hqq_ref(data, target)
    name, tid, G, nbytes, _ = _target(target)
    data = np.ascontiguousarray(data, np.uint8)
    if data.ndim != 2 or data.shape[1] % nbytes:
        raise GgufToolError(f"{name} data must be [rows, k*{nbytes}] bytes, got shape {data.shape}")
    out = np.empty((data.shape[0], data.shape[1] // nbytes * G), np.float32)
    rc = _hqq.dequantize_rows(tid, data, out)
    if rc:
        raise GgufToolError(f"cannot decode {name}: {_C_ERRORS.get(rc, f'error {rc}')}")
    return out


# ----------------------------------------------------------------------------- vec_dot twins

def quantize_q8_1_ref(x: np.ndarray) -> np.ndarray:
    """numpy port of ggml's quantize_row_q8_1_ref: float32 [n] -> block_q8_1 bytes [n/32 * 36]
    (fp16 d = amax/127, fp16 s = d * sum(qs), int8 qs = roundf(x / d), half away from zero)."""
    x = np.asarray(x, F32).reshape(-1, 32)
    amax = np.abs(x).max(axis=1)
    d = amax / F32(127)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
    v = x * idv[:, None]
    av = np.abs(v)
    qs = (np.sign(v) * (np.floor(av) + np.floor(F32(2) * (av - np.floor(av))))).astype(np.int8)  # C roundf
    total = qs.astype(np.int32).sum(axis=1)                                # exact integer sum
    s = total.astype(F32) * d
    return np.concatenate([d.astype(np.float16).view(np.uint8).reshape(-1, 2),
                           s.astype(np.float16).view(np.uint8).reshape(-1, 2),
                           qs.view(np.uint8)], axis=1).reshape(-1)


def vec_dot_q8_1_ref(x_row: np.ndarray, y_q8_1: np.ndarray, target: str | int) -> np.float32:
    """numpy twin of gqt_vec_dot_q4_hqq*_q8_1_ref: per 32 values
    (scale*d8)*sum(q*q8) + (-(scale*zero))*s8, accumulated in float32 in block order."""
    name, _, G, nbytes, _ = _target(target)
    if name in STOCK:
        ours = " and ".join(n for n in TARGETS if n not in STOCK)
        raise GgufToolError(f"vec_dot is defined for {ours}, not {name}")
    nb = len(x_row) // nbytes
    scale, zero, q = _unpack(name, np.asarray(x_row, np.uint8), nb)
    y = np.asarray(y_q8_1, np.uint8).reshape(-1, 36)
    d8 = y[:, 0:2].copy().view(np.float16).astype(F32).reshape(-1)
    s8 = y[:, 2:4].copy().view(np.float16).astype(F32).reshape(-1)
    q8 = y[:, 4:].view(np.int8).astype(np.int32)
    sumi = (q.reshape(-1, 32).astype(np.int32) * q8).sum(axis=1)
    sub = G // 32
    sc, m = np.repeat(scale, sub), np.repeat(-(scale * zero), sub)
    terms_a = (sc * d8) * sumi.astype(F32)
    terms_b = m * s8
    acc = F32(0)
    for ta, tb in zip(terms_a, terms_b):
        acc = F32(acc + F32(ta + tb))
    return acc


# ----------------------------------------------------------------------------- codecs

def _register() -> None:
    from . import register

    for t in types.of_family("hqq"):
        def quantize(x, *, threads: int = 1, imatrix=None, _n=t.name, **params):
            return quantize_hqq(x, _n, threads=threads, imatrix=imatrix, **params)

        def dequantize(data, _n=t.name):
            data = np.asarray(data, np.uint8)
            return dequantize_hqq(data.reshape(data.shape[0] if data.ndim == 2 else 1, -1), _n)

        register(t, quantize, dequantize, asdict(DEFAULTS), importance=True)


_register()
