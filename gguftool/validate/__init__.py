"""Validation runs of a GGUF model on a target (local, Android over adb, arm64 under qemu-user).

runners   one interface (push / run / pull) for the three targets
metrics   parsers for llama-perplexity, llama-bench JSON, llama-completion timings, `time -v`
isolate   the K/V isolation matrix and the rule naming a broken cache side
session   the plan of tool runs and the record it produces
report    report.json + report.md + PNG plots
cross     static aarch64 build of the pinned llama.cpp (for adb and qemu-arm64)
"""
from .runners import AdbRunner, LocalRunner, QemuRunner, Runner, RunResult, make_runner
from .session import DEFAULT_KV, Settings, default_text, parse_kv, run_validation

__all__ = ["AdbRunner", "LocalRunner", "QemuRunner", "RunResult", "Runner", "make_runner", "DEFAULT_KV", "Settings",
           "default_text", "parse_kv", "run_validation"]
