"""The patched llama.cpp build runs our types, and agrees with the Python package.

Needs `gguftool native build` (scripts/build_native.sh); skipped with the reason when the build
is missing or out of date (GGUFTOOL_NATIVE_REQUIRED=1 turns the skip into a failure, for CI).
References: the numpy twins in gguftool.quant (independent code from the C kernels), ggml's own
Q8_0/Q8_1 quantizers, double-precision dots of the dequantized rows, and the f16-cache /
stock-weight perplexity measured by the same binary in the same test.
"""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType

from gguftool import types as gtypes
from gguftool.errors import GgufToolError

pytestmark = pytest.mark.native

DATA = Path(__file__).parent / "data"
TEXT = DATA / "native_pride_excerpt.txt"
OURS = [t.name for t in gtypes.CUSTOM_TYPES]


def _skip_or_fail(msg: str):
    if os.environ.get("GGUFTOOL_NATIVE_REQUIRED"):
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def native():
    from gguftool.native import tools
    try:
        return tools.find_build(require_current=True)
    except GgufToolError as e:
        _skip_or_fail(f"{e.message} ({e.hint})")


def check(native, *args: str, env: dict[str, str] | None = None) -> str:
    r = subprocess.run([str(native.tool("gguftool-check")), *args], capture_output=True, text=True, timeout=120,
                       env={**os.environ, **env} if env else None)
    assert r.returncode == 0, f"gguftool-check {' '.join(args)} failed: {r.stderr}"
    return r.stdout


def _weights(rng: np.random.Generator, rows: int = 12, n: int = 512) -> np.ndarray:
    """Weight-like rows (rows >= 5, n >= 128) with the awkward blocks a real tensor has."""
    x = rng.standard_normal((rows, n)).astype(np.float32) * rng.uniform(0.005, 0.2, (rows, 1)).astype(np.float32)
    x[0, :128] = 0.0                 # all-zero blocks (and a zero HQQ_128 group)
    x[1, :128] = np.float32(0.03125)  # constant blocks
    x[2, 7] = np.float32(2.5)        # an outlier
    x[3] *= np.float32(1e-4)         # tiny values (fp16 subnormal scales)
    x[4, 32:64] = -x[4, 32:64] ** 2  # one-signed block
    return x


def _python_codec(name: str):
    from gguftool.quant import hqq, tcq3, tq3, tq3_1
    if name == "TQ3_0":
        return tq3.quantize_tq3_ref, tq3.dequantize_tq3_ref, tq3.quantize_tq3
    if name == "TQ3_3":
        return tcq3.quantize_ref, tcq3.dequantize_ref, tcq3.quantize
    if name in ("TQ3_1", "TQ3_2"):
        return (lambda x: tq3_1.quantize_ref(x, name), lambda d: tq3_1.dequantize_ref(d, name),
                lambda x: tq3_1.quantize(x, name))
    return (lambda x: hqq.quantize_hqq_ref(x, name), lambda d: hqq.dequantize_hqq_ref(d, name),
            lambda x: hqq.quantize_hqq(x, name))


def test_types_registered_with_our_ids(native):
    lines = check(native, "types").split("\n")
    got = {p[0]: p for p in (l.split() for l in lines if l and not l.startswith("COUNT"))}
    for t in gtypes.CUSTOM_TYPES:
        name, tid, blck, size, quantized, vdt = got[t.ggml_name]
        assert (int(tid), int(blck), int(size), quantized) == (t.id, t.block_size, t.type_size, "1")
        assert vdt == t.vec_dot_type.lower()   # the runtime pairs each type as the table says
    count = int(next(l for l in lines if l.startswith("COUNT")).split()[1])
    assert count == max(t.id for t in gtypes.CUSTOM_TYPES) + 1


