"""GGUF I/O: round trips with upstream and custom type ids, and clear errors on bad files."""
from __future__ import annotations

import os
import stat
import struct

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, quants

from gguftool import types
from gguftool.errors import GgufToolError
from gguftool.io.reader import GGUFFile, tensor_type
from gguftool.io.writer import StreamingWriter, check_output_path

from .conftest import tiny_llama


def _write_custom(path, tensors):
    """tensors: name -> (numpy-order element shape, type name, raw uint8 bytes)."""
    w = StreamingWriter(path, "llama")
    w.add("general.name", "custom", GGUFValueType.STRING)
    for name, (shape, tname, _) in tensors.items():
        w.add_tensor_info(name, shape, tensor_type(_type_id(tname)))
    w.begin()
    for _, (_, _, raw) in tensors.items():
        w.write(raw)
    w.commit()
    return path


def _type_id(name):
    t = types.lookup(name)
    return t.id if t else types.stock(name).id


def test_q1_0_and_q2_0_read_without_the_native_build(tmp_path, rng, monkeypatch):
    """Upstream's 1- and 2-bit types (Q2_0 unknown to the gguf package, Q1_0 unknown to gguf.quants) read back
    by gguftool's numpy twins: blocks built here from codes, decoded as ggml-common.h defines the layout."""
    from gguftool.quant import codec, standard
    monkeypatch.setattr(standard, "_ggml_available", lambda: False)
    d = np.float16(0.375)
    bits = rng.integers(0, 2, (2, 256)).astype(np.uint8)             # Q1_0: 128 values a block, bit j of the
    q1 = np.concatenate([np.full((2, 2, 1), d).view(np.uint8).reshape(2, 2, 2),   # block: +d if set, else -d
                         np.packbits(bits.reshape(2, 2, 128), axis=2, bitorder="little")], axis=2).reshape(2, 36)
    codes = rng.integers(0, 4, (2, 128)).astype(np.uint8)            # Q2_0: 64 values, 4 codes a byte, low first
    packed = (codes.reshape(2, 2, 16, 4) << np.array([0, 2, 4, 6], np.uint8)).sum(axis=3, dtype=np.uint8)
    q2 = np.concatenate([np.full((2, 2, 1), d).view(np.uint8).reshape(2, 2, 2), packed], axis=2).reshape(2, 36)
    path = _write_custom(tmp_path / "low.gguf", {"a": ((2, 256), "Q1_0", q1), "b": ((2, 128), "Q2_0", q2)})
    f = GGUFFile(path)
    a, b = f.tensor("a"), f.tensor("b")
    assert (a.type.name, a.type.id, b.type.name, b.type.id) == ("Q1_0", 41, "Q2_0", 42)
    np.testing.assert_array_equal(codec("Q1_0").dequantize(a.raw_rows()), np.where(bits, 0.375, -0.375))
    np.testing.assert_array_equal(codec("Q2_0").dequantize(b.raw_rows()), (codes.astype(np.float32) - 1) * 0.375)


def test_round_trip_every_tensor_and_key(tmp_path, rng):
    src = tiny_llama(tmp_path / "a.gguf", rng)
    f = GGUFFile(src)
    q40 = quants.quantize(rng.standard_normal((8, 64)).astype(np.float32), GGMLQuantizationType.Q4_0)
    custom = rng.integers(0, 256, size=(8, 2 * 20), dtype=np.uint8)  # 8 rows x 64 values of Q4_HQQ
    out = tmp_path / "b.gguf"
    w = StreamingWriter(out, f.architecture)
    w.copy_metadata(f)
    for t in f.tensors:
        w.add_tensor_info(t.name, t.shape, t.type)
    w.add_tensor_info("extra.q4_0.weight", (8, 64), tensor_type(int(GGMLQuantizationType.Q4_0)))
    w.add_tensor_info("extra.hqq.weight", (8, 64), tensor_type(types.BY_NAME["Q4_HQQ"].id))
    w.begin()
    for t in f.tensors:
        w.write(t.raw_rows())
    w.write(q40)
    w.write_chunks([custom[:3], custom[3:]])
    w.commit()

    g = GGUFFile(out)
    assert [t.name for t in g.tensors] == [t.name for t in f.tensors] + ["extra.q4_0.weight", "extra.hqq.weight"]
    for t in f.tensors:
        u = g.tensor(t.name)
        assert (u.shape, u.type) == (t.shape, t.type)
        assert np.array_equal(u.raw_rows(), t.raw_rows())
    assert np.array_equal(g.tensor("extra.q4_0.weight").raw_rows(), q40)
    assert np.array_equal(g.tensor("extra.hqq.weight").raw_rows(), custom)
    assert g.tensor("extra.hqq.weight").type.name == "Q4_HQQ"
    for k, v in f.metadata.items():
        assert g.get(k) == v, k
    rec = {a: g.get(f"gguftool.type.Q4_HQQ.{a}") for a in types.META_FIELDS}
    assert rec == {"id": 512, "block_size": 32, "type_size": 20, "layout_version": 1}


