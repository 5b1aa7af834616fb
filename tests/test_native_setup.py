"""The native build machinery without building: pinning, anchored edits, clear errors.

The first group needs nothing; the `native` group needs the pinned sdist already in the cache
(it never downloads) and checks every anchor against the real pinned source."""
from __future__ import annotations

import hashlib
import os
import re
import shutil

import pytest

from gguftool import types as gtypes
from gguftool.errors import GgufToolError
from gguftool.native import build, integrate, source


def test_missing_anchor_names_file_and_anchor():
    e = integrate.Edit("ggml/src/ggml.c", "    [4] = { // GGML_TYPE_Q4_2\n", "x", where="before")
    with pytest.raises(GgufToolError) as ei:
        e.apply("static const struct ggml_type_traits type_traits[GGML_TYPE_COUNT] = {\n};\n")
    assert "ggml/src/ggml.c" in ei.value.message and "GGML_TYPE_Q4_2" in ei.value.message
    # an anchor that occurs more often than expected is just as fatal
    e2 = integrate.Edit("ops.cpp", "case GGML_TYPE_Q4_1:\n", "y", count=7)
    with pytest.raises(GgufToolError, match=r"found 2x, expected 7x"):
        e2.apply("case GGML_TYPE_Q4_1:\ncase GGML_TYPE_Q4_1:\n")


def test_enum_lines_and_count_come_from_the_type_table():
    enum = next(e for e in integrate.edits() if e.path == "ggml/include/ggml.h")
    ids = dict(re.findall(r"GGML_TYPE_(\w+)\s*=\s*(\d+)", enum.text))
    assert {k: int(v) for k, v in ids.items() if k != "COUNT"} == {t.name: t.id for t in gtypes.CUSTOM_TYPES}
    assert int(ids["COUNT"]) == max(t.id for t in gtypes.CUSTOM_TYPES) + 1


def test_missing_cmake_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    with pytest.raises(GgufToolError) as ei:
        build.check_prerequisites()
    assert "cmake" in ei.value.message and "install" in ei.value.hint


def test_missing_compiler_is_a_clear_error(monkeypatch):
    real = shutil.which
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(build.shutil, "which",
                        lambda name: None if name in ("c++", "g++", "clang++") else real(name))
    with pytest.raises(GgufToolError) as ei:
        build.check_prerequisites()
    assert "C++ compiler" in ei.value.message and "g++" in ei.value.hint


def test_sdist_with_wrong_hash_is_refused(tmp_path, monkeypatch):
    fake = tmp_path / "fake.tar.gz"
    fake.write_bytes(b"not the pinned archive")
    monkeypatch.setenv("GGUFTOOL_NATIVE_SDIST", str(fake))
    with pytest.raises(GgufToolError, match="expected the pinned"):
        source.fetch_sdist(tmp_path / "cache")
    assert not (tmp_path / "cache" / "downloads" / source.PINNED.filename).exists()


def test_cache_root_override(monkeypatch, tmp_path):
    monkeypatch.setenv("GGUFTOOL_NATIVE_DIR", str(tmp_path))
    assert source.cache_root() == tmp_path.resolve()
    monkeypatch.delenv("GGUFTOOL_NATIVE_DIR")
    assert source.cache_root() == source.Path("~/.cache/gguftool/native").expanduser()


def test_amx_is_disabled_on_x86():
    opts = " ".join(build.cmake_options(native=True))
    if build.is_x86():
        assert "-mno-amx-tile" in opts and "-mno-amx-int8" in opts and "-mno-amx-bf16" in opts
    assert "-DBUILD_SHARED_LIBS=OFF" in opts and "-DLLAMA_OPENSSL=OFF" in opts


# ----------------------------------------------------------------------------- against the pinned source

@pytest.fixture(scope="module")
def pinned_sdist():
    p = source.sdist_path()
    local = os.environ.get("GGUFTOOL_NATIVE_SDIST")
    for cand in ([p] + ([source.Path(local)] if local else [])):
        if cand.is_file():
            if hashlib.sha256(cand.read_bytes()).hexdigest() != source.PINNED.sha256:
                pytest.fail(f"{cand} does not match the pinned sha256")
            return cand
    pytest.skip(f"pinned sdist not cached at {p} (run `gguftool native build` once; tests never download)")


@pytest.mark.native
def test_every_anchor_matches_the_pinned_source(pinned_sdist):
    edits = integrate.edits()
    texts = source.read_pristine(sorted({e.path for e in edits}))
    for e in edits:
        texts[e.path] = e.apply(texts[e.path])     # raises with file + anchor if one is off
    count = max(t.id for t in gtypes.CUSTOM_TYPES) + 1
    assert f"GGML_TYPE_COUNT   = {count}," in texts["ggml/include/ggml.h"]
    for t in gtypes.CUSTOM_TYPES:
        assert f"[GGML_TYPE_{t.name}] = {{" in texts["ggml/src/ggml.c"]
        assert f"[GGML_TYPE_{t.name}] = {{" in texts["ggml/src/ggml-cpu/ggml-cpu.c"]
        assert texts["ggml/src/ggml-cpu/ops.cpp"].count(f"case GGML_TYPE_{t.name}:") == 7


