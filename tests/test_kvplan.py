"""kv-plan against hand computation from the models' published shapes and llama.cpp's own allocation."""
import dataclasses
import json
import re
import subprocess

import pytest

from gguftool.cli import main
from gguftool.cli.size import parse_size
from gguftool.errors import GgufToolError
from gguftool.pipeline import kvplan
from gguftool.pipeline.kvplan import Shape, bytes_per_token, cache_bytes, max_context, plan


def _plan_json(capsys, *argv) -> dict:
    assert main(["kv-plan", *argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_smollm2_by_hand(smollm2, capsys):
    # SmolLM2-135M: 30 layers, 3 KV heads, head dim 64 (K and V), trained on 8192 tokens, vocabulary 49152.
    out = _plan_json(capsys, str(smollm2), "--memory", "200MiB", "--ctx", "2048",
                     "--kv", "f16", "--kv", "q8_0/tq3_1", "--kv", "q4_hqq_128")
    rows = {r["pair"]: r for r in out["rows"]}
    f16 = 30 * 3 * (64 + 64) * 2                     # 23,040 bytes per token
    mixed = 30 * 3 * 2 * (34 + 14)                   # Q8_0 34 B and TQ3_1 14 B per 32 values
    assert rows["f16/f16"]["bytes_per_token"] == f16 and rows["q8_0/tq3_1"]["bytes_per_token"] == mixed
    assert rows["q8_0/tq3_1"]["bits_per_value"] == 6.0 and rows["q8_0/tq3_1"]["kv_bytes_at_ctx"] == 2048 * mixed
    shape = out["shape"]
    budget = 200 * 2**20 - shape["weights_bytes"] - 512 * (49152 + 4 * 576) * 4
    assert rows["f16/f16"]["max_context"] == budget // f16 // 256 * 256   # whole 256-cell steps
    assert "q4_hqq_128/q4_hqq_128" not in rows  # 128-blocks do not divide head dim 64
    big = _plan_json(capsys, str(smollm2), "--memory", "8GiB", "--kv", "q4_0")
    assert big["rows"][0]["max_context"] == 8192   # capped at the trained length


def test_gemma3_sliding_window_as_llama_cpp_allocates(gemma, capsys):
    # llama.cpp: 3 global layers x 8192 cells + 15 sliding-window layers x pad256(512 + 512) cells,
    # 1 KV head x 256 x (K + V) x 2 bytes = 39 MiB (not the 144 MiB of 18 full layers)
    out = _plan_json(capsys, str(gemma), "--memory", "2GiB", "--ctx", "8192", "--kv", "f16")
    assert out["shape"]["swa_layers"] == 15 and out["shape"]["n_ctx_train"] == 32768
    assert out["rows"][0]["kv_bytes_at_ctx"] == (3 * 8192 + 15 * 1024) * 1024 == 39 * 2**20
    full = _plan_json(capsys, str(gemma), "--memory", "2GiB", "--ctx", "8192", "--kv", "f16", "--swa-full")
    assert full["rows"][0]["kv_bytes_at_ctx"] == 18 * 8192 * 1024


@pytest.mark.native
def test_sizes_equal_llama_cpp_allocation(gemma, smollm2, tmp_path):
    """The cache llama.cpp itself reports allocating, for a mixed pair of ours and stock, and for a file's
    per-layer K plan over sliding-window and global layers (Gemma 3: layer 5 is global)."""
    from gguftool.native import tools
    from gguftool.pipeline import kvcalib
    try:
        exe = tools.tool("llama-completion")
    except GgufToolError as e:
        pytest.skip(e.message)
    from gguftool.io.reader import GGUFFile
    planned = tmp_path / "gemma-plan.gguf"
    kvcalib.write(gemma, planned, kvcalib.plan_metadata({"k": kvplan.LayerPlan.parse("q8_0=4-6:q4_0,11:tq3_1")}), {})
    for model, ctx in ((gemma, 8192), (smollm2, 1000), (planned, 8192)):
        r = subprocess.run([str(exe), "-m", str(model), "-c", str(ctx), "-n", "1", "-p", "Hi", "-ctk", "q8_0",
                            "-ctv", "tq3_1", "-fa", "on", "-t", "1", "-no-cnv", "--no-warmup", "-v"],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-1500:]
        mib = {float(x) for x in re.findall(r"llama_kv_cache: size =\s+([0-9.]+) MiB", r.stderr + r.stdout)}
        got = cache_bytes(Shape.from_gguf(GGUFFile(model)), "q8_0", "tq3_1", ctx) / 2**20
        assert abs(sum(mib) - got) < 0.01, (model.name, mib, got)


def test_llama_8b_like_shape_by_hand():
    s = Shape(n_layer=32, n_head_kv=8, head_dim_k=128, head_dim_v=128, weights_bytes=0)
    assert bytes_per_token(s, "f16", "f16") == 32 * 8 * 256 * 2 == 131072   # 128 KiB/token, the article's figure
    assert bytes_per_token(s, "q4_hqq", "tq3_0") == 32 * 8 * (4 * 20 + 4 * 14)
    r = {x["pair"]: x for x in plan(s, 2 * 2**30, kv_only=True, pairs=("f16", "tq3_1", "q8_0/q4_0"))}
    assert r["f16/f16"]["max_context"] == 16384 and abs(r["tq3_1/tq3_1"]["vs_f16"] - 32 / 7) < 1e-9
    assert max_context(s, "f16", "f16", 2**30 - 1) == 8192 - 256   # one byte short of 8192 tokens


def test_weights_over_budget_is_an_error(smollm2, capsys):
    assert main(["kv-plan", str(smollm2), "--memory", "50MiB"]) != 0
    err = capsys.readouterr()
    assert "alone need more than the 50.0 MiB budget" in err.err and not err.out


def test_best_pair_is_the_best_measured_that_fits():
    """The measured table decides: the pick fits, and nothing that fits measured lower KLD on every model."""
    s = Shape(n_layer=30, n_head_kv=3, head_dim_k=64, head_dim_v=64, weights_bytes=0, n_ctx_train=8192)
    # rows with a per-layer plan (' k[...]') describe a file carrying that plan, not a pair kv-plan lists
    pairs = tuple(p.removeprefix("cal:") for m in kvplan.measured()["models"].values() for p in m["rows"] if " " not in p)
    rows = plan(s, int(cache_bytes(s, "q4_0", "q4_0", 8192)), ctx=8192, kv_only=True, pairs=tuple(dict.fromkeys(pairs)))
    for calibrated in (False, True):
        key = "quality_calibrated" if calibrated else "quality"
        pick = kvplan.best(rows, calibrated=calibrated)
        assert pick["fits"] and pick["bits_per_value"] <= 4.5
        for r in rows:
            if r["fits"] and r[key] and set(r[key]) == set(pick[key]):
                assert not all(r[key][m]["kld"] < pick[key][m]["kld"] for m in r[key]), (r["pair"], pick["pair"])


def test_measured_table_has_both_models_and_the_stock_peer():
    m = kvplan.measured()["models"]
    assert len(m) == 2
    for rows in (x["rows"] for x in m.values()):
        assert {"q4_0/q4_0", "cal:q4_0/q4_0", "cal:tq3_1/tq3_1"} <= set(rows)
        assert all(0 <= r["kld"] < 5 and r["ppl"] > 1 for r in rows.values())


@pytest.mark.parametrize("text, n", [("2GiB", 2 * 2**30), ("1.5GB", 1_500_000_000), ("512MiB", 512 * 2**20), ("100", 100)])
def test_sizes(text, n):
    assert parse_size(text) == n


def test_bad_size():
    with pytest.raises(GgufToolError, match="cannot read size"):
        parse_size("lots")


# ---- per-layer plans (kv-calibrate --k-layers; docs/kv.md) ------------------------------------------

@pytest.mark.parametrize("spec, rules", [
    ("tq3_2=8-19:q4_0", ((8, 19, "q4_0"),)),
    ("TQ3_2=3:q8_0, 10-12:iq4_nl", ((3, 3, "q8_0"), (10, 12, "iq4_nl"))),
])
def test_layer_plan_parses(spec, rules):
    p = kvplan.LayerPlan.parse(spec, 30)
    assert p.base == "tq3_2" and p.rules == rules
    assert kvplan.LayerPlan.parse(f"tq3_2={p.spec}", 30) == p   # the stored spec reads back the same
    assert p.type_of(rules[0][0], "tq3_2") == rules[0][2] and p.type_of(rules[0][0], "q4_0") == "q4_0"
    assert p.type_of(29, "tq3_2") == "tq3_2"


@pytest.mark.parametrize("spec, says", [
    ("8-19:q4_0", "expected BASE="), ("f16=1:q4_0", "expected BASE="), ("tq3_2=1:f16", "cannot use '1:f16'"),
    ("tq3_2=19-8:q4_0", "cannot use '19-8:q4_0'"), ("tq3_2=28-30:q4_0", "layers 0-29"),
    ("tq3_2=1:q4_0,x", "cannot use 'x'"), ("tq3_2=-1:q4_0", "cannot use '-1:q4_0'"),
])
def test_layer_plan_refuses(spec, says):
    with pytest.raises(GgufToolError) as e:
        kvplan.LayerPlan.parse(spec, 30)
    assert says in e.value.message + (e.value.hint or "")


def test_per_layer_sizes_by_hand():
    """A plan changes only its layers, only for its own base type, sliding-window layers keep their cells."""
    plan_ = kvplan.LayerPlan.parse("tq3_2=1-2:q4_0")
    s = Shape(n_layer=4, n_head_kv=2, head_dim_k=64, head_dim_v=64, weights_bytes=0, swa_layers=2, swa_window=100,
              swa_mask=(True, False, True, False), k_plan=plan_)
    tq, q4 = 26 / 64, 18 / 32                                   # bytes per value
    cell = {il: 2 * 64 * ((q4 if il in (1, 2) else tq) + tq) for il in range(4)}
    assert bytes_per_token(s, "tq3_2", "tq3_2") == pytest.approx(sum(cell.values()))
    assert kvplan.bits_per_value(s, "tq3_2", "tq3_2") == pytest.approx(8 * sum(cell.values()) / (4 * 2 * 128))
    assert bytes_per_token(s, "q4_0", "tq3_2") == 4 * 2 * 64 * (q4 + tq)    # not the plan's base: uniform
    swa_cells = 768                                             # pad256(100 + 512)
    assert cache_bytes(s, "tq3_2", "tq3_2", 4096) == pytest.approx(
        (cell[0] + cell[2]) * swa_cells + (cell[1] + cell[3]) * 4096)
    # within the window every layer holds every token: the per-token average; at 4096 tokens full-context
    # layers weigh more, so upgrading one (layer 1) costs more than its share and a sliding one (2) less
    f16_cell = 2 * 128 * 2
    assert kvplan.bits_per_value(s, "tq3_2", "tq3_2", 256) == pytest.approx(kvplan.bits_per_value(s, "tq3_2", "tq3_2"))
    at_4096 = 16 * ((cell[0] + cell[2]) * swa_cells + (cell[1] + cell[3]) * 4096) / ((2 * swa_cells + 2 * 4096) * f16_cell)
    assert kvplan.bits_per_value(s, "tq3_2", "tq3_2", 4096) == pytest.approx(at_4096)
    full, sliding = (dataclasses.replace(s, k_plan=kvplan.LayerPlan.parse(f"tq3_2={il}:q4_0")) for il in (1, 2))
    per_token = kvplan.bits_per_value(full, "tq3_2", "tq3_2")
    assert kvplan.bits_per_value(sliding, "tq3_2", "tq3_2") == pytest.approx(per_token)
    assert kvplan.bits_per_value(full, "tq3_2", "tq3_2", 4096) > per_token > \
        kvplan.bits_per_value(sliding, "tq3_2", "tq3_2", 4096)
    assert kvplan.config_name(s, "tq3_2", "tq3_2") == "tq3_2/tq3_2 k[1-2:q4_0]"
    assert kvplan.config_name(s, "q4_0", "tq3_2") == "q4_0/tq3_2"


def test_kv_calibrate_refuses_a_bad_plan_before_any_work(smollm2, tmp_path, capsys):
    out = tmp_path / "out.gguf"
    assert main(["kv-calibrate", str(smollm2), str(out), "--k-layers", "tq3_2=25-30:q4_0"]) != 0
    err = capsys.readouterr().err
    assert "--k-layers" in err and "25-30:q4_0" in err and "layers 0-29" in err and not out.exists()


def test_plan_stored_in_the_file_is_what_kv_plan_counts(smollm2, tmp_path, capsys):
    from gguftool.pipeline import kvcalib
    out = tmp_path / "plan.gguf"
    lp = kvplan.LayerPlan.parse("tq3_2=8-19:q4_0", 30)
    kvcalib.write(smollm2, out, kvcalib.plan_metadata({"k": lp}), {"test": "plan"})
    rows = {r["pair"]: r for r in _plan_json(capsys, str(out), "--memory", "1GiB", "--ctx", "1024",
                                             "--kv", "tq3_2", "--kv", "q4_0/tq3_2")["rows"]}
    # SmolLM2: 30 layers x 3 KV heads x 64; K on 12 layers is q4_0 (18 B / 32), the rest and V tq3_2 (26 B / 64)
    per_token = 3 * 64 * (12 * 18 / 32 + 18 * 26 / 64 + 30 * 26 / 64)
    planned = rows["tq3_2/tq3_2 k[8-19:q4_0]"]
    assert planned["bytes_per_token"] == pytest.approx(per_token)
    assert planned["bits_per_value"] == pytest.approx(3.25 + 1.25 * 12 / 60)
    assert rows["q4_0/tq3_2"]["bits_per_value"] == pytest.approx((4.5 + 3.25) / 2)
    # calibrating again without --k-layers keeps the file's plan; a new --k-layers replaces it
    again = tmp_path / "again.gguf"
    kvcalib.write(out, again, kvcalib.plan_metadata({"k": kvplan.LayerPlan.parse("tq3_2=3:q8_0")}), {})
    from gguftool.io.reader import GGUFFile
    assert Shape.from_gguf(GGUFFile(again)).k_plan.spec == "3:q8_0"
    kept = tmp_path / "kept.gguf"
    kvcalib.write(out, kept, [], {})
    assert Shape.from_gguf(GGUFFile(kept)).k_plan == lp
