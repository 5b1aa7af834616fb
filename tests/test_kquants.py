"""llama-quantize's own types and mixes (K-quants, IQ, TQ, MXFP4), importance matrices: byte for byte
against the pinned llama-quantize of the native build, run in the same test."""
from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter

from gguftool import types
from gguftool.cli import main
from gguftool.errors import GgufToolError
from gguftool.io import imatrix as imatrix_io
from gguftool.io.reader import GGUFFile
from gguftool.pipeline import llama_mix

from .conftest import write_gguf
from .test_native import native  # noqa: F401  (fixture: the build, or a skip saying how to get it)


def fails(capsys, args: list[str], match: str) -> str:
    """The command exits 1 with `match` (a regex) in its error line."""
    import re
    assert main(args) == 1
    err = capsys.readouterr().err
    assert re.search(match, err), err
    return err


def llama_quantize(native, *args) -> str:  # noqa: F811
    r = subprocess.run([str(native.tool("llama-quantize")), *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return r.stdout + r.stderr


def assert_same_tensors(ref: Path, ours: Path) -> dict[str, int]:
    """Every tensor of `ours` has the type and bytes of `ref`; returns the count per type."""
    a, b = GGUFFile(ref), GGUFFile(ours)
    assert sorted(t.name for t in a.tensors) == sorted(t.name for t in b.tensors)   # llama's loader sorts by name
    counts: dict[str, int] = {}
    for t in a.tensors:
        u = b.tensor(t.name)
        assert (t.type.name, t.shape) == (u.type.name, u.shape), t.name
        if not np.array_equal(t.raw_rows(), u.raw_rows()):
            rows = np.flatnonzero((t.raw_rows() != u.raw_rows()).any(axis=1))
            pytest.fail(f"{t.name} ({t.type.name}): rows {rows[:8].tolist()} of {t.n_rows} differ from llama-quantize's")
        counts[t.type.name] = counts.get(t.type.name, 0) + 1
    return counts


def loadable_llama(path: Path, n_embd: int = 256, n_ff: int = 512, n_vocab: int = 256, n_layer: int = 2) -> Path:
    """A float32 llama that llama.cpp's loader accepts; heavy-tailed weights (t-distributed), as real ones are."""
    rng = np.random.default_rng(7)

    def w(*shape):
        return (rng.standard_t(4, shape) * 0.02).astype(np.float32)

    t = {"token_embd.weight": w(n_vocab, n_embd), "output_norm.weight": np.ones(n_embd, np.float32),
         "output.weight": w(n_vocab, n_embd)}
    for i in range(n_layer):
        t[f"blk.{i}.attn_norm.weight"] = np.ones(n_embd, np.float32)
        t[f"blk.{i}.ffn_norm.weight"] = np.ones(n_embd, np.float32)
        for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t[f"blk.{i}.{n}.weight"] = w(n_embd, n_embd)
        t[f"blk.{i}.ffn_gate.weight"], t[f"blk.{i}.ffn_up.weight"] = w(n_ff, n_embd), w(n_ff, n_embd)
        t[f"blk.{i}.ffn_down.weight"] = w(n_embd, n_ff)
    meta = {"general.name": "tiny", "llama.context_length": 256, "llama.embedding_length": n_embd,
            "llama.block_count": n_layer, "llama.feed_forward_length": n_ff, "llama.attention.head_count": 4,
            "llama.attention.head_count_kv": 4, "llama.rope.dimension_count": n_embd // 4,
            "llama.attention.layer_norm_rms_epsilon": 1e-5}
    return write_gguf(path, {k: (v, None) for k, v in t.items()}, metadata=meta)


def write_imatrix_gguf(path: Path, model: Path, rng: np.random.Generator, n_tokens: int = 64) -> dict[str, np.ndarray]:
    """An imatrix in llama-imatrix's GGUF format for every 2-D weight of `model`; returns what it means
    (sums / counts), as llama-quantize normalises it."""
    w = GGUFWriter(path, "imatrix")
    w.add_string("general.type", "imatrix")
    w.add_array("imatrix.datasets", ["synthetic"])
    w.add_uint32("imatrix.chunk_count", 1)
    w.add_uint32("imatrix.chunk_size", n_tokens)
    want = {}
    for t in GGUFFile(model).tensors:
        if len(t.shape) == 2 and t.name.endswith(".weight") and "norm" not in t.name:
            sums = (rng.gamma(1.0, 1.0, (1, t.n_per_row)) * n_tokens).astype(np.float32)
            w.add_tensor(f"{t.name}.in_sum2", sums)
            w.add_tensor(f"{t.name}.counts", np.array([[n_tokens]], np.float32))
            want[t.name] = sums.reshape(-1) / np.float32(n_tokens)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return want


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("kq")
    model = loadable_llama(d / "tiny-f32.gguf")
    write_imatrix_gguf(d / "tiny.imatrix.gguf", model, np.random.default_rng(3))
    return model, d / "tiny.imatrix.gguf"


_NEEDS_IMATRIX = set(llama_mix.NEEDS_IMATRIX)


# every per-tensor type llama-quantize writes that only ggml's C code produces (NVFP4 has no file type)
@pytest.mark.native
@pytest.mark.parametrize("tname", [t for t in types.NATIVE_STOCK])
def test_each_type_is_llama_quantize_bytes(native, tiny, tmp_path, tname):  # noqa: F811
    model, imx = tiny
    ref, ours = tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    llama_quantize(native, "--pure", "--imatrix", imx, "--tensor-type", f"weight={tname.lower()}", model, ref, "Q8_0")
    assert main(["quantize", str(model), str(ours), "Q8_0", "--pure", "--tensor-type", f"weight={tname}",
                 "--imatrix", str(imx)]) == 0
    counts = assert_same_tensors(ref, ours)
    assert counts[tname] >= 16, counts   # every matrix got the type (nothing fell back)


@pytest.mark.native
@pytest.mark.parametrize("tname", [t for t in types.NATIVE_STOCK if t not in _NEEDS_IMATRIX])
def test_each_type_without_an_imatrix_is_llama_quantize_bytes(native, tiny, tmp_path, tname):  # noqa: F811
    """ggml takes another code path without importance weights (Q2_K, Q3_K, the IQ types' own searches)."""
    model, _ = tiny
    ref, ours = tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    llama_quantize(native, "--pure", "--tensor-type", f"weight={tname.lower()}", model, ref, "Q8_0")
    assert main(["quantize", str(model), str(ours), "Q8_0", "--pure", "--tensor-type", f"weight={tname}"]) == 0
    counts = assert_same_tensors(ref, ours)
    assert counts[tname] >= 16, counts


@pytest.mark.native
@pytest.mark.parametrize("ftype", [f for f in llama_mix.FTYPES if f not in ("F32", "F16", "BF16")])
def test_every_file_type_is_llama_quantize_bytes(native, tiny, tmp_path, ftype):  # noqa: F811
    """Each of llama-quantize's file types on a float model whose 256-wide rows take every K and IQ type:
    its mix rules (attn_v / ffn_down bumps, the output and embedding types) and its bytes, with the
    importance matrix the IQ mixes need."""
    model, imx = tiny
    ref, ours = tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    llama_quantize(native, "--imatrix", imx, model, ref, ftype)
    assert main(["quantize", str(model), str(ours), ftype, "--imatrix", str(imx)]) == 0
    counts = assert_same_tensors(ref, ours)
    assert sum(counts.values()) >= 16, counts
    assert GGUFFile(ours).get("general.file_type") == GGUFFile(ref).get("general.file_type")


@pytest.mark.native
def test_nvfp4_refuses_values_its_scale_would_clip(native):  # noqa: F811
    """NVFP4's UE4M3 scale saturates at 448 (values up to 6 x 448): ggml clips larger values without a word
    (5e3 came back with 66% error). gguftool refuses the block, named, and keeps what fits exact to ggml."""
    from gguftool.native import ggml_lib
    from gguftool.quant import codec
    rng = np.random.default_rng(40)
    x = (rng.standard_normal((4, 128)) * 100).astype(np.float32)
    x[0, :16] = 2688.0   # the largest it encodes
    q = codec("NVFP4").quantize(x)
    assert np.array_equal(ggml_lib.dequantize(GGMLQuantizationType.NVFP4, q, 128)[0, :16], x[0, :16])
    x[3, 48:64] = np.linspace(-5e3, 3e3, 16)
    with pytest.raises(GgufToolError) as e:
        codec("NVFP4").quantize(x)
    assert "cannot quantize to NVFP4: row 3, columns 48..63 hold values -5000..3000, beyond what its UE4M3 scale" \
        in e.value.message, e.value.message


@pytest.mark.native
@pytest.mark.parametrize("tname", ["Q4_0", "Q5_1", "Q8_0", "Q4_K"])
def test_imatrix_changes_the_bytes_as_in_llama_quantize(native, tiny, tmp_path, tname):  # noqa: F811
    """With an importance matrix the legacy types take ggml's weighted search (not the _ref rounding)."""
    model, imx = tiny
    ref, ours, plain = tmp_path / "ref.gguf", tmp_path / "ours.gguf", tmp_path / "plain.gguf"
    llama_quantize(native, "--pure", "--imatrix", imx, model, ref, tname)
    assert main(["quantize", str(model), str(ours), tname, "--pure", "--imatrix", str(imx)]) == 0
    assert_same_tensors(ref, ours)
    assert main(["quantize", str(model), str(plain), tname, "--pure"]) == 0
    q = GGUFFile(ours).tensor("blk.0.ffn_down.weight").raw_rows()
    if tname != "Q8_0":   # Q8_0 has no search: the weights cannot change it
        assert not np.array_equal(q, GGUFFile(plain).tensor("blk.0.ffn_down.weight").raw_rows())


@pytest.mark.native
@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q3_K_S", "Q6_K"])
def test_mixes_on_smollm2_are_llama_quantize_bytes(native, smollm2, tmp_path, ftype):  # noqa: F811
    """The whole file type: llama-quantize's per-tensor mix (attn_v/ffn_down bumps, Q6_K output,
    fallbacks on SmolLM2's 576-wide rows) and its bytes."""
    ref, ours = tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    llama_quantize(native, "--allow-requantize", smollm2, ref, ftype)
    assert main(["quantize", str(smollm2), str(ours), ftype, "--allow-requantize"]) == 0
    counts = assert_same_tensors(ref, ours)
    assert len(counts) >= 3, counts   # a real mix, not one type
    assert GGUFFile(ours).get("general.file_type") == GGUFFile(ref).get("general.file_type")


@pytest.mark.native
def test_user_rules_on_a_mix_plan_as_llama_quantize(native, smollm2, tmp_path, capsys):  # noqa: F811
    """--tensor-type / --output-tensor-type over a mix, with llama-quantize's fallbacks for rows of 576."""
    opts = ["--tensor-type", "attn_v=q6_K", "--tensor-type", "ffn_up=iq4_xs", "--output-tensor-type", "q5_K"]
    log = llama_quantize(native, "--dry-run", "--allow-requantize", *opts, smollm2, "Q4_K_S")
    theirs = {}
    for line in log.splitlines():
        if line.startswith("[") and "type =" in line:
            name = line.split("]", 1)[1].split()[0]
            theirs[name] = line.rsplit("(", 1)[1].rstrip(")\n ").upper() if "->" in line else line.split(
                "type =")[1].split(",")[0].strip().upper()
    assert main(["quantize", str(smollm2), str(tmp_path / "o.gguf"), "Q4_K_S", "--allow-requantize", *opts,
                 "--dry-run", "--format", "json"]) == 0
    import json
    ours = {r["name"]: r["to"] for r in json.loads(capsys.readouterr().out)["tensors"]}
    assert ours == theirs
    assert ours["blk.0.ffn_up.weight"] == "IQ4_NL"      # IQ4_XS needs rows of 256: llama's fallback
    assert ours["blk.0.attn_v.weight"] == "Q8_0"        # Q6_K -> Q8_0 likewise


@pytest.mark.native
def test_imatrix_command_both_formats_read_alike(native, smollm2, tmp_path):  # noqa: F811
    text = tmp_path / "t.txt"
    text.write_text(" ".join(["It is a truth universally acknowledged, that a single man in possession"] * 60))
    g, d = tmp_path / "m.imatrix.gguf", tmp_path / "m.imatrix.dat"
    for out, fmt in ((g, "gguf"), (d, "dat")):
        assert main(["imatrix", str(smollm2), "-o", str(out), "--text", str(text), "--chunks", "2", "--ctx", "128",
                     "--format", fmt]) == 0
    a, b = imatrix_io.load(g), imatrix_io.load(d)
    assert not a.legacy and b.legacy
    assert set(a.entries) == set(b.entries) and "blk.0.attn_q.weight" in a.entries
    for k in a.entries:
        np.testing.assert_allclose(a.entries[k], b.entries[k], rtol=1e-5, err_msg=k)
    assert all(np.all(v >= 0) for v in a.entries.values())
    # and llama-quantize reads ours as we do: an imatrix-driven Q4_0 ffn_down is byte-identical
    ref, ours = tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    llama_quantize(native, "--allow-requantize", "--pure", "--imatrix", d, "--include-weights", "ffn_down",
                   smollm2, ref, "Q4_0")
    assert main(["quantize", str(smollm2), str(ours), "Q4_0", "--allow-requantize", "--pure", "--imatrix", str(d),
                 "--include-weights", "ffn_down"]) == 0
    assert_same_tensors(ref, ours)
    assert GGUFFile(ours).get("quantize.imatrix.entries_count") == GGUFFile(ref).get("quantize.imatrix.entries_count")


def test_imatrix_readers_agree_on_a_known_file(tmp_path, rng):
    """The two formats written by hand from the same numbers read back as llama-quantize normalises them."""
    sums = {"blk.0.ffn_down.weight": rng.gamma(1.0, 1.0, 64).astype(np.float32)}
    # legacy: values stored as sums/ncall*ncall, read as value / ncall
    raw = struct.pack("<i", 1)
    for name, v in sums.items():
        raw += struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", 5, v.size) + (v * 5).tobytes()
    raw += struct.pack("<i", 3) + struct.pack("<i", 4) + b"text"
    (tmp_path / "x.dat").write_bytes(raw)
    m = imatrix_io.load(tmp_path / "x.dat")
    assert m.legacy and m.chunk_count == 3 and m.datasets == ["text"]
    np.testing.assert_array_equal(m.entries["blk.0.ffn_down.weight"], (sums["blk.0.ffn_down.weight"] * 5) / np.float32(5))
    assert set(m.select(exclude=["ffn"]).entries) == set() and set(m.select(include=["down"]).entries) == set(sums)


@pytest.mark.parametrize("cut", [3, 9, 40])
def test_truncated_legacy_imatrix_is_a_clear_error(tmp_path, cut):
    name = b"blk.0.attn_q.weight"
    raw = struct.pack("<i", 1) + struct.pack("<i", len(name)) + name + struct.pack("<ii", 1, 16) + bytes(64)
    (tmp_path / "x.dat").write_bytes(raw[:cut])
    with pytest.raises(GgufToolError, match="x.dat"):
        imatrix_io.load(tmp_path / "x.dat")


def test_gguf_without_imatrix_keys_is_refused(tmp_path, rng):
    p = write_gguf(tmp_path / "m.gguf", {"a.in_sum2": (np.ones((1, 4), np.float32), None)})
    with pytest.raises(GgufToolError, match="missing imatrix metadata"):
        imatrix_io.load(p)


def _imatrix_file(path: Path, datasets=("text",), chunk_count=("uint32", 3), chunk_size=("uint32", 512),
                  sums=None, counts=None) -> Path:
    w = GGUFWriter(path, "imatrix")
    w.add_string("general.type", "imatrix")
    for key, (kind, value) in (("imatrix.chunk_count", chunk_count), ("imatrix.chunk_size", chunk_size)):
        getattr(w, f"add_{kind}")(key, value)
    if isinstance(datasets, tuple):
        w.add_array("imatrix.datasets", list(datasets))
    else:
        w.add_uint32("imatrix.datasets", datasets)
    w.add_tensor("blk.0.attn_q.weight.in_sum2", np.ones((1, 8), np.float32) * 4 if sums is None else sums)
    w.add_tensor("blk.0.attn_q.weight.counts", np.array([[2]], np.float32) if counts is None else counts)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("bad,match", [
    ({"datasets": 7}, "imatrix.datasets is uint32, expected an array of strings"),
    ({"chunk_count": ("string", "3")}, "imatrix.chunk_count is string, expected an integer"),
    ({"chunk_count": ("float32", 3.0)}, "imatrix.chunk_count is float32, expected an integer"),
    ({"chunk_size": ("array", [1, 2])}, "imatrix.chunk_size is array of int32, expected an integer"),
    ({"chunk_count": ("int32", -1)}, "imatrix.chunk_count is -1, expected a count"),
    ({"sums": np.array([[1, np.nan, 1, 1, 1, 1, 1, 1]], np.float32)}, "attn_q.weight: the sums or counts hold NaN"),
    ({"counts": np.array([[np.inf]], np.float32)}, "attn_q.weight: the sums or counts hold NaN"),
])
def test_gguf_imatrix_with_wrong_typed_metadata_or_data_is_named(tmp_path, bad, match):
    """llama-imatrix writes datasets as an array of strings and the chunk counts as integers; anything else,
    and sums or counts that are not finite, is an error naming the file and the key or tensor."""
    ok = imatrix_io.load(_imatrix_file(tmp_path / "ok.gguf"))
    assert ok.chunk_count == 3 and ok.datasets == ["text"]
    np.testing.assert_array_equal(ok.entries["blk.0.attn_q.weight"], np.full(8, 2, np.float32))
    with pytest.raises(GgufToolError, match=match) as e:
        imatrix_io.load(_imatrix_file(tmp_path / "bad.gguf", **bad))
    assert "bad.gguf" in e.value.message


@pytest.mark.native
def test_imatrix_types_need_an_imatrix_and_mismatches_are_named(native, tiny, tmp_path, rng, capsys):  # noqa: F811
    model, _ = tiny
    fails(capsys, ["quantize", str(model), str(tmp_path / "o.gguf"), "IQ2_XXS", "--pure"],
          r"blk\.0\.attn_q\.weight -> IQ2_XXS needs an importance matrix")
    other = loadable_llama(tmp_path / "wide.gguf", n_embd=512, n_ff=512)
    write_imatrix_gguf(tmp_path / "wide.imatrix.gguf", other, rng)
    fails(capsys, ["quantize", str(model), str(tmp_path / "o.gguf"), "Q4_K", "--pure", "--imatrix",
                   str(tmp_path / "wide.imatrix.gguf")], "has 512 importance values, the tensor needs 256")
    assert not (tmp_path / "o.gguf").exists()


def test_mixes_without_the_native_build_say_how(tmp_path, rng, monkeypatch, capsys):
    from gguftool.native import ggml_lib, tools
    model = loadable_llama(tmp_path / "m.gguf", n_layer=1)
    from gguftool.quant import standard

    def forget():   # loaded by an earlier test: forget it, as a machine without the build has never seen it
        ggml_lib.library.cache_clear()
        standard._ggml_available.cache_clear()
    forget()

    def no_build(*a, **k):
        raise GgufToolError("no native llama.cpp build in /nowhere", "run `gguftool native build`")
    monkeypatch.setattr(tools, "find_build", no_build)
    for target in ("Q4_K_M", "IQ3_S"):
        fails(capsys, ["quantize", str(model), str(tmp_path / "o.gguf"), target],
              f"{target} is a llama-quantize mix.*native build")
    # a single K type as a rule, too
    fails(capsys, ["quantize", str(model), str(tmp_path / "o.gguf"), "Q8_0", "--tensor-type", "ffn=Q4_K"],
          "Q4_K is written by ggml's own quantizer, from the native build")
    assert not (tmp_path / "o.gguf").exists()
    # the legacy types still work, by gguftool's own rules
    assert main(["quantize", str(model), str(tmp_path / "o.gguf"), "Q4_0"]) == 0
    assert GGUFFile(tmp_path / "o.gguf").tensor("blk.0.ffn_up.weight").type.name == "Q4_0"
    forget()   # monkeypatch restores find_build after the test: the next use loads the library again


@pytest.mark.native
def test_convert_to_a_mix_equals_convert_then_llama_quantize(native, minilm_dir, tmp_path):  # noqa: F811
    """A checkpoint straight to Q4_K_M (its mix planned on a sparse skeleton GGUF) equals llama.cpp's two
    steps: convert to F32, then llama-quantize."""
    f32, ref, ours = tmp_path / "f32.gguf", tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    assert main(["convert", str(minilm_dir), str(f32), "--outtype", "F32"]) == 0
    llama_quantize(native, f32, ref, "Q4_K_M")
    assert main(["convert", str(minilm_dir), str(ours), "--outtype", "Q4_K_M"]) == 0
    counts = assert_same_tensors(ref, ours)
    assert counts.get("Q4_K") and counts.get("Q6_K"), counts
    assert not list(tmp_path.glob("*skeleton*"))


@pytest.mark.native
@pytest.mark.parametrize("tname", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", *types.NATIVE_STOCK])
def test_gguf_numpy_and_ggml_agree_so_either_path_gives_one_file(native, tname):  # noqa: F811
    """With the native build, gguftool takes ggml's C code for the stock types (5-10x faster than gguf.quants'
    numpy); the files must not depend on which path ran: same blocks, same decoded values. Types gguf.quants
    cannot read (Q1_0, Q2_0) have gguftool's numpy twins of ggml's dequantizers, checked here as well."""
    from gguf import GGMLQuantizationType, quants

    from gguftool.native import ggml_lib
    from gguftool.quant import standard
    t = types.stock(tname)
    own = standard._OWN_DEQUANTIZERS.get(tname)
    rng = np.random.default_rng(11)
    x = (rng.standard_t(3, (16, 512)) * 0.03).astype(np.float32)
    x[0, :7] = [0.0, -0.0, 1e-30, -65504.0, 3e4, 1e-8, -1e-8]
    x[1] = 0.0
    tt = types.stock(tname)
    row_bytes = 512 // tt.block_size * tt.type_size
    imx = None if not ggml_lib.requires_imatrix(t) else np.ones(512, np.float32)
    q = ggml_lib.quantize(t, x, row_bytes, imx)
    numpy = own(q) if own else quants.dequantize(q, GGMLQuantizationType[tname])
    np.testing.assert_array_equal(ggml_lib.dequantize(t, q, 512), numpy.reshape(16, 512))
    if tname in types.STOCK_PRODUCIBLE:
        np.testing.assert_array_equal(q, quants.quantize(x, GGMLQuantizationType[tname]).view(np.uint8).reshape(q.shape))
    assert ggml_lib.validate(t, q)


@pytest.mark.native
def test_tensor_type_file_and_override_kv_as_llama_quantize(native, tiny, tmp_path, capsys):  # noqa: F811
    model, _ = tiny
    (tmp_path / "rules.txt").write_text("attn_v=q6_K\n  ffn_down=q5_K\tattn_q=q4_0\n")
    opts = ["--tensor-type-file", tmp_path / "rules.txt", "--override-kv", "general.name=str:renamed",
            "--override-kv", "llama.context_length=int:-128", "--override-kv", "tiny.flag=bool:true",
            "--override-kv", "tiny.x=float:0.5"]
    ref, ours = tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    llama_quantize(native, *opts, model, ref, "Q4_K_M")
    assert main(["quantize", str(model), str(ours), "Q4_K_M", *map(str, opts)]) == 0
    counts = assert_same_tensors(ref, ours)
    assert counts["Q6_K"] >= 2 and counts["Q5_K"] >= 2
    a, b = GGUFFile(ref), GGUFFile(ours)
    for key in ("general.name", "llama.context_length", "tiny.flag", "tiny.x"):
        assert a.get(key) == b.get(key) and a.field_type(key) == b.field_type(key), key
    assert b.get("llama.context_length") == 128 and b.get("general.name") == "renamed"
    for bad, why in (("x=int:12a", "not a valid int"), ("x=bool:yes", "TYPE must be"), ("x", "KEY=TYPE:VALUE"),
                     ("x=float:nan", "not a valid float")):
        fails(capsys, ["quantize", str(model), str(tmp_path / "o.gguf"), "Q4_0", "--override-kv", bad], why)
    fails(capsys, ["quantize", str(model), str(tmp_path / "o.gguf"), "Q4_0", "--tensor-type-file",
                   str(tmp_path / "none.txt")], "none.txt: cannot read")
    assert not (tmp_path / "o.gguf").exists()


def test_side_inputs_are_never_the_output(tmp_path, capsys, rng):
    """--imatrix and --tensor-type-file files are inputs too: naming one as the output is refused."""
    model = loadable_llama(tmp_path / "m.gguf", n_layer=1)
    rules, imx = tmp_path / "rules.txt", tmp_path / "m.imatrix.gguf"
    rules.write_text("ffn=Q8_0")
    write_imatrix_gguf(imx, model, rng)
    before = rules.read_bytes(), imx.read_bytes()
    fails(capsys, ["quantize", str(model), str(rules), "Q8_0", "--tensor-type-file", str(rules)], "rules.txt")
    fails(capsys, ["quantize", str(model), str(imx), "Q8_0", "--imatrix", str(imx)], "m.imatrix.gguf")
    assert (rules.read_bytes(), imx.read_bytes()) == before


@pytest.mark.native
def test_prune_layers_as_llama_quantize(native, tmp_path, rng):  # noqa: F811
    """--prune-layers drops blocks, renumbers the rest and lowers block_count, with the mix planned on the
    pruned model and a full-model imatrix following the renumbering: llama-quantize's tensors and bytes."""
    model = loadable_llama(tmp_path / "m.gguf", n_layer=5)
    imx = tmp_path / "m.imatrix.gguf"
    write_imatrix_gguf(imx, model, rng)
    ref, ours = tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    llama_quantize(native, "--prune-layers", "1,3", "--imatrix", imx, model, ref, "Q4_K_M")
    assert main(["quantize", str(model), str(ours), "Q4_K_M", "--prune-layers", "3,1", "--imatrix", str(imx)]) == 0
    assert_same_tensors(ref, ours)
    a, b = GGUFFile(ref), GGUFFile(ours)
    assert a.get("llama.block_count") == b.get("llama.block_count") == 3
    assert "blk.2.attn_q.weight" in b and "blk.3.attn_q.weight" not in b
    # the former blk.4 is now blk.2: its bytes come from the source's blk.4
    src4 = GGUFFile(model).tensor("blk.4.ffn_norm.weight").raw_rows()
    assert np.array_equal(b.tensor("blk.2.ffn_norm.weight").raw_rows(), src4)


def test_prune_layers_refuses_missing_blocks(tmp_path, capsys):
    model = loadable_llama(tmp_path / "m.gguf", n_layer=2)
    fails(capsys, ["quantize", str(model), str(tmp_path / "o.gguf"), "Q8_0", "--prune-layers", "2"],
          r"--prune-layers \[2\]: the model has blocks 0-1")
    fails(capsys, ["quantize", str(model), str(tmp_path / "o.gguf"), "Q8_0", "--prune-layers", "0,1"], "every block")
    fails(capsys, ["quantize", str(model), str(tmp_path / "o.gguf"), "Q8_0", "--prune-layers", "a"], "layer ids")


@pytest.mark.native
@pytest.mark.parametrize("tname", ["Q8_0", "Q4_K", "IQ4_NL"])
def test_values_beyond_fp16_are_refused_with_the_row_as_llama_quantize_refuses_them(native, tmp_path, capsys, tname):  # noqa: F811
    model = loadable_llama(tmp_path / "m.gguf", n_layer=1)
    t = GGUFFile(model).tensor("blk.0.ffn_up.weight")
    raw = bytearray(model.read_bytes())   # row 2, column 40 := 1e9: no fp16 scale holds its block
    struct.pack_into("<f", raw, t.offset + (2 * t.n_per_row + 40) * 4, 1e9)
    model.write_bytes(bytes(raw))
    r = subprocess.run([str(native.tool("llama-quantize")), "--pure", "--tensor-type", f"weight={tname.lower()}",
                        str(model), str(tmp_path / "ref.gguf"), "Q8_0"], capture_output=True, text=True)
    assert r.returncode != 0 and "validation failed" in r.stdout + r.stderr
    fails(capsys, ["quantize", str(model), str(tmp_path / "o.gguf"), "Q8_0", "--pure", "--tensor-type",
                   f"weight={tname}"], rf"blk\.0\.ffn_up\.weight.*cannot quantize to {tname}: row 2, columns")
    assert not (tmp_path / "o.gguf").exists()


@pytest.mark.parametrize("failure", ["input", "planner"])
def test_legacy_mix_falls_back_only_when_llama_quantize_cannot_plan(monkeypatch, capsys, failure):
    """A legacy target (Q4_0) is planned by llama-quantize when the build exists. If llama-quantize cannot plan
    the model (an architecture it does not know), gguftool's own rules make it, with a warning; an error gguftool
    found in the input itself stops the run, as it does for every other target."""
    from gguftool.cli import planning as cli_planning
    from gguftool.native import tools
    from gguftool.pipeline import llama_mix
    from gguftool.pipeline import plan as pipeline_plan

    def plan_model(src, ft, **kw):
        if failure == "input":
            raise GgufToolError("model.gguf: metadata key general.name holds an array, expected a string")
        raise llama_mix.PlanError("model.gguf: llama-quantize could not plan Q4_0 (exit 1)")

    monkeypatch.setattr(tools, "find_build", lambda *a, **k: None)
    monkeypatch.setattr(llama_mix, "plan_model", plan_model)
    opts = pipeline_plan.Options(target="Q4_0")
    if failure == "input":
        with pytest.raises(GgufToolError, match="holds an array"):
            cli_planning.llama_file_type(opts, None, None)
    else:
        cli_planning.llama_file_type(opts, None, None)
        assert "using gguftool's rules for Q4_0" in capsys.readouterr().err
        assert opts.mix is None


@pytest.mark.native
@pytest.mark.parametrize("tname", ["Q4_HQQ", "Q4_HQQ_128"])
def test_llama_quantize_q4_hqq_takes_the_imatrix_as_we_do(native, tiny, tmp_path, tname):  # noqa: F811
    """Our types in the bundled llama-quantize: with --imatrix its ggml entry point runs the weighted
    solver, byte for byte what `gguftool quantize --imatrix` writes, and not the unweighted bytes."""
    model, imx = tiny
    ref, ours, plain = tmp_path / "ref.gguf", tmp_path / "ours.gguf", tmp_path / "plain.gguf"
    llama_quantize(native, "--pure", "--imatrix", imx, model, ref, tname)
    assert main(["quantize", str(model), str(ours), tname, "--pure", "--imatrix", str(imx)]) == 0
    counts = assert_same_tensors(ref, ours)
    assert counts[tname] >= 16, counts
    llama_quantize(native, "--pure", model, plain, tname)
    name = "blk.0.ffn_down.weight"
    assert not np.array_equal(GGUFFile(ref).tensor(name).raw_rows(), GGUFFile(plain).tensor(name).raw_rows())
