"""TQ3_1: C kernels against the numpy twins (identical bytes on every toolchain, arm64 under qemu),
a hand-worked block, the Lloyd-Max theory, and the K-cache inner products behind a head-wide rotation."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants

from gguftool.errors import GgufToolError
from gguftool.quant import tq3, tq3_1
from gguftool.quant import tq3_codebook as cb

from .test_tq3 import _TOOLCHAINS, ROOT, _inputs, check_harness, checked_path_agrees, hadamard_orthonormal

BYTES = tq3_1.BLOCK_BYTES


@pytest.mark.parametrize("name", list(_inputs()))
def test_c_and_numpy_identical(name):
    x = _inputs()[name]
    checked_path_agrees(tq3_1.quantize_tq3_1, tq3_1.quantize_tq3_1_ref, x)
    q = tq3_1.quantize_tq3_1_ref(x, saturate=True)   # ggml's entry's bytes (the native harness compares the C)
    d = tq3_1.dequantize_tq3_1(q)
    assert np.array_equal(d.view(np.uint32), tq3_1.dequantize_tq3_1_ref(q).view(np.uint32))
    y8 = tq3.quantize_q8_0_ref(np.random.default_rng(3).standard_normal(x.shape).astype(np.float32))
    assert np.array_equal(tq3_1.vec_dot_tq3_1_q8_0(q, y8).view(np.uint32), tq3_1.vec_dot_tq3_1_q8_0_ref(q, y8).view(np.uint32))


def test_random_bytes_decode_identically():
    raw = np.random.default_rng(5).integers(0, 256, (32, BYTES * 8), dtype=np.uint8)
    raw[:, 0::BYTES] &= 0xFF          # any scale, NaN and inf included
    a, b = tq3_1.dequantize_tq3_1(raw), tq3_1.dequantize_tq3_1_ref(raw)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_hand_worked_block():
    """A block whose answer follows from the layout text in gqt_tq3_1.h alone: values on the levels
    times 0.01, the inner levels used more often (as in a Gaussian block), so that the rms start
    already picks them and the stored scale is fp16(0.01)."""
    per_sign = [4] * 6 + [5] * 5 + [6] * 3 + [7] * 2                # indices of 15, 46, 81, 127
    idx = np.array([i for pair in zip(per_sign, [7 - i for i in per_sign]) for i in pair])
    x = (tq3_1.LEVELS[idx] * np.float32(0.01)).astype(np.float32)
    q = tq3_1.quantize_tq3_1(x)[0]
    assert q[:2].view("<f2")[0] == np.float16(0.01)
    assert q[2:6].view("<u4")[0] == sum(int(i >> 2) << j for j, i in enumerate(idx))
    assert [int(b) for b in q[6:]] == [int(idx[j] & 3 | (idx[j + 8] & 3) << 2 | (idx[j + 16] & 3) << 4 | (idx[j + 24] & 3) << 6)
                                        for j in range(8)]
    want = np.float32(np.float16(0.01)) * tq3_1.LEVELS[idx].astype(np.float32)
    np.testing.assert_array_equal(tq3_1.dequantize_tq3_1(q.reshape(1, -1))[0], want)


def test_levels_are_tq3_0_codebook_rounded():
    scaled = np.array(cb.CENTROIDS) * tq3_1.UNIT
    assert np.array_equal(tq3_1.LEVELS, np.round(scaled).astype(np.int8))
    assert tq3_1.LEVELS[-1] == 127 and np.abs(scaled - tq3_1.LEVELS).max() < 0.5


def test_zero_and_nonfinite_blocks():
    x = np.zeros((2, 64), np.float32)
    x[1, 32:] = -0.0
    assert not tq3_1.quantize_tq3_1(x).any()
    assert not tq3_1.dequantize_tq3_1(tq3_1.quantize_tq3_1(x)).view(np.uint32).any()   # +0.0, never -0.0
    bad = np.ones((2, 64), np.float32)
    bad[1, 40] = np.inf
    with pytest.raises(GgufToolError, match=r"row 1, column 40"):
        tq3_1.quantize_tq3_1(bad)
    with pytest.raises(GgufToolError, match="multiple of 32"):
        tq3_1.quantize_tq3_1(np.ones((2, 48), np.float32))


def test_mse_beats_tq3_0_behind_a_rotation():
    """On rotated data (what llama.cpp caches) TQ3_1 beats TQ3_0's distortion with no transform: same
    codebook, but its encoder searches 7 starting scales (9% lower MSE on Gaussian blocks)."""
    rng = np.random.default_rng(11)
    g = rng.standard_normal((4000, 32)).astype(np.float32)
    rel31 = ((tq3_1.dequantize_tq3_1(tq3_1.quantize_tq3_1(g)) - g) ** 2).mean()
    rel30 = ((tq3.dequantize_tq3(tq3.quantize_tq3(g)) - g) ** 2).mean()
    assert 0.85 * rel30 <= rel31 <= 0.94 * rel30
    assert 0.75 * cb.DISTORTION <= rel31 <= 0.85 * cb.DISTORTION     # per-block scale: under the fixed-norm figure


@pytest.mark.parametrize("d", [64, 256])
def test_key_dot_error_behind_the_upstream_rotation(d):
    """Keys with outlier channels (what real K looks like), rotated head-wide as llama.cpp does: the
    q.k error of TQ3_1 equals TQ3_0's within 5%; without the rotation it is far worse."""
    rng = np.random.default_rng(d)
    n = 3000
    scale = np.ones(d)
    scale[rng.choice(d, 4, replace=False)] = 12.0                  # outlier channels
    k = (rng.standard_normal((n, d)) * scale).astype(np.float32)
    q = rng.standard_normal((n, d)).astype(np.float32)
    h = hadamard_orthonormal(d).astype(np.float32)
    kr, qr = k @ h, q @ h                                          # the graph's rotation of both sides
    true = (q.astype(np.float64) * k).sum(1)
    y8 = tq3.quantize_q8_0_ref(qr)

    def err(kk, dots):
        return np.abs(dots - true).mean()

    e31 = err(kr, tq3_1.vec_dot_tq3_1_q8_0(tq3_1.quantize_tq3_1(kr), y8))
    e30 = err(kr, tq3.vec_dot_tq3_q8_0(tq3.quantize_tq3(kr), y8))
    assert e31 <= 1.05 * e30
    y8raw = tq3.quantize_q8_0_ref(q)
    raw = err(k, tq3_1.vec_dot_tq3_1_q8_0(tq3_1.quantize_tq3_1(k), y8raw))
    assert raw > 1.3 * e31
    # and vec_dot is the float64 dot of what the two blocks decode to, to float32 rounding
    qk = tq3_1.quantize_tq3_1(kr)
    ref = (tq3_1.dequantize_tq3_1(qk).astype(np.float64) * quants.dequantize(y8, T.Q8_0)).sum(1)
    np.testing.assert_allclose(tq3_1.vec_dot_tq3_1_q8_0(qk, y8), ref, rtol=1e-6, atol=1e-4)


