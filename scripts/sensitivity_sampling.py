"""How well does `gguftool sensitivity --every-block N` stand in for measuring every block?

    PYTHONPATH=. python scripts/sensitivity_sampling.py MODEL.gguf FULL.sensitivity.json [--every 2,4,8] [--out DIR]

FULL is a file measured on every block. For each N, the tensors of the blocks --every-block N would skip are
held out; their KLD is guessed as quantize --sensitivity guesses it (pipeline/sensitivity.weights: the role's
value interpolated by depth between the nearest kept blocks) and, for comparison, by the role's median over
the kept blocks (what it did before the interpolation). Printed: the median and 90th percentile of
|log(guess / measured)| over the held-out tensors, and the Spearman rank correlation of guess and measured.
With --out, writes the sampled file (FULL with only the kept blocks) for each N, to feed quantize or the
size-targeting bench: the same numbers --every-block N would have measured, without running it again.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from gguftool.io.split import open_gguf
from gguftool.pipeline import sensitivity as S
from gguftool.pipeline.budget import n_blocks


def ranks(v: list[float]) -> np.ndarray:
    return np.argsort(np.argsort(v)).astype(float)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("full", type=Path)
    ap.add_argument("--every", default="2,4,8")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    src = open_gguf(a.model)
    full = S.load(a.full, src)
    nb = n_blocks(src)
    print(f"{a.full.name}: {len(full.kld)} tensors, {nb} blocks")
    print(f"{'every':>5s} {'runs':>5s} {'held out':>8s} | {'interpolated: med':>18s} {'p90':>6s} {'rank r':>7s}"
          f" | {'role median: med':>17s} {'p90':>6s} {'rank r':>7s}")
    for n in map(int, a.every.split(",")):
        keep = S.sampled_blocks(nb, n)
        kept = {k: v for k, v in full.kld.items() if S.block_of(k) is None or S.block_of(k) in keep}
        held = [k for k in full.kld if k not in kept and full.kld[k] > 0]
        sub = replace(full, kld=kept)
        interp = S.weights(sub, {k: 1.0 for k in full.kld})   # unit errors: the weights are the KLDs themselves
        by_role: dict[str, list[float]] = {}
        for k, v in kept.items():
            by_role.setdefault(S.role(k), []).append(v)
        median = {k: statistics.median(by_role[S.role(k)]) for k in held}
        row = [f"{n:5d} {len(kept):5d} {len(held):8d}"]
        for guess in (interp, median):
            err = np.abs(np.log([max(guess[k], 1e-9) / full.kld[k] for k in held]))
            r = np.corrcoef(ranks([guess[k] for k in held]), ranks([full.kld[k] for k in held]))[0, 1]
            row.append(f"{np.median(err):18.3f} {np.quantile(err, 0.9):6.3f} {r:7.3f}")
        print(" | ".join(row))
        if a.out:
            a.out.mkdir(parents=True, exist_ok=True)
            doc = json.loads(a.full.read_text())
            doc["kld"], doc["every_block"] = kept, n
            (a.out / f"{a.full.stem}.every{n}.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
