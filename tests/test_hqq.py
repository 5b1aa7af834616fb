"""HQQ quantizer: numpy reference == C kernels byte for byte, stock layouts decode with gguf's own
decoder, quality against llama.cpp's reference Q4_1 (gguf.quants) and a min-max baseline, vec_dot
against its numpy twin and a float dot, bad input rejected."""
from __future__ import annotations

import json

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants

from gguftool.errors import GgufToolError
from gguftool.quant import hqq as H
from gguftool.types import BY_NAME

_hqq = pytest.importorskip("gguftool._fast._hqq")

F32 = np.float32
TARGETS = ("Q4_HQQ", "Q4_HQQ_128", "Q4_1", "Q5_1")
PARAMS = (
    {},                                                            # defaults (refit 2)
    {"refit": 0},                                                  # plain HQQ
    {"scale_search": 1},
    {"scale_search": H.SCALE_SEARCH_MAX, "refit": H.REFIT_MAX, "early_stop": 0, "iters": 7},
    {"scale_search": 2, "refit": 0},
    {"kappa": 1.0, "lp_norm": 0.5, "beta": 2.0, "iters": 0},
    {"kappa": 1.2, "lp_norm": 1.0, "beta": 0.5},
)


def _random_sets(seed: int):
    rng = np.random.default_rng(seed)
    g = (rng.standard_normal((6, 256)) * 0.02).astype(F32)
    t = (rng.standard_t(3, (6, 256)) * 0.05).astype(F32)
    out = (rng.standard_normal((6, 256)) * 0.02).astype(F32)
    out[rng.integers(0, 6, 5), rng.integers(0, 256, 5)] = F32(3.0)
    big = (rng.standard_normal((4, 256)) * 300).astype(F32)       # residuals large enough to shrink
    offset = (rng.standard_normal((4, 256)) * 0.01 + 7.0).astype(F32)
    return {"gauss": g, "student_t3": t, "outliers": out, "big": big, "offset": offset}


def _edge_rows() -> np.ndarray:
    """Rows of 128 values, each 32-value block an edge case."""
    blocks = [
        np.zeros(32),                                   # all zero
        np.full(32, 0.5), np.full(32, -3.25),           # constant, exact in fp16
        np.full(32, 1e-3),                              # constant, not an fp16 value
        np.r_[np.full(31, 0.01), 1e4],                  # one huge outlier
        np.r_[np.zeros(16), -np.zeros(16)],             # +0 and -0
        np.linspace(-1, 1, 32),                         # exact ramp
        np.linspace(1e-40, 3e-39, 32),                  # float32 denormals
        np.r_[np.full(16, 1e-41), np.full(16, -2e-41)], # two denormal levels
        np.linspace(1000.0, 1000.01, 32),               # tiny range far from zero (zero cap)
        np.linspace(-1e-6, 2e-6, 32),                   # below fp16's smallest step
        np.r_[np.full(31, -2.0), 5.0],                  # constant but one
    ]
    x = np.concatenate(blocks).astype(F32)
    return x.reshape(-1, 128)


def _assert_same(a: np.ndarray, b: np.ndarray, what: str) -> None:
    if not np.array_equal(a, b):
        bad = np.argwhere(a != b)
        raise AssertionError(f"{what}: {len(bad)} bytes differ, first at {bad[:4].tolist()}\n"
                             f"ref  {a[tuple(bad[0][:1])][:24]}\nfast {b[tuple(bad[0][:1])][:24]}")


@pytest.mark.parametrize("target", TARGETS)
def test_numpy_reference_equals_c(target):
    for seed in (0, 1):
        for dname, x in _random_sets(seed).items():
            for prm in PARAMS:
                _assert_same(H.quantize_hqq_ref(x, target, **prm), H.quantize_hqq(x, target, **prm),
                             f"{target} {dname} seed {seed} {prm}")


def test_constant_rows_exact_at_g128():
    x = np.stack([np.zeros(128), np.full(128, -3.25), np.full(128, 2.0 ** -20)]).astype(F32)
    for target in ("Q4_HQQ_128", "Q4_HQQ"):
        assert np.array_equal(H.dequantize_hqq(H.quantize_hqq(x, target), target), x)


