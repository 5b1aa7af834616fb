"""TQ3_0: C kernels against the numpy twins (identical bytes), against explicit matrices and the
published theory, and the inner products llama.cpp's K-cache path computes with vec_dot."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants

from gguftool._fast import _tq3
from gguftool.errors import GgufToolError
from gguftool.quant import tq3
from gguftool.quant import tq3_codebook as cb
from gguftool.quant.rows import BlockRangeError

ROOT = Path(__file__).resolve().parent.parent
KAT = Path(__file__).parent / "data" / "tq3_kat_v1.npz"
C = np.array(cb.CENTROIDS)
D = np.array(cb.SIGNS, dtype=np.float64)
LLOYD_MAX = 0.0323                                   # published, d = 32
PAPER_UPPER = np.sqrt(3) * np.pi / 2 * 4.0 ** -3     # TurboQuant Thm 1, b = 3 (0.0425)
PAPER_LOWER = 4.0 ** -3                              # Thm 3 (0.0156)


def hadamard_orthonormal(n: int = 32) -> np.ndarray:
    """Sylvester construction by Kronecker products (independent of the FWHT butterflies)."""
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.kron(np.array([[1.0, 1.0], [1.0, -1.0]]), h)
    return h / np.sqrt(n)


H = hadamard_orthonormal()


def assert_same_bytes(a: np.ndarray, b: np.ndarray, x: np.ndarray | None = None):
    if np.array_equal(a, b):
        return
    bad = np.argwhere((a.reshape(-1, 14) != b.reshape(-1, 14)).any(1)).ravel()
    msg = [f"{len(bad)} of {a.size // 14} blocks differ; first ones:"]
    for i in bad[:3]:
        msg.append(f"block {i}: C {a.reshape(-1, 14)[i].tobytes().hex()} numpy {b.reshape(-1, 14)[i].tobytes().hex()}")
        if x is not None:
            msg.append(f"  input {x.reshape(-1, 32)[i]}")
    pytest.fail("\n".join(msg))


def _inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(20261202)
    g = rng.standard_normal((64, 256))
    out = {
        "gaussian": g,
        "student_t2": rng.standard_t(2, (64, 256)),
        "outliers": np.where(rng.random((64, 256)) < 0.01, 1e4, 1.0) * g,
        "zeros_mixed": np.where((np.arange(64 * 8) % 3 == 0)[:, None], 0.0, g.reshape(-1, 32)).reshape(64, 256),
        "negative_zero": np.full((2, 64), -0.0),
        "denormal": g * 1e-40,                    # float32 denormals
        "tiny": g * 1e-30,
        "fp16_underflow": g * 1e-9,               # scale below fp16's smallest denormal
        "huge": g * 1e30,                         # scale saturates at fp16 max
        "near_float_max": np.clip(g, -1, 1) * 3e38,
        "per_block_scales": g * np.repeat(10.0 ** rng.integers(-8, 8, (64, 8)), 32, axis=1),
        "constant": np.ones((4, 64)) * 0.37,
        "spike": np.eye(32)[:4] * 5.0,
        "walsh": (hadamard_orthonormal() * np.sqrt(32))[:8],
        "ints": rng.integers(-3, 4, (16, 64)).astype(np.float64),
    }
    return {k: v.astype(np.float32) for k, v in out.items()}


def checked_path_agrees(quantize, quantize_ref, x) -> None:
    """gguftool's checked path (quantize) and its numpy twin: the same bytes, or the same refusal of a
    block beyond fp16 (the same row and columns named)."""
    try:
        want = quantize_ref(x)
    except BlockRangeError as e:
        with pytest.raises(BlockRangeError) as got:
            quantize(x)
        assert got.value.message == e.message
    else:
        assert_same_bytes(quantize(x), want, x)


@pytest.mark.parametrize("name", list(_inputs()))
def test_c_and_numpy_identical(name):
    x = _inputs()[name]
    checked_path_agrees(tq3.quantize_tq3, tq3.quantize_tq3_ref, x)
    qc = np.empty((x.shape[0], x.shape[1] // 32 * 14), np.uint8)   # ggml's entry: saturates, never fails
    _tq3.quantize_ggml(np.ascontiguousarray(x), qc)
    qn = tq3.quantize_tq3_ref(x, saturate=True)
    assert_same_bytes(qc, qn, x)
    dc, dn = tq3.dequantize_tq3(qc), tq3.dequantize_tq3_ref(qc)
    assert np.array_equal(dc.view(np.uint32), dn.view(np.uint32))
    assert np.isfinite(dc).all()  # saturating scale: even near FLT_MAX decodes finite
    y8 = tq3.quantize_q8_0_ref(np.random.default_rng(1).standard_normal(x.shape).astype(np.float32))
    vc, vn = tq3.vec_dot_tq3_q8_0(qc, y8), tq3.vec_dot_tq3_q8_0_ref(qc, y8)
    assert np.array_equal(vc.view(np.uint32), vn.view(np.uint32))


def test_random_bytes_decode_identically():
    # every bit pattern a file may hold (incl. fp16 inf/NaN/denormal scales) decodes the same in C and numpy
    raw = np.random.default_rng(7).integers(0, 256, (256, 14 * 8), dtype=np.uint8)
    dc, dn = tq3.dequantize_tq3(raw), tq3.dequantize_tq3_ref(raw)
    assert np.array_equal(dc.view(np.uint32), dn.view(np.uint32))


def test_zero_blocks_are_exact():
    x = np.zeros((3, 96), np.float32)
    x[1, 32:64] = -0.0
    x[2, 0:32] = np.random.default_rng(0).standard_normal(32)
    q = tq3.quantize_tq3(x)
    assert not q[0].any() and not q[1].any() and not q[2, 14:].any()
    d = tq3.dequantize_tq3(q)
    assert np.array_equal(d[:, 32:].view(np.uint32), np.zeros((3, 64), np.uint32))   # +0.0, not -0.0
    assert np.abs(d[2, :32]).min() > 0


def test_nonfinite_rejected():
    for bad in (np.nan, np.inf, -np.inf):
        x = np.ones((2, 64), np.float32)
        x[1, 40] = bad
        with pytest.raises(GgufToolError, match="NaN or Inf.*row 1, column 40"):
            tq3.quantize_tq3(x)
        with pytest.raises(GgufToolError, match="NaN or Inf"):
            tq3.quantize_tq3_ref(x)
        with pytest.raises(GgufToolError, match="NaN or Inf"):
            tq3.quantize_tq3(x, threads=2)
        out = np.full((2, 28), 0xAB, np.uint8)
        assert _tq3.quantize_rows(x, out) == _tq3.ERR_NONFINITE
        assert (out == 0xAB).all()                # nothing written
        # the unchecked ggml reference marks just that block with a NaN scale, never a made-up one
        row = np.empty(28, np.uint8)
        _tq3.quantize_row_ref(np.ascontiguousarray(x[1]), row)
        assert row[14:16].view("<u2")[0] == 0x7E00 and not row[16:].any()
        d = tq3.dequantize_tq3(row)
        assert np.isfinite(d[0, :32]).all() and np.isnan(d[0, 32:]).all()


def test_bad_shapes_rejected():
    with pytest.raises(GgufToolError, match="multiple of 32"):
        tq3.quantize_tq3(np.ones((2, 33), np.float32))
    with pytest.raises(GgufToolError, match="multiple of 14"):
        tq3.dequantize_tq3(np.zeros((2, 15), np.uint8))
    with pytest.raises(GgufToolError, match="floating-point"):
        tq3.quantize_tq3(np.ones((2, 32), np.int32))
    with pytest.raises(GgufToolError, match="Q8_0"):
        tq3.vec_dot_tq3_q8_0(np.zeros((2, 28), np.uint8), np.zeros((2, 34), np.uint8))
    assert tq3.quantize_tq3(np.ones((0, 64), np.float32)).shape == (0, 28)


def test_fwht_is_the_hadamard_matrix():
    v = np.random.default_rng(3).standard_normal((50, 32))
    np.testing.assert_allclose(tq3.fwht(v) / np.sqrt(32), v @ H.T, rtol=0, atol=1e-12)
    np.testing.assert_allclose(H @ H, np.eye(32), atol=1e-15)          # symmetric and orthogonal: H H = I
    assert np.array_equal(H, H.T)
    np.testing.assert_allclose(tq3.fwht(tq3.fwht(v)) / 32, v, atol=1e-12)
    iv = np.random.default_rng(4).integers(-128, 128, (10, 32))
    assert np.array_equal(tq3.fwht(iv), iv @ (H * np.sqrt(32)).round().astype(int).T)


def _pack_by_spec(scale_bits: int, idx: np.ndarray) -> bytes:
    """docs/tq3.md written out with Python ints: fp16 LE, then 4 x 24-bit LE words of 8 x 3 bits."""
    out = scale_bits.to_bytes(2, "little")
    for g in range(4):
        word = sum(int(idx[8 * g + i]) << (3 * i) for i in range(8))
        out += word.to_bytes(3, "little")
    return out


def test_known_answer_from_the_spec():
    # a block that is exactly D H (1.0 * c[idx]) must come back as scale 1.0 and the same indices
    levels = [0] * 2 + [1] * 3 + [2] * 5 + [3] * 6 + [4] * 6 + [5] * 5 + [6] * 3 + [7] * 2
    idx = np.random.default_rng(11).permutation(np.array(levels))
    x = (D * (H @ C[idx])).astype(np.float32)
    q = tq3.quantize_tq3(x[None])
    assert q[0].tobytes() == _pack_by_spec(0x3C00, idx)
    # and decoding is D H (s c[idx]) with explicit matrices
    rng = np.random.default_rng(12)
    q = tq3.quantize_tq3(rng.standard_normal((200, 32)).astype(np.float32))
    s, idx = tq3._unpack(q)
    for b in range(200):
        assert q[b].tobytes() == _pack_by_spec(int(q[b, :2].view("<u2")[0]), idx[b])
    expect = (D * ((s[:, None] * C[idx]) @ H.T))
    np.testing.assert_allclose(tq3.dequantize_tq3(q), expect, rtol=0, atol=2e-6 * np.abs(expect).max())


def test_known_answer_file():
    kat = np.load(KAT)
    q = tq3.quantize_tq3(kat["x"])
    assert_same_bytes(q, kat["q"], kat["x"])
    assert np.array_equal(tq3.dequantize_tq3(kat["q"]).view(np.uint32), kat["dq"].view(np.uint32))


def test_relative_mse_against_theory():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((40_000, 32)).astype(np.float32)
    xh = tq3.dequantize_tq3(tq3.quantize_tq3(x))
    rel = ((xh - x.astype(np.float64)) ** 2).sum() / (x.astype(np.float64) ** 2).sum()
    assert PAPER_LOWER < rel <= LLOYD_MAX * 1.05 and rel <= PAPER_UPPER, rel
    assert np.max(((xh - x) ** 2).sum(1) / (x ** 2).sum(1)) < 4 * PAPER_UPPER  # no block blows up
    # TurboQuant as published (scale ||y|| / sqrt(32), nearest centroid, same rotation) lands on the
    # Lloyd-Max distortion within 5%; our 2 Lloyd passes + norm-preserving scale must do better
    y = (x * D) @ H.T
    norm = np.linalg.norm(y, axis=1, keepdims=True)
    t = y * np.sqrt(32) / norm
    y_hat = C[np.searchsorted(np.array(cb.BOUNDARIES), t)] * norm / np.sqrt(32)
    paper = ((y_hat @ H.T * D - x) ** 2).sum() / (x.astype(np.float64) ** 2).sum()
    assert abs(paper / LLOYD_MAX - 1) < 0.05, paper
    assert rel < paper
    # heavy tails: the rotation keeps the distortion under the paper's bound
    xt = rng.standard_t(3, (20_000, 32)).astype(np.float32)
    xth = tq3.dequantize_tq3(tq3.quantize_tq3(xt))
    assert ((xth - xt) ** 2).sum() / (xt.astype(np.float64) ** 2).sum() <= PAPER_UPPER


def test_scale_preserves_the_norm():
    """The stored scale is ||y|| / ||c[idx]||: every decoded block has the input's norm, to the
    fp16 rounding of the scale (relative 2^-11), measured on the C output in float64."""
    rng = np.random.default_rng(6)
    x = np.concatenate([rng.standard_normal((2000, 32)), rng.standard_t(3, (2000, 32)),
                        rng.standard_normal((2000, 32)) * np.exp(rng.uniform(-8, 8, (2000, 1)))]).astype(np.float32)
    xh = tq3.dequantize_tq3(tq3.quantize_tq3(x)).astype(np.float64)
    ratio = np.linalg.norm(xh, axis=1) / np.linalg.norm(x.astype(np.float64), axis=1)
    assert np.abs(ratio - 1).max() <= 2.0 ** -11 + 1e-6, np.abs(ratio - 1).max()


@pytest.mark.parametrize("d", [64, 128])
def test_scores_shrink_less_than_with_least_squares(d):
    """Why the format stores the norm-preserving scale: the least-squares one (the format before,
    still reachable in the numpy twin) projects, so <q, k_hat> ~ 0.97 <q, k> for q correlated with k
    (a flatter softmax; it cost the K cache perplexity, docs/tq3.md). Norm-preserving: ~0.985, for
    < 2% more MSE on the same indices."""
    rng = np.random.default_rng(100 + d)
    n = 6000
    k = rng.standard_normal((n, d))
    k = (k / np.linalg.norm(k, axis=1, keepdims=True)).astype(np.float32)
    q = k + rng.standard_normal((n, d)) / np.sqrt(d)
    true = (q * k).sum(1)

    def slope_and_mse(qb):
        kh = tq3.dequantize_tq3_ref(qb).astype(np.float64)
        return np.polyfit(true, (q * kh).sum(1), 1)[0], ((kh - k) ** 2).sum() / (k.astype(np.float64) ** 2).sum()

    s_fmt, mse_fmt = slope_and_mse(tq3.quantize_tq3(k))
    s_ls, mse_ls = slope_and_mse(tq3.quantize_tq3_ref(k, scale="ls"))
    assert s_ls < 0.976 and s_fmt > s_ls + 0.01 and s_fmt < 1.0, (s_ls, s_fmt)
    assert mse_ls < mse_fmt < 1.02 * mse_ls, (mse_ls, mse_fmt)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_composes_with_upstream_rotation(d):
    """llama.cpp (PR #21038) multiplies K/V head vectors by the natural-order Sylvester matrix H_d
    = H_(d/32) (x) H_32 before they reach the cache. Our block transform H_32 D then sees
    H_32 D H_32 per block: with D = I the two would cancel to a mere pairing of blocks; with the
    committed flat-spectrum D every entry is 0 or +-1/4, so the composition still spreads."""
    hd = np.array([[1.0]])
    while hd.shape[0] < d:
        hd = np.block([[hd, hd], [hd, -hd]])
    hd /= np.sqrt(d)
    assert np.allclose(hd, np.kron(hadamard_orthonormal(d // 32), H))
    assert np.allclose(np.unique(np.abs(H @ np.diag(D) @ H).round(12)), [0, 0.25])
    rng = np.random.default_rng(d)
    k = rng.standard_normal((4000, d))
    k[:, [3, 17, 40]] *= 20.0          # outlier channels
    k[:, 5] += 8.0                     # and an offset one, as K caches have
    k = k.astype(np.float32)
    kr = (k @ hd.T).astype(np.float32)

    def rel(x, xh):
        return ((xh - x.astype(np.float64)) ** 2).sum() / (x.astype(np.float64) ** 2).sum()

    plain = rel(k, tq3.dequantize_tq3(tq3.quantize_tq3(k)))
    rotated = rel(kr, tq3.dequantize_tq3(tq3.quantize_tq3(kr)))
    assert rotated <= LLOYD_MAX and rotated <= 1.05 * plain, (plain, rotated)
    # the same type without D (quantizing D*x applies D twice): upstream's rotation is undone
    dd = np.tile(D, d // 32).astype(np.float32)
    no_d = rel(kr, dd * tq3.dequantize_tq3(tq3.quantize_tq3(kr * dd)))
    assert no_d > 2 * rotated


@pytest.mark.parametrize("d", [64, 128])
def test_inner_product_error(d):
    rng = np.random.default_rng(d)
    n = 6000
    q = rng.standard_normal((n, d))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    k = rng.standard_normal((n, d))
    k = (k / np.linalg.norm(k, axis=1, keepdims=True)).astype(np.float32)
    true = (q * k).sum(1)
    kq = tq3.quantize_tq3(k)
    err = np.abs((q * tq3.dequantize_tq3(kq)).sum(1) - true)
    # error ~ N(0, D/d) for the Lloyd-Max distortion D: E|e| = sqrt(2/pi) sigma, p99 = 2.576 sigma
    sigma = np.sqrt(LLOYD_MAX / d)
    assert err.mean() <= 1.05 * np.sqrt(2 / np.pi) * sigma
    assert np.percentile(err, 99) <= 1.15 * 2.576 * sigma
    # Q4_0 spends one more bit per value: TQ3_0's error may be ~2x, not more
    q40 = quants.dequantize(quants.quantize(k, T.Q4_0), T.Q4_0)
    err40 = np.abs((q * q40).sum(1) - true)
    assert err.mean() <= 2.2 * err40.mean()
    assert np.percentile(err, 99) <= 2.2 * np.percentile(err40, 99)
    # llama.cpp's K path: q -> Q8_0, then vec_dot; C equals the numpy twin bit for bit ...
    y8 = tq3.quantize_q8_0_ref(q.astype(np.float32))
    dots = tq3.vec_dot_tq3_q8_0(kq, y8)
    assert np.array_equal(dots.view(np.uint32), tq3.vec_dot_tq3_q8_0_ref(kq, y8).view(np.uint32))
    # ... and the float64 dot of the two dequantized rows, to float32 rounding
    ref = (tq3.dequantize_tq3(kq).astype(np.float64) * quants.dequantize(y8, T.Q8_0)).sum(1)
    np.testing.assert_allclose(dots, ref, rtol=0, atol=2e-6)
    err_vd = np.abs(dots - true)
    assert err_vd.mean() <= 1.05 * err.mean() + 1e-4


def _safetensors_f32_matrices(path: Path):
    """2-d float32 tensors of a .safetensors file (8-byte header length, JSON header, raw data)."""
    import json
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    n = int(raw[:8].view("<u8")[0])
    header = json.loads(bytes(raw[8:8 + n]))
    for name, info in header.items():
        if name != "__metadata__" and info["dtype"] == "F32" and len(info["shape"]) == 2:
            a, b = info["data_offsets"]
            yield name, np.frombuffer(raw[8 + n + a:8 + n + b], np.float32).reshape(info["shape"])


def test_real_weights_follow_the_theory(minilm_dir):
    """Real float32 weights (all-MiniLM-L6-v2): every matrix lands where the rotation argument
    says, between the paper's bounds and at or under the Lloyd-Max figure."""
    seen = 0
    for name, w in _safetensors_f32_matrices(minilm_dir / "model.safetensors"):
        if w.shape[1] % 32 or w.size < 32 * 64:
            continue
        rel = ((tq3.dequantize_tq3(tq3.quantize_tq3(w, threads=2)) - w) ** 2).sum() / (w.astype(np.float64) ** 2).sum()
        assert PAPER_LOWER < rel <= LLOYD_MAX * 1.02 and rel <= PAPER_UPPER, (name, rel)
        seen += 1
    assert seen >= 30


def test_threads_and_ggml_entry_point_agree():
    x = np.random.default_rng(9).standard_normal((37, 128)).astype(np.float32)
    q1 = tq3.quantize_tq3(x)
    assert np.array_equal(q1, tq3.quantize_tq3(x, threads=2))
    out = np.empty_like(q1)
    assert _tq3.quantize_ggml(x, out) == q1.size
    assert np.array_equal(out, q1)


def test_codec_registered():
    from gguftool.quant import codec
    c = codec("TQ3_0")
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    assert np.array_equal(c.quantize(x, threads=1), tq3.quantize_tq3_ref(x))
    assert np.array_equal(c.dequantize(c.quantize(x)), tq3.dequantize_tq3_ref(c.quantize(x)))
    with pytest.raises(GgufToolError, match="no parameters"):
        c.quantize(x, solver="hqq")


_HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include "gqt_tq3.h"
int main(int argc, char ** argv) {
    const int rows = atoi(argv[1]), n = atoi(argv[2]);
    float * x = malloc(sizeof(float) * rows * n), * d = malloc(sizeof(float) * rows * n), * s = malloc(sizeof(float) * rows);
    unsigned char * q = malloc((size_t) rows * n / 32 * 14), * y = malloc((size_t) rows * n / 32 * 34);
    if (fread(x, sizeof(float), (size_t) rows * n, stdin) != (size_t) rows * n) return 2;
    if (fread(y, 1, (size_t) rows * n / 32 * 34, stdin) != (size_t) rows * n / 32 * 34) return 2;
    gqt_quantize_tq3_0(x, q, rows, n, NULL);   /* ggml's entry, as llama.cpp compiles and calls it */
    for (int r = 0; r < rows; ++r) {
        gqt_dequantize_row_tq3_0(q + (size_t) r * n / 32 * 14, d + (size_t) r * n, n);
        gqt_vec_dot_tq3_0_q8_0(n, s + r, 0, q + (size_t) r * n / 32 * 14, 0, y + (size_t) r * n / 32 * 34, 0, 1);
    }
    fwrite(q, 1, (size_t) rows * n / 32 * 14, stdout);
    fwrite(d, sizeof(float), (size_t) rows * n, stdout);
    fwrite(s, sizeof(float), rows, stdout);
    return 0;
}
"""


_TOOLCHAINS = {
    # what llama.cpp's x86 build does to the file: -O3 -march=native, contraction allowed
    "x86-native": (["gcc", "-O3", "-march=native", "-ffp-contract=fast", "-std=gnu11"], []),
    # llama.cpp's ggml-base and the Python wheel: baseline x86-64, AVX2 chosen at run time
    "x86-baseline": (["gcc", "-O3", "-ffp-contract=fast", "-std=gnu11"], []),
    # the portable scalar path (no SIMD at all)
    "x86-scalar": (["gcc", "-O3", "-ffp-contract=fast", "-std=gnu11", "-DGQT_NO_RUNTIME_AVX2"], []),
    # clang (Android NDK, macOS): its default -ffp-contract=on obeys the file's STDC pragma
    # (clang's -ffp-contract=fast would ignore every pragma: the native build must not pass it)
    "clang-native": ([next((c for c in ("clang", *(f"clang-{v}" for v in range(14, 21))) if shutil.which(c)), "clang"),
                      "-O3", "-march=native", "-std=gnu11"], []),
    # a phone build: arm64 with FMA in every pipe (GCC contracts by default there), run under qemu
    "arm64": (["aarch64-linux-gnu-gcc", "-O3", "-march=armv8.2-a+dotprod", "-ffp-contract=fast", "-std=gnu11",
               "-static"], ["qemu-aarch64"]),
}


@pytest.mark.parametrize("toolchain", list(_TOOLCHAINS))
def test_native_flags_give_the_same_results(tmp_path, toolchain):
    """Compiled as llama.cpp compiles it, the file must not change a bit: it forbids FMA
    contraction itself, and its float work does not depend on the target."""
    check_harness(tmp_path, toolchain, _HARNESS, "gqt_tq3.c", lambda x: tq3.quantize_tq3_ref(x, saturate=True),
                  tq3.dequantize_tq3_ref, tq3.vec_dot_tq3_q8_0_ref)


def build_harness(tmp_path, toolchain: str, harness: str, c_file: str, *more: str) -> tuple[list[str], Path]:
    """Compile `harness` with gguftool/_fast/`c_file` (and `more` of them) by `toolchain` (skip where it is
    not installed): the command prefix that runs it (qemu for arm64) and the executable."""
    cc, runner = _TOOLCHAINS[toolchain]
    missing = [t for t in (cc[0], *runner[:1]) if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    src = tmp_path / "h.c"
    src.write_text(harness)
    exe = tmp_path / "h"
    fast = ROOT / "gguftool" / "_fast"
    r = subprocess.run([*cc, f"-I{fast}", str(src), *(str(fast / f) for f in (c_file, *more)), "-lm", "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return runner, exe


def check_harness(tmp_path, toolchain: str, harness: str, c_file: str, quantize_ref, dequantize_ref, vec_dot_ref,
                  block: int = 32, block_bytes: int = 14):
    """Compile `harness` with gguftool/_fast/`c_file` by `toolchain`, feed it every `block`-divisible input and a
    Q8_0 row set, and require the numpy twins' bytes for quantize, dequantize and vec_dot."""
    runner, exe = build_harness(tmp_path, toolchain, harness, c_file)
    rng = np.random.default_rng(8)
    for x in (v for v in _inputs().values() if v.shape[1] % block == 0):
        y8 = tq3.quantize_q8_0_ref(rng.standard_normal(x.shape).astype(np.float32))
        out = subprocess.run([*runner, str(exe), str(x.shape[0]), str(x.shape[1])], input=x.tobytes() + y8.tobytes(),
                             capture_output=True, check=True, timeout=120).stdout
        nq = x.size // block * block_bytes
        q = np.frombuffer(out[:nq], np.uint8).reshape(x.shape[0], -1)
        assert_same_bytes(q, quantize_ref(x), x)
        assert out[nq:nq + 4 * x.size] == dequantize_ref(q).tobytes()
        assert out[nq + 4 * x.size:] == vec_dot_ref(q, y8).tobytes()


def _write_kat():  # run once per layout version: python tests/test_tq3.py
    rng = np.random.default_rng(514)
    x = np.concatenate([rng.standard_normal((8, 64)), rng.standard_t(2, (8, 64)), np.zeros((1, 64)),
                        rng.standard_normal((4, 64)) * 1e-6]).astype(np.float32)
    q = tq3.quantize_tq3_ref(x)
    np.savez_compressed(KAT, x=x, q=q, dq=tq3.dequantize_tq3_ref(q))


if __name__ == "__main__":
    _write_kat()
