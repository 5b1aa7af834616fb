"""The same gqt_hqq.c compiled the way the native llama.cpp build compiles it (-O3 -march=native
-ffp-contract=off, gnu11) must write the known-answer bytes too: byte parity may not depend on the
compiler's optimisation level, the host's SIMD or the compiler: gcc and clang with -march=native, and
gcc for baseline x86-64 (ggml-base's flags, where the solver's AVX2 clone is picked at load time),
and gcc for arm64 (a phone build: NEON, run under qemu-aarch64). Skipped for a compiler or an
emulator that is not installed."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

FAST = Path(__file__).resolve().parents[1] / "gguftool" / "_fast"
KAT = Path(__file__).parent / "data" / "hqq_kat.npz"
BUILDS = {
    "gcc-native": ["gcc", "-O3", "-march=native"],
    "clang-native": ["clang", "-O3", "-march=native"],
    "gcc-baseline": ["gcc", "-O3"],
}


class Params(ctypes.Structure):
    _fields_ = [("lp_norm", ctypes.c_float), ("beta", ctypes.c_float), ("kappa", ctypes.c_float),
                ("iters", ctypes.c_int), ("early_stop", ctypes.c_int), ("scale_search", ctypes.c_int),
                ("refit", ctypes.c_int)]


@pytest.fixture(scope="module", params=list(BUILDS))
def native_lib(request, tmp_path_factory):
    cc = BUILDS[request.param]
    if shutil.which(cc[0]) is None:
        pytest.skip(f"{cc[0]} not installed")
    so = tmp_path_factory.mktemp("hqq_native") / "libgqt_hqq.so"
    cmd = [*cc, "-ffp-contract=off", "-std=gnu11", "-shared", "-fPIC",
           f"-I{FAST}", str(FAST / "gqt_hqq.c"), "-o", str(so), "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)} failed: {r.stderr[:2000]}"
    lib = ctypes.CDLL(str(so))
    lib.gqt_hqq_quantize_rows.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                          ctypes.c_int64, ctypes.POINTER(Params)]
    lib.gqt_hqq_quantize_rows_weighted.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                                   ctypes.c_int64, ctypes.POINTER(Params), ctypes.c_void_p,
                                                   ctypes.c_int64]
    lib.gqt_hqq_default_params.argtypes = [ctypes.POINTER(Params)]
    return lib


def test_native_build_matches_known_answers(native_lib):
    from gguftool.quant.hqq import TARGETS as INFO
    from tests.test_hqq_kat import PARAM_SETS, TARGETS
    with np.load(KAT) as f:
        kat = dict(f)
    x = np.ascontiguousarray(kat["x"])
    for target in TARGETS:
        tid, _, _, _ = INFO[target]
        for pname, prm in PARAM_SETS.items():
            p = Params()
            native_lib.gqt_hqq_default_params(ctypes.byref(p))
            for k, v in prm.items():
                setattr(p, k, v)
            want = kat[f"{target}/{pname}"]
            out = np.zeros_like(want)
            rc = native_lib.gqt_hqq_quantize_rows(tid, x.ctypes.data, out.ctypes.data, x.shape[0], x.shape[1],
                                                  ctypes.byref(p))
            assert rc == 0
            assert np.array_equal(out, want), f"{target} {pname}: native build differs"


def test_native_build_weighted_matches_numpy(native_lib):
    """The weighted solver (importance weights per column, with zeros and huge ratios) built the native way
    writes the numpy reference's bytes."""
    from gguftool.quant import hqq as H
    from tests.test_hqq_kat import PARAM_SETS, TARGETS
    with np.load(KAT) as f:
        x = np.ascontiguousarray(f["x"])
    rng = np.random.default_rng(3)
    w = (rng.gamma(0.5, size=x.shape[1]) * 10.0 ** rng.uniform(-20, 20, x.shape[1])).astype(np.float32)
    w[rng.integers(0, x.shape[1], 40)] = 0
    w[32:64] = 0
    for target in TARGETS:
        tid = H.TARGETS[target][0]
        for pname, prm in PARAM_SETS.items():
            p = Params()
            native_lib.gqt_hqq_default_params(ctypes.byref(p))
            for k, v in prm.items():
                setattr(p, k, v)
            # the C call takes its parameters as given: the struct's scale search, not the weighted default
            want = H.quantize_hqq_ref(x, target, imatrix=w, **{"scale_search": p.scale_search, **prm})
            out = np.zeros_like(want)
            rc = native_lib.gqt_hqq_quantize_rows_weighted(tid, x.ctypes.data, out.ctypes.data, x.shape[0], x.shape[1],
                                                           ctypes.byref(p), w.ctypes.data, 0)
            assert rc == 0
            assert np.array_equal(out, want), f"{target} {pname}: weighted native build differs"


# reads "target rows n lp_norm beta kappa iters early_stop scale_search refit\n" and rows*n floats,
# writes the quantized rows
_ARM_HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include "gqt_hqq.h"
int main(void) {
    int target, rows, n;
    gqt_hqq_params p;
    if (scanf("%d %d %d %f %f %f %d %d %d %d", &target, &rows, &n, &p.lp_norm, &p.beta, &p.kappa, &p.iters,
              &p.early_stop, &p.scale_search, &p.refit) != 10 || getchar() != '\n') return 2;
    float * x = malloc(sizeof(float) * rows * n);
    const size_t rb = gqt_hqq_row_size(target, n);
    unsigned char * y = malloc(rb * rows);
    if (!x || !y || fread(x, sizeof(float), (size_t) rows * n, stdin) != (size_t) rows * n) return 3;
    if (gqt_hqq_quantize_rows(target, x, y, rows, n, &p) != GQT_OK) return 4;
    fwrite(y, 1, rb * rows, stdout);
    return 0;
}
"""


def test_arm64_build_matches_known_answers(tmp_path):
    from dataclasses import asdict

    from gguftool.quant.hqq import DEFAULTS
    from gguftool.quant.hqq import TARGETS as INFO
    from tests.test_hqq_kat import PARAM_SETS, TARGETS
    cc, qemu = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
    if not cc or not qemu:
        pytest.skip("aarch64-linux-gnu-gcc or qemu-aarch64 missing (apt-get install gcc-aarch64-linux-gnu qemu-user)")
    (tmp_path / "h.c").write_text(_ARM_HARNESS)
    exe = tmp_path / "h"
    cmd = [cc, "-O3", "-march=armv8.2-a+dotprod", "-ffp-contract=off", "-std=gnu11", "-static", f"-I{FAST}",
           str(tmp_path / "h.c"), str(FAST / "gqt_hqq.c"), "-lm", "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)} failed: {r.stderr[:2000]}"
    with np.load(KAT) as f:
        kat = dict(f)
    x = np.ascontiguousarray(kat["x"], np.float32)
    for target in TARGETS:
        for pname, prm in PARAM_SETS.items():
            p = {**asdict(DEFAULTS), **prm}
            head = " ".join(str(v) for v in (
                INFO[target][0], *x.shape, *(repr(float(np.float32(p[k]))) for k in ("lp_norm", "beta", "kappa")),
                p["iters"], p["early_stop"], p["scale_search"], p["refit"]))
            out = subprocess.run([qemu, str(exe)], input=head.encode() + b"\n" + x.tobytes(),
                                 capture_output=True, timeout=120)
            assert out.returncode == 0, out.stderr[-500:]
            want = kat[f"{target}/{pname}"]
            assert np.array_equal(np.frombuffer(out.stdout, np.uint8).reshape(want.shape), want), \
                f"{target} {pname}: arm64 build differs"
