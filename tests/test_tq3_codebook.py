"""TQ3_0 constants: the generator reproduces the committed files, the codebook matches the
published Lloyd-Max figures, and an independent Monte-Carlo agrees with the integrated distortion."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

from gguftool.quant import tq3_codebook as cb

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_tq3_codebook", ROOT / "scripts" / "gen_tq3_codebook.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _numbers(text: str) -> list[float]:
    return [float(v) for v in re.findall(r"-?\d+\.\d+(?:e-?\d+)?", text)]


def test_generator_reproduces_committed_files(gen):
    py, c = gen.generate()
    for path, fresh in ((gen.PY_OUT, py), (gen.C_OUT, c)):
        committed = path.read_text()
        if committed == fresh:
            continue
        # quadrature and pow() may differ in the last bit across libm/LAPACK builds: then the
        # numbers must still agree to 1e-13 and everything else (hex floats, sign word) exactly
        strip = lambda t: re.sub(r"-?\d+\.\d+(?:e-?\d+)?", "#", t)  # noqa: E731
        assert strip(committed) == strip(fresh), f"{path} is stale: run scripts/gen_tq3_codebook.py"
        np.testing.assert_allclose(_numbers(committed), _numbers(fresh), rtol=1e-13, atol=1e-15)


def test_codebook_matches_published_values():
    # TurboQuant / DESIGN.md: +-{0.2424, 0.7453, 1.3150, 2.0719}, boundaries 0, +-0.4939, +-1.0302, +-1.6935, D = 0.0323
    assert np.round(cb.CENTROIDS, 4).tolist() == [-2.0719, -1.3150, -0.7453, -0.2424, 0.2424, 0.7453, 1.3150, 2.0719]
    assert np.round(cb.BOUNDARIES, 4).tolist() == [-1.6935, -1.0302, -0.4939, 0.0, 0.4939, 1.0302, 1.6935]
    assert round(cb.DISTORTION, 4) == 0.0323
    # TurboQuant Thm 1 and 3 (b = 3): 4^-b <= D <= sqrt(3) pi / 2 * 4^-b
    assert 4.0 ** -3 <= cb.DISTORTION <= np.sqrt(3) * np.pi / 2 * 4.0 ** -3


def test_lloyd_max_fixed_point_and_monte_carlo():
    c, b = np.array(cb.CENTROIDS), np.array(cb.BOUNDARIES)
    assert np.allclose(b, 0.5 * (c[:-1] + c[1:]), rtol=0, atol=1e-15) and np.all(np.diff(c) > 0)
    # sample the law directly: sqrt(32) * first coordinate of a uniform direction in 32 dims
    rng = np.random.default_rng(1234)
    g = rng.standard_normal((400_000, 32))
    t = np.sqrt(32) * g[:, 0] / np.linalg.norm(g, axis=1)
    q = c[np.searchsorted(b, t)]
    mc = np.mean((t - q) ** 2)
    assert abs(mc - cb.DISTORTION) < 4e-4, (mc, cb.DISTORTION)        # ~0.3 % sampling error
    # centroid condition: each centroid is the mean of its cell (sampling error ~1e-3)
    cell = np.searchsorted(b, t)
    means = np.array([t[cell == k].mean() for k in range(8)])
    np.testing.assert_allclose(means, c, atol=0.01)


def test_sign_pattern_is_the_documented_flat_one(gen):
    signs = np.array(cb.SIGNS)
    assert signs.tolist() == [(-1 if (cb.SIGN_WORD >> j) & 1 else 1) for j in range(32)]
    h = gen.hadamard(32)
    # max |Walsh coefficient| = 8 is the flattest spectrum 5 variables allow (no bent functions)
    assert np.abs(h @ signs).max() == 8
    assert gen.sign_pattern() [0] == cb.SIGN_WORD
    assert cb.SQRT_BLOCK == float(np.sqrt(32.0))
    assert np.float32(cb.INV_SQRT_BLOCK_F32) == np.float32(1 / np.sqrt(32.0))
