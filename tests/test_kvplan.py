"""kv-plan against hand computation from the models' published shapes and llama.cpp's own allocation."""
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
def test_sizes_equal_llama_cpp_allocation(gemma, smollm2):
    """The cache llama.cpp itself reports allocating, for a mixed pair of ours and stock."""
    from gguftool.native import tools
    try:
        exe = tools.tool("llama-completion")
    except GgufToolError as e:
        pytest.skip(e.message)
    from gguftool.io.reader import GGUFFile
    for model, ctx in ((gemma, 8192), (smollm2, 1000)):
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
    pairs = tuple(p.removeprefix("cal:") for m in kvplan.measured()["models"].values() for p in m["rows"])
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
