"""kv-plan against hand computation from the models' published shapes."""
import json

import pytest

from gguftool.cli import main
from gguftool.cli.size import parse_size
from gguftool.errors import GgufToolError
from gguftool.pipeline.kvplan import Shape, bytes_per_token, plan


def test_smollm2_by_hand(smollm2, capsys):
    # SmolLM2-135M: 30 layers, 3 KV heads, head dim 64 (K and V).
    assert main(["kv-plan", str(smollm2), "--memory", "1GiB", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["type"]: r for r in out["rows"]}
    f16 = 30 * 3 * (64 + 64) * 2                     # 23,040 bytes per token
    q8 = 30 * 3 * 2 * (64 // 32) * 34                # Q8_0: 34 bytes per 32 values
    tq3 = 30 * 3 * 2 * (64 // 32) * 14               # TQ3_0: 14 bytes per 32 values
    assert rows["f16"]["bytes_per_token"] == f16 and rows["q8_0"]["bytes_per_token"] == q8
    assert rows["tq3_0"]["bytes_per_token"] == tq3
    weights = out["shape"]["weights_bytes"]
    assert rows["f16"]["max_context"] == (2**30 - weights) // f16
    assert "q4_hqq_128" not in rows  # 128-blocks do not divide head dim 64


def test_llama_8b_like_shape_by_hand():
    s = Shape(n_layer=32, n_head_kv=8, head_dim_k=128, head_dim_v=128, weights_bytes=0)
    assert bytes_per_token(s, "f16", "f16") == 32 * 8 * 256 * 2 == 131072   # 128 KiB/token, the article's figure
    assert bytes_per_token(s, "q4_hqq", "tq3_0") == 32 * 8 * (4 * 20 + 4 * 14)
    r = {x["type"]: x for x in plan(s, 2 * 2**30, kv_only=True)}
    assert r["f16"]["max_context"] == 16384 and abs(r["tq3_0"]["vs_f16"] - 32 / 7) < 1e-9


@pytest.mark.parametrize("text, n", [("2GiB", 2 * 2**30), ("1.5GB", 1_500_000_000), ("512MiB", 512 * 2**20), ("100", 100)])
def test_sizes(text, n):
    assert parse_size(text) == n


def test_bad_size():
    with pytest.raises(GgufToolError, match="cannot read size"):
        parse_size("lots")
