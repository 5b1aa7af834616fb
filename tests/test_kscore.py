"""validate's attention-score error of K cache types, against hand computation on made-up keys."""
import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gq

from gguftool.validate.kscore import layer_errors

Q4_0 = GGMLQuantizationType.Q4_0


def _qk(t=16, hq=2, hkv=1, d=32, seed=0, outlier=0.0):
    r = np.random.default_rng(seed)
    q = r.standard_normal((t, hq, d)).astype(np.float32)
    k = r.standard_normal((t, hkv, d)).astype(np.float32)
    k[..., 3] += outlier * np.sign(k[..., 3])
    return q, k


def _naive_rel(q, k, kh, n_ctx):
    """Loops over every causal (query, key) pair: sum of squared score errors over the squared spread."""
    g = q.shape[1] // k.shape[1]
    err = spread = 0.0
    for h in range(q.shape[1]):
        for i in range(n_ctx):
            exact = [float(q[i, h] @ k[j, h // g]) for j in range(i + 1)]
            got = [float(q[i, h] @ kh[j, h // g]) for j in range(i + 1)]
            m = sum(exact) / len(exact)
            err += sum((a - b) ** 2 for a, b in zip(got, exact))
            spread += sum((a - m) ** 2 for a in exact)
    return (err / spread) ** 0.5


def test_unquantized_keys_have_no_error():
    q, k = _qk()
    rel, kl = layer_errors("f32", q, k, 16, None)
    assert rel == 0.0 and abs(kl) < 1e-12


def test_q4_0_error_matches_hand_loops():
    q, k = _qk(d=32)   # head dim 32: llama.cpp does not rotate (needs a multiple of 64)
    rows = k.reshape(16, -1)
    kh = gq.dequantize(gq.quantize(rows, Q4_0), Q4_0).reshape(k.shape)
    rel, kl = layer_errors("q4_0", q, k, 16, None)
    assert abs(rel - _naive_rel(q.astype(np.float64), k.astype(np.float64), kh.astype(np.float64), 16)) < 1e-9
    assert 0.02 < rel < 0.5 and kl > 0


def test_rotation_is_applied_at_head_dim_64():
    # one outlier channel: q4_0 on raw keys wastes its scale on it; the head-wide Hadamard spreads it
    q, k = _qk(d=64, outlier=12.0)
    rel, _ = layer_errors("q4_0", q, k, 16, None)
    kh = gq.dequantize(gq.quantize(k.reshape(16, -1), Q4_0), Q4_0).reshape(k.shape)
    raw = _naive_rel(q.astype(np.float64), k.astype(np.float64), kh.astype(np.float64), 16)
    assert rel < 0.6 * raw


def test_calibration_removes_the_key_mean():
    q, k = _qk(d=64)
    mu = np.full((1, 64), 30.0)
    k = k + mu[None].astype(np.float32)   # a large shared offset: q4_0 steps grow with it
    raw, _ = layer_errors("q4_0", q, k, 16, None)
    cal, _ = layer_errors("q4_0", q, k, 16, (mu.reshape(-1), np.ones(64)))
    assert cal < raw / 5