def test_codec_registered():
    from gguftool.quant import codec
    c = codec("TQ3_1")
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    assert np.array_equal(c.quantize(x, threads=2), tq3_1.quantize_tq3_1_ref(x))
    assert c.bpw == 3.5 and c.id == 515


_HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include "gqt_tq3_1.h"
int main(int argc, char ** argv) {
    const int rows = atoi(argv[1]), n = atoi(argv[2]);
    const size_t nq = (size_t) rows * n / 32 * 14, ny = (size_t) rows * n / 32 * 34;
    float * x = malloc(sizeof(float) * rows * n), * d = malloc(sizeof(float) * rows * n), * s = malloc(sizeof(float) * rows);
    unsigned char * q = malloc(nq), * y = malloc(ny);
    if (fread(x, sizeof(float), (size_t) rows * n, stdin) != (size_t) rows * n) return 2;
    if (fread(y, 1, ny, stdin) != ny) return 2;
    gqt_quantize_tq3_1(x, q, rows, n, NULL);   /* ggml's entry, as llama.cpp compiles and calls it */
    for (int r = 0; r < rows; ++r) {
        gqt_dequantize_row_tq3_1(q + (size_t) r * n / 32 * 14, d + (size_t) r * n, n);
        gqt_vec_dot_tq3_1_q8_0(n, s + r, 0, q + (size_t) r * n / 32 * 14, 0, y + (size_t) r * n / 32 * 34, 0, 1);
    }
    fwrite(q, 1, nq, stdout);
    fwrite(d, sizeof(float), (size_t) rows * n, stdout);
    fwrite(s, sizeof(float), rows, stdout);
    return 0;
}
"""


@pytest.mark.parametrize("toolchain", list(_TOOLCHAINS))
def test_native_flags_give_the_same_results(tmp_path, toolchain):
    """As llama.cpp compiles it (AVX2, NEON under qemu, scalar), the file gives the numpy twin's bits."""
    check_harness(tmp_path, toolchain, _HARNESS, "gqt_tq3_1.c", lambda x: tq3_1.quantize_tq3_1_ref(x, saturate=True),
                  tq3_1.dequantize_tq3_1_ref, tq3_1.vec_dot_tq3_1_q8_0_ref)


