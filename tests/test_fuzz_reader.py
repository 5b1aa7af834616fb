"""Damaged GGUF files: every one ends in GgufToolError (or parses), never a crash, hang or huge allocation.

A hand-made corpus covers each section (header, metadata, tensor infos, data); hypothesis then mutates
a valid file at random. `GGUFTOOL_FUZZ_EXAMPLES=20000 pytest tests/test_fuzz_reader.py` runs a longer campaign."""
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