@pytest.mark.parametrize("target", TARGETS)
def test_edge_cases_equal_and_exact(target):
    x = _edge_rows()
    for prm in PARAMS[:3]:
        ref = H.quantize_hqq_ref(x, target, **prm)
        _assert_same(ref, H.quantize_hqq(x, target, **prm), f"{target} edge {prm}")
        y = H.dequantize_hqq(ref, target)
        assert np.isfinite(y).all()
        if H.TARGETS[target][1] != 32:
            continue
        blocks, yb = x.reshape(-1, 32), y.reshape(-1, 32)
        assert (yb[0] == 0).all() and (yb[5] == 0).all()                   # zero blocks decode to zeros
        assert (yb[1] == 0.5).all() and (yb[2] == -3.25).all()             # constants: exact
        assert np.allclose(yb[3], 1e-3, rtol=1e-3)                         # nearest fp16
        assert np.abs(yb[7]).max() < 1e-7 and np.abs(yb[8]).max() < 1e-7   # denormals: no blow-up
        ymm = H.dequantize_hqq(H.quantize_hqq(x, target, iters=0, refit=0), target).reshape(-1, 32)
        sq, sq_mm = ((yb - blocks) ** 2).sum(1), ((ymm - blocks) ** 2).sum(1)
        assert sq[6] <= sq_mm[6] and sq[11] <= sq_mm[11]                   # never worse than min-max


def test_shrink_path_is_exercised():
    """On data with large residuals the sparse-error term changes the result, so the parity test
    above covers the pow branch of the shrink (C pow vs math.pow)."""
    x = _random_sets(0)["big"]
    a = H.quantize_hqq_ref(x, "Q4_HQQ", refit=0)
    b = H.quantize_hqq_ref(x, "Q4_HQQ", refit=0, beta=1e-3)   # threshold huge: W_e == 0
    assert not np.array_equal(a, b)


@pytest.mark.parametrize("target", ("Q4_HQQ", "Q4_HQQ_128", "Q5_1"))
def test_many_batches_mixed_blocks_equal(target):
    """The C solver works on batches of blocks, 8 at a time in SIMD lanes, and a lane whose block
    stops early takes the next one: over several batches of very different blocks (Gaussian,
    heavy tails, residuals large enough to shrink, constant, all-zero, offset) every block must
    still come out exactly as the reference solves it alone."""
    rng = np.random.default_rng(7)
    rows = []
    for i in range(41):
        kind = i % 6
        r = rng.standard_normal(1024) * (0.02, 300.0, 1e-3, 0.0, 0.0, 0.01)[kind]
        if kind == 2:
            r = rng.standard_t(2, 1024) * 1e-3
        elif kind == 3:
            r[:] = 0.75
        elif kind == 5:
            r += 7.0
        rows.append(r)
    x = np.stack(rows).astype(F32)
    for prm in ({}, {"refit": 0}, {"scale_search": 2, "refit": 5, "kappa": 1.05}):
        _assert_same(H.quantize_hqq_ref(x, target, **prm), H.quantize_hqq(x, target, **prm), f"{target} {prm}")


def test_blocks_are_independent():
    """Per-block solving: a block's bytes do not depend on the rest of the tensor."""
    x = _random_sets(2)["student_t3"]
    whole = H.quantize_hqq(x, "Q4_HQQ")
    alone = H.quantize_hqq(np.ascontiguousarray(x[3:4, 64:96]), "Q4_HQQ")
    assert np.array_equal(whole[3:4, 40:60], alone)


@pytest.mark.parametrize("fn", [H.quantize_hqq, H.quantize_hqq_ref])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_rejected(fn, bad):
    x = (np.random.default_rng(0).standard_normal((3, 64)) * 0.1).astype(F32)
    x[2, 40] = bad
    with pytest.raises(GgufToolError, match=r"non-finite value .* row 2, column 40"):
        fn(x, "Q4_HQQ")


def test_c_reports_nonfinite_and_range():
    x = np.zeros((1, 32), F32)
    out = np.zeros((1, 20), np.uint8)
    x[0, 5] = np.nan
    assert _hqq.quantize_rows(512, x, out, 0.7, 10, 1.01, 20, 1, 1, 2) == -1   # GQT_ERR_NONFINITE
    x[0, 5], x[0, 6] = F32(3e38), F32(-3e38)
    assert _hqq.quantize_rows(512, x, out, 0.7, 10, 1.01, 20, 1, 1, 2) == -3   # GQT_ERR_RANGE
    for fn in (H.quantize_hqq, H.quantize_hqq_ref):
        with pytest.raises(GgufToolError, match="fp16 scale"):
            fn(x, "Q4_HQQ")


