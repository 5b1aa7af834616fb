"""Recipes (declarative plans) and size-targeted planning."""
from __future__ import annotations

import numpy as np
import pytest

from gguftool.cli import main
from gguftool.errors import GgufToolError
from gguftool.io.reader import GGUFFile
from gguftool.pipeline import budget, recipe
from gguftool.pipeline import plan as planning

from .conftest import tiny_llama


@pytest.mark.parametrize("name", ["phone-small", "max-compression", "stock-llamacpp", "quality"])
def test_shipped_recipes_load(name):
    from gguftool.quant.hqq import HQQParams
    r = recipe.load(name)
    assert r.name == name and r.kv.keys() == {"k", "v"} and r.allowed and isinstance(r.kv_calibrate, bool)
    for params in [r.solver, *(rule.params for rule in r.rules)]:
        if params:
            HQQParams.make(**params)   # raises on an unknown parameter or a value out of range


def test_recipe_caches_are_the_measured_picks():
    """phone-small and max-compression carry the K/V pairs docs/kv.md measured (gguftool/data/kv_measured.json):
    each is calibrated, within its bits, and below stock q4_0/q4_0 in KLD on both models where claimed."""
    from gguftool.pipeline import kvplan
    models = kvplan.measured()["models"]
    for name, max_bits in (("phone-small", 4.5), ("max-compression", 3.5)):
        r = recipe.load(name)
        pair = f"cal:{r.kv['k']}/{r.kv['v']}"
        assert r.kv_calibrate
        for m in models.values():
            row = m["rows"][pair]
            assert row["bits"] <= max_bits
            if name == "phone-small":   # goal 2: PPL within +2% (SmolLM2) / +3% (Gemma 3) of the f16 cache
                assert row["ppl"] / m["f16_ppl"] - 1 < 0.03 and row["kld"] < m["rows"]["q4_0/q4_0"]["kld"]
    gemma = next(m for k, m in models.items() if k.lower().startswith("gemma"))
    mc = recipe.load("max-compression")
    assert gemma["rows"][f"cal:{mc.kv['k']}/{mc.kv['v']}"]["kld"] < gemma["rows"]["q4_0/q4_0"]["kld"]   # goal 1


@pytest.mark.parametrize("body, message", [
    ('type = "Q4_HQQ"\ncolour = "red"\n', "unknown key(s) ['colour']"),
    ('type = "Q4_7"\n', "unknown quantization type 'Q4_7'"),
    ('type = "Q8_K"\n', "unknown quantization type 'Q8_K'"),
    ('type = "Q4_0"\n[[rules]]\npattern = "attn_v"\ntype = "Q9"\n', "rules[0]: unknown quantization type"),
    ('type = "Q4_0"\n[[rules]]\npattern = "(("\ntype = "Q8_0"\n', "bad regular expression"),
    ('type = "Q4_0"\n[[rules]]\npattern = "x"\ntype = "Q8_0"\nsize = 3\n', "rules[0]: unknown key(s) ['size']"),
    ('type = "Q4_0"\n[kv]\nk = "q4_0"\nw = "f16"\n', "[kv]: unknown key(s) ['w']"),
    ('type = "Q4_0"\n[kv]\nk = "q4_0"\ncalibrate = "yes"\n', "calibrate must be true or false"),
    ('type = "Q4_0"\n[kv]\nk = "q9_0"\n', "'q9_0' is not a KV cache type"),
    ('type = "Q4_0"\nkv = 3\n', "[kv] must be a table"),
    ('description = "no type"\n', "missing `type`"),
    ('type = "Q4_0\n', "not valid TOML"),
])
def test_bad_recipes_name_the_problem(tmp_path, body, message):
    p = tmp_path / "r.toml"
    p.write_text(body)
    with pytest.raises(GgufToolError) as e:
        recipe.load(str(p))
    assert message in str(e.value) and str(p) in str(e.value)


def test_unknown_recipe_name():
    with pytest.raises(GgufToolError, match="no recipe named 'nope'"):
        recipe.load("nope")


def test_recipe_rules_params_and_record(tmp_path, rng, capsys):
    src = tiny_llama(tmp_path / "t.gguf", rng)
    r = tmp_path / "mine.toml"
    r.write_text('type = "Q4_0"\n[solver]\nsolver = "hqq"\n'
                 '[[rules]]\npattern = "attn_v"\ntype = "Q5_1"\n'
                 '[[rules]]\npattern = "no_such_tensor"\ntype = "Q8_0"\n')
    out = tmp_path / "o.gguf"
    assert main(["quantize", str(src), str(out), "--recipe", str(r)]) == 0
    err = capsys.readouterr().err
    assert "pattern 'no_such_tensor' matches no tensor" in err
    f = GGUFFile(out)
    assert f.tensor("blk.0.attn_v.weight").type.name == "Q5_1"
    assert f.tensor("blk.0.attn_q.weight").type.name == "Q4_0"
    assert f.get("gguftool.recipe.name") == "mine" and f.get("gguftool.recipe.toml") == r.read_text()
    assert f.get("gguftool.version")
    import json
    from dataclasses import asdict

    from gguftool.quant.hqq import HQQParams
    assert json.loads(f.get("gguftool.hqq.defaults")) == asdict(HQQParams())   # the solver's defaults, kept
    # the HQQ solver really ran for the Q5_1 rule: not the reference quantizer's bytes
    from gguf import GGMLQuantizationType, quants
    x = GGUFFile(src).tensor("blk.0.attn_v.weight").data
    ref = quants.quantize(np.asarray(x), GGMLQuantizationType.Q5_1)
    assert not np.array_equal(f.tensor("blk.0.attn_v.weight").raw_rows(), ref)


def test_budget_meets_target_and_beats_uniform_error(tmp_path, rng):
    src = GGUFFile(tiny_llama(tmp_path / "t.gguf", rng, n_embd=256, n_ff=512, n_vocab=128))
    base = planning.make_plan(src, planning.Options(target="Q4_0", pure=True))
    allowed = ["Q4_0", "Q5_0", "Q8_0"]
    uniform = planning.make_plan(src, planning.Options(target="Q5_0", pure=True))
    target = uniform.out_bytes  # the budget of all-Q5_0
    fitted = budget.fit(src, base, allowed, target)
    assert fitted.out_bytes <= target
    assert len({s.out_type.name for s in fitted.steps if s.quantizable}) > 1  # it mixed types

    def total_error(p):
        return sum(budget.measure(src, s, [s.out_type.name], {})[s.out_type.name] for s in p.steps if s.quantizable)
    assert total_error(fitted) <= total_error(uniform)
    with pytest.raises(GgufToolError, match="below the smallest plan"):
        budget.fit(src, base, allowed, 1000)