@pytest.mark.parametrize("name", OURS)
def test_quantize_bytes_match_python(native, name, tmp_path, rng):
    x = _weights(rng)
    src, q, deq = tmp_path / "x.f32", tmp_path / "x.q", tmp_path / "x.deq"
    x.tofile(src)
    check(native, "quant", name.lower(), str(x.shape[1]), str(src), str(q), str(deq))
    got = np.fromfile(q, np.uint8).reshape(x.shape[0], -1)
    ref_q, ref_dq, fast_q = _python_codec(name)
    want = ref_q(x)
    bad = np.nonzero((got != want).any(axis=1))[0]
    assert bad.size == 0, f"{name}: llama.cpp bytes differ from the numpy reference in rows {bad.tolist()}"
    assert np.array_equal(got, fast_q(x))
    # both dequantizers agree bit for bit
    got_dq = np.fromfile(deq, np.float32).reshape(x.shape)
    assert np.array_equal(got_dq.view(np.uint32), ref_dq(want).astype(np.float32).view(np.uint32))
    # and the decoded values are a quantization of x, not garbage
    err = np.abs(got_dq - x).max(axis=1)
    assert (err <= 0.5 * np.abs(x).max(axis=1) + 1e-30).all()


@pytest.mark.parametrize("name", OURS)
@pytest.mark.parametrize("n", [128, 256, 4096])
def test_vec_dot_simd_agrees(native, name, n, tmp_path, rng):
    from gguftool.quant import hqq, tcq3, tq3, tq3_1
    twins = {"TQ3_0": (tq3.dequantize_tq3_ref, tq3.vec_dot_tq3_q8_0_ref),
             "TQ3_1": (tq3_1.dequantize_tq3_1_ref, tq3_1.vec_dot_tq3_1_q8_0_ref),
             "TQ3_2": (lambda d: tq3_1.dequantize_ref(d, "TQ3_2"), lambda x, y: tq3_1.vec_dot_q8_0_ref(x, y, "TQ3_2")),
             "TQ3_3": (tcq3.dequantize_ref, tcq3.vec_dot_q8_0_ref)}
    for trial in range(3):
        x = (rng.standard_normal(n) * 0.05 + (0.01 if trial == 1 else 0.0)).astype(np.float32)
        y = rng.standard_normal(n).astype(np.float32) * np.float32(3.0)
        fx, fy, qx, qy = (tmp_path / f"{s}{trial}" for s in ("x.f32", "y.f32", "x.q", "y.q"))
        x.tofile(fx)
        y.tofile(fy)
        simd, ref, exact = map(float, check(native, "dot", name.lower(), str(n), str(fx), str(fy),
                                            str(qx), str(qy)).split())
        xq, yq = np.fromfile(qx, np.uint8), np.fromfile(qy, np.uint8)
        if name in twins:
            deq, dot = twins[name]
            dx = deq(xq.reshape(1, -1)).reshape(-1)
            # the scalar kernel equals its numpy twin, and the SIMD paths give the same bits
            assert np.float32(ref) == dot(xq.reshape(1, -1), yq.reshape(1, -1))[0]
            assert simd == ref
        else:
            dx = hqq.dequantize_hqq_ref(xq.reshape(1, -1), name).reshape(-1)
            assert np.float32(ref) == hqq.vec_dot_q8_1_ref(xq, yq, name)      # C ref == numpy twin
        yb = yq.reshape(-1, 34 if gtypes.BY_NAME[name].vec_dot_type == "Q8_0" else 36)
        dy = (yb[:, 0:2].copy().view(np.float16).astype(np.float64)
              * yb[:, -32:].view(np.int8).astype(np.float64)).reshape(-1)
        mag = float(np.abs(dx.astype(np.float64) * dy).sum())
        assert abs(exact - float(dx.astype(np.float64) @ dy)) <= 1e-9 * mag + 1e-12
        # SIMD vs scalar reference: same math, other summation order
        assert abs(simd - ref) <= 1e-5 * mag + 1e-6, (simd, ref, mag)
        # vs the exact dot of what the blocks decode to (Q8_1's s is an fp16 rounding of d*sum(q))
        assert abs(simd - exact) <= 2e-3 * mag + 1e-5, (simd, exact, mag)


KV_TYPES = [t.name.lower() for t in gtypes.CUSTOM_TYPES if t.kv_cache]


@pytest.mark.parametrize("k,v", [("f16", "f16"), ("q8_0", "q4_0"), ("iq4_nl", "tq3_2"), *(("q5_0", t) for t in KV_TYPES),
                                 *((t, t) for t in KV_TYPES)])
