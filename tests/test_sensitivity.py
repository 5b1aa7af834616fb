"""Measured per-tensor sensitivity (gguftool sensitivity) and its use by size targeting."""
from __future__ import annotations

import json
import math

import pytest

from gguftool.cli import main
from gguftool.errors import GgufToolError
from gguftool.io.reader import GGUFFile
from gguftool.pipeline import budget, sensitivity
from gguftool.pipeline import plan as planning

from .conftest import tiny_llama
from .test_native import native  # noqa: F401  (fixture: the build, or a skip saying how to get it)
from .test_recipes import _outlier_pair

UP, GATE = "blk.0.ffn_up.weight", "blk.0.ffn_gate.weight"


def _sens(kld: dict, probe: str = "Q4_0") -> sensitivity.Sensitivity:
    return sensitivity.Sensitivity(None, probe, kld)


@pytest.mark.parametrize("sensitive", [UP, GATE])
def test_the_measured_tensor_gets_the_upgrade(tmp_path, rng, sensitive):
    """Two tensors of one distribution (their errors alike), a budget for one upgrade Q4_HQQ_128 -> Q4_HQQ: the
    tensor the measurement says costs 50x the KLD gets it, both ways round."""
    src = GGUFFile(_outlier_pair(tmp_path / "m.gguf", rng))
    base = planning.make_plan(src, planning.Options(target="Q4_HQQ_128", pure=True))
    one_up = base.out_bytes + 256 * 256 // 32 * 20 - 256 * 256 // 128 * 68
    other = UP if sensitive == GATE else GATE
    fit = budget.search(src, base, ["Q4_HQQ_128", "Q4_HQQ"], one_up, sensitivity=_sens({sensitive: 0.5, other: 0.01}))
    assert {s.tensor.name: s.out_type.name for s in fit.plan.steps if s.quantizable} == \
        {sensitive: "Q4_HQQ", other: "Q4_HQQ_128"}


def test_the_objective_is_the_measured_kld_at_the_probe(tmp_path, rng):
    """Weighted by measured sensitivity, the plan that puts every tensor at the probe type scores the sum of the
    measured KLDs (each tensor's weight is its KLD over its error at the probe), and a finer type scores less."""
    src = GGUFFile(tiny_llama(tmp_path / "t.gguf", rng, n_embd=256, n_ff=512, n_vocab=128))
    base = planning.make_plan(src, planning.Options(target="Q4_0", pure=True))
    free = [s.tensor.name for s in base.steps if s.quantizable]
    kld = {n: 0.001 * (1 + i) for i, n in enumerate(free)}
    fit = budget.search(src, base, ["Q4_0", "Q8_0"], base.out_bytes * 2, sensitivity=_sens(kld))
    assert fit.candidates["uniform Q4_0"][1] == pytest.approx(sum(kld.values()), rel=1e-9)
    assert fit.candidates["uniform Q8_0"][1] < 0.01 * sum(kld.values())


def test_unmeasured_tensors_take_their_role_interpolated_by_depth():
    s = _sens({"blk.0.ffn_down.weight": 0.02, "blk.2.ffn_down.weight": 0.04, "blk.6.ffn_down.weight": 0.09,
               "blk.0.attn_q.weight": 0.5, "output.weight": 3.0})
    err = {f"blk.{i}.ffn_down.weight": 0.01 for i in (0, 1, 2, 5, 6, 8)}
    err.update({"blk.0.attn_q.weight": 0.01, "blk.3.attn_q.weight": 0.01, "blk.1.attn_v.weight": 0.01,
                "output.weight": 0.0})   # output: on the probe's grid already, so unmeasurable
    w = sensitivity.weights(s, err)
    assert w["blk.0.ffn_down.weight"] == pytest.approx(2.0) and w["blk.6.ffn_down.weight"] == pytest.approx(9.0)
    assert w["blk.1.ffn_down.weight"] == pytest.approx(3.0)     # between blocks 0 (2) and 2 (4)
    assert w["blk.5.ffn_down.weight"] == pytest.approx(7.75)    # 3/4 of the way from block 2 (4) to 6 (9)
    assert w["blk.8.ffn_down.weight"] == pytest.approx(9.0)     # beyond the last measured block: its value
    assert w["blk.3.attn_q.weight"] == pytest.approx(50.0)      # its role's one measured block
    assert w["blk.1.attn_v.weight"] == pytest.approx(6.5)       # no attn_v measured: median of all (2, 4, 9, 50)
    assert w["output.weight"] == pytest.approx(6.5)


def test_every_block_samples_the_first_and_last_blocks():
    assert sensitivity.sampled_blocks(30, 4) == {0, 4, 8, 12, 16, 20, 24, 28, 29}
    assert sensitivity.sampled_blocks(30, 1) == set(range(30)) and sensitivity.sampled_blocks(1, 8) == {0}


