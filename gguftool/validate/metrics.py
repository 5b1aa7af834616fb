"""Read the numbers out of llama.cpp's tools: perplexity, KL divergence, llama-bench JSON, timings, peak RSS.

The formats are the pinned llama.cpp's (tools/perplexity/perplexity.cpp, tools/llama-bench,
common/sampling.cpp) plus the two `time -v` dialects a run meets: GNU time on Linux hosts and
toybox `time -v` on Android. Every parser returns None / raises MetricsError instead of guessing.
"""
from __future__ import annotations

import json
import math
import re

from ..errors import GgufToolError

_NUM = r"([-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|nan|-?inf))"
_PM = r"\s*(?:±|\+/-)\s*"

PPL_RE = re.compile(r"Final estimate: PPL = " + _NUM + r" \+/- " + _NUM)
KLD_FIELDS = {
    # key: (regex, groups) - lines of perplexity.cpp's kl_divergence() summary
    "ppl": (r"Mean PPL\(Q\)\s*:\s*" + _NUM + _PM + _NUM, ("ppl", "ppl_err")),
    "ppl_base": (r"Mean PPL\(base\)\s*:\s*" + _NUM + _PM + _NUM, ("ppl_base", "ppl_base_err")),
    "ln_ratio": (r"Mean ln\(PPL\(Q\)/PPL\(base\)\)\s*:\s*" + _NUM + _PM + _NUM, ("ln_ppl_ratio", "ln_ppl_ratio_err")),
    "kld": (r"Mean\s+KLD:\s*" + _NUM + _PM + _NUM, ("kld", "kld_err")),
    "kld_max": (r"Maximum KLD:\s*" + _NUM, ("kld_max",)),
    "kld_99": (r"99\.0%\s+KLD:\s*" + _NUM, ("kld_p99",)),
    "kld_med": (r"Median\s+KLD:\s*" + _NUM, ("kld_median",)),
    "rms_dp": (r"RMS Δp\s*:\s*" + _NUM + _PM + _NUM + r"\s*%", ("rms_dp_pct", "rms_dp_pct_err")),
    "top": (r"Same top p:\s*" + _NUM + _PM + _NUM + r"\s*%", ("same_top_p_pct", "same_top_p_pct_err")),
}
GNU_RSS_RE = re.compile(r"Maximum resident set size \(kbytes\):\s*(\d+)")
TOYBOX_RSS_RE = re.compile(r"Max RSS \(KiB\):\s*(\d+)")
PERF_RE = re.compile(r"(prompt eval|eval) time =\s*" + _NUM + r" ms /\s*(\d+) (?:tokens|runs)\s*\(\s*" + _NUM
                     + r" ms per token,\s*" + _NUM + r" tokens per second\)")


class MetricsError(GgufToolError):
    """A tool ran but its output lacks the numbers we need (crash, wrong flags, too little text)."""


def _f(s: str) -> float:
    return float(s)  # float() already reads nan / inf / -inf


def error_lines(log: str, limit: int = 6) -> list[str]:
    """The lines a user needs when a run failed: llama.cpp's error / abort lines, else the tail."""
    keep = [l.strip() for l in log.splitlines()
            if re.search(r"error|failed|abort|unsupported|GGML_ASSERT|Segmentation|not enough|too few", l, re.I)
            or re.match(r"\s*[0-9.]+ E ", l)]   # llama.cpp's timestamped log marks its error lines with E
    return (keep or [l.strip() for l in log.splitlines() if l.strip()])[-limit:]


# (what the log says, what to do about it): first match wins, so the specific causes come first
_HINTS = (
    (r"you need at least \d+ tokens|tokenizes to only|there are only \d+ tokens, this is not enough",
     "the text is too short for ctx x chunks: give a longer --text or lower --chunks/--ctx"),
    (r"Unsupported cache type|unsupported .*type", "this llama.cpp build lacks that cache type: "
     "rebuild ours with `gguftool native build`, or pick another --kv"),
    (r"error loading model|failed to load model|unknown model architecture|invalid magic|tensor .* data is not within",
     "llama.cpp could not load the model: check it with `gguftool inspect`"),
    (r"failed to allocate|unable to allocate|out of memory|std::bad_alloc|cannot allocate memory",
     "the run ran out of memory: lower --ctx or use a smaller K/V type"),
)


def failure_hint(log: str, rc: int) -> str:
    """A hint that names the likely cause of a failed llama.cpp run, from its log and exit status."""
    for pattern, hint in _HINTS:
        if re.search(pattern, log, re.I):
            return hint
    if rc in (-9, 137):
        return "the tool was killed (SIGKILL; on a phone or small box usually the out-of-memory killer): lower --ctx"
    if rc < 0 or rc >= 128:
        return f"the tool died of signal {-rc if rc < 0 else rc - 128}: rerun it by hand with the command in the log"
    return "rerun it by hand with the command in the log to see its full output"