@pytest.mark.parametrize("n_kv,window", [(256, 0), (1024, 0), (1024, 700)])
def test_decode_flash_attention_agrees(native, k, v, n_kv, window):
    """One decode step of CPU flash attention (SmolLM2's 9 query / 3 KV heads of 64, or of one 128 block),
    with no mask or one that leaves a window of keys wrapping around the cells (a sliding-window layer):
    the build's path gives ggml's reference path's result (one head per thread, to_float then mad) and
    attention in double on the decoded cache. From 512 keys on, the build splits the unmasked keys over
    the threads and reads each quantized row once for the 3 query heads of its KV head; TQ3_1/TQ3_2 keys are
    then dotted with the exact f32 query instead of its Q8_0 rounding, so they agree with the double attention
    to float rounding, while TQ3_3 keys (int8 levels and a grouped Q8_0 dot, gqt_kv_dot.h) agree with the reference.
    GGUFTOOL_FA_GROUPED=0 keeps the split and upstream's per-head reads."""
    d = max([64] + [gtypes.BY_NAME[t.upper()].block_size for t in (k, v) if t.upper() in gtypes.BY_NAME])
    args = ["fa", k, v, str(d), str(n_kv), "9", "3", "2", "1", *([str(window)] if window else [])]
    runs = {"grouped": check(native, *args)}
    if n_kv >= 512 and k != "f16":
        runs["per-head"] = check(native, *args, env={"GGUFTOOL_FA_GROUPED": "0"})
    kt = gtypes.BY_NAME.get(k.upper())
    exact_q = n_kv >= 512 and kt is not None and kt.table_decode and kt.name != "TQ3_3"
    for how, out in runs.items():
        got = {key: float(val) for key, val in (kv.split("=") for kv in out.split())}
        if how == "grouped" and exact_q:
            # the reference's own error is the Q8_0 query's; the build's is float summation order only
            assert got["fast_vs_exact"] <= 1e-4 and got["fast_vs_exact"] < got["ref_vs_exact"] / 10, (how, out)
            continue
        # same math up to float summation order; the f16 reference path accumulates V in fp16
        assert got["fast_vs_ref"] <= (1e-2 if v == "f16" else 1e-5), (how, out)
        # the double reference differs by the Q8 query of a quantized K dot, and f16 rounding
        assert got["fast_vs_exact"] <= 2e-2, (how, out)


@pytest.mark.parametrize("t", ["q4_0", *KV_TYPES])
@pytest.mark.parametrize("rows,threads", [(1, 2), (1, 3), (2, 3), (7, 2)])
def test_cache_writes_split_over_threads(native, t, rows, threads):
    """SET_ROWS into our cache types runs on every thread, and a decode step's single row is split by blocks
    (upstream runs the op on one thread): the cells written hold ggml_quantize_chunk's bytes of the same rows,
    and the cells around them are untouched."""
    d = max(256, gtypes.BY_NAME[t.upper()].block_size if t.upper() in gtypes.BY_NAME else 32)
    assert check(native, "setrows", t, str(d), str(rows), str(threads)).strip() == "same=1"


@pytest.mark.parametrize("name", OURS)
def test_validate_row_data_checks_fp16_fields(native, name, tmp_path, rng):
    x = _weights(rng, rows=6, n=256)
    src, q, deq = tmp_path / "x.f32", tmp_path / "x.q", tmp_path / "x.deq"
    x.tofile(src)
    check(native, "quant", name.lower(), "256", str(src), str(q), str(deq))
    assert check(native, "validate", name.lower(), str(q)).strip() == "valid"
    t = gtypes.BY_NAME[name]
    data = np.fromfile(q, np.uint8)
    fields = [2 * k for k in range(t.fp16_fields)]          # scale; and zero for the HQQ types
    for off in fields:
        bad = data.copy()
        bad[t.type_size + off: t.type_size + off + 2] = np.array([0x00, 0x7E], np.uint8)  # fp16 NaN in block 1
        p = tmp_path / f"bad{off}.q"
        bad.tofile(p)
        r = subprocess.run([str(native.tool("gguftool-check")), "validate", name.lower(), str(p)],
                           capture_output=True, text=True)
        assert r.returncode == 3 and r.stdout.strip() == "invalid", r.stdout + r.stderr


# ----------------------------------------------------------------------------- whole models

PPL_RE = re.compile(r"Final estimate: PPL = ([0-9.]+|nan|inf)")


