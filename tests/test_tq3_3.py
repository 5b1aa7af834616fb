"""TQ3_3 (8-state trellis-coded 3-bit cache type, 3.25 bits): C kernels against the numpy twins on every
toolchain (arm64 under qemu), the decode rule against the layout written out by hand, the Viterbi search
against single and double bit flips of its path, and the squared error against TQ3_2 and Shannon's bound."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from gguftool.errors import GgufToolError
from gguftool.quant import tcq3, tq3, tq3_1

from .test_tq3 import _TOOLCHAINS, _inputs, build_harness, check_harness, checked_path_agrees

BYTES = 26
LEVELS = [-127, -92, -70, -54, -40, -28, -17, -6, 6, 17, 28, 40, 54, 70, 92, 127]   # gqt_tcq3.h


def _inputs64():
    return {k: v for k, v in _inputs().items() if v.shape[1] % 64 == 0}


@pytest.mark.parametrize("name", list(_inputs64()))
def test_c_and_numpy_identical(name):
    x = _inputs64()[name]
    checked_path_agrees(tcq3.quantize, tcq3.quantize_ref, x)
    q = tcq3.quantize_ref(x, saturate=True)
    assert np.array_equal(tcq3.dequantize(q).view(np.uint32), tcq3.dequantize_ref(q).view(np.uint32))
    y8 = tq3.quantize_q8_0_ref(np.random.default_rng(3).standard_normal(x.shape).astype(np.float32))
    assert np.array_equal(tcq3.vec_dot_q8_0(q, y8).view(np.uint32), tcq3.vec_dot_q8_0_ref(q, y8).view(np.uint32))


def test_random_bytes_decode_identically():
    raw = np.random.default_rng(6).integers(0, 256, (32, BYTES * 4), dtype=np.uint8)
    raw[:, 0:2] = np.random.default_rng(7).standard_normal((32, 1)).astype(np.float16).view(np.uint8)
    a, b = tcq3.dequantize(raw), tcq3.dequantize_ref(raw)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def _decode_by_hand(block: bytes) -> list[float]:
    """The header's decode rule, one value at a time, from nothing but the block bytes."""
    d = float(np.frombuffer(block[0:2], np.float16)[0])
    word = int.from_bytes(block[2:10], "little")
    b = [(word >> i) & 1 for i in range(64)]
    out = []
    for i in range(64):
        bi, b1, b2, b3 = (b[i - t] if i - t >= 0 else 0 for t in range(4))
        s = b1 | (bi ^ b2 ^ b3) << 1
        idx = (block[10 + i % 16] >> (2 * (i // 16))) & 3
        out.append(d * LEVELS[s + 4 * idx])
    return out


def test_decode_follows_the_layout():
    rng = np.random.default_rng(9)
    raw = rng.integers(0, 256, (8, BYTES), dtype=np.uint8)
    raw[:, 0:2] = np.array([0.25], np.float16).view(np.uint8)
    got = tcq3.dequantize(raw)
    for r in range(len(raw)):
        assert got[r].tolist() == _decode_by_hand(raw[r].tobytes())
    assert tcq3.LEVELS.tolist() == LEVELS


def test_subsets_partition_the_levels():
    """Ungerboeck's partition: from each state both branches reach one parity of subset, and over the 8
    states every (state, branch) pair picks a subset with both parities taken by half the states."""
    sub = tcq3.subset(np.arange(16))
    assert sorted(np.bincount(sub).tolist()) == [4, 4, 4, 4]
    for st in range(8):
        s0, s1 = sub[0 << 3 | st], sub[1 << 3 | st]
        assert s0 % 2 == s1 % 2 and s0 != s1


def _path_error(x: np.ndarray, d: float, bits: np.ndarray) -> float:
    """Squared error of the best indices for fixed branch bits at scale d (each value: nearest level of its
    subset), computed from the decode rule alone."""
    lev = d * np.array(LEVELS, np.float64)
    err = 0.0
    for i in range(64):
        bi, b1, b2, b3 = (int(bits[i - t]) if i - t >= 0 else 0 for t in range(4))
        s = b1 | (bi ^ b2 ^ b3) << 1
        err += float(np.min((x[i] - lev[s::4]) ** 2))
    return err


def test_viterbi_path_survives_bit_flips():
    """No path one or two adjacent branch flips away from the search's is better, and the indices the search
    chose are the nearest levels of their subsets (the error it reports is the path's own)."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((3, 64))
    d = 1.0 / tcq3.UNIT
    bits, idx = tcq3._viterbi(x, np.full(3, d))
    lev = d * np.array(LEVELS, np.float64)
    for r in range(3):
        best = _path_error(x[r], d, bits[r])
        w = tcq3._windows(bits[r:r + 1])[0]
        assert np.isclose(best, float(((x[r] - lev[tcq3._SUB[w] + 4 * idx[r].astype(int)]) ** 2).sum()), rtol=1e-12)
        for i in range(64):
            for span in (1, 2):
                alt = bits[r].copy()
                alt[i:i + span] ^= 1
                assert _path_error(x[r], d, alt) >= best - 1e-12, (r, i, span)


def test_squared_error_between_tq3_2_and_shannon():
    """Gaussian rows: 8-state TCQ takes ~30% off TQ3_2's squared error at the same 3.25 bits; no code can
    go below the rate-distortion bound 2^(-2R) at R = 3.25."""
    g = np.random.default_rng(11).standard_normal((4000, 64)).astype(np.float32)

    def mse(dq):
        return float(((dq - g) ** 2).mean())
    e3 = mse(tcq3.dequantize(tcq3.quantize(g)))
    e2 = mse(tq3_1.dequantize(tq3_1.quantize(g, "TQ3_2"), "TQ3_2"))
    assert 2.0 ** -6.5 < e3 < 0.8 * e2


def test_shapes_and_nonfinite():
    with pytest.raises(GgufToolError, match="multiple of 64"):
        tcq3.quantize(np.ones((2, 96), np.float32))
    bad = np.ones((2, 128), np.float32)
    bad[1, 70] = np.inf
    with pytest.raises(GgufToolError, match=r"row 1, column 70"):
        tcq3.quantize(bad)
    assert not tcq3.quantize(np.zeros((1, 64), np.float32)).any()


def test_codec_registered():
    from gguftool.quant import codec
    from gguftool.types import BY_NAME
    c = codec("TQ3_3")
    x = np.random.default_rng(2).standard_normal((4, 128)).astype(np.float32)
    assert np.array_equal(c.quantize(x, threads=2), tcq3.quantize_ref(x))
    assert c.bpw == 3.25 and c.id == 517
    t = BY_NAME["TQ3_3"]
    assert t.fallback == "TQ3_1" and t.kv_cache and t.table_decode


_HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include "gqt_tcq3.h"
int main(int argc, char ** argv) {
    const int rows = atoi(argv[1]), n = atoi(argv[2]);
    const size_t nq = (size_t) rows * n / 64 * 26, ny = (size_t) rows * n / 32 * 34;
    float * x = malloc(sizeof(float) * rows * n), * d = malloc(sizeof(float) * rows * n), * s = malloc(sizeof(float) * rows);
    unsigned char * q = malloc(nq), * y = malloc(ny);
    if (fread(x, sizeof(float), (size_t) rows * n, stdin) != (size_t) rows * n) return 2;
    if (fread(y, 1, ny, stdin) != ny) return 2;
    gqt_quantize_tq3_3(x, q, rows, n, NULL);
    for (int r = 0; r < rows; ++r) {
        gqt_dequantize_row_tq3_3(q + (size_t) r * n / 64 * 26, d + (size_t) r * n, n);
        gqt_vec_dot_tq3_3_q8_0(n, s + r, 0, q + (size_t) r * n / 64 * 26, 0, y + (size_t) r * n / 32 * 34, 0, 1);
    }
    fwrite(q, 1, nq, stdout);
    fwrite(d, sizeof(float), (size_t) rows * n, stdout);
    fwrite(s, sizeof(float), rows, stdout);
    return 0;
}
"""


@pytest.mark.parametrize("toolchain", list(_TOOLCHAINS))
def test_native_flags_give_the_same_results(tmp_path, toolchain):
    check_harness(tmp_path, toolchain, _HARNESS, "gqt_tcq3.c", lambda x: tcq3.quantize_ref(x, saturate=True),
                  tcq3.dequantize_ref, tcq3.vec_dot_q8_0_ref, block=64, block_bytes=BYTES)


_MAD_HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include "gqt_tcq3.h"
int main(int argc, char ** argv) {
    const int rows = atoi(argv[1]), n = atoi(argv[2]);
    const size_t nq = (size_t) rows * n / 64 * 26;
    unsigned char * q = malloc(nq);
    float * acc = malloc(sizeof(float) * rows * n), * s = malloc(sizeof(float) * rows);
    if (fread(q, 1, nq, stdin) != nq || fread(acc, sizeof(float), (size_t) rows * n, stdin) != (size_t) rows * n
        || fread(s, sizeof(float), rows, stdin) != (size_t) rows) return 2;
    for (int r = 0; r < rows; ++r) gqt_mad_tq3_3(n, acc + (size_t) r * n, q + (size_t) r * n / 64 * 26, s[r]);
    fwrite(acc, sizeof(float), (size_t) rows * n, stdout);
    return 0;
}
"""


def _mad_inputs():
    rng = np.random.default_rng(32)
    x = rng.standard_normal((16, 256)).astype(np.float32)
    x[1] = 0.0
    x[2, :64] *= np.float32(1e-6)
    q = tcq3.quantize_ref(x)
    acc = (rng.standard_normal(x.shape) * 3).astype(np.float32)
    s = rng.uniform(0, 1, len(x)).astype(np.float32)
    return q, acc, s


def test_fused_v_accumulate_matches_twin():
    q, acc, s = _mad_inputs()
    got = tcq3.mad(q, acc, s)
    assert np.array_equal(got, tcq3.mad_ref(q, acc, s))
    plain = acc + s[:, None] * tcq3.dequantize_ref(q)
    assert np.abs(got - plain).max() <= 4 * np.finfo(np.float32).eps * np.abs(plain).max()
    assert np.array_equal(got[1], acc[1])


@pytest.mark.parametrize("toolchain", list(_TOOLCHAINS))
def test_fused_v_accumulate_same_bits_on_every_toolchain(tmp_path, toolchain):
    runner, exe = build_harness(tmp_path, toolchain, _MAD_HARNESS, "gqt_tcq3.c")
    q, acc, s = _mad_inputs()
    out = subprocess.run([*runner, str(exe), str(len(q)), str(acc.shape[1])],
                         input=q.tobytes() + acc.tobytes() + s.tobytes(), capture_output=True, check=True, timeout=120).stdout
    assert out == tcq3.mad_ref(q, acc, s).tobytes()