def test_bad_shape_params_target():
    x = np.zeros((2, 48), F32)
    for fn in (H.quantize_hqq, H.quantize_hqq_ref):
        with pytest.raises(GgufToolError, match="multiple of 32"):
            fn(x, "Q4_HQQ")
        with pytest.raises(GgufToolError, match="multiple of 128"):
            fn(np.zeros((1, 256 + 32), F32), "Q4_HQQ_128")
        with pytest.raises(GgufToolError, match="float32"):
            fn(np.zeros((1, 32)), "Q4_HQQ")
        with pytest.raises(GgufToolError, match="cannot produce"):
            fn(np.zeros((1, 32), F32), "Q8_0")
        with pytest.raises(GgufToolError, match="lp_norm"):
            fn(np.zeros((1, 32), F32), "Q4_HQQ", lp_norm=1.5)
        with pytest.raises(GgufToolError, match="unknown HQQ parameter"):
            fn(np.zeros((1, 32), F32), "Q4_HQQ", gamma=1)
    assert _hqq.quantize_rows(512, np.zeros((1, 32), F32), np.zeros((1, 20), np.uint8),
                              0.7, 10, 1.01, 20, 1, 99, 2) == -4   # GQT_ERR_PARAM
    assert _hqq.quantize_rows(512, np.zeros((1, 32), F32), np.zeros((1, 20), np.uint8),
                              0.7, 10, 1.01, 20, 1, 0, H.REFIT_MAX + 1) == -4
    with pytest.raises(GgufToolError, match="refit"):
        H.quantize_hqq(np.zeros((1, 32), F32), "Q4_HQQ", refit=-1)


@pytest.mark.parametrize("target,qtype", [("Q4_1", T.Q4_1), ("Q5_1", T.Q5_1)])
def test_stock_layouts_decode_with_gguf(target, qtype):
    x = np.concatenate([_random_sets(3)["student_t3"][:, :128], _edge_rows()]).astype(F32)
    data = H.quantize_hqq(x, target)
    theirs = quants.dequantize(data, qtype).astype(F32)
    assert np.array_equal(theirs, H.dequantize_hqq(data, target))
    assert np.array_equal(theirs, H.dequantize_hqq(data, target, impl="numpy"))
    with np.errstate(all="ignore"):   # llama.cpp's reference divides by the denormal range of one edge block
        ref = quants.dequantize(quants.quantize(x, qtype), qtype)
    err, err_ref = ((x - theirs) ** 2).sum(), ((x - ref) ** 2).sum()
    assert err < err_ref


@pytest.mark.parametrize("target", ("Q4_HQQ", "Q4_HQQ_128"))
def test_decoders_agree(target):
    x = np.concatenate([_random_sets(4)["outliers"][:, :128], _edge_rows()])
    data = H.quantize_hqq(x, target)
    y = H.dequantize_hqq(data, target)
    assert np.array_equal(y, H.dequantize_hqq(data, target, impl="numpy"))
    one = np.empty(x.shape[1], F32)
    _hqq.dequantize_row(BY_NAME[target].id, data[1], one)        # ggml's to_float entry point
    assert np.array_equal(one, y[1])
    # the layout by hand: fp16 scale, fp16 zero, byte j of each 32-sub-block = code j | code j+16 << 4
    blk = data[0, : BY_NAME[target].type_size]
    scale, zero = blk[:4].view(np.float16).astype(F32)
    codes = np.concatenate([np.r_[b & 15, b >> 4] for b in blk[4:].reshape(-1, 16)]).astype(F32)
    assert np.array_equal((codes - zero) * scale, y[0, : BY_NAME[target].block_size])


def _minmax_baseline(x: np.ndarray, group: int) -> np.ndarray:
    """Asymmetric min-max, fp32 scale and offset, nearest code: the textbook baseline."""
    w = x.reshape(-1, group).astype(np.float64)
    lo, hi = w.min(1, keepdims=True), w.max(1, keepdims=True)
    d = (hi - lo) / 15
    q = np.clip(np.rint((w - lo) / d), 0, 15)
    return (q * d + lo).reshape(x.shape)


