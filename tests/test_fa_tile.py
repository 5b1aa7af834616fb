"""The tile helpers of the build's decode attention (gguftool/native/integrate.py, gqt_fa_grouped): written in
GCC vector extensions so one source serves AVX2, SSE2 and NEON. Here they are compiled alone by every toolchain
that is installed (x86 native and baseline, clang, arm64 under qemu) and checked against numpy in double on
shapes whose tails and head counts take every branch."""
import shutil
import subprocess

import numpy as np
import pytest

from gguftool.native import integrate

HARNESS = r"""
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
@TILE@
/* stdin: D G n T, then K[n][D] V[n][D] q[G][D] acc[G][D] w[G][T] as float32; stdout: s[G][T] then acc */
int main(void) {
    int D, G, n, T;
    if (fread(&D, 4, 1, stdin) != 1 || fread(&G, 4, 1, stdin) != 1 || fread(&n, 4, 1, stdin) != 1 ||
        fread(&T, 4, 1, stdin) != 1) return 2;
    static float K[32 * 512], V[32 * 512], q[8 * 512], acc[8 * 512], w[8 * 32], s[8 * 32];
    if (fread(K, 4, (size_t) (n * D), stdin) != (size_t) (n * D) || fread(V, 4, (size_t) (n * D), stdin) != (size_t) (n * D) ||
        fread(q, 4, (size_t) (G * D), stdin) != (size_t) (G * D) || fread(acc, 4, (size_t) (G * D), stdin) != (size_t) (G * D) ||
        fread(w, 4, (size_t) (G * T), stdin) != (size_t) (G * T)) return 2;
    const float * qp[8];
    float * ap[8];
    for (int g = 0; g < G; ++g) { qp[g] = q + g * D; ap[g] = acc + g * D; }
    memset(s, 0, sizeof s);
    gqt_fa_heads<gqt_fa_dot_heads>((int64_t) G, (int64_t) D, n, (const float *) K, (const float * const *) qp, s, T);
    gqt_fa_heads<gqt_fa_mad_heads>((int64_t) G, (int64_t) D, n, (const float *) V, (const float *) w, T, ap);
    fwrite(s, 4, (size_t) (G * T), stdout);
    fwrite(acc, 4, (size_t) (G * D), stdout);
    return 0;
}
"""

# compile (and link) commands, and the runner
_SYSROOT = "/usr/aarch64-linux-gnu"
TOOLCHAINS = {
    "g++ native": (["g++", "-O3", "-march=native"], None, []),
    "g++ baseline": (["g++", "-O3"], None, []),
    "clang++": (["clang++", "-O3", "-march=native"], None, []),
    # no aarch64 libstdc++ is needed: the helpers use none of it
    "arm64 (qemu)": (["clang++", "--target=aarch64-linux-gnu", "-O3", "-nostdinc++", "-isystem", f"{_SYSROOT}/include"],
                     ["aarch64-linux-gnu-gcc"], ["qemu-aarch64", "-L", _SYSROOT]),
}


def _tile_source() -> str:
    src = integrate._FA_DECODE
    return src[src.index("typedef float gqt_f8"):src.index("// gguftool: decode with grouped-query attention")]


@pytest.mark.parametrize("toolchain", list(TOOLCHAINS))
def test_fa_tile_helpers_agree_with_double(toolchain, tmp_path):
    cc, link, runner = TOOLCHAINS[toolchain]
    missing = [t for t in (cc[0], *(link or [])[:1], *runner[:1]) if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    (tmp_path / "h.cpp").write_text(HARNESS.replace("@TILE@", _tile_source()))
    exe = tmp_path / "h"
    flags = ["-std=gnu++17", "-Wall", "-Wextra", "-Wpedantic", "-Werror"]
    if link:
        cmds = [[*cc, *flags, "-c", str(tmp_path / "h.cpp"), "-o", str(tmp_path / "h.o")],
                [*link, str(tmp_path / "h.o"), "-lm", "-o", str(exe)]]
    else:
        cmds = [[*cc, *flags, str(tmp_path / "h.cpp"), "-lm", "-o", str(exe)]]
    for cmd in cmds:
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr   # -Werror: the build compiles ops.cpp with -Wall -Wextra -Wpedantic
    rng = np.random.default_rng(11)
    # Gemma 3 (256, 4 heads a group), SmolLM2 (64, 3), a head size with 8- and 1-value tails, more than 4 heads
    for d, g, n, t in [(256, 4, 8, 8), (64, 3, 32, 32), (72, 6, 7, 8), (64, 2, 1, 4), (128, 5, 5, 16)]:
        k, v = rng.standard_normal((n, d)).astype(np.float32), rng.standard_normal((n, d)).astype(np.float32)
        q, acc = rng.standard_normal((g, d)).astype(np.float32), rng.standard_normal((g, d)).astype(np.float32)
        w = rng.random((g, t)).astype(np.float32)
        stdin = np.array([d, g, n, t], np.int32).tobytes() + b"".join(a.tobytes() for a in (k, v, q, acc, w))
        out = subprocess.run([*runner, str(exe)], input=stdin, capture_output=True, check=True, timeout=60).stdout
        s = np.frombuffer(out[:4 * g * t], np.float32).reshape(g, t)
        got_acc = np.frombuffer(out[4 * g * t:], np.float32).reshape(g, d)
        want_s = q.astype(np.float64) @ k.astype(np.float64).T
        want_acc = acc + w[:, :n].astype(np.float64) @ v.astype(np.float64)
        np.testing.assert_allclose(s[:, :n], want_s, atol=1e-4 * np.sqrt(d), err_msg=f"scores {d} {g} {n}")
        assert not s[:, n:].any(), "scores written past the tile's keys"
        np.testing.assert_allclose(got_acc, want_acc, atol=1e-4 * np.sqrt(n), err_msg=f"accumulators {d} {g} {n}")