def perplexity(native, model: Path, *extra: str, chunks: int = 3, ctx: int = 256, env: dict | None = None) -> float:
    cmd = [str(native.tool("llama-perplexity")), "-m", str(model), "-f", str(TEXT), "-c", str(ctx),
           "--chunks", str(chunks), "-t", "2", "-b", str(ctx), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{out[-3000:]}"
    m = PPL_RE.search(out)
    assert m, f"no final estimate in output:\n{out[-2000:]}"
    return float(m.group(1))


@pytest.fixture(scope="session")
def kv_ppl(native, smollm2):
    """f16-cache perplexity of the stock model: the reference every quantized cache is judged by."""
    cache = {}

    def run(k: str, v: str, rot: bool = True) -> float:
        key = (k, v, rot)
        if key not in cache:
            cache[key] = perplexity(native, smollm2, "-fa", "on", "-ctk", k, "-ctv", v,
                                    env=None if rot else {"LLAMA_ATTN_ROT_DISABLE": "1"})
        return cache[key]
    return run


def test_stock_quantized_model_runs(kv_ppl):
    # a Q4_1 model through the whole CPU path (the AMX crash of upstream #20824 would abort here)
    ppl = kv_ppl("f16", "f16")
    assert math.isfinite(ppl) and 1.0 < ppl < 100.0


@pytest.mark.parametrize("k,v", [("q4_hqq", "q4_hqq"), ("tq3_0", "tq3_0"), ("tq3_0", "f16"), ("f16", "tq3_0"),
                                 ("q4_hqq", "q8_0"), ("tq3_1", "tq3_1"), ("tq3_2", "tq3_2"),
                                 ("tq3_3", "tq3_3")])
def test_kv_cache_types_give_sane_perplexity(kv_ppl, k, v):
    base = kv_ppl("f16", "f16")
    ppl = kv_ppl(k, v)
    assert math.isfinite(ppl)
    # a 3-4 bit cache costs a few percent on this model; the community TQ3 K-cache bug gave 100s
    assert ppl < 1.5 * base, (k, v, ppl, base)


def test_tq3_k_cache_in_range_of_v_cache(kv_ppl):
    k_only, v_only, base = kv_ppl("tq3_0", "f16"), kv_ppl("f16", "tq3_0"), kv_ppl("f16", "f16")
    # K feeds the softmax logits and is the more sensitive side (measured here: +10-15% for K,
    # +2-3% for V), but the same order: the community K-cache bug (RMS scale, zero blocks forced
    # to 1) gave perplexities in the hundreds, 10x the V-only run
    assert k_only < 1.25 * v_only and k_only < 1.25 * base, (k_only, v_only, base)


def test_tq3_1_leans_on_the_upstream_rotation(kv_ppl):
    """TQ3_1 is TQ3_0 without the per-block Hadamard: behind llama.cpp's head-wide rotation it must
    cost no more than TQ3_0 does; without that rotation (raw keys, outlier channels) it is worse."""
    rot, tq3 = kv_ppl("tq3_1", "tq3_1"), kv_ppl("tq3_0", "tq3_0")
    assert rot <= 1.03 * tq3, (rot, tq3)
    assert kv_ppl("tq3_1", "tq3_1", rot=False) > rot


def test_per_layer_cache_types(native, smollm2, tmp_path):
    """GGUFTOOL_KV_LAYERS_K (docs/kv.md): the named layers get that K type, the cache grows by exactly
    their extra bytes, a KLD against the f16 cache that lies between the two uniform caches, and a bad
    spec is named and unused. KLD over the whole excerpt (13 x 256): PPL over 2 chunks is noise at this size."""
    base = tmp_path / "f16.kld"
    cmd = [str(native.tool("llama-perplexity")), "-m", str(smollm2), "-f", str(TEXT), "-c", "256",
           "-t", "2", "-b", "256", "-fa", "on", "--kl-divergence-base", str(base), "-v"]

    def run(k: str, v: str, spec: str | None):
        env = {**os.environ, **({"GGUFTOOL_KV_LAYERS_K": spec} if spec is not None else {})}
        kld = [] if k == "f16" else ["--kl-divergence"]
        r = subprocess.run(cmd + ["-ctk", k, "-ctv", v] + kld, capture_output=True, text=True, timeout=600, env=env)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-3000:]
        mib = float(re.search(r"K \([a-z0-9_]+\): +([0-9.]+) MiB", out).group(1))
        m = re.search(r"Mean +KLD: +([0-9.]+)", out)
        return (float(m.group(1)) if m else None), mib, out
    run("f16", "f16", None)
    low, low_mib, _ = run("tq3_1", "tq3_1", None)
    high, high_mib, _ = run("q8_0", "tq3_1", None)
    mixed, mixed_mib, out = run("tq3_1", "tq3_1", "10-14:q8_0")
    assert "layer 12 K cache: q8_0" in out
    _, bogus_mib, out = run("tq3_1", "tq3_1", "10-14:q8_0,bogus")   # a spec with a bad item is refused whole
    assert "ignoring 'bogus'" in out and bogus_mib == low_mib
    assert mixed_mib == pytest.approx(low_mib + (high_mib - low_mib) * 5 / 30, abs=0.01)
    # measured: 0.027 < 0.139 < 0.208 (five of 30 layers hold a third of the K side's KLD)
    assert high < mixed < 0.9 * low, (high, mixed, low)