@pytest.mark.parametrize("dist", ["gauss", "student_t5"])
def test_quality(dist):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((128, 1024)) if dist == "gauss" else rng.standard_t(5, (128, 1024)))
    x = (x * 0.02).astype(F32)

    def rel(t, **kw):
        return float(((x - H.dequantize_hqq(H.quantize_hqq(x, t, **kw), t)) ** 2).sum() / (x ** 2).sum())

    q41 = quants.dequantize(quants.quantize(x, T.Q4_1), T.Q4_1)
    rel_q41 = float(((x - q41) ** 2).sum() / (x ** 2).sum())
    rel_mm128 = float(((x - _minmax_baseline(x, 128)) ** 2).sum() / (x ** 2).sum())
    # measured (scripts/bench_hqq_quality.py): of Q4_1, plain ~0.90, default ~0.85, scale search ~0.80;
    # of min-max g128, plain ~0.95, default ~0.90, scale search ~0.86
    assert rel("Q4_HQQ", scale_search=1) <= 0.83 * rel_q41
    assert rel("Q4_HQQ") <= 0.88 * rel_q41
    assert rel("Q4_HQQ", refit=0) <= 0.93 * rel_q41
    assert rel("Q4_HQQ_128", scale_search=1) <= 0.89 * rel_mm128
    assert rel("Q4_HQQ_128") <= 0.93 * rel_mm128
    assert rel("Q4_HQQ_128", refit=0) <= 0.97 * rel_mm128
    q51 = quants.dequantize(quants.quantize(x, T.Q5_1), T.Q5_1)
    assert rel("Q5_1") <= 0.90 * float(((x - q51) ** 2).sum() / (x ** 2).sum())


def test_q8_1_port_matches_ggml_q8_0():
    """ggml's quantize_row_q8_1_ref computes d and qs exactly as quantize_row_q8_0_ref (gguf's port)
    and adds s = fp16(d * sum(qs))."""
    rng = np.random.default_rng(6)
    y = (rng.standard_normal(1024) * rng.choice([1e-3, 1.0, 50.0], 1024)).astype(F32)
    y[:32] = 0
    y[32:64] = np.arange(32, dtype=F32) - 15.5    # ties at .5 after scaling
    ours = H.quantize_q8_1_ref(y).reshape(-1, 36)
    q80 = quants.quantize(y.reshape(1, -1), T.Q8_0).reshape(-1, 34)
    assert np.array_equal(ours[:, :2], q80[:, :2]) and np.array_equal(ours[:, 4:], q80[:, 2:])
    d = np.abs(y.reshape(-1, 32)).max(1) / F32(127)     # ggml: s = fp16(sum * d), d before rounding
    s = (ours[:, 4:].view(np.int8).astype(np.int32).sum(1).astype(F32) * d).astype(np.float16)
    assert np.array_equal(ours[:, 2:4].copy().view(np.float16).ravel(), s)


