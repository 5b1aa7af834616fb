"""The calibration and llama.cpp's head-wide rotation inside SET_ROWS and FLASH_ATTN_EXT
(gguftool/native/patches/gqt_kv_fused.h) compute the same floats as the graph nodes they replace.

The reference is the same build with GGUFTOOL_KV_FUSED=0, which keeps upstream's rotation nodes and the
calibration's ggml_sub/mul/add: prefill logits must be byte-identical, greedy decodes (the split-key path
and the one-chunk path) token-identical, and the fused graph must be smaller (or nothing was fused)."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from .test_kvcalib import random_calibration

pytestmark = pytest.mark.native

TEXT = Path(__file__).parent / "data" / "native_emma_excerpt.txt"


def _tool(name: str) -> Path:
    from gguftool.native import tools
    try:
        return tools.tool(name)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"native build absent: {e}")


def _run(args: list[str], fused: bool) -> tuple[str, str]:
    env = {**os.environ, "GGUFTOOL_KV_FUSED": "1" if fused else "0"}
    r = subprocess.run(args, capture_output=True, text=True, env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-1500:]
    return r.stdout, r.stderr


def _nodes(log: str) -> int:
    return int(re.search(r"graph: nodes = (\d+)", log).group(1))


def _perplexity(model: Path, k: str, v: str, logits: Path, fused: bool, ctx: int) -> tuple[str, int]:
    log = "".join(_run([str(_tool("llama-perplexity")), "-m", str(model), "-f", str(TEXT), "-c", str(ctx),
                        "-b", str(ctx), "--chunks", "2", "-t", "2", "-fa", "on", "-ctk", k, "-ctv", v, "-v",
                        "--kl-divergence-base", str(logits)], fused))
    chunks = re.search(r"^\[1\].*$", log, re.M)
    assert chunks, log[-1500:]
    return chunks.group(0), _nodes(log)


def _greedy(model: Path, k: str, v: str, prompt: Path, fused: bool) -> str:
    """the generated text (stdout)"""
    return _run([str(_tool("llama-completion")), "-m", str(model), "-f", str(prompt), "-n", "24", "--temp", "0",
                 "-fa", "on", "-ctk", k, "-ctv", v, "-t", "2", "-c", "1024", "--no-display-prompt", "-no-cnv"],
                fused)[0]


@pytest.mark.parametrize("calibrated,k,v", [
    (False, "tq3_3", "tq3_3"),    # our types: only the rotation moves into the kernels
    (True, "q4_0", "tq3_3"),      # a stock K type of a calibrated file, our V: both transforms
    (True, "tq3_1", "q8_0"),
])
def test_smollm2_prefill_logits_are_identical(smollm2, tmp_path, calibrated, k, v):
    model = random_calibration(smollm2, tmp_path / "cal.gguf", 5) if calibrated else smollm2
    graph_ppl, graph_nodes = _perplexity(model, k, v, tmp_path / "graph.kld", False, 256)
    fused_ppl, fused_nodes = _perplexity(model, k, v, tmp_path / "fused.kld", True, 256)
    assert fused_ppl == graph_ppl
    assert (tmp_path / "fused.kld").read_bytes() == (tmp_path / "graph.kld").read_bytes()
    # 30 layers; per layer the Q, K, V and output rotations (a reshape, the transform, a reshape back) and
    # with a calibration its five nodes
    assert graph_nodes - fused_nodes == 30 * (17 if calibrated else 12), (graph_nodes, fused_nodes)


def test_stock_cache_of_a_plain_file_keeps_the_graph(smollm2, tmp_path):
    """Only gguftool's types and calibrated files take the fused path: stock q4_0 on a plain file runs
    upstream's graph, so benchmarks against it compare with what users have."""
    _, graph_nodes = _perplexity(smollm2, "q4_0", "q4_0", tmp_path / "a.kld", False, 256)
    _, fused_nodes = _perplexity(smollm2, "q4_0", "q4_0", tmp_path / "b.kld", True, 256)
    assert fused_nodes == graph_nodes


def test_gemma_calibrated_prefill_and_decode_match(gemma, tmp_path):
    """Gemma 3: head dim 256 (a 256-wide K rotation, 64-wide V), sliding-window layers (the other cache of
    the pair), and decodes past 512 cached keys (the split-key path) and below (the one-chunk path)."""
    model = random_calibration(gemma, tmp_path / "cal.gguf", 6)
    graph_ppl, graph_nodes = _perplexity(model, "tq3_3", "iq4_nl", tmp_path / "graph.kld", False, 512)
    fused_ppl, fused_nodes = _perplexity(model, "tq3_3", "iq4_nl", tmp_path / "fused.kld", True, 512)
    assert fused_ppl == graph_ppl
    assert graph_nodes - fused_nodes == 18 * 17, (graph_nodes, fused_nodes)
    words = TEXT.read_text().split()
    for n_words, name in ((600, "long.txt"), (60, "short.txt")):
        prompt = tmp_path / name
        prompt.write_text(" ".join(words[:n_words]))
        graph = _greedy(model, "tq3_3", "tq3_3", prompt, False)
        assert len(re.findall(r"\w+", graph)) >= 8, graph   # words, or a random calibration's "very--very--..."
        assert _greedy(model, "tq3_3", "tq3_3", prompt, True) == graph