def test_per_layer_plan_stored_in_the_file(native, smollm2, tmp_path):
    """kv-calibrate --k-layers' metadata: applied when the requested K type is the plan's, with a log line;
    another -ctk, GGUFTOOL_KV_LAYERS_K=off and a malformed plan run uniform; the environment overrides it."""
    from gguftool.pipeline import kvcalib
    from gguftool.pipeline.kvplan import LayerPlan
    planned, broken = tmp_path / "plan.gguf", tmp_path / "broken.gguf"
    kvcalib.write(smollm2, planned, kvcalib.plan_metadata({"k": LayerPlan.parse("tq3_1=10-14:q8_0")}), {})
    kvcalib.write(smollm2, broken, [("gguftool.kv_layers.k", "10-99:q8_0", GGUFValueType.STRING, None),
                                    ("gguftool.kv_layers.k.for", "tq3_1", GGUFValueType.STRING, None)], {})

    def k_mib(model, k: str, **env):
        cmd = [str(native.tool("llama-perplexity")), "-m", str(model), "-f", str(TEXT), "-c", "256",
               "--chunks", "1", "-t", "2", "-b", "256", "-fa", "on", "-ctk", k, "-ctv", "tq3_1", "-v"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, **env})
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-3000:]
        return float(re.search(r"K \([a-z0-9_]+\): +([0-9.]+) MiB", out).group(1)), out

    uniform, _ = k_mib(smollm2, "tq3_1")
    high, _ = k_mib(smollm2, "q8_0")
    mib, out = k_mib(planned, "tq3_1")
    assert "layers 10-14:q8_0 from the file's plan" in out
    assert mib == pytest.approx(uniform + (high - uniform) * 5 / 30, abs=0.01)
    other, out = k_mib(planned, "q8_0")
    assert other == high and "plan is for tq3_1; q8_0 runs on every layer" in out
    off, out = k_mib(planned, "tq3_1", GGUFTOOL_KV_LAYERS_K="off")
    assert off == uniform and "GGUFTOOL_KV_LAYERS_K=off" in out
    env, out = k_mib(planned, "tq3_1", GGUFTOOL_KV_LAYERS_K="3:q8_0")
    assert env == pytest.approx(uniform + (high - uniform) / 30, abs=0.01) and "layer 3 K cache: q8_0" in out
    bad, out = k_mib(broken, "tq3_1")
    assert bad == uniform and "gguftool.kv_layers.k: '10-99:q8_0'" in out