@pytest.mark.parametrize("target", ("Q4_HQQ", "Q4_HQQ_128"))
def test_vec_dot(target):
    rng = np.random.default_rng(7)
    tid = BY_NAME[target].id
    for trial in range(12):
        n = 128 * (1 + trial)
        x = (rng.standard_t(4, (1, n)) * 0.02).astype(F32)
        if trial == 3:
            x[:] = F32(0.25)                       # constant blocks: zero = -1
        y = (rng.standard_normal(n) * rng.choice([0.1, 3.0])).astype(F32)
        xq = H.quantize_hqq(x, target)[0]
        yq = H.quantize_q8_1_ref(y)
        c = _hqq.vec_dot_q8_1(tid, xq, yq, n)
        twin = H.vec_dot_q8_1_ref(xq, yq, target)
        assert np.float32(c) == twin, (c, twin)
        # float dot of the dequantized values; the one inexact input is s8 = fp16(d8*sum q8)
        xd = H.dequantize_hqq(xq[None], target)[0].astype(np.float64)
        yb = yq.reshape(-1, 36)
        d8 = yb[:, :2].copy().view(np.float16).astype(np.float64).ravel()
        yd = (yb[:, 4:].view(np.int8) * d8[:, None]).ravel()
        exact = float(xd @ yd)
        blk = xq.reshape(-1, BY_NAME[target].type_size)[:, :4].copy().view(np.float16).astype(np.float64)
        sz = np.repeat(np.abs(blk[:, 0] * blk[:, 1]), BY_NAME[target].block_size // 32)
        tol = float((sz * np.abs(yb[:, 4:].view(np.int8).sum(1)) * d8).sum()) * 2.0 ** -10 \
            + 1e-5 * float(np.abs(xd * yd).sum()) + 1e-30
        assert abs(c - exact) <= tol, (c, exact, tol)
        # the registered kernel (AVX2 picked at run time in this baseline build where the CPU has it)
        simd = _hqq.vec_dot_q8_1(tid, xq, yq, n, simd=True)
        assert abs(simd - c) <= 1e-5 * float(np.abs(xd * yd).sum()) + 1e-6, (simd, c)


@pytest.mark.parametrize("target", ("Q4_HQQ", "Q4_HQQ_128"))
def test_ggml_entry_points(target):
    """quantize_q4_hqq* / quantize_row_*_ref (ggml traits, default params) == quantize_hqq defaults;
    a block with NaN is marked with NaN scale/zero instead of an error code."""
    tid = BY_NAME[target].id
    x = _random_sets(8)["gauss"]
    want = H.quantize_hqq(x, target)
    out = np.empty_like(want)
    assert _hqq.quantize_rows_default(tid, x, out) == want.size
    assert np.array_equal(out, want)
    row = np.empty(want.shape[1], np.uint8)
    _hqq.quantize_row_ref(tid, x[2], row)
    assert np.array_equal(row, want[2])
    x = x.copy()
    x[0, 3] = np.nan
    _hqq.quantize_row_ref(tid, x[0], row)
    assert np.isnan(row[:4].view(np.float16)).all()
    assert np.array_equal(row[BY_NAME[target].type_size:], want[0, BY_NAME[target].type_size:])
    c_defaults = _hqq.default_params()   # gqt_hqq_default_params == HQQParams() (floats as float32)
    assert c_defaults == {k: (float(F32(v)) if isinstance(v, float) else v) for k, v in vars(H.DEFAULTS).items()}


def test_threads_and_codec():
    from gguftool.quant import codec
    x = _random_sets(9)["student_t3"]
    assert np.array_equal(H.quantize_hqq(x, "Q4_HQQ", threads=1), H.quantize_hqq(x, "Q4_HQQ", threads=3))
    for name in ("Q4_HQQ", "Q4_HQQ_128"):
        c = codec(name)
        data = c.quantize(x, threads=2, refit=0)
        assert data.shape == (x.shape[0], c.row_bytes(x.shape[1]))
        assert np.array_equal(data, H.quantize_hqq_ref(x, name, refit=0))
        assert np.array_equal(c.dequantize(data), H.dequantize_hqq_ref(data, name))


# ----------------------------------------------------------------------------- importance weights

def _imatrices(n: int, seed: int) -> dict[str, np.ndarray]:
    """Per-column importance vectors: llama-imatrix-like (gamma), with zero columns and an all-zero block,
    and huge ratios within blocks (1e-30 .. 1e30)."""
    rng = np.random.default_rng(seed)
    gamma = rng.gamma(0.5, size=n).astype(F32)
    zeros = gamma.copy()
    zeros[rng.integers(0, n, n // 4)] = 0
    zeros[32:64] = 0                                  # one Q4_HQQ block (and a quarter of a 128-block) all zero
    if n >= 256:
        zeros[128:256] = 0                            # a whole 128-block too
    huge = (10.0 ** rng.uniform(-30, 30, n)).astype(F32)
    huge[::7] = 0
    return {"gamma": gamma, "zeros": zeros, "huge": huge}


@pytest.mark.parametrize("target", TARGETS)
def test_weighted_numpy_reference_equals_c(target):
    for seed in (0, 1):
        for dname, x in _random_sets(seed).items():
            for iname, w in _imatrices(x.shape[1], seed).items():
                for prm in PARAMS:
                    _assert_same(H.quantize_hqq_ref(x, target, imatrix=w, **prm),
                                 H.quantize_hqq(x, target, imatrix=w, **prm),
                                 f"{target} {dname} imatrix {iname} seed {seed} {prm}")


@pytest.mark.parametrize("target", ("Q4_HQQ", "Q4_HQQ_128", "Q5_1"))
def test_weighted_per_value_many_batches_and_threads(target):
    """Per-value weights [rows, n] (each row its own), over several C batches of mixed blocks (edge blocks
    included), split over threads: every block as the reference solves it."""
    rng = np.random.default_rng(11)
    edge = np.tile(_edge_rows().reshape(1, -1)[:, :384], (1, 8))[:, :1024]
    x = np.concatenate([(rng.standard_t(3, (40, 1024)) * 0.02), edge, np.zeros((1, 1024)),
                        rng.standard_normal((3, 1024)) * 300]).astype(F32)
    w = (rng.gamma(0.5, size=x.shape) * rng.choice([0.0, 1.0, 1e6], x.shape, p=[0.2, 0.7, 0.1])).astype(F32)
    for prm in ({}, {"refit": 0}, {"scale_search": 2, "refit": 5, "kappa": 1.05}):
        ref = H.quantize_hqq_ref(x, target, imatrix=w, **prm)
        _assert_same(ref, H.quantize_hqq(x, target, imatrix=w, **prm), f"{target} per-value {prm}")
        _assert_same(ref, H.quantize_hqq(x, target, imatrix=w, threads=3, **prm), f"{target} per-value threads {prm}")


@pytest.mark.parametrize("target", TARGETS)
def test_weights_without_preference_give_the_unweighted_bytes(target):
    """All-zero weights fall back to unweighted (no division by zero); weights equal within each block, or
    all scaled by a power of two, change nothing (each block's weights are divided by their maximum).
    With weights the scale search defaults to WEIGHTED_SCALE_SEARCH; given explicitly, it is the same solve."""
    edge = np.r_[_edge_rows().reshape(-1), np.zeros(128)].reshape(-1, 256)
    x = np.concatenate([_random_sets(5)["student_t3"][:, :256], edge]).astype(F32)
    assert H.WEIGHTED_SCALE_SEARCH == 1
    G = H.TARGETS[target][1]
    per_block = np.repeat(np.random.default_rng(3).uniform(0.1, 50, 256 // G), G).astype(F32)
    for search in (None, 0, 2):
        given = {} if search is None else {"scale_search": search}
        plain = H.quantize_hqq(x, target, scale_search=H.WEIGHTED_SCALE_SEARCH if search is None else search)
        for w in (np.zeros(256, F32), np.full(256, 3.7, F32), per_block):
            for fn in (H.quantize_hqq, H.quantize_hqq_ref):
                _assert_same(plain, fn(x, target, imatrix=w, **given), f"{target} {fn.__name__} w={w[:3]} {given}")
    plain = H.quantize_hqq(x, target)
    assert not np.array_equal(H.quantize_hqq(x, target, imatrix=np.ones(256, F32)), plain)   # the search is on
    w = _imatrices(256, 4)["gamma"]
    _assert_same(H.quantize_hqq(x, target, imatrix=w), H.quantize_hqq(x, target, imatrix=w * F32(2.0 ** 40)),
                 f"{target} scaled weights")
    assert not np.array_equal(H.quantize_hqq(x, target, imatrix=w), plain)


def _wrel(x, y, w):
    d = (x.astype(np.float64) - y) ** 2
    return float((d * w).sum() / ((x.astype(np.float64) ** 2) * w).sum())


@pytest.mark.parametrize("target", TARGETS)
def test_weighted_solver_lowers_the_weighted_error(target):
    """On heavy-tailed rows with llama-imatrix-like weights (a few columns dominate), the weighted solver's
    imatrix-weighted squared error (float64, decoded by gguf's own decoder for the stock layouts) is well below
    the unweighted solver's, and its plain squared error is higher: it trades where the weights say."""
    rng = np.random.default_rng(12)
    x = (rng.standard_t(4, (64, 1024)) * 0.02).astype(F32)
    w = (rng.gamma(0.3, size=1024) * 10).astype(F32)
    dec = (lambda q: quants.dequantize(q, T[target]).astype(np.float64)) if target in H.STOCK else \
        (lambda q: H.dequantize_hqq_ref(q, target).astype(np.float64))
    y_w, y_u = dec(H.quantize_hqq(x, target, imatrix=w)), dec(H.quantize_hqq(x, target))
    # measured: 0.76 (Q4_HQQ, Q4_1), 0.75 (Q5_1), 0.87 (Q4_HQQ_128) of the unweighted solver's
    assert _wrel(x, y_w, w) < (0.93 if H.TARGETS[target][1] == 128 else 0.81) * _wrel(x, y_u, w)
    assert _wrel(x, y_w, np.ones(1024)) > _wrel(x, y_u, np.ones(1024))


def test_bad_importance_weights_rejected():
    x = (np.random.default_rng(0).standard_normal((3, 64)) * 0.1).astype(F32)
    for fn in (H.quantize_hqq, H.quantize_hqq_ref):
        with pytest.raises(GgufToolError, match="importance matrix of 32 values"):
            fn(x, "Q4_HQQ", imatrix=np.ones(32, F32))
        for bad in (np.nan, np.inf, -1.0):
            w = np.ones(64, F32)
            w[5] = bad
            with pytest.raises(GgufToolError, match="NaN, Inf or negative"):
                fn(x, "Q4_HQQ", imatrix=w)
    out = np.zeros((3, 40), np.uint8)
    neg = np.ones((1, 64), F32)
    neg[0, 9] = -1
    assert _hqq.quantize_rows(512, x, out, 0.7, 10, 1.01, 20, 1, 0, 2, neg) == -4     # GQT_ERR_PARAM
    assert _hqq.quantize_rows(512, x, out, 0.7, 10, 1.01, 20, 1, 0, 2, np.ones((2, 64), F32)) == -2   # shape
    with pytest.raises(GgufToolError, match="non-finite value"):   # NaN in x is named before the weights
        x[1, 3] = np.nan
        H.quantize_hqq(x, "Q4_1", imatrix=np.ones(64, F32))


def test_codecs_take_the_imatrix():
    """Q4_HQQ/Q4_HQQ_128 take imatrix= (the pipeline passes each tensor's row), and so do Q4_1/Q5_1 with
    solver "hqq"."""
    from gguftool.quant import codec
    x = _random_sets(10)["student_t3"]
    w = _imatrices(x.shape[1], 10)["gamma"]
    for name in ("Q4_HQQ", "Q4_HQQ_128"):
        c = codec(name)
        assert c.importance
        assert np.array_equal(c.quantize(x, threads=2, imatrix=w), H.quantize_hqq_ref(x, name, imatrix=w))


@pytest.mark.parametrize("target", ["Q4_HQQ", "Q4_HQQ_128"])
def test_quantize_command_uses_the_imatrix(tmp_path, rng, target):
    """`gguftool quantize --imatrix F` with an HQQ target: every tensor with an imatrix entry is the weighted
    solver's bytes for its row of the matrix, the others (and every tensor without --imatrix) unweighted."""
    from gguftool.cli import main
    from gguftool.io.reader import GGUFFile

    from .conftest import tiny_llama
    from .test_kquants import write_imatrix_gguf
    src = tiny_llama(tmp_path / "t.gguf", rng, n_embd=256, n_ff=512)
    want = write_imatrix_gguf(tmp_path / "t.imatrix.gguf", src, np.random.default_rng(4))
    a, b = tmp_path / "w.gguf", tmp_path / "u.gguf"
    assert main(["quantize", str(src), str(a), target, "--pure", "--imatrix", str(tmp_path / "t.imatrix.gguf")]) == 0
    assert main(["quantize", str(src), str(b), target, "--pure"]) == 0
    fs, fa, fb = GGUFFile(src), GGUFFile(a), GGUFFile(b)
    weighted = 0
    for t in fa.tensors:
        if t.type.name != target:
            continue
        x = np.ascontiguousarray(fs.tensor(t.name).raw_rows().view(np.float32).reshape(t.n_rows, t.n_per_row))
        w = want.get(t.name)
        assert np.array_equal(t.raw_rows(), H.quantize_hqq_ref(x, target, imatrix=w)), t.name
        assert np.array_equal(fb.tensor(t.name).raw_rows(), H.quantize_hqq_ref(x, target)), t.name
        weighted += w is not None
    assert weighted >= 8
    # the file says which scale search the weighted solves ran at
    assert json.loads(fa.get("gguftool.hqq.weighted_defaults")) == {"scale_search": H.WEIGHTED_SCALE_SEARCH}
    assert fb.get("gguftool.hqq.weighted_defaults") is None
