"""`gguftool convert` checked by llama.cpp itself (native build): embeddings against llama.cpp's own
convert_hf_to_gguf.py output, and perplexity of a decoder rebuilt in HF layout against its source GGUF."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gguftool.cli import main
from gguftool.errors import GgufToolError
from gguftool.io.reader import GGUFFile

from .hf_export import export_llama

pytestmark = [pytest.mark.native, pytest.mark.slow]
SENTENCES = ["The quick brown fox jumps over the lazy dog.",
             "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
             "must be in want of a wife.",
             "Quantization trades a little accuracy for a much smaller model.",
             "HELLO world! Tokenizers lowercase this for an uncased BERT."]


@pytest.fixture(scope="module")
def tools() -> Path:
    try:
        from gguftool.native import find_build
        return find_build().bin_dir
    except GgufToolError as e:
        pytest.skip(f"native llama.cpp build absent: {e.message}")


@pytest.fixture(scope="module")
def convert_hf() -> Path:
    from gguftool.native import PINNED, cache_root
    script = cache_root() / "src" / f"llama.cpp-{PINNED.version}" / "convert_hf_to_gguf.py"
    if not script.is_file():
        pytest.skip(f"llama.cpp source tree absent ({script}); run `gguftool native build`")
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"convert_hf_to_gguf.py needs {', '.join(missing)} (pip install torch transformers)")
    return script


def run_convert_hf(script: Path, model_dir: Path, out: Path, outtype: str) -> Path:
    r = subprocess.run([sys.executable, str(script), str(model_dir), "--outfile", str(out), "--outtype", outtype],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def embeddings(tools: Path, model: Path) -> np.ndarray:
    cmd = [str(tools / "llama-embedding"), "-m", str(model), "-p", "\n".join(SENTENCES),
           "--embd-output-format", "array", "--embd-normalize", "2", "-t", "2", "--no-warmup"]
    for _ in range(5):  # llama.cpp's asynchronous logger sometimes loses the tail of stdout at exit: run again
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        out = r.stdout.strip()
        if out.startswith("[[") and out.endswith("]]"):
            e = np.array(json.loads(out), dtype=np.float64)
            assert e.shape[0] == len(SENTENCES)
            return e
    raise AssertionError(f"llama-embedding printed no complete array: ...{r.stdout[-200:]!r}")


@pytest.mark.parametrize("outtype", ["f32", "f16"])
def test_minilm_matches_llamacpp_converter(tmp_path, tools, convert_hf, minilm_dir, outtype):
    ref = run_convert_hf(convert_hf, minilm_dir, tmp_path / "ref.gguf", outtype)
    ours = tmp_path / "ours.gguf"
    assert main(["convert", str(minilm_dir), str(ours), "--outtype", outtype]) == 0
    a, b = GGUFFile(ref), GGUFFile(ours)
    assert {t.name for t in a.tensors} == {t.name for t in b.tensors}
    for t in a.tensors:
        u = b.tensor(t.name)
        assert u.type == t.type and np.array_equal(u.raw_rows(), t.raw_rows()), t.name
    ea, eb = embeddings(tools, ref), embeddings(tools, ours)
    cos = np.sum(ea * eb, axis=1) / np.linalg.norm(ea, axis=1) / np.linalg.norm(eb, axis=1)
    print(f"minilm {outtype}: cosine per sentence {np.round(cos, 6).tolist()}")
    assert cos.min() > 0.999
    # and the sentences are told apart (the comparison is not between two constant vectors)
    assert float(ea[0] @ ea[1]) < 0.9


def perplexity(tools: Path, model: Path, text: Path) -> float:
    r = subprocess.run([str(tools / "llama-perplexity"), "-m", str(model), "-f", str(text), "-c", "128",
                        "--chunks", "8", "-b", "128", "-t", "2"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", r.stdout + r.stderr)
    assert m, (r.stdout + r.stderr)[-2000:]
    return float(m.group(1))


def test_smollm2_rebuilt_in_hf_layout_keeps_its_perplexity(tmp_path, tools, smollm2):
    import gguftool
    text = tmp_path / "pride.txt"
    prose = (Path(gguftool.__file__).parent / "data" / "pride_and_prejudice.txt").read_text(encoding="utf-8")
    text.write_text(prose[20000:45000], encoding="utf-8")
    hf = export_llama(smollm2, tmp_path / "hf")  # all 30 blocks, float32 safetensors, tokenizer.json
    back = tmp_path / "back-Q4_1.gguf"
    assert main(["convert", str(hf), str(back), "--outtype", "Q4_1", "--threads", "2"]) == 0
    f16 = tmp_path / "back-F16.gguf"
    assert main(["convert", str(hf), str(f16), "--outtype", "F16"]) == 0
    # llama.cpp's own route to F16 from the source: llama-quantize dequantizes Q4_1 and stores F16
    ref16 = tmp_path / "llama-quantize-F16.gguf"
    r = subprocess.run([str(tools / "llama-quantize"), "--allow-requantize", str(smollm2), str(ref16), "F16", "2"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    a, b = GGUFFile(ref16), GGUFFile(f16)
    for t in a.tensors:
        assert np.array_equal(b.tensor(t.name).raw_rows(), t.raw_rows()), t.name
    results = {"source Q4_1": perplexity(tools, smollm2, text), "converted Q4_1": perplexity(tools, back, text),
               "converted F16": perplexity(tools, f16, text)}
    print("SmolLM2 perplexity:", results)
    # Q4_1 -> HF float32 -> Q4_1 is the same model; F16 runs the same weights without Q4_1's q8_1 activations
    assert abs(results["converted Q4_1"] / results["source Q4_1"] - 1) < 0.005
    assert abs(results["converted F16"] / results["source Q4_1"] - 1) < 0.01


def test_smollm2_hf_layout_matches_llamacpp_converter(tmp_path, convert_hf, smollm2):
    # convert_hf_to_gguf.py reads our rebuilt tokenizer.json through transformers and hashes its output to
    # name the pre-tokenizer: finding "smollm" also checks the rebuilt tokenizer tokenizes like the original
    pytest.importorskip("sentencepiece")  # convert_hf_to_gguf.py imports it before falling back to tokenizer.json
    hf = export_llama(smollm2, tmp_path / "hf", n_layers=2)
    ref = run_convert_hf(convert_hf, hf, tmp_path / "ref.gguf", "f32")
    ours = tmp_path / "ours.gguf"
    assert main(["convert", str(hf), str(ours), "--outtype", "f32"]) == 0
    a, b = GGUFFile(ref), GGUFFile(ours)
    assert [t.name for t in sorted(a.tensors, key=lambda t: t.name)] == [t.name for t in sorted(b.tensors, key=lambda t: t.name)]
    for t in a.tensors:
        assert np.array_equal(b.tensor(t.name).raw_rows(), t.raw_rows()), t.name
    ma, mb = a.metadata, b.metadata
    assert ma["tokenizer.ggml.pre"] == "smollm"
    diff = {k for k in set(ma) | set(mb) if ma.get(k) != mb.get(k) and not k.startswith("gguftool.")}
    assert not diff, {k: (ma.get(k), mb.get(k)) for k in diff}