def test_quantized_v_turns_flash_attention_on(native, smollm2):
    cmd = [str(native.tool("llama-perplexity")), "-m", str(smollm2), "-f", str(TEXT), "-c", "128",
           "--chunks", "1", "-t", "2", "-fa", "auto", "-ctv", "q4_hqq"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    # the integration raises upstream's INFO line to a warning, visible at default verbosity
    assert "enabling flash_attn since it is required for quantized V cache (q4_hqq)" in r.stdout + r.stderr


@pytest.fixture(scope="session")
def q4_hqq_model(smollm2, tmp_path_factory):
    out = tmp_path_factory.mktemp("native") / "smollm2-q4_hqq.gguf"
    r = subprocess.run([sys.executable, "-m", "gguftool", "quantize", str(smollm2), str(out), "Q4_HQQ",
                        "--allow-requantize", "-t", "2"], capture_output=True, text=True, timeout=1200)
    if r.returncode != 0:
        pytest.fail(f"gguftool quantize failed: {r.stderr[-2000:]}")
    return out


def test_q4_hqq_weights_run_in_llama_cpp(native, smollm2, q4_hqq_model, kv_ppl):
    ppl = perplexity(native, q4_hqq_model, "-fa", "on")
    base = kv_ppl("f16", "f16")   # the stock Q4_1 file, same text and settings
    assert math.isfinite(ppl)
    # the weights already sit on a Q4_1 grid, so HQQ requantization can only lose a little
    assert ppl < 1.15 * base, (ppl, base)


@pytest.mark.parametrize("qtype", ["Q4_HQQ", "Q8_0", "Q4_0"])
def test_llama_quantize_matches_gguftool_quantize(native, smollm2, tmp_path, qtype):
    """llama-quantize and `gguftool quantize` write the same tensor bytes: for Q8_0/Q4_0 gguftool's
    numpy path equals ggml's reference quantizers; for Q4_HQQ both run the shared HQQ kernel
    (both dequantize the stock Q4_1; --pure: no per-tensor mixing)."""
    from gguftool.io.reader import GGUFFile
    lq, gt = tmp_path / "llama-quantize.gguf", tmp_path / "gguftool.gguf"
    r = subprocess.run([str(native.tool("llama-quantize")), "--allow-requantize", "--pure", str(smollm2), str(lq),
                        qtype, "2"], capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "gguftool", "quantize", str(smollm2), str(gt), qtype,
                        "--allow-requantize", "--pure", "-t", "2"], capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-2000:]
    a, b = GGUFFile(lq), GGUFFile(gt)
    assert sorted(t.name for t in a.tensors) == sorted(t.name for t in b.tensors)
    n_target = 0
    for t in a.tensors:
        u = b.tensor(t.name)
        assert t.type.name == u.type.name, t.name
        assert np.array_equal(t.raw_rows(), u.raw_rows()), f"{t.name} ({t.type.name}) differs"
        n_target += t.type.name == qtype
    assert n_target >= 211   # every matrix of the 30 layers, and the embedding
    assert b.get("general.file_type") == a.get("general.file_type") is not None   # ours: the type id
    # both record the custom types the file uses, and only those
    rec = {f: {k: x.get(k) for k in x.fields if k.startswith(gtypes.META_PREFIX)} for f, x in (("lq", a), ("gt", b))}
    assert rec["lq"] == rec["gt"] == ({f"{gtypes.META_PREFIX}Q4_HQQ.{k}": getattr(gtypes.BY_NAME["Q4_HQQ"], k)
                                       for k in gtypes.META_FIELDS} if qtype == "Q4_HQQ" else {})
    if qtype != "Q4_HQQ":
        # gguftool's standard-type file runs in llama.cpp: Q8_0 of a Q4_1-grid model is near lossless
        ppl, base = perplexity(native, gt, "-fa", "on"), perplexity(native, smollm2, "-fa", "on")
        assert math.isfinite(ppl) and ppl < (1.02 if qtype == "Q8_0" else 1.5) * base, (qtype, ppl, base)


def test_gemma3_q4_hqq_weights_run_in_llama_cpp(native, gemma, tmp_path):
    """End to end on a second real model, Gemma 3 270M (262k vocabulary, head dim 256, tied
    embeddings): gguftool requantizes its Q4_K_M weights to Q4_HQQ and to Q4_0 (llama.cpp's
    reference Q4_0, the stock 4-bit type without a zero) and llama.cpp runs all three files."""
    files = {}
    for qtype in ("Q4_HQQ", "Q4_0"):
        files[qtype] = tmp_path / f"gemma-{qtype}.gguf"
        r = subprocess.run([sys.executable, "-m", "gguftool", "quantize", str(gemma), str(files[qtype]), qtype,
                            "--allow-requantize", "-t", "2"], capture_output=True, text=True, timeout=1200)
        assert r.returncode == 0, r.stderr[-2000:]
    base = perplexity(native, gemma, "-fa", "on", chunks=2)
    hqq = perplexity(native, files["Q4_HQQ"], "-fa", "on", chunks=2)
    q40 = perplexity(native, files["Q4_0"], "-fa", "on", chunks=2)
    assert all(math.isfinite(v) for v in (base, hqq, q40)), (base, hqq, q40)
    # requantizing 4-6 bit weights costs something; Q4_HQQ (scale + fp16 zero) must cost less
    # than Q4_0 (scale only) and stay near the source (40 x 512 figures in docs/native.md)
    assert hqq < q40 and hqq < 1.2 * base, (base, hqq, q40)
