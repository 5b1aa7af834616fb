"""gguftool validate on the real SmolLM2-135M with the real llama.cpp tools.

The reference for every number is a hand run of the same llama.cpp tool with the same flags,
written out here independently of gguftool.validate, parsed with this file's own regexes.
Needs `gguftool native build` (local) and the static aarch64 build (`gguftool validate
--build-arm64`, for qemu-arm64 / adb); each test skips with the reason when its build is absent
(GGUFTOOL_NATIVE_REQUIRED=1 turns the skips into failures). Runs a few short chunks only."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from gguftool.errors import GgufToolError
from gguftool.validate import session
from gguftool.validate.runners import AdbRunner, LocalRunner, QemuRunner

pytestmark = pytest.mark.native

HERE = Path(__file__).parent
TEXT = HERE / "data" / "native_pride_excerpt.txt"
FAKE_ADB = HERE / "fake_adb"
CTX, CHUNKS = 128, 3
THREADS = "1"   # llama.cpp's spinning thread barriers crawl on an oversubscribed 2-core CI box


def _skip_or_fail(msg: str):
    if os.environ.get("GGUFTOOL_NATIVE_REQUIRED"):
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="module")
def local_bins() -> Path:
    from gguftool.native import tools
    try:
        b = tools.find_build()
    except GgufToolError as e:
        _skip_or_fail(f"{e.message} ({e.hint})")
    if not all((b.bin_dir / t).is_file() for t in session.TOOLS):
        _skip_or_fail(f"the native build in {b.bin_dir} lacks {session.TOOLS}")
    return b.bin_dir


@pytest.fixture(scope="module")
def arm_bins() -> Path:
    from gguftool.validate import cross
    try:
        return cross.find_cross_build().bin_dir
    except GgufToolError as e:
        _skip_or_fail(f"{e.message} ({e.hint})")


def _settings(**kw) -> session.Settings:
    base = dict(ctx=CTX, chunks=CHUNKS, threads=int(THREADS), bench_p=32, bench_n=8, bench_reps=2, gen_tokens=12)
    base.update(kw)
    return session.Settings(**base)


def hand(argv: list[str]) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout + r.stderr


def hand_kld(bins: Path, model: Path, base: Path, k: str, v: str, prefix: list[str] = ()) -> tuple[float, float]:
    log = hand([*prefix, str(bins / "llama-perplexity"), "-m", str(model), "-c", str(CTX), "-b", str(CTX), "-t", THREADS,
                "-fa", "on", "-ctk", k, "-ctv", v, "--kl-divergence-base", str(base), "--kl-divergence"])
    ppl = float(re.search(r"Mean PPL\(Q\)\s+:\s+([0-9.]+)", log).group(1))
    kld = float(re.search(r"Mean\s+KLD:\s+(-?[0-9.]+)", log).group(1))   # self-divergence can round below 0
    return ppl, kld


def test_local_isolate_matches_hand_runs(local_bins, smollm2, tmp_path):
    r = LocalRunner(local_bins, tmp_path / "runs")
    rec = session.run_validation(r, smollm2, TEXT, _settings(), [("q4_hqq", "tq3_0")],
                                 isolate_types=["f16", "tq3_0"], log=lambda m: None)
    cells = {(c["k"], c["v"]): c for c in rec["cells"]}
    assert set(cells) == {("f16", "f16"), ("tq3_0", "f16"), ("f16", "tq3_0"), ("tq3_0", "tq3_0"), ("q4_hqq", "tq3_0")}
    assert not any(c.get("failed") for c in cells.values())
    # the attention-score error on keys dumped from this run: f16 rounding is tiny, 3-bit K is not
    ks = rec["k_score_error"]
    assert set(ks["types"]) == {"f16", "tq3_0"} and ks["layers"] == 30 and not ks["calibrated"]
    assert ks["types"]["f16"]["rel_rms"] < 2e-3 < 0.1 < ks["types"]["tq3_0"]["rel_rms"] < 0.5
    # the reference PPL, by hand: same text, chunks, context, f16 cache
    base = tmp_path / "hand.kld"
    log = hand([str(local_bins / "llama-perplexity"), "-m", str(smollm2), "-f", str(TEXT), "-c", str(CTX),
                "-b", str(CTX), "--chunks", str(CHUNKS), "-t", THREADS, "-fa", "on", "-ctk", "f16", "-ctv", "f16",
                "--kl-divergence-base", str(base)])
    assert float(re.search(r"Final estimate: PPL = ([0-9.]+)", log).group(1)) == round(rec["reference"]["ppl"], 4)
    for (k, v) in [("tq3_0", "f16"), ("q4_hqq", "tq3_0")]:
        ppl, kld = hand_kld(local_bins, smollm2, base, k, v)
        assert (ppl, kld) == (round(cells[(k, v)]["ppl"], 6), round(cells[(k, v)]["kld"], 6)), (k, v)
    # the f16 logits file gives the f16 model its own PPL back in KL mode (the file stores log-probs
    # as 16-bit steps, so the self-divergence is ~1e-6, not exactly 0)
    ppl, kld = hand_kld(local_bins, smollm2, base, "f16", "f16")
    assert abs(kld) < 1e-4 and math.isclose(ppl, rec["reference"]["ppl"], rel_tol=1e-4)
    # KV memory column: SmolLM2 30 layers x 3 KV heads x 64, tq3_0 = 14 B per 32 values
    assert cells[("tq3_0", "tq3_0")]["kv_bytes_per_token"] == 30 * 3 * 128 * 14 / 32
    # the sample is what llama-completion gives by hand with the same seed and flags
    perf = {(p["k"], p["v"]): p for p in rec["perf"]}
    s = rec["settings"]
    out = subprocess.run([str(local_bins / "llama-completion"), "-m", str(smollm2), "-p", s["prompt"], "-n", "12",
                          "--seed", "42", "--temp", "0", "-c", "256", "-t", THREADS, "-fa", "on", "-ctk", "q4_hqq",
                          "-ctv", "tq3_0", "-no-cnv", "--no-warmup"], capture_output=True, text=True, timeout=600).stdout
    assert perf[("q4_hqq", "tq3_0")]["sample"]["text"] == out.split(s["prompt"], 1)[1].strip()
    assert perf[("q4_hqq", "tq3_0")]["sample"]["text"]
    # bench rows are llama-bench's own, for the asked configuration
    b = perf[("q4_hqq", "tq3_0")]["bench"]
    assert (b["pp"]["type_k"], b["pp"]["type_v"], b["pp"]["n_prompt"], b["tg"]["n_gen"]) == ("q4_hqq", "tq3_0", 32, 8)
    assert b["pp"]["avg_ts"] > 0 and len(b["tg"]["samples_ts"]) == 2
    assert all(c["peak_rss_kib"] > 10 * 1024 for c in cells.values())   # the model alone is ~90 MB mapped


def test_cli_writes_the_report(local_bins, smollm2, tmp_path):
    out = tmp_path / "rep"
    r = subprocess.run([sys.executable, "-m", "gguftool", "validate", str(smollm2), "--target", "local",
                        "--bin-dir", str(local_bins), "--kv", "q8_0", "--text", str(TEXT), "--ctx", str(CTX),
                        "--chunks", "2", "--threads", THREADS, "--no-sample", "--bench-p", "16", "--bench-n", "4", "--reps", "1",
                        "--sustained", "3", "--out", str(out)], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads((out / "report.json").read_text())
    assert [(c["k"], c["v"]) for c in doc["cells"]] == [("f16", "f16"), ("q8_0", "q8_0")]
    assert doc["cells"][1]["kld"] < 0.05 and doc["ok"] is True
    sus = [p["sustained"] for p in doc["perf"] if p.get("sustained")]
    assert sus and all(len(s["points"]) >= 1 and all(p["tps"] > 0 for p in s["points"]) for s in sus)
    md = (out / "report.md").read_text()
    assert "| q8_0 | q8_0 |" in md and "llama-bench" in md


def test_qemu_arm64_within_noise_of_local(local_bins, arm_bins, smollm2, tmp_path):
    """Same model, text and flags; the arm64 build (NEON kernels) under qemu vs the host build."""
    st = _settings(chunks=2, bench=False, sample=False)
    kv = [("q4_hqq", "q4_hqq")]
    loc = session.run_validation(LocalRunner(local_bins, tmp_path / "l"), smollm2, TEXT, st, kv, log=lambda m: None)
    arm = session.run_validation(QemuRunner(arm_bins, tmp_path / "q"), smollm2, TEXT, st, kv, log=lambda m: None)
    (lr, lq), (ar, aq) = loc["cells"], arm["cells"]
    assert (lq["k"], lq["v"]) == (aq["k"], aq["v"]) == kv[0]
    # f16 cache: only float summation order differs (AVX2 vs NEON) - within 1 %
    assert abs(math.log(lr["ppl"] / ar["ppl"])) < 0.01, (lr["ppl"], ar["ppl"])
    # quantized cache: different SIMD kernels round differently, so each target's loss against its
    # own f16 run is a noisy estimate; within 3 sigma of the uncertainties llama-perplexity reports
    # (measured: ln ratio 0.049 +/- 0.028 local vs 0.010 +/- 0.028 arm64; KLD 0.058 +/- 0.007 vs 0.043 +/- 0.003)
    for key in ("ln_ppl_ratio", "kld"):
        sigma = math.hypot(lq[f"{key}_err"], aq[f"{key}_err"])
        assert abs(lq[key] - aq[key]) < 3 * sigma, (key, lq[key], aq[key], sigma)
    assert lq["kld"] < 0.2 and aq["kld"] < 0.2   # and neither is broken


def test_adb_sequence_on_fake_phone_matches_qemu(arm_bins, smollm2, tmp_path, monkeypatch):
    """The whole validate run over (fake) adb: push, run on the 'phone' (qemu-user), pull - numbers equal the
    same binaries run directly under qemu, and a second run pushes nothing."""
    monkeypatch.setenv("PATH", f"{FAKE_ADB}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ADB_ROOT", str(tmp_path / "phone"))
    monkeypatch.delenv("FAKE_ADB_STATE", raising=False)
    monkeypatch.delenv("FAKE_ADB_CAPACITY", raising=False)
    st = _settings(ctx=64, chunks=2, bench=False, sample=True, gen_tokens=4)
    kv = [("tq3_0", "tq3_0")]
    adb = session.run_validation(AdbRunner(arm_bins, tmp_path / "a"), smollm2, TEXT, st, kv, log=lambda m: None)
    q = session.run_validation(QemuRunner(arm_bins, tmp_path / "q"), smollm2, TEXT, st, kv, log=lambda m: None)
    assert [(c["ppl"], c["kld"]) for c in adb["cells"]] == [(c["ppl"], c["kld"]) for c in q["cells"]]
    assert adb["perf"][1]["sample"]["text"] == q["perf"][1]["sample"]["text"]
    assert not any(p["skipped"] for p in adb["pushes"])
    again = AdbRunner(arm_bins, tmp_path / "a2")
    again.prepare(["llama-perplexity", "llama-completion"])   # what the first run pushed (no bench)
    again.push(smollm2)
    assert all(p["skipped"] for p in again.pushed)


def _validate_fails(local_bins, model: Path, text: Path, tmp_path) -> str:
    r = subprocess.run([sys.executable, "-m", "gguftool", "validate", str(model), "--target", "local",
                        "--bin-dir", str(local_bins), "--kv", "q8_0", "--text", str(text), "--ctx", str(CTX),
                        "--chunks", "2", "--threads", THREADS, "--no-sample", "--no-bench", "--out", str(tmp_path / "rep")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    return r.stderr


def test_a_failed_reference_run_is_blamed_on_what_its_log_says(local_bins, smollm2, tmp_path):
    """The hint follows llama-perplexity's own words: a short text is blamed on the text, a model
    llama.cpp cannot load on the model, never the one on the other's cause."""
    short = tmp_path / "short.txt"
    short.write_text("It is a truth universally acknowledged.\n")
    err = _validate_fails(local_bins, smollm2, short, tmp_path)
    assert "tokenizes to only" in err and "gave no result" in err   # llama-perplexity's own line, and it exits 0
    assert "text is too short" in err and "could not load the model" not in err, err

    odd = tmp_path / "odd.gguf"   # a well-formed GGUF of an architecture llama.cpp does not know
    w = gguf.GGUFWriter(str(odd), "nonesuch")
    w.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    err = _validate_fails(local_bins, odd, TEXT, tmp_path)
    assert "could not load the model" in err and "too short" not in err, err
