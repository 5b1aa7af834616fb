"""Damaged GGUF files: every one ends in GgufToolError (or parses), never a crash, hang or huge allocation.

A hand-made corpus covers each section (header, metadata, tensor infos, data); hypothesis then mutates
a valid file at random. Values of any type (any JSON in config.json and tokenizer.json at the keys convert
reads, any GGUF value type at the metadata keys gguftool and llama.cpp read) end in exit 0 or a clean error,
never in the last-resort handler. `GGUFTOOL_FUZZ_EXAMPLES=20000 pytest tests/test_fuzz_reader.py` runs a
longer campaign."""
from __future__ import annotations

import os
import resource
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gguftool.errors import GgufToolError
from gguftool.io.reader import GGUFFile

from .conftest import write_gguf

EXAMPLES = int(os.environ.get("GGUFTOOL_FUZZ_EXAMPLES", "300"))


@pytest.fixture(scope="module")
def seed_file(tmp_path_factory) -> bytes:
    rng = np.random.default_rng(7)
    p = write_gguf(tmp_path_factory.mktemp("seed") / "seed.gguf", {
        "a.weight": (rng.standard_normal((4, 32)).astype(np.float32), None),
        "b.weight": (rng.standard_normal((2, 64)).astype(np.float16), None),
    }, metadata={"general.name": "seed", "llama.block_count": 1, "x.f": 0.5})
    return p.read_bytes()


def _parse(data: bytes, tmp_path) -> str:
    p = tmp_path / "f.gguf"
    p.write_bytes(data)
    try:
        f = GGUFFile(p)
        for t in f.tensors:  # touching the data must stay inside the file
            assert t.offset + t.n_bytes <= len(data)
            t.raw_rows().sum()
        return "ok"
    except GgufToolError as e:
        assert str(p) in e.message
        return "error"


def _offsets(data: bytes) -> dict[str, int]:
    kv_count = struct.unpack_from("<Q", data, 16)[0]
    return {"tensor_count": 8, "kv_count": 16, "first_key_len": 24, "kv_count_value": kv_count}


@pytest.mark.parametrize("cut", [4, 8, 16, 24, 30, 60, 120, 200, 260, 300, -300, -1])
def test_truncated_at_every_section(seed_file, tmp_path, cut):
    assert _parse(seed_file[:cut], tmp_path) == "error"


@pytest.mark.parametrize("field, value", [
    ("tensor_count", 2**63), ("tensor_count", 10**6), ("kv_count", 2**64 - 1), ("kv_count", 10**7),
    ("first_key_len", 2**62), ("first_key_len", 0),
])
def test_bad_counts_and_huge_lengths(seed_file, tmp_path, field, value):
    data = bytearray(seed_file)
    struct.pack_into("<Q", data, _offsets(seed_file)[field], value)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, hard))  # a huge allocation fails instead of swapping
    try:
        assert _parse(bytes(data), tmp_path) in ("ok", "error")
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _tensor_info_pos(data: bytes, name: bytes) -> int:
    key = struct.pack("<Q", len(name)) + name
    return data.index(key) + len(key)


