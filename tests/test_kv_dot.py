"""Decode's grouped K dots (gguftool/_fast/gqt_kv_dot.c): built by every toolchain installed (x86 native and
baseline, clang, arm64 under qemu), the levels of random Q4_0 / Q5_0 / Q8_0 / IQ4_NL blocks against gguf-py's
own dequantization and of TQ3_3 blocks against its numpy twin, and the dots with every head against numpy's
float32 of the same sums, bit for bit."""
import subprocess

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants

from gguftool.quant import tcq3

from .test_tq3 import _TOOLCHAINS, build_harness

# gqt_kv_dot.h's kinds, in enum order, with the block bytes per 32 values
KINDS = [(T.Q4_0, 18), (T.Q5_0, 22), (T.Q8_0, 34), (T.IQ4_NL, 18), ("TQ3_3", 13)]

HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include "gqt_kv_dot.h"
/* argv: kind rows n G block_bytes; stdin: rows K rows, then G Q8_0 rows; stdout: levels, scales, s[r][g] */
int main(int argc, char ** argv) {
    (void) argc;
    const int kind = atoi(argv[1]), rows = atoi(argv[2]), n = atoi(argv[3]), G = atoi(argv[4]), bb = atoi(argv[5]);
    const int G4 = (G + 3) & ~3;
    const size_t nk = (size_t) rows * n / 32 * bb, ny = (size_t) G * n / 32 * 34;
    unsigned char * k = malloc(nk), * y = malloc(ny);
    int8_t * lv = malloc((size_t) rows * n);
    float * d = malloc(sizeof(float) * rows * n / 32), * yd = calloc((size_t) G4 * n / 32, sizeof(float));
    float * s = malloc(sizeof(float) * rows * G);
    if (fread(k, 1, nk, stdin) != nk || fread(y, 1, ny, stdin) != ny) return 2;
    for (int g = 0; g < G; ++g) {
        const gqt_block_q8_0 * yb = (const gqt_block_q8_0 *) (y + (size_t) g * n / 32 * 34);
        for (int j = 0; j < n / 32; ++j) yd[(size_t) j * G4 + g] = gqt_fp16_to_fp32(yb[j].d);
    }
    for (int r = 0; r < rows; ++r) {
        int8_t * l = lv + (size_t) r * n;
        float * dr = d + (size_t) r * n / 32;
        gqt_kv_levels(kind, k + (size_t) r * n / 32 * bb, n, l, dr);
        gqt_kv_dot_heads(n, l, dr, y, (size_t) n / 32 * 34, yd, G, s + (size_t) r * G, 1);
    }
    fwrite(lv, 1, (size_t) rows * n, stdout);
    fwrite(d, sizeof(float), (size_t) rows * n / 32, stdout);
    fwrite(s, sizeof(float), (size_t) rows * G, stdout);
    return 0;
}
"""


def _blocks(rng, rows, n, bb):
    """random blocks of bb bytes per 32 values (TQ3_3: 26 per 64) with finite scales of both signs and a
    zero-scale row"""
    size, nb = (26, n // 64) if bb == 13 else (bb, n // 32)
    b = rng.integers(0, 256, (rows, nb, size), dtype=np.uint8)
    d = (rng.uniform(0.01, 2, (rows, nb)) * rng.choice([-1, 1], (rows, nb))).astype(np.float16)
    d[1] = 0
    b[:, :, :2] = d.view(np.uint8).reshape(rows, nb, 2)
    return b.reshape(rows, -1)


def _values(k, qtype):
    return tcq3.dequantize_ref(k) if qtype == "TQ3_3" else quants.dequantize(k, qtype)


@pytest.mark.parametrize("toolchain", list(_TOOLCHAINS))
def test_levels_and_grouped_dots(tmp_path, toolchain):
    runner, exe = build_harness(tmp_path, toolchain, HARNESS, "gqt_kv_dot.c", "gqt_tcq3.c")
    rng = np.random.default_rng(21)
    rows, n = 6, 256
    for kind, (qtype, bb) in enumerate(KINDS):
        k = _blocks(rng, rows, n, bb)
        if qtype == T.Q8_0:   # ggml's Q8_0 never holds -128 (|x| * 127 / amax rounds within +-127)
            k.reshape(rows, n // 32, bb)[:, :, 2:][k.reshape(rows, n // 32, bb)[:, :, 2:] == 128] = 129
        for g in (1, 3, 4, 9):
            y8 = quants.quantize((rng.standard_normal((g, n)) * rng.uniform(0.1, 10, (g, 1))).astype(np.float32), T.Q8_0)
            out = subprocess.run([*runner, str(exe), str(kind), str(rows), str(n), str(g), str(bb)],
                                 input=k.tobytes() + y8.tobytes(), capture_output=True, check=True, timeout=120).stdout
            lv = np.frombuffer(out[:rows * n], np.int8).reshape(rows, n).astype(np.int64)
            d = np.frombuffer(out[rows * n:rows * n + 4 * rows * n // 32], np.float32).reshape(rows, n // 32)
            s = np.frombuffer(out[rows * n + 4 * rows * n // 32:], np.float32).reshape(rows, g)
            # the levels times their scales are gguf-py's values of the blocks
            want = _values(k, qtype).reshape(rows, n // 32, 32).astype(np.float64)
            assert np.array_equal(d[:, :, None] * lv.reshape(rows, n // 32, 32), want), (toolchain, qtype)
            # each head: sum over blocks of (d * yd) * isum in float32, in block order
            yb = y8.reshape(g, n // 32, 34)
            yd = yb[:, :, :2].copy().view(np.float16)[..., 0].astype(np.float32)
            yq = yb[:, :, 2:].view(np.int8).astype(np.int64)
            isum = np.einsum("rjk,gjk->rgj", lv.reshape(rows, n // 32, 32), yq).astype(np.float32)
            terms = (d[:, None, :] * yd[None, :, :]) * isum
            ref = np.zeros((rows, g), np.float32)
            for j in range(n // 32):
                ref = ref + terms[:, :, j]
            assert s.tobytes() == ref.tobytes(), (toolchain, qtype, g)
            assert not s[1].any()
