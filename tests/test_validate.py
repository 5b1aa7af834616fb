"""gguftool validate without the native build: parsers, the isolation rule, the report, runners.

References: llama.cpp's own printf formats (copied verbatim from the pinned tools and filled
with random values - the parser must give the values back), GNU time's own measurement of the
same child, Python's sha256 of the files, and synthetic K/V tables shaped like the article's
TQ3_0 K-cache bug and like DESIGN.md's measured healthy matrix."""
from __future__ import annotations

import json
import math
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gguftool.errors import GgufToolError
from gguftool.pipeline import kvplan
from gguftool.validate import isolate, metrics, report, session
from gguftool.validate.runners import LocalRunner

# -- llama.cpp output formats, verbatim from the pinned sources ---------------------------------
# tools/perplexity/perplexity.cpp
FMT_FINAL = "Final estimate: PPL = %.4lf +/- %.5lf\n"
FMT_KLD = [
    ("Mean PPL(Q)                   : %10.6lf ± %10.6lf\n", ("ppl", "ppl_err")),
    ("Mean PPL(base)                : %10.6lf ± %10.6lf\n", ("ppl_base", "ppl_base_err")),
    ("Cor(ln(PPL(Q)), ln(PPL(base))): %6.2lf%%\n", (None,)),
    ("Mean ln(PPL(Q)/PPL(base))     : %10.6lf ± %10.6lf\n", ("ln_ppl_ratio", "ln_ppl_ratio_err")),
    ("Mean PPL(Q)/PPL(base)         : %10.6lf ± %10.6lf\n", (None, None)),
    ("Mean PPL(Q)-PPL(base)         : %10.6lf ± %10.6lf\n", (None, None)),
    ("Mean    KLD: %10.6lf ± %10.6lf\n", ("kld", "kld_err")),
    ("Maximum KLD: %10.6f\n", ("kld_max",)),
    ("99.9%%   KLD: %10.6f\n", (None,)),
    ("99.0%%   KLD: %10.6f\n", ("kld_p99",)),
    ("Median  KLD: %10.6f\n", ("kld_median",)),
    ("Mean    Δp: %6.3lf ± %5.3lf %%\n", (None, None)),
    ("RMS Δp    : %6.3lf ± %5.3lf %%\n", ("rms_dp_pct", "rms_dp_pct_err")),
    ("Same top p: %6.3lf ± %5.3lf %%\n", ("same_top_p_pct", "same_top_p_pct_err")),
]
# src/llama-context.cpp (llama_perf_context_print)
FMT_PROMPT = "%s: prompt eval time = %10.2f ms / %5d tokens (%8.2f ms per token, %8.2f tokens per second)\n"
FMT_EVAL = "%s:        eval time = %10.2f ms / %5d runs   (%8.2f ms per token, %8.2f tokens per second)\n"

FAKE_ADB = Path(__file__).parent / "fake_adb"


def _close(a: float, b: float, digits: int) -> bool:
    return abs(a - b) <= 0.51 * 10 ** -digits


def test_parse_ppl_and_kld_from_llama_formats():
    rnd = random.Random(7)
    for _ in range(50):
        ppl, err = rnd.uniform(1, 900), rnd.uniform(0, 5)
        log = "noise\n" + FMT_FINAL % (ppl, err) + "llama_perf_context_print: total\n"
        got = metrics.parse_ppl(log)
        assert _close(got["ppl"], ppl, 4) and _close(got["ppl_err"], err, 5)
        want, lines = {}, ["chunk  PPL  ln(PPL(Q)/PPL(base))  KL Divergence\n", "   1   22.1 ± 3.0\n"]
        for fmt, names in FMT_KLD:
            vals = [rnd.uniform(0, 500) for _ in names]
            lines.append(fmt % tuple(vals) if "%" in fmt.replace("%%", "") else fmt % ())
            want.update({n: v for n, v in zip(names, vals) if n})
        got = metrics.parse_kld("".join(lines))
        assert got.pop("kld_source") == "summary" and set(got) == set(want)
        for n, v in want.items():
            assert _close(got[n], v, 3 if "pct" in n else 6), (n, got[n], v)
    assert metrics.parse_ppl("main: error: failed to load model") is None
    assert metrics.parse_kld("Final estimate: PPL = 3.0 +/- 0.1") is None
    assert metrics.parse_ppl("Final estimate: PPL = nan +/- nan")["ppl"] != metrics.parse_ppl(
        "Final estimate: PPL = nan +/- nan")["ppl"]   # NaN survives as NaN, not as a number


