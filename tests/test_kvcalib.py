"""KV calibration: the transform is attention-neutral (numpy and the native build) and lowers the error."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gguftool.pipeline import kvcalib


def _qk(rng, t=512, hq=4, hkv=2, d=64):
    q = rng.standard_normal((t, hq, d)) * rng.uniform(0.2, 3, d)
    k = rng.standard_normal((t, hkv, d)) * rng.uniform(0.2, 3, d) + rng.standard_normal(d) * 4
    return q, k


def test_transform_leaves_attention_unchanged_and_balance_lowers_the_product():
    rng = np.random.default_rng(0)
    q, k = _qk(rng)
    hkv, g, d = 2, 2, 64
    mu = k.mean(0)
    qe = (q ** 2).reshape(-1, hkv, g, d).mean(0).sum(1)
    ke = ((k - mu) ** 2).mean(0)
    for rope in ("norm", "neox"):
        s = kvcalib.balance(qe, ke, rope, 1.0)
        pairs = (s[:, 0::2], s[:, 1::2]) if rope == "norm" else (s[:, : d // 2], s[:, d // 2:])
        assert np.array_equal(*pairs)   # RoPE partners share the scale: a K shift stays exact
        qs = (q.reshape(-1, hkv, g, d) * s[None, :, None]).reshape(q.shape)
        ks = (k - mu) / s
        assert kvcalib.attention_kl(q, k, qs, ks, 512) < 1e-12
        before = (q ** 2).sum(-1).mean() * ((k - mu) ** 2).sum(-1).mean()
        after = (qs ** 2).sum(-1).mean() * (ks ** 2).sum(-1).mean()
        assert after < before
    # keys divided by s without the query multiplied by it are not neutral
    assert kvcalib.attention_kl(q, k, q, ks, 512) > 1e-3


def test_calibrated_layer_beats_raw_on_the_q4_0_proxy():
    rng = np.random.default_rng(1)
    q, k = _qk(rng, t=1024)
    v = rng.standard_normal((1024, 2, 64)) + 3 * rng.standard_normal(64)   # per-channel offsets
    c = kvcalib.calibrate_layer(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), 512, "neox")
    assert c.kl[c.alpha] < 0.8 * c.kl_raw
    # values with a shared offset and no sink: the whole mean comes out, and that lowers the V error
    assert c.gamma == 1.0 and c.v_err[1.0] < 0.8 * c.v_err[0.0]
    assert np.allclose(c.v_mean.reshape(2, 64), v.mean(0), atol=1e-5)


def test_attention_sink_keeps_its_small_value():
    """An attention sink (the first token of each chunk takes most of the weight) with a near-zero value:
    v - nu would make the heaviest row large, so the calibration keeps the mean in (gamma 0)."""
    rng = np.random.default_rng(3)
    t, d = 1024, 64
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)
    q = rng.standard_normal((t, 2, d)) + 4 * u
    k = rng.standard_normal((t, 1, d))
    v = rng.standard_normal((t, 1, d)) * 0.3 + 3 * rng.standard_normal(d)
    for c0 in (0, 512):
        k[c0, 0] = 12 * u
        v[c0, 0] = rng.standard_normal(d) * 0.05
    c = kvcalib.calibrate_layer(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), 512, "neox")
    assert c.gamma == 0.0 and not c.v_mean.any() and c.v_err[0.0] < c.v_err[1.0]


def test_value_error_by_hand():
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((8, 2, 4)), rng.standard_normal((8, 1, 4)), rng.standard_normal((8, 1, 4))
    vh = v + rng.standard_normal(v.shape) * 0.1
    err = ref = 0.0
    for h in range(2):
        for i in range(8):
            s = np.array([q[i, h] @ k[j, 0] / 2 for j in range(i + 1)])
            p = np.exp(s - s.max())
            p /= p.sum()
            err += ((p @ (vh[: i + 1, 0] - v[: i + 1, 0])) ** 2).sum()
            ref += ((p @ v[: i + 1, 0]) ** 2).sum()
    assert abs(kvcalib.value_error(q, k, v, vh, 8, max_queries=8) - err / ref) < 1e-12


def random_calibration(model: Path, out: Path, seed: int) -> Path:
    """`model` with large random means and scales in every layer (RoPE pairs of adjacent channels share a
    scale): any slip in applying them shows at once."""
    from gguf import GGUFValueType

    from gguftool.io.reader import GGUFFile
    src = GGUFFile(model)
    arch = src.get("general.architecture")
    n_layer = int(src.get(f"{arch}.block_count"))
    dk = int(src.get(f"{arch}.attention.key_length") or int(src.get(f"{arch}.embedding_length")) //
             int(src.get(f"{arch}.attention.head_count")))
    hkv = src.get(f"{arch}.attention.head_count_kv")
    n = dk * int(hkv if np.isscalar(hkv) else hkv[0])
    rng = np.random.default_rng(seed)
    A, F = GGUFValueType.ARRAY, GGUFValueType.FLOAT32
    items = []
    for il in range(n_layer):
        items += [(f"{kvcalib.META}blk.{il}.k_mean", (rng.standard_normal(n) * 3).tolist(), A, F),
                  (f"{kvcalib.META}blk.{il}.k_scale", np.repeat(rng.uniform(0.5, 2.0, n // 2), 2).tolist(), A, F),
                  (f"{kvcalib.META}blk.{il}.v_mean", (rng.standard_normal(n) * 0.5).tolist(), A, F)]
    kvcalib.write(model, out, items, {})
    return out


@pytest.mark.native
def test_native_runtime_applies_calibration_exactly(smollm2, tmp_path):
    """Large random means and scales in the file: with a q8_0 cache the perplexity must stay that of
    the plain file (a missing add-back, an unscaled query or a wrong layout would wreck it)."""
    from gguftool.native import tools
    try:
        ppl_bin = tools.tool("llama-perplexity")
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"native build absent: {e}")
    out = random_calibration(smollm2, tmp_path / "cal.gguf", 2)
    text = kvcalib.__file__.replace("pipeline/kvcalib.py", "data/pride_and_prejudice.txt")

    def ppl(model):
        r = subprocess.run([str(ppl_bin), "-m", str(model), "-f", text, "-c", "256", "-b", "256", "--chunks", "3",
                            "-t", "2", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0"], capture_output=True, text=True)
        m = re.search(r"Final estimate: PPL = ([0-9.]+)", r.stdout + r.stderr)
        assert m, (r.stdout + r.stderr)[-500:]
        return float(m.group(1))

    plain, cal = ppl(smollm2), ppl(out)
    assert abs(cal / plain - 1) < 0.01, (plain, cal)


@pytest.mark.native
def test_recipe_kv_caches_against_f16(smollm2, tmp_path):
    """The K/V caches the recipes recommend, on a file kv-calibrated by the CLI with max-compression's per-layer
    K plan, against the f16 cache of the same run, on text the calibration did not see (Emma; the calibration
    reads Pride and Prejudice); the plan stored in the file beats the same types without it."""
    import os
    from pathlib import Path

    from gguftool.cli import main
    from gguftool.native import tools
    from gguftool.pipeline.recipe import load
    try:
        ppl_bin = tools.tool("llama-perplexity")
        tools.tool("gguftool-kvdump")
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"native build absent: {e}")
    mc = load("max-compression")
    out = tmp_path / "cal.gguf"
    assert main(["kv-calibrate", str(smollm2), str(out), "--chunks", "4", "--ctx", "256", "-t", "2",
                 "--k-layers", mc.kv_layers["k"]]) == 0
    text = Path(__file__).parent / "data" / "native_emma_excerpt.txt"
    base = tmp_path / "f16.kld"

    def run(model, k, v, *extra, plan="on"):
        env = {**os.environ, **({"GGUFTOOL_KV_LAYERS_K": "off"} if plan == "off" else {})}
        r = subprocess.run([str(ppl_bin), "-m", str(model), "-f", str(text), "-c", "256", "-b", "256", "--chunks", "4",
                            "-t", "2", "-fa", "on", "-ctk", k, "-ctv", v, *extra], capture_output=True, text=True,
                           env=env)
        log = r.stdout + r.stderr
        assert r.returncode == 0, log[-800:]
        return log

    f16 = float(re.search(r"Final estimate: PPL = ([0-9.]+)", run(smollm2, "f16", "f16",
                                                                "--kl-divergence-base", str(base))).group(1))

    def kld(model, k, v, plan="on"):
        log = run(model, k, v, "--kl-divergence-base", str(base), "--kl-divergence", "-v", plan=plan)
        assert ("from the file's plan" in log) == (plan == "on" and k == mc.kv["k"] and model == out), log[-2000:]
        return (float(re.search(r"Mean PPL\(Q\)\s*:\s*([0-9.]+)", log).group(1)),
                float(re.search(r"Mean\s+KLD:\s*([0-9.]+)", log).group(1)))

    _, stock = kld(smollm2, "q4_0", "q4_0")
    got = {name: kld(out, load(name).kv["k"], load(name).kv["v"]) for name in ("phone-small", "max-compression")}
    uniform = kld(out, mc.kv["k"], mc.kv["v"], plan="off")
    # 40 x 512 of Emma (docs/kv.md): phone-small's cache 0.45x stock q4_0's KLD; max-compression's (1 bit less)
    # 1.10x, its types without the plan 1.78x
    assert got["phone-small"][1] < 0.85 * stock, (got, stock)
    assert got["max-compression"][1] < 1.5 * stock and got["max-compression"][0] < 1.1 * f16, (got, stock, f16)
    assert got["max-compression"][1] < 0.85 * uniform[1], (got, uniform)


@pytest.mark.native
def test_quantize_with_a_calibrated_recipe_calibrates_the_output(smollm2, tmp_path):
    from gguftool.cli import main
    from gguftool.io.reader import GGUFFile
    from gguftool.native import tools
    try:
        tools.tool("gguftool-kvdump")
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"native build absent: {e}")
    out, plain = tmp_path / "phone.gguf", tmp_path / "plain.gguf"
    assert main(["quantize", str(smollm2), str(out), "--recipe", "phone-small", "--allow-requantize", "-t", "2"]) == 0
    assert main(["quantize", str(smollm2), str(plain), "--recipe", "phone-small", "--allow-requantize", "-t", "2",
                 "--no-kv-calibrate"]) == 0
    f, g = GGUFFile(out), GGUFFile(plain)
    n_layer = int(f.get("llama.block_count"))
    assert all(len(f.get(f"{kvcalib.META}blk.{il}.k_scale")) == 192 for il in range(n_layer))
    assert not any(k.startswith(kvcalib.META) for k in g.fields)
    assert f.get("gguftool.recipe.name") == "phone-small"
    for t in g.tensors:   # the calibration adds metadata only
        assert np.array_equal(f.tensor(t.name).raw_rows(), t.raw_rows()), t.name
    assert not list(tmp_path.glob(".*kv-calibrate*"))


@pytest.mark.native
def test_kv_calibrate_chooses_the_layers_it_measured_best(smollm2, tmp_path, capsys):
    """--k-layers BASE=auto:TYPE:N%: N% of the layers at TYPE, whole groups in the order of their measured
    gain, stored in the file; the file then runs with lower KLD than the uniform cache the search measured."""
    import json

    from gguftool.cli import main
    from gguftool.io.reader import GGUFFile
    from gguftool.native import tools
    from gguftool.pipeline.kvplan import Shape
    try:
        tools.tool("gguftool-kvdump")
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"native build absent: {e}")
    out = tmp_path / "auto.gguf"
    assert main(["kv-calibrate", str(smollm2), str(out), "--chunks", "2", "--ctx", "256",
                 "--k-layers", "tq3_2=auto:q4_0:40%", "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plans"]["k"]
    stored = Shape.from_gguf(GGUFFile(out)).k_plan
    assert stored.base == "tq3_2" and stored.spec == plan["layers"]
    chosen = {il for lo, hi, t in stored.rules for il in range(lo, hi + 1) if t == "q4_0"}
    assert len(chosen) == 12                                    # 40% of 30 layers
    gains = {tuple(map(int, g.split("-"))): v for g, v in plan["search"].items() if g != "kld_uniform"}
    full = [g for g in gains if set(range(g[0], g[1] + 1)) <= chosen]
    left = [g for g in gains if not set(range(g[0], g[1] + 1)) & chosen]
    assert len(full) == 2 and min(gains[g] for g in full) >= max(gains[g] for g in left)
    ref = tmp_path / "f16.kld"
    text = Path(kvcalib.__file__).parent.parent / "data" / "pride_and_prejudice.txt"
    kw = dict(chunks=2, ctx=256, threads=2)
    kvcalib.kld(out, text, ref, "f16", "f16", make_ref=True, **kw)
    # an empty variable is unset: the file's plan applies (the helper turns both plans off otherwise)
    planned = kvcalib.kld(out, text, ref, "tq3_2", "tq3_2", env={"GGUFTOOL_KV_LAYERS_K": ""}, **kw)["kld"]
    assert planned < plan["search"]["kld_uniform"], (planned, plan["search"])


def test_auto_plan_keeps_its_bit_budget_at_the_trained_context(gemma, smollm2, monkeypatch):
    """With sliding-window attention a full-context layer holds every token: the fill skips one that would
    put the cache over the plan's share at the trained context (Gemma 3: layers 5, 11, 17 hold 32768 cells,
    the others 1024), and takes the next best instead; without it (SmolLM2) the ranking alone decides."""
    import dataclasses

    from gguftool.io.reader import GGUFFile
    from gguftool.pipeline.kvplan import Shape, bits_per_value

    # Gemma's measured gains per layer, groups of 3 (docs/kv.md): 3-5 > 9-11 > 6-8 > 0-2 > 15-17 > 12-14
    gain = {"3-5": .0046, "9-11": .0021, "6-8": .00177, "0-2": .00119, "15-17": .00107, "12-14": .00105,
            "0-4": .00147, "5-9": .00091, "10-14": .00295, "15-19": .00347, "20-24": .0012, "25-29": .00083}

    def fake_kld(model, text, ref, k, v, *, env=None, make_ref=False, **kw):
        group = (env or {}).get("GGUFTOOL_KV_LAYERS_K", "").partition(":")[0]
        n = int(group.split("-")[1]) - int(group.split("-")[0]) + 1 if group else 0
        return {"kld": 0.1 - n * gain.get(group, 0.0)}
    monkeypatch.setattr(kvcalib, "kld", fake_kld)
    want = kvcalib.AutoPlan("k", "tq3_2", "iq4_nl", 7)
    got, report = kvcalib.choose_layers(gemma, gemma, want, chunks=1, ctx=256, threads=1)
    # 3, 4, 5 (one full-context layer: 29% of the cache at 32k), 11 skipped (a second would be 58% > 7/18),
    # 10, 9, then 6, 7 from the third group
    assert got.spec == "3-7:iq4_nl,9-10:iq4_nl" and report["3-5"] == pytest.approx(.0046)
    shape = Shape.from_gguf(GGUFFile(gemma))
    planned = dataclasses.replace(shape, k_plan=got)
    short = bits_per_value(planned, "tq3_2", "tq3_2")
    assert bits_per_value(planned, "tq3_2", "tq3_2", shape.n_ctx_train) <= short
    greedy = dataclasses.replace(shape, k_plan=kvcalib.LayerPlan.parse("tq3_2=3-6:iq4_nl,9-11:iq4_nl"))
    assert bits_per_value(greedy, "tq3_2", "tq3_2", shape.n_ctx_train) > short + 0.1   # what it avoids

    got, _ = kvcalib.choose_layers(smollm2, smollm2, kvcalib.AutoPlan("k", "tq3_2", "iq4_nl", 12),
                                   chunks=1, ctx=256, threads=1)
    assert got.spec == "3-4:iq4_nl,10-19:iq4_nl"   # 15-19, 10-14, then 0-4 from its end (next to nothing chosen)