def test_bulk_metadata_equals_gguf_py(smollm2):
    """Our reader reads metadata arrays in bulk and our writer packs them in bulk (gguf-py does both
    element by element): the values must equal gguf.GGUFReader's for a real file (SmolLM2: 49k
    tokens, scores, merges), and the packed bytes gguf.GGUFWriter's, for every array type and both
    byte orders."""
    from gguf import GGUFEndian, GGUFWriter

    from gguftool.io.writer import _Writer
    src = smollm2
    ours, theirs = GGUFFile(src), GGUFReader(src)
    assert list(ours.fields) == [k for k in theirs.fields if not k.startswith("GGUF.")]
    for k, f in ours.fields.items():
        assert (ours.get(k), f.types) == (_py(theirs.fields[k].contents()), theirs.fields[k].types), k
    assert len(ours.get("tokenizer.ggml.tokens")) == 49152

    V = GGUFValueType
    rng = np.random.default_rng(3)
    arrays = {V.UINT8: [0, 255, 7], V.INT8: [-128, 5], V.UINT16: [65535, 1], V.INT16: [-3, 3], V.UINT32: [2**32 - 1, 0],
              V.INT32: [int(v) for v in rng.integers(-2**31, 2**31, 100)], V.FLOAT32: [float(v) for v in rng.standard_normal(50)],
              V.UINT64: [2**64 - 1], V.INT64: [-2**63, 5], V.FLOAT64: [1e300, -0.0], V.BOOL: [True, False, True],
              V.STRING: ["a", "", "h\u00e9llo", "\u2581tok" * 3, "\x00x", *ours.get("tokenizer.ggml.tokens")[:500]]}
    for order in (GGUFEndian.LITTLE, GGUFEndian.BIG):
        a, b = GGUFWriter(None, "x", endianess=order), _Writer(None, "x", endianess=order)
        for t, v in arrays.items():
            for with_type in (True, False):
                assert b._pack_val(v, V.ARRAY, with_type, t) == a._pack_val(v, V.ARRAY, with_type, t), (t, order)


def _py(v):
    return v.item() if isinstance(v, np.generic) else v


@pytest.mark.parametrize("order", ["little", "big"])
def test_copy_metadata_keeps_every_value(smollm2, tmp_path, order):
    """copy_metadata copies a little-endian file's values byte for byte (and decodes a big-endian
    file's): the copy's values, read by gguf.GGUFReader, equal the source's, in order."""
    from gguf import GGUFEndian, GGUFWriter
    src = smollm2
    if order == "big":   # a big-endian source with the same kinds of values, written by gguf-py
        theirs = GGUFReader(smollm2)
        src = tmp_path / "big.gguf"
        g = GGUFWriter(src, "llama", endianess=GGUFEndian.BIG)
        for k, f in theirs.fields.items():
            if k.startswith("GGUF.") or k == "general.architecture":
                continue
            g.add_key_value(k, _py(f.contents()), GGUFValueType(f.types[0]),
                            GGUFValueType(f.types[-1]) if len(f.types) > 1 else None)
        g.add_tensor("t", np.ones((2, 32), np.float32))
        g.write_header_to_file()
        g.write_kv_data_to_file()
        g.write_tensors_to_file()
        g.close()
    f = GGUFFile(src)
    assert f.raw_value("general.architecture") == (None if order == "big" else
                                                   struct.pack("<IQ", GGUFValueType.STRING, 5) + b"llama")
    w = StreamingWriter(tmp_path / "copy.gguf", "llama")
    w.copy_metadata(f)
    w.add_tensor_info("t", (2, 32), tensor_type(GGMLQuantizationType.F32))
    w.begin()
    w.write(np.ones((2, 32), np.float32))
    w.commit()
    a, b = GGUFReader(src), GGUFReader(tmp_path / "copy.gguf")
    keys = [k for k in a.fields if not k.startswith("GGUF.")]
    assert keys == [k for k in b.fields if not k.startswith(("GGUF.", "gguftool."))]
    for k in keys:
        assert (_py(a.fields[k].contents()), a.fields[k].types) == (_py(b.fields[k].contents()), b.fields[k].types), k