# kl_divergence()'s running table row (printed per chunk; the summary is skipped below 100 tokens)
FMT_KLD_ROW = ("%4d" + "    %9.4lf ± %9.4lf" + "    %10.5lf ± %10.5lf" + "    %10.5lf ± %10.5lf"
               + "    %6.3lf ± %6.3lf %%" + "    %6.3lf ± %6.3lf %%" + "\n")


def test_parse_kld_short_run_uses_the_last_table_row():
    rnd = random.Random(3)
    rows, vals = [], None
    for chunk in (1, 2, 3):
        vals = [rnd.uniform(1, 300), rnd.uniform(0, 50), rnd.uniform(-1, 1), rnd.uniform(0, 1), rnd.uniform(0, 2),
                rnd.uniform(0, 1), rnd.uniform(0, 30), rnd.uniform(0, 5), rnd.uniform(0, 100), rnd.uniform(0, 9)]
        rows.append(FMT_KLD_ROW % (chunk, *vals))
    log = ("kl_divergence: computing over 3 chunks\n\nchunk             PPL               ln(PPL(Q)/PPL(base))"
           "          KL Divergence              Δp RMS            Same top p\n" + "".join(rows) + "\n\n")
    got = metrics.parse_kld(log)
    assert got["kld_source"] == "table" and got["chunks"] == 3
    for name, v, digits in zip(metrics.KLD_ROW_NAMES, vals, (4, 4, 5, 5, 5, 5, 3, 3, 3, 3)):
        assert _close(got[name], v, digits), name


def test_parse_perf_and_bench_json():
    log = FMT_PROMPT % ("common_perf_print", 120.5, 19, 6.34, 157.68) + FMT_EVAL % ("common_perf_print", 410.0, 31, 13.2, 75.61)
    got = metrics.parse_perf(log)
    assert (got["prompt_tokens"], got["gen_tokens"]) == (19, 31)
    assert got["prompt_tps"] == 157.68 and got["gen_tps"] == 75.61
    # llama-bench -o json: a JSON array of test objects (fields of tools/llama-bench test::get_fields)
    rows = [{"build_commit": "0c1e570", "type_k": "q4_0", "type_v": "tq3_0", "n_threads": 2, "flash_attn": 1,
             "n_prompt": 64, "n_gen": 0, "avg_ns": 100, "stddev_ns": 1, "avg_ts": 640.25, "stddev_ts": 3.5,
             "samples_ns": [99, 101], "samples_ts": [641.0, 639.5]},
            {"build_commit": "0c1e570", "type_k": "q4_0", "type_v": "tq3_0", "n_threads": 2, "flash_attn": 1,
             "n_prompt": 0, "n_gen": 16, "avg_ns": 100, "stddev_ns": 1, "avg_ts": 90.5, "stddev_ts": 0.5,
             "samples_ns": [1, 2], "samples_ts": [90.0, 91.0]}]
    got = metrics.parse_bench("load_backend: x\n" + json.dumps(rows, indent=2))
    assert [g["test"] for g in got] == ["pp64", "tg16"]
    assert [g["avg_ts"] for g in got] == [640.25, 90.5] and got[1]["samples_ts"] == [90.0, 91.0]
    with pytest.raises(GgufToolError, match="no JSON"):
        metrics.parse_bench("error: unknown cache type tq9")


def test_time_v_parsers_gnu_and_toybox():
    gnu = "\tCommand being timed: \"x\"\n\tMaximum resident set size (kbytes): 52344\n\tExit status: 0\n"
    toy = "Real time (s): 1.5\nSystem time (s): 0.1\nUser time (s): 1.2\nMax RSS (KiB): 8123\nMajor faults: 0\n"
    assert metrics.parse_peak_rss_kib("tool output\n" + gnu) == 52344
    assert metrics.parse_peak_rss_kib(toy) == 8123
    assert metrics.strip_time_v("tool stderr\n" + toy) == "tool stderr\n"
    assert metrics.parse_peak_rss_kib("nothing") is None