@pytest.mark.parametrize("mutation", ["overlap", "misaligned", "past_end", "zero_dim", "huge_dims", "bad_utf8"])
def test_bad_tensor_infos(seed_file, tmp_path, mutation):
    data = bytearray(seed_file)
    pos = _tensor_info_pos(seed_file, b"b.weight")
    n_dims = struct.unpack_from("<I", data, pos)[0]
    dims_at, type_at = pos + 4, pos + 4 + 8 * n_dims
    off_at = type_at + 4
    if mutation == "overlap":     # b's data placed on top of a's: llama.cpp refuses it, so do we
        struct.pack_into("<Q", data, off_at, 0)
    elif mutation == "misaligned":
        struct.pack_into("<Q", data, off_at, struct.unpack_from("<Q", data, off_at)[0] + 3)
    elif mutation == "past_end":
        struct.pack_into("<Q", data, off_at, 2**40)
    elif mutation == "zero_dim":
        struct.pack_into("<Q", data, dims_at, 0)
    elif mutation == "huge_dims":
        struct.pack_into("<Q", data, dims_at, 2**62)
    elif mutation == "bad_utf8":
        i = seed_file.index(b"seed", 30)
        data[i:i + 2] = b"\xff\xfe"
    expected = "error"
    assert _parse(bytes(data), tmp_path) == expected


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_mutations(seed_file, tmp_path_factory, data):
    buf = bytearray(seed_file)
    for _ in range(data.draw(st.integers(1, 8))):
        kind = data.draw(st.sampled_from(["flip", "byte", "u64", "cut"]))
        pos = data.draw(st.integers(0, len(buf) - 1))
        if kind == "flip":
            buf[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "byte":
            buf[pos] = data.draw(st.integers(0, 255))
        elif kind == "u64" and pos + 8 <= len(buf):
            struct.pack_into("<Q", buf, pos, data.draw(st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1])))
        elif kind == "cut":
            del buf[pos:]
            if not buf:
                buf = bytearray(b"G")
    assert _parse(bytes(buf), tmp_path_factory.mktemp("m")) in ("ok", "error")


