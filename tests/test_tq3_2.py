"""TQ3_2 (TQ3_1's codes with one scale per 64 values, 3.25 bits): C kernels against the numpy twins on
every toolchain (arm64 under qemu), the layout against TQ3_1's, and the cost of the shared scale."""
from __future__ import annotations

import subprocess
from functools import partial

import numpy as np
import pytest

from gguftool.errors import GgufToolError
from gguftool.quant import tq3, tq3_1

from .test_tq3 import _TOOLCHAINS, _inputs, build_harness, check_harness, checked_path_agrees

BYTES = 26
q_ref = partial(tq3_1.quantize_ref, name="TQ3_2")
dq_ref = partial(tq3_1.dequantize_ref, name="TQ3_2")
dot_ref = partial(tq3_1.vec_dot_q8_0_ref, name="TQ3_2")
mad_ref = partial(tq3_1.mad_ref, name="TQ3_2")


def _inputs64():
    return {k: v for k, v in _inputs().items() if v.shape[1] % 64 == 0}


@pytest.mark.parametrize("name", list(_inputs64()))
def test_c_and_numpy_identical(name):
    x = _inputs64()[name]
    checked_path_agrees(partial(tq3_1.quantize, name="TQ3_2"), q_ref, x)
    q = q_ref(x, saturate=True)
    assert np.array_equal(tq3_1.dequantize(q, "TQ3_2").view(np.uint32), dq_ref(q).view(np.uint32))
    y8 = tq3.quantize_q8_0_ref(np.random.default_rng(3).standard_normal(x.shape).astype(np.float32))
    assert np.array_equal(tq3_1.vec_dot_q8_0(q, y8, "TQ3_2").view(np.uint32), dot_ref(q, y8).view(np.uint32))


def test_random_bytes_decode_identically():
    raw = np.random.default_rng(6).integers(0, 256, (32, BYTES * 4), dtype=np.uint8)
    a, b = tq3_1.dequantize(raw, "TQ3_2"), dq_ref(raw)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_layout_is_two_tq3_1_code_groups_under_one_scale():
    """Byte for byte: a TQ3_2 block is fp16 d, then the 12 code bytes TQ3_1 would write for values 0-31
    and for 32-63; so splitting it into two TQ3_1 blocks that both carry d decodes to the same floats."""
    x = np.random.default_rng(7).standard_t(4, (16, 256)).astype(np.float32)
    q = tq3_1.quantize(x, "TQ3_2").reshape(-1, BYTES)
    halves = np.concatenate([q[:, :2], q[:, 2:14], q[:, :2], q[:, 14:26]], axis=1).reshape(-1, 14)
    np.testing.assert_array_equal(tq3_1.dequantize_tq3_1(halves).reshape(-1), tq3_1.dequantize(q, "TQ3_2").reshape(-1))
    # a block whose two halves have equal scale needs is what TQ3_1 writes twice, save the shared scale
    same = np.tile(x[:, :32], (1, 2))
    q2 = tq3_1.quantize(same, "TQ3_2").reshape(-1, BYTES)
    q1 = tq3_1.quantize_tq3_1(same).reshape(-1, 14)
    assert np.array_equal(q2[:, 2:14], q2[:, 14:26])
    assert np.array_equal(q2[:, 2:14], q1[0::2, 2:14])


def test_shared_scale_costs_little():
    """On rotated (Gaussian-like) data one scale per 64 values costs 10-20% more squared error than TQ3_1
    (0.25 bits per value more); still below TQ3_0 without a rotation of its own."""
    g = np.random.default_rng(11).standard_normal((4000, 64)).astype(np.float32)

    def mse(dq):
        return float(((dq - g) ** 2).mean())
    e1 = mse(tq3_1.dequantize_tq3_1(tq3_1.quantize_tq3_1(g)))
    e2 = mse(tq3_1.dequantize(tq3_1.quantize(g, "TQ3_2"), "TQ3_2"))
    assert 1.05 * e1 <= e2 <= 1.25 * e1
    assert e2 < mse(tq3.dequantize_tq3(tq3.quantize_tq3(g))) * 1.1


def test_shapes_and_nonfinite():
    with pytest.raises(GgufToolError, match="multiple of 64"):
        tq3_1.quantize(np.ones((2, 96), np.float32), "TQ3_2")
    bad = np.ones((2, 128), np.float32)
    bad[1, 70] = np.nan
    with pytest.raises(GgufToolError, match=r"row 1, column 70"):
        tq3_1.quantize(bad, "TQ3_2")
    assert not tq3_1.quantize(np.zeros((1, 64), np.float32), "TQ3_2").any()