def test_local_runner_peak_rss_matches_gnu_time(tmp_path):
    """wait4's ru_maxrss of the child is what GNU time -v reports for the same program."""
    gtime = shutil.which("time") and Path("/usr/bin/time")
    if not gtime or not gtime.exists():
        pytest.skip("GNU time (/usr/bin/time) not installed")
    prog = "b = bytearray(120 * 2**20); b[::4096] = b'x' * len(b[::4096]); print(len(b))"
    r = LocalRunner(Path(sys.executable).parent, tmp_path)
    res = r.run(Path(sys.executable).name, ["-c", prog], tag="alloc")
    assert res.rc == 0 and res.stdout.strip() == str(120 * 2**20)
    ref = subprocess.run([str(gtime), "-v", sys.executable, "-c", prog], capture_output=True, text=True)
    want = metrics.parse_peak_rss_kib(ref.stderr)
    assert res.peak_rss_kib >= 120 * 1024          # it touched 120 MiB
    assert abs(res.peak_rss_kib - want) < 0.1 * want


def test_local_runner_with_relative_folders(tmp_path, monkeypatch):
    """validate's default --out is relative; the tools run inside it, so every path handed to them
    (GNU time's output file included) must still point at the right place."""
    bins = tmp_path / "bins"
    bins.mkdir()
    tool = bins / "tool"
    tool.write_text("#!/bin/sh\npwd\n")
    tool.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    r = LocalRunner(Path("bins"), Path("validate-out/runs"))
    res = r.run("tool", [], tag="rel")
    assert res.rc == 0 and Path(res.stdout.strip()) == (tmp_path / "validate-out" / "runs").resolve()
    if Path("/usr/bin/time").exists():
        assert res.peak_rss_kib and res.peak_rss_kib > 0
        assert (tmp_path / "validate-out" / "runs" / "rel.out.maxrss").is_file()


# -- the isolation rule ---------------------------------------------------------------------------

def _matrix(ppl: dict[tuple[str, str], float], base: float = 22.57) -> list[dict]:
    cells = [{"k": "f16", "v": "f16", "ppl": base}]
    for (k, v), p in ppl.items():
        kld = max(0.0, math.log(p / base)) * 0.9 if math.isfinite(p) else math.nan
        cells.append({"k": k, "v": v, "ppl": p, "kld": kld})
    return cells


HEALTHY = {  # DESIGN.md, SmolLM2 Q4_1, 40 x 512 tokens, FA on, rotation on (single sides interpolated)
    ("q8_0", "f16"): 22.56, ("f16", "q8_0"): 22.56, ("q8_0", "q8_0"): 22.55,
    ("q4_0", "f16"): 23.20, ("f16", "q4_0"): 23.10, ("q4_0", "q4_0"): 23.86,
    ("q4_hqq", "f16"): 23.05, ("f16", "q4_hqq"): 23.00, ("q4_hqq", "q4_hqq"): 23.68,
    ("tq3_0", "f16"): 23.60, ("f16", "tq3_0"): 23.40, ("tq3_0", "tq3_0"): 24.60,
}


def test_isolate_healthy_matrix_has_no_flags():
    res = isolate.analyse(_matrix(HEALTHY))
    assert res["flags"] == [] and res["verdicts"] == {}


def test_isolate_names_the_k_side_for_the_community_tq3_bug():
    """The article's pattern: K=tq3_0 perplexity in the hundreds, V=tq3_0 fine."""
    t = dict(HEALTHY)
    t[("tq3_0", "f16")] = 412.0
    t[("tq3_0", "tq3_0")] = 455.0
    res = isolate.analyse(_matrix(t))
    assert res["verdicts"] == {"tq3_0": "K"}
    (f,) = res["flags"]
    assert (f["level"], f["k"], f["v"], f["side"], f["role"]) == ("bug", "tq3_0", "f16", "K", "K-only")
    assert "vec_dot" in f["message"]


