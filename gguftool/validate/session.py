"""One validation run: the plan of tool invocations on a target and the record it produces.

Every number in the record comes from a llama.cpp tool run on the target; the record keeps the
exact command line of each run so a reviewer can repeat any of them by hand.

    ref  llama-perplexity -f TEXT ... -ctk f16 -ctv f16 --kl-divergence-base ref.kld     (PPL of f16)
    each llama-perplexity --kl-divergence-base ref.kld --kl-divergence -ctk K -ctv V      (PPL, KLD)
    each llama-bench -p P -n N -r R -fa 1 -ctk K -ctv V -o json                          (pp / tg t/s)
    each llama-completion -p PROMPT -n G --seed S --temp 0 -ctk K -ctv V -no-cnv          (sample)
    --sustained: llama-bench -p 0 -n N repeated for SECONDS per configuration            (t/s over time)
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import GgufToolError
from ..io.reader import require_gguf_path
from ..io.split import SHARD_NAME, model_paths
from ..pipeline.kvplan import columns as kv_columns
from ..pipeline.kvplan import parse_pair as parse_kv  # noqa: F401  ('q4_0/tq3_1' -> ('q4_0', 'tq3_1'))
from . import isolate as iso
from . import metrics
from .runners import Runner, RunResult, sha256_file

# stock peers and the recipes' caches (phone-small, max-compression; measured in docs/kv.md)
DEFAULT_KV = ("f16/f16", "q8_0/q8_0", "q4_0/q4_0", "q5_0/tq3_3", "tq3_3/tq3_3")   # the recipes' caches and their peers
DEFAULT_PROMPT = "It is a truth universally acknowledged, that a single man in possession of a good fortune,"
TOOLS = ("llama-perplexity", "llama-bench", "llama-completion")


def default_text() -> Path:
    return Path(__file__).resolve().parent.parent / "data" / "pride_and_prejudice.txt"


@dataclass
class Settings:
    ctx: int = 512
    chunks: int = 8
    threads: int = 2
    bench_p: int = 64
    bench_n: int = 16
    bench_reps: int = 3
    gen_tokens: int = 32
    seed: int = 42
    prompt: str = DEFAULT_PROMPT
    rotation: bool = True     # upstream's Q/K/V Hadamard rotation (LLAMA_ATTN_ROT_DISABLE=1 turns it off)
    bench: bool = True
    sample: bool = True
    sustained_s: float = 0.0
    sustained_n: int = 32
    timeout_s: float = 3600.0
    extra: dict = field(default_factory=dict)

    def env(self) -> dict:
        return {} if self.rotation else {"LLAMA_ATTN_ROT_DISABLE": "1"}


def _ppl_args(s: Settings, model: str) -> list[str]:
    # -b = -c: one sequence per batch, the layout llama-perplexity's KL mode also uses
    return ["-m", model, "-c", str(s.ctx), "-b", str(s.ctx), "-t", str(s.threads), "-fa", "on"]


def _kv_args(k: str, v: str) -> list[str]:
    return ["-ctk", k, "-ctv", v]


class Validation:
    def __init__(self, runner: Runner, model: Path, text: Path, settings: Settings, log=print,
                 reference_model: Path | None = None):
        self.r = runner
        self.model = Path(model)
        self.ref_model = Path(reference_model) if reference_model else None
        if self.ref_model:
            require_gguf_path(self.ref_model, "reference model file")
        self.text = Path(text)
        self.s = settings
        self.log = log
        self.runs: list[dict] = []
        require_gguf_path(self.model)
        if not self.text.is_file():
            raise GgufToolError(f"{self.text}: no such text file")

    # -- helpers
    def _run(self, tool: str, args: list[str], tag: str) -> RunResult:
        res = self.r.run(tool, args, env=self.s.env(), tag=tag, timeout=self.s.timeout_s)
        self.runs.append({"tag": tag, "command": res.command(), "rc": res.rc, "seconds": round(res.seconds, 2),
                          "peak_rss_kib": res.peak_rss_kib})
        return res

    def _fail(self, what: str, res: RunResult) -> str:
        lines = metrics.error_lines(res.log)
        how = f"exited {res.rc}" if res.rc else "gave no result"   # llama-perplexity exits 0 on a too-short text
        return f"{what} {how}: " + " | ".join(lines)

    # -- steps
    def setup(self) -> None:
        self.log(f"[{self.r.name}] preparing tools ...")
        s = self.s
        need = ["llama-perplexity"] + (["llama-bench"] if s.bench or s.sustained_s > 0 else []) + \
               (["llama-completion"] if s.sample else [])
        self.r.prepare(need)   # only what this run uses: fewer pushes to a phone
        self.model_t = self._push_model(self.model)
        self.text_t = self.r.push(self.text)
        self.ref_model_t = self._push_model(self.ref_model) if self.ref_model else self.model_t
        self.kld_t = self.r.path("reference-f16.kld")

    def _push_model(self, model: Path) -> str:
        """The model's file, and for a split model the other shards, which llama.cpp looks for beside the first."""
        if SHARD_NAME.search(model.name):
            for shard in model_paths(model):
                if shard != model:
                    self.r.push(shard)
        return self.r.push(model)

    def reference(self) -> dict:
        s = self.s
        who = self.ref_model.name if self.ref_model else "f16 K/V"
        self.log(f"[{self.r.name}] reference: perplexity of {who}, {s.chunks} x {s.ctx} tokens, saving logits")
        args = [*_ppl_args(s, self.ref_model_t), "-f", self.text_t, "--chunks", str(s.chunks), *_kv_args("f16", "f16"),
                "--kl-divergence-base", self.kld_t]
        res = self._run("llama-perplexity", args, "ref-f16")
        ppl = metrics.parse_ppl(res.log)
        if res.rc != 0 or ppl is None:
            raise GgufToolError(self._fail("the f16 reference perplexity run", res),
                                metrics.failure_hint(res.log, res.rc))
        if self.ref_model:   # another model's logits: its row is not a cell of the matrix
            return {"k": "f16", "v": "f16", "role": "reference-model", "model": str(self.ref_model), **ppl, "kld": 0.0,
                    "peak_rss_kib": res.peak_rss_kib, "command": res.command()}
        return {"k": "f16", "v": "f16", "role": "reference", **ppl, "kld": 0.0,
                "peak_rss_kib": res.peak_rss_kib, "command": res.command()}

    def cell(self, k: str, v: str, role: str = "config") -> dict:
        s = self.s
        tag = f"kld-{k}-{v}"
        args = [*_ppl_args(s, self.model_t), *_kv_args(k, v), "--kl-divergence-base", self.kld_t, "--kl-divergence"]
        res = self._run("llama-perplexity", args, tag)
        out = {"k": k, "v": v, "role": role, "peak_rss_kib": res.peak_rss_kib, "command": res.command()}
        kld = metrics.parse_kld(res.log)
        if res.rc != 0 or kld is None:
            out.update(failed=True, error=self._fail("llama-perplexity", res), hint=metrics.failure_hint(res.log, res.rc))
            self.log(f"  K={k:<10} V={v:<10} FAILED: {out['error'][:200]} (hint: {out['hint']})")
            return out
        out.update(kld)
        self.log(f"  K={k:<10} V={v:<10} PPL {kld['ppl']:9.4f}  KLD {kld['kld']:.5f}  top-1 same "
                 f"{kld.get('same_top_p_pct', float('nan')):.2f} %")
        return out

    def bench(self, k: str, v: str) -> dict:
        s = self.s
        args = ["-m", self.model_t, "-p", str(s.bench_p), "-n", str(s.bench_n), "-r", str(s.bench_reps),
                "-t", str(s.threads), "-fa", "1", *_kv_args(k, v), "-o", "json"]
        res = self._run("llama-bench", args, f"bench-{k}-{v}")
        try:
            rows = metrics.parse_bench(res.stdout) if res.rc == 0 else None
        except metrics.MetricsError:
            rows = None
        if not rows:
            return {"failed": True, "error": self._fail("llama-bench", res), "command": res.command()}
        out = {"command": res.command(), "peak_rss_kib": res.peak_rss_kib}
        for r in rows:
            out["pp" if r["n_gen"] == 0 else "tg"] = r
        return out

    def sample(self, k: str, v: str) -> dict:
        s = self.s
        args = ["-m", self.model_t, "-p", s.prompt, "-n", str(s.gen_tokens), "--seed", str(s.seed), "--temp", "0",
                "-c", "256", "-t", str(s.threads), "-fa", "on", *_kv_args(k, v), "-no-cnv", "--no-warmup"]
        res = self._run("llama-completion", args, f"sample-{k}-{v}")
        if res.rc != 0:
            return {"failed": True, "error": self._fail("llama-completion", res), "command": res.command()}
        text = res.stdout
        i = text.find(s.prompt)
        gen = text[i + len(s.prompt):] if i >= 0 else text
        return {"text": gen.strip(), "command": res.command(), **metrics.parse_perf(res.stderr),
                "peak_rss_kib": res.peak_rss_kib}

    def sustained(self, k: str, v: str) -> dict:
        s = self.s
        t0 = time.monotonic()
        points, n = [], 0
        args = ["-m", self.model_t, "-p", "0", "-n", str(s.sustained_n), "-r", "3", "-t", str(s.threads),
                "-fa", "1", *_kv_args(k, v), "-o", "json"]
        cmd = None
        while time.monotonic() - t0 < s.sustained_s:
            start = time.monotonic() - t0
            n += 1
            res = self.r.run("llama-bench", args, env=s.env(), tag=f"sustained-{k}-{v}-{n:03d}",
                             timeout=s.timeout_s)
            cmd = res.command()
            if res.rc != 0:
                return {"failed": True, "error": self._fail("llama-bench", res), "points": points, "command": cmd}
            for row in metrics.parse_bench(res.stdout):
                # samples are back to back inside one call; place each at the end of its own sample
                tt = start
                for ns, ts in zip(row["samples_ns"], row["samples_ts"]):
                    tt += ns / 1e9
                    points.append({"t": round(tt, 3), "tps": ts})
        tps = [p["tps"] for p in points]
        out = {"k": k, "v": v, "seconds": s.sustained_s, "calls": n, "points": points, "command": cmd}
        if len(tps) >= 4:
            q = max(1, len(tps) // 4)
            first, last = sum(tps[:q]) / q, sum(tps[-q:]) / q
            out.update(first_quarter_tps=first, last_quarter_tps=last, retained=last / first)
        return out


def file_info(p: Path) -> dict:
    return {"path": str(p), "bytes": p.stat().st_size, "sha256": sha256_file(p)}


def run_validation(runner: Runner, model: Path, text: Path, settings: Settings, kv: list[tuple[str, str]],
                   isolate_types: list[str] | None = None, log=print, reference_model: Path | None = None) -> dict:
    """The whole run; returns the JSON-able record (report.write() turns it into files)."""
    t_start = time.time()
    val = Validation(runner, model, text, settings, log, reference_model)
    val.setup()
    ref = val.reference()
    # with a reference model the tested model's own f16/f16 is a measured cell, not the reference
    pairs: list[tuple[str, str, str]] = [("config", k, v) for k, v in kv if (k, v) != ("f16", "f16")]
    if reference_model:
        pairs.insert(0, ("reference" if isolate_types else "config", "f16", "f16"))
    if isolate_types:
        pairs = [(role, k, v) for role, k, v in iso.cells_for(isolate_types) if role != "reference"] + \
                [p for p in pairs if (p[1], p[2]) not in {(k, v) for _, k, v in iso.cells_for(isolate_types)}]
    cells = [ref] + [val.cell(k, v, role) for role, k, v in pairs]
    for c in cells:
        c.update(kv_columns(val.model, c["k"], c["v"], settings.ctx))
    # speed, sample and sustained for the configurations asked for (isolate: the both-sides cells)
    perf_pairs = list(dict.fromkeys([("f16", "f16")] + [(k, v) for k, v in kv] +
                                    ([(t, t) for t in isolate_types] if isolate_types else [])))
    perf = []
    for k, v in perf_pairs:
        row = {"k": k, "v": v}
        if settings.bench:
            log(f"[{runner.name}] llama-bench K={k} V={v}")
            row["bench"] = val.bench(k, v)
        if settings.sample:
            row["sample"] = val.sample(k, v)
        if settings.sustained_s > 0:
            log(f"[{runner.name}] sustained generation {settings.sustained_s:.0f} s, K={k} V={v}")
            row["sustained"] = val.sustained(k, v)
        perf.append(row)
    analysis = iso.analyse([c for c in cells if c["role"] != "reference-model"]) if isolate_types else None
    scores = _score_errors(val.model, val.text, isolate_types, settings, log) if isolate_types else None
    rec = {
        "schema": "gguftool.validate/1",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
        "seconds": round(time.time() - t_start, 1),
        "model": file_info(val.model),
        "text": file_info(val.text),
        "target": runner.describe(),
        "settings": {k: v for k, v in settings.__dict__.items() if k != "extra"},
        "reference": {"k": "f16", "v": "f16", "ppl": ref["ppl"], "ppl_err": ref["ppl_err"],
                      "model": str(reference_model) if reference_model else None},
        "cells": cells,
        "perf": perf,
        "isolate": analysis,
        "k_score_error": scores,
        "runs": val.runs,
    }
    if hasattr(runner, "pushed"):
        rec["pushes"] = runner.pushed
    rec["ok"] = verdict(rec)
    return rec


def _score_errors(model: Path, text: Path, types: list[str], s: Settings, log) -> dict:
    """Per K type, the attention-score error on keys and queries dumped on this machine (host build)."""
    from . import kscore
    log(f"attention-score error of K types {', '.join(types)} on one chunk of {text.name} (host gguftool-kvdump)")
    try:
        return kscore.score_errors(model, text, types, ctx=s.ctx, threads=s.threads)
    except GgufToolError as e:   # no host build (a cross-only setup), or a model the dump cannot run
        return {"skipped": str(e)}


def verdict(rec: dict) -> bool:
    """A record passes when every run succeeded and the isolation analysis (if any) found no bug."""
    analysis = rec.get("isolate")
    return not any(c.get("failed") for c in rec["cells"]) and not (
        analysis and any(f["level"] == "bug" for f in analysis["flags"]))


def reanalyse(rec: dict) -> dict:
    """`rec` (a report.json) with the isolation analysis and the verdict computed again by this version."""
    if rec.get("isolate") is not None:
        rec["isolate"] = iso.analyse([c for c in rec["cells"] if c["role"] != "reference-model"])
        rec["ok"] = verdict(rec)
    return rec


def digest(obj: str) -> str:
    return hashlib.sha256(obj.encode()).hexdigest()[:12]