def parse_ppl(log: str) -> dict | None:
    """llama-perplexity's final estimate: {'ppl', 'ppl_err'} or None."""
    m = PPL_RE.search(log)
    return {"ppl": _f(m.group(1)), "ppl_err": _f(m.group(2))} if m else None


# one row of kl_divergence()'s running table: chunk, PPL, ln(PPL(Q)/PPL(base)), KLD, RMS dp %, same top %
KLD_ROW_RE = re.compile(r"^\s*(\d+)" + (r"\s+" + _NUM + _PM + _NUM) * 3 + (r"\s+" + _NUM + _PM + _NUM + r"\s*%") * 2
                        + r"\s*$", re.M)
KLD_ROW_NAMES = ("ppl", "ppl_err", "ln_ppl_ratio", "ln_ppl_ratio_err", "kld", "kld_err", "rms_dp_pct",
                 "rms_dp_pct_err", "same_top_p_pct", "same_top_p_pct_err")


def parse_kld(log: str) -> dict | None:
    """llama-perplexity --kl-divergence summary, or None when there is none.

    llama-perplexity skips its summary below 100 scored tokens (ctx/2 x chunks); the running
    table's last row holds the same cumulative means (PPL, ln ratio, KLD, RMS dp, same top),
    so that row is used then ('kld_source': 'table'). Percent fields stay in percent; KLD in nats."""
    out: dict = {}
    for rx, names in KLD_FIELDS.values():
        m = re.search(rx, log)
        if m:
            out.update({n: _f(g) for n, g in zip(names, m.groups())})
    if "kld" in out:
        out["kld_source"] = "summary"
        return out
    rows = KLD_ROW_RE.findall(log)
    if not rows:
        return None
    out = {n: _f(g) for n, g in zip(KLD_ROW_NAMES, rows[-1][1:])}
    out["kld_source"] = "table"
    out["chunks"] = int(rows[-1][0])
    return out


def parse_peak_rss_kib(log: str) -> int | None:
    """Peak resident set (KiB) from GNU `time -v` or toybox `time -v` output; the last one wins."""
    hits = GNU_RSS_RE.findall(log) or TOYBOX_RSS_RE.findall(log)
    return int(hits[-1]) if hits else None


def strip_time_v(log: str) -> str:
    """The tool's own stderr without the `time -v` block appended after it."""
    i = log.rfind("\tCommand being timed:")
    if i >= 0:
        return log[:i]
    lines = log.splitlines(keepends=True)
    j = next((n for n, l in enumerate(lines) if l.startswith("real") or l.startswith("Real time (s):")), None)
    return "".join(lines[:j]) if j is not None and TOYBOX_RSS_RE.search(log) else log


def parse_perf(log: str) -> dict:
    """Timings llama-completion prints at exit: prompt and generation tokens/s (and counts)."""
    out: dict[str, float] = {}
    for m in PERF_RE.finditer(log):
        key = "prompt" if m.group(1) == "prompt eval" else "gen"
        out[f"{key}_ms"] = _f(m.group(2))
        out[f"{key}_tokens"] = int(m.group(3))
        out[f"{key}_tps"] = _f(m.group(5))
    return out


def parse_bench(text: str) -> list[dict]:
    """llama-bench `-o json`: one dict per test with the fields the report uses.
    Raises MetricsError when the text holds no JSON array (llama-bench failed before printing)."""
    i, j = text.find("["), text.rfind("]")
    try:
        rows = json.loads(text[i:j + 1]) if i >= 0 and j > i else None
    except ValueError:
        rows = None
    if not isinstance(rows, list):
        raise MetricsError("llama-bench printed no JSON results", "; ".join(error_lines(text)) or None)
    out = []
    for r in rows:
        n_p, n_g = int(r.get("n_prompt", 0)), int(r.get("n_gen", 0))
        out.append({
            "test": f"pp{n_p}" if n_g == 0 else (f"tg{n_g}" if n_p == 0 else f"pp{n_p}+tg{n_g}"),
            "type_k": r.get("type_k"), "type_v": r.get("type_v"), "n_threads": r.get("n_threads"),
            "flash_attn": r.get("flash_attn"), "n_prompt": n_p, "n_gen": n_g,
            "avg_ts": float(r["avg_ts"]), "stddev_ts": float(r.get("stddev_ts", 0.0)),
            "samples_ts": [float(x) for x in r.get("samples_ts", [])],
            "samples_ns": [int(x) for x in r.get("samples_ns", [])],
            "model_size": r.get("model_size"), "build_commit": r.get("build_commit"),
        })
    return out


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
