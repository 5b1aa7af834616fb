"""Our HQQ solver against the hqq package itself (hqq 0.2.8, torch on CPU), where it is installed:
`pip install torch && pip install --no-deps hqq termcolor` (its declared dependencies are not needed)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the hqq comparison needs torch (and hqq)")
hqq_optimize = pytest.importorskip("hqq.core.optimize", reason="the hqq package is not installed")
hqq_quantize = pytest.importorskip("hqq.core.quantize", reason="the hqq package is not installed")

from gguftool.quant import hqq as H  # noqa: E402

F32 = np.float32


def _zero_diffs(scale: float, n: int, seed: int) -> np.ndarray:
    """|our zero - hqq's zero| of the legacy proximal loop (kappa=1) on single-group tensors, where
    hqq's per-tensor early stop and ours per block coincide; same inverse scale and start zero."""
    rng = np.random.default_rng(seed)
    prm = H.HQQParams(kappa=1.0)
    diffs = []
    for _ in range(n):
        w = (rng.standard_t(4, (1, 32)) * scale).astype(F32)
        mn, mx = w.min(), w.max()
        s = F32(1) / H._fp16(F32(1) / (F32(15) / (mx - mn)))[None]
        z0 = -mn * s
        ours = float(H._solve_zero(w, s, z0, 15, prm)[0])
        _, _, z = hqq_optimize.optimize_weights_proximal_legacy(
            torch.from_numpy(w.T.copy()), torch.tensor([[float(s[0])]]), torch.tensor([[float(z0[0])]]),
            [0, 15], axis=0, device="cpu")
        diffs.append(abs(ours - float(z.reshape(-1)[0])))
    return np.array(diffs)


def test_zero_loop_is_hqqs():
    d = _zero_diffs(0.02, 200, seed=1)   # weight-sized values: the shrink is 0, the loop re-centres
    assert d.max() <= 1e-5, np.sort(d)[-5:]


def test_zero_loop_with_the_shrink_active_mostly_agrees():
    # large residuals survive the shrink; the early stop compares errors equal to the last bit
    # (torch's mean vs our left-to-right sum), which can move the stop by a step
    d = _zero_diffs(3.0, 200, seed=2)
    assert (d <= 1e-5).mean() >= 0.7, np.sort(d)[-10:]


def test_whole_tensor_error_matches_the_package():
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((256, 1024)) * 0.02).astype(F32)
    W_q, meta = hqq_quantize.Quantizer.quantize(
        torch.from_numpy(w.copy()), nbits=4, channel_wise=True, group_size=32, optimize=True, round_zero=False,
        axis=1, bitpack=False, device="cpu", compute_dtype=torch.float32)
    meta["compute_dtype"] = torch.float32
    pkg_mse = float(((hqq_quantize.Quantizer.dequantize(W_q, meta).numpy().astype(np.float64) - w) ** 2).mean())

    def mse(**params) -> float:
        y = H.dequantize_hqq(H.quantize_hqq(w, "Q4_HQQ", **params), "Q4_HQQ")
        return float(((y.astype(np.float64) - w) ** 2).mean()) / pkg_mse

    # all 20 steps, legacy kappa: hqq's loop, only our fp16 scale/zero differ
    assert mse(refit=0, early_stop=0, kappa=1.0) == pytest.approx(1.0, abs=2e-3)
    assert mse(refit=0) == pytest.approx(1.0, abs=1e-2)   # per-block early stop (module docstring)
    assert mse() < 0.97                                     # the default refit beats plain HQQ