@pytest.mark.native
def test_our_ids_do_not_collide_with_pinned_ggml(pinned_sdist):
    text = source.read_pristine(["ggml/include/ggml.h"])["ggml/include/ggml.h"]
    upstream = {m.group(1): int(m.group(2)) for m in re.finditer(r"GGML_TYPE_(\w+)\s*=\s*(\d+)", text)}
    assert upstream["COUNT"] == source.PINNED.ggml_type_count
    assert integrate.check_enum_collisions() == []
    assert not {t.id for t in gtypes.CUSTOM_TYPES} & set(upstream.values())


@pytest.mark.native
def test_types_the_gguf_package_lacks_are_the_pinned_ggmls(pinned_sdist):
    """gguftool's entries for upstream types and file types that gguf does not know yet (Q2_0): the id, block
    and bytes of ggml.h / ggml-common.h, the llama_ftype of llama.h, and gguf's own numbers where it has them."""
    import gguf

    from gguftool.pipeline import llama_mix
    texts = source.read_pristine(["ggml/include/ggml.h", "ggml/src/ggml-common.h", "include/llama.h"])
    upstream = {m.group(1): int(m.group(2)) for m in re.finditer(r"^\s*GGML_TYPE_(\w+)\s*=\s*(\d+)",
                                                                  texts["ggml/include/ggml.h"], re.M)}
    assert gtypes.UPSTREAM_UNKNOWN_TO_GGUF
    for name, (tid, block, size) in gtypes.UPSTREAM_UNKNOWN_TO_GGUF.items():
        common = texts["ggml/src/ggml-common.h"]
        qk = int(re.search(rf"#define QK{name[1:]} (\d+)", common).group(1))
        expr = re.search(rf"sizeof\(block_{name.lower()}\) == (.+?), \"", common).group(1)
        assert (upstream[name], qk, eval(expr, {"sizeof": lambda _: 2, "ggml_half": 0, f"QK{name[1:]}": qk})) \
            == (tid, block, size)
        assert gtypes.tensor_type(tid) == gtypes.TensorType(name, tid, block, size)
        if name in gguf.GGMLQuantizationType.__members__:   # gguf caught up: its numbers must agree
            assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]] == (block, size)
    ftypes = {m.group(1): int(m.group(2)) for m in re.finditer(r"LLAMA_FTYPE_MOSTLY_(\w+)\s*=\s*(\d+)",
                                                               texts["include/llama.h"])}
    for name in llama_mix.FTYPES:
        if name != "F32":
            assert llama_mix.file_type_id(name) == ftypes[name], name


@pytest.mark.native
def test_llama_quantize_keeps_every_upstream_type_and_adds_ours(pinned_sdist):
    """llama-quantize's QUANT_OPTIONS after the integration: upstream's names in upstream's order (an anchored
    edit must remove none) plus ours; and gguftool knows every upstream one as a target, save COPY and the
    two that the installed gguf package cannot represent (docs/stock-types.md, Not yet)."""
    from gguftool.pipeline import llama_mix
    rel = "tools/quantize/quantize.cpp"
    text = source.read_pristine([rel])[rel]
    edited = text
    for e in integrate.edits():
        if e.path == rel:
            edited = e.apply(edited)

    def names(t: str) -> list[str]:
        body = t[t.index("static const std::vector<quant_option> QUANT_OPTIONS = {"):]
        return re.findall(r'^\s*\{\s*"(\w+)",', body[:body.index("};")], re.M)

    upstream, ours = names(text), [t.name for t in gtypes.CUSTOM_TYPES]
    assert len(upstream) >= 30
    assert [n for n in names(edited) if n not in ours] == upstream
    assert set(ours) <= set(names(edited))
    missing = set(upstream) - set(llama_mix.FTYPES) - set(llama_mix.ALIASES) - {"COPY"}
    assert not missing, missing


def test_cache_type_list_keeps_upstreams_and_adds_ours(pinned_sdist):
    """--cache-type-k/-v accept upstream's list and then ours (an earlier edit dropped q5_1)."""
    rel = "common/arg.cpp"
    text = source.read_pristine([rel])[rel]
    edited = next(e for e in integrate.edits() if e.path == rel).apply(text)

    def listed(t: str) -> list[str]:
        body = t[t.index("const std::vector<ggml_type> kv_cache_types = {"):]
        return re.findall(r"GGML_TYPE_(\w+),", body[:body.index("};")])

    ours = [t.name for t in gtypes.CUSTOM_TYPES if t.kv_cache]
    assert listed(edited) == listed(text) + ours
    assert {n.upper() for n in gtypes.CACHE_TYPES} <= set(listed(edited))   # what gguftool sizes, llama.cpp takes
