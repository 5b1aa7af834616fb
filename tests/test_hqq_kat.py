"""Known-answer test: tests/data/hqq_kat.npz holds input floats and the bytes the numpy reference
produced for them when the file was made, for every target and three parameter sets, plus q8_1
activations and the expected vec_dot values. A change to the math (in C or numpy) fails here even
when both sides change together.

Regenerate ONLY for an intended change of the format or solver (and bump the layout version in
gguftool/types.py if decoding changes):

    python tests/test_hqq_kat.py --regenerate
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

KAT = Path(__file__).parent / "data" / "hqq_kat.npz"
TARGETS = ("Q4_HQQ", "Q4_HQQ_128", "Q4_1", "Q5_1")
PARAM_SETS = {
    "default": {},
    "plain": {"refit": 0},
    "search": {"scale_search": 1},
    "wide": {"scale_search": 6, "early_stop": 0, "iters": 9, "lp_norm": 0.5, "beta": 1.0, "kappa": 1.05},
}


def _inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(20261202)
    f = np.float32
    rows = [
        rng.standard_normal(256) * 0.02,
        rng.standard_t(3, 256) * 0.05,
        np.r_[rng.standard_normal(255) * 0.01, 2.5],
        rng.standard_normal(256) * 300,                      # shrink active
        np.r_[np.zeros(32), np.full(32, -3.25), np.full(32, 1e-3), np.linspace(1e-40, 3e-39, 32),
              np.linspace(1000.0, 1000.01, 32), np.linspace(-1e-6, 2e-6, 32), np.linspace(-1, 1, 32),
              np.r_[np.zeros(16), -np.zeros(16)]],
        rng.uniform(-1, 1, 256) ** 3,
    ]
    x = np.stack(rows).astype(f)
    y = (rng.standard_normal(256) * 2).astype(f)             # activation row for vec_dot
    return x, y


def _regenerate() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from gguftool.quant import hqq as H

    x, y = _inputs()
    out = {"x": x, "y_q8_1": H.quantize_q8_1_ref(y)}
    for t in TARGETS:
        for pname, prm in PARAM_SETS.items():
            out[f"{t}/{pname}"] = H.quantize_hqq_ref(x, t, **prm)
    for t in ("Q4_HQQ", "Q4_HQQ_128"):
        out[f"dot/{t}"] = np.array([H.vec_dot_q8_1_ref(r, out["y_q8_1"], t) for r in out[f"{t}/default"]],
                                   np.float32)
    KAT.parent.mkdir(exist_ok=True)
    np.savez_compressed(KAT, **out)
    print(f"wrote {KAT} ({KAT.stat().st_size} bytes)")


@pytest.fixture(scope="module")
def kat():
    with np.load(KAT) as f:
        return dict(f)


def test_inputs_unchanged(kat):
    x, _ = _inputs()
    assert np.array_equal(kat["x"], x), "the KAT input generator changed; regenerate deliberately"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("pname", PARAM_SETS)
def test_known_answer(kat, target, pname):
    from gguftool.quant import hqq as H
    want = kat[f"{target}/{pname}"]
    assert np.array_equal(H.quantize_hqq(kat["x"], target, **PARAM_SETS[pname]), want), "C kernel"
    assert np.array_equal(H.quantize_hqq_ref(kat["x"], target, **PARAM_SETS[pname]), want), "numpy reference"


@pytest.mark.parametrize("target", ("Q4_HQQ", "Q4_HQQ_128"))
def test_known_dot(kat, target):
    from gguftool._fast import _hqq
    from gguftool.quant import hqq as H
    from gguftool.types import BY_NAME
    _, y = _inputs()
    assert np.array_equal(H.quantize_q8_1_ref(y), kat["y_q8_1"])
    got = [_hqq.vec_dot_q8_1(BY_NAME[target].id, r, kat["y_q8_1"], 256) for r in kat[f"{target}/default"]]
    assert np.array_equal(np.array(got, np.float32), kat[f"dot/{target}"])


if __name__ == "__main__":
    if sys.argv[1:] == ["--regenerate"]:
        _regenerate()
    else:
        print(__doc__)