def test_isolate_v_side_bug_and_failed_runs():
    t = dict(HEALTHY)
    t[("f16", "q4_hqq")] = 60.0
    t[("q4_hqq", "q4_hqq")] = 61.0
    res = isolate.analyse(_matrix(t))
    assert res["verdicts"] == {"q4_hqq": "V"}
    cells = _matrix(HEALTHY)
    for c in cells:
        if (c["k"], c["v"]) == ("q4_0", "f16"):
            c.update(ppl=math.nan, failed=True)
    res = isolate.analyse(cells)
    assert res["verdicts"] == {"q4_0": "K"} and res["flags"][0]["metric"] == "failed"


def test_isolate_interaction_and_precision_loss_not_flagged_as_bug():
    t = dict(HEALTHY)
    t[("tq3_0", "tq3_0")] = 90.0   # both sides fine alone, broken together
    res = isolate.analyse(_matrix(t))
    assert res["verdicts"] == {"tq3_0": "K+V"}
    # no rotation: q4_0 K noticeably worse than V (DESIGN.md: q4_0 both 26.53 vs 23.86) - honest
    # quantization error, below the bug level
    t = dict(HEALTHY)
    t[("q4_0", "f16")], t[("q4_0", "q4_0")] = 25.9, 26.53
    res = isolate.analyse(_matrix(t))
    assert res["verdicts"] == {}
    assert all(f["level"] == "suspect" for f in res["flags"])


def test_isolate_two_type_matrix_uses_the_other_side():
    """With only f16 and one type there are no same-side neighbours: the K/V pair decides."""
    ok = {("tq3_0", "f16"): 23.60, ("f16", "tq3_0"): 23.40, ("tq3_0", "tq3_0"): 24.60}
    assert isolate.analyse(_matrix(ok))["flags"] == []
    bad = {("tq3_0", "f16"): 412.0, ("f16", "tq3_0"): 23.40, ("tq3_0", "tq3_0"): 455.0}
    assert isolate.analyse(_matrix(bad))["verdicts"] == {"tq3_0": "K"}


def test_isolate_k_sensitivity_at_fewer_bits_is_not_a_bug():
    """K error grows faster than V's and 3.5 bits loses more than 5: a measured SmolLM2 pattern
    (2 x 128 tokens, rotation on: KLD K-only q4_0 0.039, q4_hqq 0.030, tq3_0 0.224; V-only
    0.008, 0.0065, 0.034) must not be called a bug."""
    kld = {("q8_0", "f16"): 0.0034, ("f16", "q8_0"): 0.0031, ("q4_0", "f16"): 0.039, ("f16", "q4_0"): 0.0079,
           ("q4_hqq", "f16"): 0.030, ("f16", "q4_hqq"): 0.0065, ("tq3_0", "f16"): 0.224, ("f16", "tq3_0"): 0.034}
    cells = [{"k": "f16", "v": "f16", "ppl": 35.60, "kld": 0.0}]
    for (k, v), x in kld.items():
        cells.append({"k": k, "v": v, "ppl": 35.60 * math.exp(0.75 * x), "kld": x})
    for t in ("q8_0", "q4_0", "q4_hqq", "tq3_0"):
        cells.append({"k": t, "v": t, "ppl": 35.60 * math.exp(0.75 * (kld[(t, "f16")] + kld[("f16", t)])),
                      "kld": kld[(t, "f16")] + kld[("f16", t)]})
    res = isolate.analyse(cells)
    assert res["flags"] == [], res["flags"]


def test_cells_for_and_parse_kv():
    cells = isolate.cells_for(["f16", "q8_0", "tq3_0"])
    assert cells == [("reference", "f16", "f16"), ("K-only", "q8_0", "f16"), ("V-only", "f16", "q8_0"),
                     ("both", "q8_0", "q8_0"), ("K-only", "tq3_0", "f16"), ("V-only", "f16", "tq3_0"),
                     ("both", "tq3_0", "tq3_0")]
    assert session.parse_kv("q4_hqq/TQ3_0") == ("q4_hqq", "tq3_0") and session.parse_kv("q8_0") == ("q8_0", "q8_0")
    with pytest.raises(GgufToolError, match="unknown KV cache type 'q3_k'"):
        session.parse_kv("q3_k")


