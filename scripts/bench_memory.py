#!/usr/bin/env python3
"""Peak memory of `gguftool quantize` on a synthetic multi-GB model, next to the peers that matter:
the largest tensor (what streaming should cost) and the whole model (what loading it all costs),
plus gguf-py's own in-memory path (GGUFWriter.add_tensor for every tensor) measured in the same run.

    python scripts/bench_memory.py --gib 2 --type Q4_0 [--json out.json]

Prints a table of max RSS (from /usr/bin/time -v) and ratios; the model is written to a temp dir."""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synth_model import synth_llama  # noqa: E402

PEER = r"""
import sys, numpy as np
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType as T, quants
r = GGUFReader(sys.argv[1]); w = GGUFWriter(sys.argv[2], "llama")
for t in r.tensors:  # gguf-py's usual path: every quantized tensor is held until write
    x = np.asarray(t.data, dtype=np.float32)
    if x.ndim == 2:
        w.add_tensor(t.name, quants.quantize(x, T[sys.argv[3]]), raw_dtype=T[sys.argv[3]])
    else:
        w.add_tensor(t.name, x)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
"""


def synth(path: Path, gib: float, n_embd: int = 4096, n_ff: int = 11008) -> tuple[int, int]:
    """A llama-shaped F16 model of about `gib` GiB; returns (model bytes, largest tensor bytes)."""
    per_layer = 2 * (4 * n_embd * n_embd + 3 * n_embd * n_ff)
    return synth_llama(path, max(1, int(gib * 2**30 // per_layer)), n_embd, n_ff)


def max_rss(cmd: list[str]) -> tuple[int, float]:
    r = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1))
    m = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", r.stderr)
    secs = int(m.group(1) or 0) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
    return kib * 1024, secs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--type", default="Q4_0")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--skip-peer", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "synth.gguf"
        model_bytes, largest = synth(src, a.gib)
        ours, t_ours = max_rss([sys.executable, "-m", "gguftool", "quantize", str(src), str(Path(d) / "o.gguf"),
                                a.type, "--threads", "2"])
        rows = {"gguftool quantize (streaming)": (ours, t_ours)}
        if not a.skip_peer:
            peer, t_peer = max_rss([sys.executable, "-c", PEER, str(src), str(Path(d) / "p.gguf"), a.type])
            rows["gguf-py GGUFWriter.add_tensor (peer)"] = (peer, t_peer)
    print(f"model {model_bytes / 2**30:.2f} GiB (F16), largest tensor {largest / 2**20:.0f} MiB "
          f"(= {2 * largest / 2**20:.0f} MiB as float32), target {a.type}")
    print(f"{'run':<40}{'max RSS MiB':>12}{'/ largest f32':>15}{'/ model':>10}{'wall s':>9}")
    for k, (rss, t) in rows.items():
        print(f"{k:<40}{rss / 2**20:>12.0f}{rss / (2 * largest):>15.2f}{rss / model_bytes:>10.2f}{t:>9.1f}")
    if a.json:
        a.json.write_text(json.dumps({"model_bytes": model_bytes, "largest_tensor_bytes": largest, "type": a.type,
                                      "runs": {k: {"max_rss": v[0], "wall_s": v[1]} for k, v in rows.items()}}, indent=2))


if __name__ == "__main__":
    main()