def _mad_inputs():
    rng = np.random.default_rng(31)
    x = rng.standard_normal((16, 256)).astype(np.float32)
    x[1] = 0.0                                     # zero-scale blocks
    x[2, :32] *= np.float32(1e-6)                  # subnormal-ish scales
    q = tq3_1.quantize_tq3_1_ref(x)
    acc = (rng.standard_normal(x.shape) * 3).astype(np.float32)
    s = rng.uniform(0, 1, len(x)).astype(np.float32)
    s[3] = 1.0
    return q, acc, s


def test_fused_v_accumulate_matches_twin():
    """gqt_mad_tq3_1 (flash attention's V accumulation) gives its numpy twin's bits, and that is
    acc + s * (the decoded row) up to one rounding."""
    q, acc, s = _mad_inputs()
    got = tq3_1.mad_tq3_1(q, acc, s)
    assert np.array_equal(got, tq3_1.mad_tq3_1_ref(q, acc, s))
    plain = acc + s[:, None] * tq3_1.dequantize_tq3_1_ref(q)
    assert np.abs(got - plain).max() <= 4 * np.finfo(np.float32).eps * np.abs(plain).max()
    assert np.array_equal(got[1], acc[1])          # a zero row adds nothing


_MAD_HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include "gqt_tq3_1.h"
int main(int argc, char ** argv) {
    const int rows = atoi(argv[1]), n = atoi(argv[2]);
    const size_t nq = (size_t) rows * n / 32 * 14;
    unsigned char * q = malloc(nq);
    float * acc = malloc(sizeof(float) * rows * n), * s = malloc(sizeof(float) * rows);
    if (fread(q, 1, nq, stdin) != nq || fread(acc, sizeof(float), (size_t) rows * n, stdin) != (size_t) rows * n
        || fread(s, sizeof(float), rows, stdin) != (size_t) rows) return 2;
    for (int r = 0; r < rows; ++r) gqt_mad_tq3_1(n, acc + (size_t) r * n, q + (size_t) r * n / 32 * 14, s[r]);
    fwrite(acc, sizeof(float), (size_t) rows * n, stdout);
    return 0;
}
"""


@pytest.mark.parametrize("toolchain", list(_TOOLCHAINS))
def test_fused_v_accumulate_same_bits_on_every_toolchain(tmp_path, toolchain):
    """As llama.cpp compiles it (AVX2, NEON under qemu, scalar, contraction allowed): the twin's bits."""
    import shutil
    import subprocess
    cc, runner = _TOOLCHAINS[toolchain]
    missing = [t for t in (cc[0], *runner[:1]) if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    (tmp_path / "h.c").write_text(_MAD_HARNESS)
    fast = ROOT / "gguftool" / "_fast"
    r = subprocess.run([*cc, f"-I{fast}", str(tmp_path / "h.c"), str(fast / "gqt_tq3_1.c"), "-lm", "-o", str(tmp_path / "h")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    q, acc, s = _mad_inputs()
    out = subprocess.run([*runner, str(tmp_path / "h"), str(len(q)), str(acc.shape[1])],
                         input=q.tobytes() + acc.tobytes() + s.tobytes(), capture_output=True, check=True, timeout=120).stdout
    assert out == tq3_1.mad_tq3_1_ref(q, acc, s).tobytes()