def test_stock_reader_refuses_our_ids_but_reads_the_rest(tmp_path, rng):
    # Documents why gguftool has its own tensor step: gguf.GGUFReader raises on our ids.
    path = _write_custom(tmp_path / "c.gguf", {"w": ((4, 32), "Q4_HQQ", np.zeros((4, 20), np.uint8))})
    with pytest.raises(ValueError):
        GGUFReader(path)
    assert GGUFFile(path).tensor("w").type.custom


def _corrupt(tmp_path, rng, mutate):
    p = tiny_llama(tmp_path / "ok.gguf", rng)
    data = bytearray(p.read_bytes())
    mutate(data, GGUFFile(p))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    return bad


def _ti_type_offset(f: GGUFFile, name: str) -> int:
    """File offset of a tensor's type id field in the tensor-info section."""
    raw = f.path.read_bytes()
    key = struct.pack("<Q", len(name)) + name.encode()
    pos = raw.index(key, 0, f.data_offset) + len(key)
    n_dims = struct.unpack_from("<I", raw, pos)[0]
    return pos + 4 + 8 * n_dims


@pytest.mark.parametrize("case, expect", [
    ("wrong_magic", "bad magic"),
    ("truncated_header", "corrupt or truncated"),
    ("truncated_data", "runs past the end"),
    ("unknown_type", "unknown tensor type id 77777"),
    ("gguftool_future_type", "in gguftool's range but unknown"),
    ("upstream_unknown", "upstream ggml id that neither the installed gguf package nor the pinned ggml knows"),
    ("empty", "too short"),
])
def test_bad_files_give_clear_errors(tmp_path, rng, case, expect):
    def mutate(data, f):
        if case == "wrong_magic":
            data[0:4] = b"GGML"
        elif case == "truncated_header":
            del data[200:]
        elif case == "truncated_data":
            del data[-100:]
        elif case == "empty":
            del data[10:]
        else:
            type_id = {"unknown_type": 77777, "gguftool_future_type": 530, "upstream_unknown": 31}[case]   # 31: Q4_0_4_4, removed
            struct.pack_into("<I", data, _ti_type_offset(f, "output.weight"), type_id)
    bad = _corrupt(tmp_path, rng, mutate)
    before = bad.read_bytes()
    with pytest.raises(GgufToolError) as e:
        GGUFFile(bad)
    assert expect in str(e.value) and str(bad) in str(e.value)
    assert bad.read_bytes() == before


def test_record_that_disagrees_with_table_is_refused(tmp_path):
    # A file whose record puts Q4_HQQ on 40, the id where an old fork collided with upstream NVFP4.
    path = _write_custom(tmp_path / "d.gguf", {"w": ((4, 32), "Q4_HQQ", np.zeros((4, 20), np.uint8))})
    data = bytearray(path.read_bytes())
    key = b"gguftool.type.Q4_HQQ.id"
    pos = data.index(key) + len(key) + 4  # skip the value-type field
    assert struct.unpack_from("<I", data, pos)[0] == 512
    struct.pack_into("<I", data, pos, 40)
    path.write_bytes(bytes(data))
    with pytest.raises(GgufToolError, match="record of Q4_HQQ says id=40"):
        GGUFFile(path)


def test_output_path_checks(tmp_path, rng):
    src = tiny_llama(tmp_path / "m.gguf", rng)
    with pytest.raises(GgufToolError, match="output path is the input"):
        check_output_path(src, [src])
    with pytest.raises(GgufToolError, match="does not exist"):
        check_output_path(tmp_path / "nope" / "x.gguf", [src])
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        if os.access(ro, os.W_OK):  # root ignores permission bits
            pytest.skip("running as root: directory permissions are not enforced")
        with pytest.raises(GgufToolError, match="not writable"):
            check_output_path(ro / "x.gguf", [src])
    finally:
        ro.chmod(stat.S_IRWXU)


def test_failed_write_leaves_no_file(tmp_path, rng):
    out = tmp_path / "o.gguf"
    w = StreamingWriter(out, "llama")
    w.add_tensor_info("a", (4, 32), tensor_type(0))
    with pytest.raises(GgufToolError, match="produced 64 bytes, 512 declared"):
        with w.session():
            w.begin()
            w.write(np.zeros((4, 4), np.float32))
    assert not out.exists() and not list(tmp_path.iterdir())