@pytest.mark.parametrize("doc, message", [
    ("not json", "not a gguftool sensitivity file"),
    ({"format": "gguftool-imatrix", "probe": "Q4_0", "kld": {}}, "expected 'gguftool-sensitivity/1'"),
    ({"format": sensitivity.FORMAT, "probe": "Q9_9", "kld": {"output.weight": 0.1}}, "probe 'Q9_9'"),
    ({"format": sensitivity.FORMAT, "probe": "Q4_0", "kld": [0.1]}, "must be objects"),
    ({"format": sensitivity.FORMAT, "probe": "Q4_0", "kld": {"blk.7.ffn_up.weight": 0.1}}, "measured on another model"),
    ({"format": sensitivity.FORMAT, "probe": "Q4_0", "kld": {"output.weight": math.nan}}, "not a finite number"),
    ({"format": sensitivity.FORMAT, "probe": "Q4_0", "kld": {"output.weight": -1}}, "not a finite number"),
    ({"format": sensitivity.FORMAT, "probe": "Q4_0", "kld": {"output.weight": "0.1"}}, "not a finite number"),
    ({"format": sensitivity.FORMAT, "probe": "Q4_0", "kld": {}}, "no tensor was measured"),
])
def test_bad_sensitivity_files_name_the_problem(tmp_path, rng, capsys, doc, message):
    src = tiny_llama(tmp_path / "t.gguf", rng)
    f = tmp_path / "s.json"
    f.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(GgufToolError, match=message) as e:
        sensitivity.load(f, GGUFFile(src))
    assert str(f) in e.value.message
    assert main(["quantize", str(src), str(tmp_path / "o.gguf"), "Q4_0", "--target-bpw", "6", "--sensitivity", str(f),
                 "--dry-run"]) == 1
    assert message.split("'")[0][:20] in capsys.readouterr().err
    assert main(["quantize", str(src), str(tmp_path / "o.gguf"), "Q4_0", "--sensitivity", str(f)]) == 1
    assert "give --target-bpw or --target-size" in capsys.readouterr().err


def test_measured_on_smollm2_ranks_as_the_one_at_a_time_runs(native, smollm2, tmp_path, capsys):  # noqa: F811
    """The independent reference: uniform Q4_HQQ with one ffn_down at Q4_HQQ_128, 20 x 512 tokens of Emma scored
    by llama-perplexity (docs/size-targeting.md), cost KLD +0.0291 for blk.11's and +0.0009 for blk.26's.
    `gguftool sensitivity` (Q4_0 probe, 2 x 512 tokens of the packaged Pride and Prejudice) must rank them so, far
    apart; then size targeting with the file keeps blk.11's at the finer type where the budget demotes one."""
    out = tmp_path / "smol.sensitivity.json"
    assert main(["sensitivity", str(smollm2), "-o", str(out), "--tensors", r"blk\.(11|26)\.ffn_down\.weight",
                 "-t", "2"]) == 0
    assert "highest: blk.11.ffn_down.weight" in capsys.readouterr().out
    s = sensitivity.load(out, GGUFFile(smollm2))
    assert set(s.kld) == {"blk.11.ffn_down.weight", "blk.26.ffn_down.weight"} and s.probe == "Q4_0"
    assert s.kld["blk.11.ffn_down.weight"] > 3 * s.kld["blk.26.ffn_down.weight"] > 0
    assert s.info["tensors"] == 211 and s.info["chunks"] == 2
    r = tmp_path / "r.toml"
    r.write_text('type = "Q4_HQQ"\npure = true\nallowed = ["Q4_HQQ_128", "Q4_HQQ"]\n')
    swapped = tmp_path / "swapped.json"   # the same file with the two values exchanged
    doc = json.loads(out.read_text())
    doc["kld"] = dict(zip(doc["kld"], reversed(doc["kld"].values())))
    swapped.write_text(json.dumps(doc))
    demoted = {}
    for name, f in (("measured", out), ("swapped", swapped)):
        assert main(["quantize", str(smollm2), str(tmp_path / "o.gguf"), "--recipe", str(r), "--allow-requantize",
                     "--target-bpw", "4.999", "--dry-run", "--format", "json", "--sensitivity", str(f)]) == 0
        got = capsys.readouterr()
        assert "with measured sensitivity, estimated KLD" in got.err
        demoted[name] = {t["name"] for t in json.loads(got.out)["tensors"] if t["to"] == "Q4_HQQ_128"}
    # the other ffn_down take the pair's values interpolated by depth (beyond them, the nearer one's): what is
    # demoted lies on the side measured cheap, and the tensor measured costly is kept
    assert "blk.26.ffn_down.weight" in demoted["measured"] and "blk.11.ffn_down.weight" not in demoted["measured"]
    assert all(sensitivity.block_of(n) > 11 for n in demoted["measured"]), demoted
    assert "blk.26.ffn_down.weight" not in demoted["swapped"] and demoted["swapped"], demoted
    assert all(sensitivity.block_of(n) < 26 for n in demoted["swapped"]), demoted


def test_every_block_measures_the_sampled_blocks_only(native, smollm2, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "s.json"
    assert main(["sensitivity", str(smollm2), "-o", str(out), "--tensors", r"ffn_down", "--every-block", "10",
                 "-t", "2"]) == 0
    s = sensitivity.load(out, GGUFFile(smollm2))
    assert set(s.kld) == {f"blk.{b}.ffn_down.weight" for b in (0, 10, 20, 29)} and s.info["every_block"] == 10
    assert all(v > 0 for v in s.kld.values())