def test_codec_registered():
    from gguftool.quant import codec
    from gguftool.types import BY_NAME
    c = codec("TQ3_2")
    x = np.random.default_rng(2).standard_normal((4, 128)).astype(np.float32)
    assert np.array_equal(c.quantize(x, threads=2), q_ref(x))
    assert c.bpw == 3.25 and c.id == 516
    assert BY_NAME["TQ3_2"].fallback == "TQ3_1" and BY_NAME["TQ3_2"].kv_cache


_HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include "gqt_tq3_1.h"
int main(int argc, char ** argv) {
    const int rows = atoi(argv[1]), n = atoi(argv[2]);
    const size_t nq = (size_t) rows * n / 64 * 26, ny = (size_t) rows * n / 32 * 34;
    float * x = malloc(sizeof(float) * rows * n), * d = malloc(sizeof(float) * rows * n), * s = malloc(sizeof(float) * rows);
    unsigned char * q = malloc(nq), * y = malloc(ny);
    if (fread(x, sizeof(float), (size_t) rows * n, stdin) != (size_t) rows * n) return 2;
    if (fread(y, 1, ny, stdin) != ny) return 2;
    gqt_quantize_tq3_2(x, q, rows, n, NULL);
    for (int r = 0; r < rows; ++r) {
        gqt_dequantize_row_tq3_2(q + (size_t) r * n / 64 * 26, d + (size_t) r * n, n);
        gqt_vec_dot_tq3_2_q8_0(n, s + r, 0, q + (size_t) r * n / 64 * 26, 0, y + (size_t) r * n / 32 * 34, 0, 1);
    }
    fwrite(q, 1, nq, stdout);
    fwrite(d, sizeof(float), (size_t) rows * n, stdout);
    fwrite(s, sizeof(float), rows, stdout);
    return 0;
}
"""


@pytest.mark.parametrize("toolchain", list(_TOOLCHAINS))
def test_native_flags_give_the_same_results(tmp_path, toolchain):
    check_harness(tmp_path, toolchain, _HARNESS, "gqt_tq3_1.c", partial(q_ref, saturate=True), dq_ref, dot_ref,
                  block=64, block_bytes=BYTES)


_MAD_HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include "gqt_tq3_1.h"
int main(int argc, char ** argv) {
    const int rows = atoi(argv[1]), n = atoi(argv[2]);
    const size_t nq = (size_t) rows * n / 64 * 26;
    unsigned char * q = malloc(nq);
    float * acc = malloc(sizeof(float) * rows * n), * s = malloc(sizeof(float) * rows);
    if (fread(q, 1, nq, stdin) != nq || fread(acc, sizeof(float), (size_t) rows * n, stdin) != (size_t) rows * n
        || fread(s, sizeof(float), rows, stdin) != (size_t) rows) return 2;
    for (int r = 0; r < rows; ++r) gqt_mad_tq3_2(n, acc + (size_t) r * n, q + (size_t) r * n / 64 * 26, s[r]);
    fwrite(acc, sizeof(float), (size_t) rows * n, stdout);
    return 0;
}
"""


def _mad_inputs():
    rng = np.random.default_rng(32)
    x = rng.standard_normal((16, 256)).astype(np.float32)
    x[1] = 0.0
    x[2, :64] *= np.float32(1e-6)
    q = q_ref(x)
    acc = (rng.standard_normal(x.shape) * 3).astype(np.float32)
    s = rng.uniform(0, 1, len(x)).astype(np.float32)
    return q, acc, s


def test_fused_v_accumulate_matches_twin():
    q, acc, s = _mad_inputs()
    got = tq3_1.mad(q, acc, s, "TQ3_2")
    assert np.array_equal(got, mad_ref(q, acc, s))
    plain = acc + s[:, None] * dq_ref(q)
    assert np.abs(got - plain).max() <= 4 * np.finfo(np.float32).eps * np.abs(plain).max()
    assert np.array_equal(got[1], acc[1])


@pytest.mark.parametrize("toolchain", list(_TOOLCHAINS))
def test_fused_v_accumulate_same_bits_on_every_toolchain(tmp_path, toolchain):
    runner, exe = build_harness(tmp_path, toolchain, _MAD_HARNESS, "gqt_tq3_1.c")
    q, acc, s = _mad_inputs()
    out = subprocess.run([*runner, str(exe), str(len(q)), str(acc.shape[1])],
                         input=q.tobytes() + acc.tobytes() + s.tobytes(), capture_output=True, check=True, timeout=120).stdout
    assert out == mad_ref(q, acc, s).tobytes()