def test_default_text_ships_with_the_package():
    p = session.default_text()
    head = p.read_text()[:200]
    assert p.stat().st_size > 300_000 and "PRIDE AND PREJUDICE" in head


def test_kv_columns_against_hand_computation(smollm2):
    # SmolLM2-135M: 30 layers, 3 KV heads x 64 (DESIGN.md). f16: 2 bytes; tq3_0: 14 B / 32 values.
    c = kvplan.columns(smollm2, "f16", "f16", 512)
    assert c["kv_bytes_per_token"] == 30 * 3 * (64 + 64) * 2 and c["bits_per_value"] == 16
    c = kvplan.columns(smollm2, "q4_hqq", "tq3_0", 512)
    assert c["kv_bytes_per_token"] == 30 * 3 * 64 * (20 / 32 + 14 / 32)
    assert c["bits_per_value"] == (5.0 + 3.5) / 2


def _record(tmp_path: Path) -> dict:
    model, text = tmp_path / "m.gguf", tmp_path / "t.txt"
    model.write_bytes(b"GGUF" + bytes(100))
    text.write_text("words " * 100)
    cells = _matrix({**HEALTHY, ("tq3_0", "f16"): 412.0, ("tq3_0", "tq3_0"): 455.0})
    for c in cells:
        c.update(role="config", ppl_err=0.5, peak_rss_kib=200_000, **kvplan.columns(model, c["k"], c["v"], 512))
    return {"schema": "gguftool.validate/1", "created": "2026-12-02T00:00:00Z", "seconds": 1.0,
            "model": session.file_info(model), "text": session.file_info(text),
            "target": {"target": "local", "bin_dir": "/x", "emulated": False},
            "settings": session.Settings().__dict__, "reference": {"ppl": 22.57, "ppl_err": 0.5},
            "cells": cells, "isolate": isolate.analyse(cells),
            "perf": [{"k": "f16", "v": "f16", "bench": {"pp": {"test": "pp64", "avg_ts": 400.0, "stddev_ts": 2.0},
                                                         "tg": {"test": "tg16", "avg_ts": 145.0, "stddev_ts": 1.0}},
                      "sample": {"text": "must be in want of a wife.", "gen_tps": 140.0},
                      "sustained": {"points": [{"t": i, "tps": 140.0 - i} for i in range(8)], "calls": 3,
                                    "first_quarter_tps": 139.5, "last_quarter_tps": 133.5, "retained": 0.957}}],
            "runs": [{"command": "llama-perplexity -m m.gguf", "rc": 0, "seconds": 1.0}], "ok": False}


def test_report_writes_markdown_json_and_pngs(tmp_path):
    rec = _record(tmp_path)
    paths = report.write(rec, tmp_path / "out")
    doc = json.loads(paths["json"].read_text())
    assert doc["cells"][0]["ppl"] == 22.57 and doc["isolate"]["verdicts"] == {"tq3_0": "K"}
    assert doc["model"]["sha256"] == __import__("hashlib").sha256((tmp_path / "m.gguf").read_bytes()).hexdigest()
    md = paths["md"].read_text()
    assert "| tq3_0 | 412.000 |" in md and "bug: K side" in md and "probable kernel bug" in md
    assert "llama-perplexity -m m.gguf" in md
    pytest.importorskip("matplotlib")
    for key in ("ppl_vs_bits", "tokens_per_s", "sustained"):
        assert paths[key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({paths[key].name})" in md


def test_report_json_has_no_nan(tmp_path):
    rec = _record(tmp_path)
    rec["cells"][1]["ppl"] = math.nan
    paths = report.write(rec, tmp_path / "out")
    json.loads(paths["json"].read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))


def test_cli_rerender_recomputes_the_isolation(tmp_path):
    from gguftool.cli import main
    rec = _record(tmp_path)
    rec["isolate"] = {"flags": [], "verdicts": {}, "scores": []}   # as if analysed by an older rule
    rec["ok"] = True
    report.write(rec, tmp_path / "out")
    assert main(["validate", "--rerender", str(tmp_path / "out")]) == 1   # the K-side bug is found again
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    assert doc["isolate"]["verdicts"] == {"tq3_0": "K"} and doc["ok"] is False