# -- values of any type where a known key is read: exit 0 or a clean error (1), never the last resort (70) ----------
_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
_CONFIG_KEYS = ["num_attention_heads", "num_key_value_heads", "num_hidden_layers", "hidden_size", "intermediate_size",
                "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", "head_dim", "rope_scaling",
                "architectures", "text_config", "tie_word_embeddings", "type_vocab_size", "layer_norm_eps"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from .test_convert import tiny_checkpoint
    return tiny_checkpoint(tmp_path_factory.mktemp("ck") / "ck", np.random.default_rng(1))


def _convert_rc(ck, tmp, capsys) -> int:
    from gguftool.cli import main
    rc = main(["convert", str(ck), str(tmp / "o.gguf"), "--dry-run"])
    err = capsys.readouterr().err
    assert rc in (0, 1) and "unexpected" not in err, err
    return rc


@settings(max_examples=max(EXAMPLES // 5, 40), deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_config_values_of_any_type(checkpoint, tmp_path_factory, capsys, data):
    import json
    import shutil
    tmp = tmp_path_factory.mktemp("cfg")
    ck = tmp / "ck"
    shutil.copytree(checkpoint, ck)
    cfg = json.loads((ck / "config.json").read_text())
    for key in data.draw(st.lists(st.sampled_from(_CONFIG_KEYS), min_size=1, max_size=3, unique=True)):
        cfg[key] = data.draw(_JSON_VALUES)
    (ck / "config.json").write_text(json.dumps(cfg))
    _convert_rc(ck, tmp, capsys)


_TOKENIZER_PATHS = [("model", "vocab"), ("model", "merges"), ("model", "type"), ("model", "byte_fallback"),
                    ("model", "unk_token"), ("added_tokens",), ("pre_tokenizer",), ("normalizer",), ("post_processor",),
                    ("model",), ("decoder",)]


@settings(max_examples=max(EXAMPLES // 5, 40), deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_tokenizer_values_of_any_type(checkpoint, tmp_path_factory, capsys, data):
    import json
    import shutil
    tmp = tmp_path_factory.mktemp("tok")
    ck = tmp / "ck"
    shutil.copytree(checkpoint, ck)
    tok = json.loads((ck / "tokenizer.json").read_text())
    for path in data.draw(st.lists(st.sampled_from(_TOKENIZER_PATHS), min_size=1, max_size=2, unique=True)):
        node = tok
        for k in path[:-1]:
            node = node.setdefault(k, {}) if isinstance(node.get(k), dict) else node.__setitem__(k, {}) or node[k]
        node[path[-1]] = data.draw(_JSON_VALUES)
    (ck / "tokenizer.json").write_text(json.dumps(tok))
    tcfg = json.loads((ck / "tokenizer_config.json").read_text())
    if data.draw(st.booleans()):
        tcfg[data.draw(st.sampled_from(["bos_token", "eos_token", "add_bos_token", "chat_template", "add_prefix_space",
                                        "pad_token"]))] = data.draw(_JSON_VALUES)
    (ck / "tokenizer_config.json").write_text(json.dumps(tcfg))
    _convert_rc(ck, tmp, capsys)


def _gguf_values():
    from gguf import GGUFValueType as T
    ints = {T.UINT8: (0, 255), T.INT8: (-128, 127), T.UINT16: (0, 2**16 - 1), T.INT16: (-2**15, 2**15 - 1),
            T.UINT32: (0, 2**32 - 1), T.INT32: (-2**31, 2**31 - 1), T.UINT64: (0, 2**64 - 1), T.INT64: (-2**63, 2**63 - 1)}
    scalar = st.one_of(
        *[st.tuples(st.integers(lo, hi), st.just(t)) for t, (lo, hi) in ints.items()],
        st.tuples(st.floats(width=32), st.just(T.FLOAT32)), st.tuples(st.floats(), st.just(T.FLOAT64)),
        st.tuples(st.booleans(), st.just(T.BOOL)), st.tuples(st.text(max_size=6), st.just(T.STRING)))
    arrays = st.one_of(st.lists(st.integers(0, 600), min_size=1, max_size=5),   # gguf writes no empty array
                       st.lists(st.integers(-5, 5), min_size=1, max_size=3),
                       st.lists(st.text(max_size=4), min_size=1, max_size=4),
                       st.lists(st.floats(width=32), min_size=1, max_size=3), st.lists(st.booleans(), min_size=1, max_size=3),
                       st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=2), min_size=1, max_size=2))
    return st.one_of(scalar, st.tuples(arrays, st.just(T.ARRAY)))


_GGUF_KEYS = ["llama.block_count", "llama.context_length", "llama.embedding_length", "llama.feed_forward_length",
              "llama.attention.head_count", "llama.attention.head_count_kv", "llama.attention.key_length",
              "llama.rope.freq_base", "llama.attention.sliding_window", "llama.attention.sliding_window_pattern",
              "general.architecture", "general.name", "general.file_type", "general.quantization_version",
              "tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
              "tokenizer.ggml.bos_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.model", "split.count",
              "split.no", "gguftool.type.Q4_HQQ.id", "gguftool.kv_calib.x"]


@settings(max_examples=max(EXAMPLES // 5, 40), deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_gguf_metadata_values_of_any_type(tmp_path_factory, capsys, data):
    from gguf import GGUFValueType as T
    from gguf import GGUFWriter

    from gguftool.cli import main
    tmp = tmp_path_factory.mktemp("meta")
    kv = {"llama.block_count": (1, T.UINT32), "llama.embedding_length": (64, T.UINT32),
          "llama.attention.head_count": (4, T.UINT32)}
    for key in data.draw(st.lists(st.sampled_from(_GGUF_KEYS), min_size=1, max_size=4, unique=True)):
        kv[key] = data.draw(_gguf_values())
    p = tmp / "m.gguf"
    w = GGUFWriter(p, "llama")
    for k, (v, t) in kv.items():
        w.add_key_value(k, v, t)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((32, 64)).astype(np.float32))
    w.add_tensor("blk.0.ffn_up.weight", rng.standard_normal((64, 64)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for argv in (["inspect", str(p), "--metadata", "--format", "json"], ["kv-plan", str(p), "--memory", "1G"],
                 ["quantize", str(p), str(tmp / "o.gguf"), "Q4_HQQ", "--dry-run"]):
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc in (0, 1) and "unexpected" not in err, (argv, kv, err)
