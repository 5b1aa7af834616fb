"""Split GGUF (llama-gguf-split's shards): reading a split model whole, writing one, and llama.cpp agreeing.

Split inputs are made by gguf-py's own split writer (an implementation independent of ours); the native
tests hold our output against llama.cpp's loader and against llama-gguf-split built from the pinned source.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType, GGUFWriter, Keys

from gguftool.cli import main
from gguftool.errors import GgufToolError
from gguftool.io import hub as hubio
from gguftool.io.reader import GGUFFile
from gguftool.io.split import SplitGGUF, open_gguf, output_prefix, shard_layout, shard_path

from .conftest import tiny_llama
from .hfserver import FakeHub

SPLIT_KEYS = [Keys.Split.LLM_KV_SPLIT_NO, Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT, Keys.Split.LLM_KV_SPLIT_COUNT]


def _quantize(*args) -> int:
    return main(["quantize", *map(str, args)])


def _fails(capsys, pattern: str, *args) -> None:
    """The command exits non-zero with an error matching `pattern` (main() prints GgufToolError)."""
    capsys.readouterr()
    assert main([*map(str, args)]) != 0
    err = capsys.readouterr().err
    assert re.search(pattern, err), err


def _shards(prefix: Path, n: int) -> list[Path]:
    return [shard_path(prefix, i, n) for i in range(n)]


def _same_tensors(a, b) -> None:
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
    for t in a.tensors:
        u = b.tensor(t.name)
        assert (u.type.name, u.shape) == (t.type.name, t.shape), t.name
        assert np.array_equal(t.raw_rows(), u.raw_rows()), f"{t.name} differs"


def gguf_py_split(src: Path, out: Path, max_tensors: int) -> list[Path]:
    """`src` split by gguf-py's GGUFWriter (its own shard writer): out-00001-of-0000N.gguf, ..."""
    f = GGUFFile(src)
    w = GGUFWriter(out, f.architecture, split_max_tensors=max_tensors)
    for k in f.fields:
        if k != "general.architecture":
            main_t, sub = f.field_type(k)
            w.add_key_value(k, f.get(k), main_t, sub)
    for t in f.tensors:
        w.add_tensor(t.name, np.array(t.data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    n = len(w.tensors)
    return _shards(Path(output_prefix(out)), n)


def fake_shard(path: Path, names: list[str], no: int, count: int, total: int) -> Path:
    """One shard written by hand, split keys as given (for inconsistent sets)."""
    w = GGUFWriter(path, "llama")
    w.add_uint16(Keys.Split.LLM_KV_SPLIT_NO, no)
    w.add_uint16(Keys.Split.LLM_KV_SPLIT_COUNT, count)
    w.add_int32(Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT, total)
    for n in names:
        w.add_tensor(n, np.ones(32, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def tiny(tmp_path, rng) -> Path:
    return tiny_llama(tmp_path / "tiny.gguf", rng)   # 19 float32 tensors


# ----------------------------------------------------------------------------- the rule and the names
def test_names_and_layout_follow_llama_cpp():
    assert shard_path("m/out", 0, 3) == Path("m/out-00001-of-00003.gguf")   # llama_split_path: 1-based, %05d
    assert output_prefix("a/out.gguf") == "a/out" and output_prefix("out") == "out"
    assert shard_layout([10] * 7, max_tensors=3) == [0, 0, 0, 1, 1, 1, 2]
    # sizes are padded to 32 bytes: 40 -> 64; a tensor above the limit sits alone
    assert shard_layout([40, 40, 100, 10], max_size=96) == [0, 1, 2, 3]
    assert shard_layout([32, 32, 32], max_size=64) == [0, 0, 1]
    assert shard_layout([32, 32, 32]) == [0, 0, 0]


# ----------------------------------------------------------------------------- writing, read back whole
def test_round_trip_split_max_tensors(tiny, tmp_path):
    out = tmp_path / "out.gguf"
    assert _quantize(tiny, out, "F32", "--split-max-tensors", "5") == 0
    paths = _shards(tmp_path / "out", 4)   # 19 tensors, 5 a shard
    assert all(p.is_file() for p in paths) and not out.exists()
    src, whole = GGUFFile(tiny), open_gguf(paths[0])
    assert isinstance(whole, SplitGGUF) and whole.paths == paths
    _same_tensors(src, whole)   # every tensor byte for byte, in order
    assert {k: src.get(k) for k in src.fields}.items() <= whole.metadata.items()
    assert not set(SPLIT_KEYS) & set(whole.metadata)   # the view is the model, not its files
    # each shard as llama-gguf-split writes it: the split keys, in its order and types, metadata in the first only
    for i, p in enumerate(paths):
        f = GGUFFile(p)
        assert list(f.fields)[-3:] == SPLIT_KEYS
        assert [f.field_type(k)[0] for k in SPLIT_KEYS] == [GGUFValueType.UINT16, GGUFValueType.INT32, GGUFValueType.UINT16]
        assert [f.get(k) for k in SPLIT_KEYS] == [i, 19, 4]
        assert len(f.tensors) == (5 if i < 3 else 4)
        if i:
            assert list(f.fields) == SPLIT_KEYS
    assert GGUFFile(paths[0]).get("general.name") == "tiny"
    _same_tensors(src, open_gguf(paths[2]))   # any shard opens the whole model


def test_round_trip_split_max_size(tiny, tmp_path):
    out = tmp_path / "out.gguf"
    assert _quantize(tiny, out, "F32", "--split-max-size", "0.3M") == 0
    paths = sorted(tmp_path.glob("out-*.gguf"))
    assert len(paths) > 2
    for p in paths:
        f = GGUFFile(p)
        data = sum(-(-t.n_bytes // 32) * 32 for t in f.tensors)
        assert data <= 300_000 or len(f.tensors) == 1, (p, data)
    _same_tensors(GGUFFile(tiny), open_gguf(paths[0]))


def test_inspect_lists_every_tensor_of_a_split_model(tiny, tmp_path, capsys):
    assert _quantize(tiny, tmp_path / "out.gguf", "F32", "--split-max-tensors", "8") == 0
    capsys.readouterr()
    first = shard_path(tmp_path / "out", 0, 3)
    assert main(["inspect", str(first), "--tensors", "--format", "json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [t["name"] for t in info["tensors"]] == [t.name for t in GGUFFile(tiny).tensors]
    assert len(info["shards"]) == 3 and info["file_bytes"] == sum(Path(p).stat().st_size for p in info["shards"])


def test_failed_write_leaves_the_old_shards_whole(tmp_path, rng, capsys):
    src = tiny_llama(tmp_path / "src.gguf", rng)
    out = tmp_path / "out.gguf"
    assert _quantize(src, out, "Q8_0", "--split-max-tensors", "5") == 0
    old = {p: p.read_bytes() for p in tmp_path.glob("out-*")}
    f = GGUFFile(src)   # a NaN in the last tensor: the run fails while writing the last shard
    bad = {t.name: np.array(t.data) for t in f.tensors}
    last = f.tensors[-1].name
    bad[last][0, 0] = np.nan
    w = GGUFWriter(tmp_path / "bad.gguf", "llama")
    for name, a in bad.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _fails(capsys, "holds nan", "quantize", tmp_path / "bad.gguf", out, "Q8_0", "--split-max-tensors", "5")
    assert {p: p.read_bytes() for p in tmp_path.glob("out-*")} == old   # no shard replaced, none half-written
    assert not list(tmp_path.glob(".out*"))   # no temporary file left


def test_split_options(tiny, tmp_path, capsys):
    o = tmp_path / "o.gguf"
    _fails(capsys, "not both", "quantize", tiny, o, "F32", "--split-max-size", "1M", "--split-max-tensors", "3")
    _fails(capsys, "at least 1", "quantize", tiny, o, "F32", "--split-max-tensors", "0")
    _fails(capsys, "cannot read size", "quantize", tiny, o, "F32", "--split-max-size", "lots")
    assert not list(tmp_path.glob("o*"))


# ----------------------------------------------------------------------------- split inputs
def test_quantize_a_split_input(tiny, tmp_path):
    shards = gguf_py_split(tiny, tmp_path / "in.gguf", 6)
    assert len(shards) == 4
    whole, split = tmp_path / "whole.gguf", tmp_path / "split.gguf"
    assert _quantize(tiny, whole, "Q8_0") == 0
    assert _quantize(shards[0], split, "Q8_0") == 0
    a, b = GGUFFile(whole), GGUFFile(split)   # one file: the split keys stay behind
    _same_tensors(a, b)
    assert not set(SPLIT_KEYS) & set(b.fields)
    assert b.get("general.name") == "tiny"


def test_keep_split(tiny, tmp_path, capsys):
    shards = gguf_py_split(tiny, tmp_path / "in.gguf", 7)
    assert _quantize(shards[0], tmp_path / "out.gguf", "Q8_0", "--keep-split") == 0
    outs = _shards(tmp_path / "out", len(shards))
    for s, o in zip(shards, outs):
        assert [t.name for t in GGUFFile(o).tensors] == [t.name for t in GGUFFile(s).tensors]
    assert _quantize(tiny, tmp_path / "ref.gguf", "Q8_0") == 0
    _same_tensors(GGUFFile(tmp_path / "ref.gguf"), open_gguf(outs[0]))
    # the output may not overwrite the input's shards
    _fails(capsys, "output path is the input file", "quantize", shards[0], tmp_path / "in.gguf", "Q8_0", "--keep-split")
    assert GGUFFile(shards[0]).get("general.name") == "tiny"
    assert _quantize(tiny, tmp_path / "plain.gguf", "Q8_0", "--keep-split") == 0
    assert "not split" in capsys.readouterr().err and (tmp_path / "plain.gguf").is_file()


def test_bad_sets_are_clear_errors(tiny, tmp_path, capsys):
    shards = gguf_py_split(tiny, tmp_path / "in.gguf", 7)   # 3 shards
    keep = shards[2].read_bytes()
    shards[2].unlink()
    with pytest.raises(GgufToolError, match=r"in-00003-of-00003\.gguf: missing: shard 3 of 3"):
        open_gguf(shards[0])
    fake_shard(shards[2], ["x.weight"], 2, 4, 19)   # a shard of another (4-shard) split
    with pytest.raises(GgufToolError, match=r"in-00003-of-00003\.gguf: says it is shard .*split\.count=4"):
        open_gguf(shards[0])
    fake_shard(shards[2], ["x.weight"], 2, 3, 19)   # right keys, but 15 tensors in all where 19 are said
    with pytest.raises(GgufToolError, match=r"in-00001-of-00003\.gguf: split\.tensors\.count says 19 tensors, .* hold 15"):
        open_gguf(shards[0])
    fake_shard(shards[2], ["blk.0.attn_q.weight"], 2, 3, 15)   # a name shard 1 or 2 has
    with pytest.raises(GgufToolError, match=r"in-00003-of-00003\.gguf: tensor 'blk\.0\.attn_q\.weight' is also in"):
        open_gguf(shards[0])
    shards[2].write_bytes(keep)
    renamed = shards[1].rename(tmp_path / "second.gguf")
    with pytest.raises(GgufToolError, match="does not end in -00002-of-00003.gguf"):
        open_gguf(renamed)
    _fails(capsys, "missing: shard 2 of 3", "inspect", shards[0])


def test_kv_calibration_of_a_split_model(tiny, tmp_path):
    """kv-calibrate's writer: a split input becomes one file; `shard` (quantize's recipe step on a split
    output) rewrites only the first shard, which holds all the metadata, and keeps it a shard."""
    from gguftool.pipeline import kvcalib
    shards = gguf_py_split(tiny, tmp_path / "in.gguf", 7)
    item = [(kvcalib.META + "note", "x", GGUFValueType.STRING, None)]
    kvcalib.write(shards[0], tmp_path / "one.gguf", item, {})
    one = GGUFFile(tmp_path / "one.gguf")
    _same_tensors(GGUFFile(tiny), one)
    assert one.get(kvcalib.META + "note") == "x" and not set(SPLIT_KEYS) & set(one.fields)
    kvcalib.write(shards[0], tmp_path / "first.gguf", item, {}, shard=True)
    first = GGUFFile(tmp_path / "first.gguf")
    _same_tensors(GGUFFile(shards[0]), first)
    assert [first.get(k) for k in SPLIT_KEYS] == [0, 19, 3] and first.get(kvcalib.META + "note") == "x"


def test_validate_pushes_every_shard(tiny, tmp_path):
    """On a phone llama.cpp finds the other shards beside the first: validate pushes them all."""
    from gguftool.validate.session import Validation

    class Recorder:
        def __init__(self):
            self.pushed = []

        def push(self, local, name=None):
            self.pushed.append(Path(local).name)
            return f"/remote/{Path(local).name}"

    shards = gguf_py_split(tiny, tmp_path / "in.gguf", 7)
    v = Validation.__new__(Validation)   # only the push step, without a target
    v.r = Recorder()
    assert v._push_model(shards[0]) == "/remote/in-00001-of-00003.gguf"
    assert sorted(v.r.pushed) == [p.name for p in shards]
    v.r.pushed.clear()
    v._push_model(tiny)
    assert v.r.pushed == ["tiny.gguf"]


# ----------------------------------------------------------------------------- hub
@pytest.fixture
def hub(monkeypatch, tmp_path):
    with FakeHub() as h:
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        for var in ("HF_HUB_CACHE", "HF_TOKEN", "HF_HUB_OFFLINE", "HUGGING_FACE_HUB_TOKEN"):
            monkeypatch.delenv(var, raising=False)
        yield h


def test_hub_fetches_every_shard(hub, tiny, tmp_path, rng):
    shards = gguf_py_split(tiny, tmp_path / "tiny-F32.gguf", 7)
    q4 = tiny_llama(tmp_path / "tiny-Q4_0.gguf", rng, dtype=np.float16)
    files = {f"F32/{p.name}": p.read_bytes() for p in shards} | {"tiny-Q4_0.gguf": q4.read_bytes()}
    hub.add("tests-org/tiny-split-GGUF", files)
    out = tmp_path / "o.gguf"
    assert main(["hub", "tests-org/tiny-split-GGUF", "--type", "Q8_0", "-o", str(out)]) == 0   # F32 beats Q4_0
    fetched = sorted(Path(p).name for _, p, _ in hub.requests("GET") if p.endswith(".gguf"))
    assert fetched == sorted(p.name for p in shards)
    assert GGUFFile(out).get("gguftool.source.file") == shards[0].name
    assert _quantize(tiny, tmp_path / "ref.gguf", "Q8_0") == 0
    _same_tensors(GGUFFile(tmp_path / "ref.gguf"), GGUFFile(out))
    names = list(files)
    assert hubio.choose_gguf(names, "*F32*", "r") == "F32/tiny-F32-00001-of-00003.gguf"   # one model, three files
    assert hubio.choose_gguf(names, "*F32.gguf", "r") == "F32/tiny-F32-00001-of-00003.gguf"
    with pytest.raises(GgufToolError, match="lacks 1 of its 3 shards: F32/tiny-F32-00002-of-00003.gguf"):
        hubio.gguf_files([n for n in names if "00002" not in n], names[0], "r")


# ----------------------------------------------------------------------------- llama.cpp
def _native():
    from gguftool.native import tools
    try:
        return tools.find_build(require_current=True)
    except GgufToolError as e:
        if os.environ.get("GGUFTOOL_NATIVE_REQUIRED"):
            pytest.fail(e.message)
        pytest.skip(f"{e.message} ({e.hint})")


def _copy_split(smollm2: Path, out: Path, *opts: str) -> None:
    # Q4_1 stays Q4_1 and the Q8_0 embedding stays Q8_0: every tensor is copied, so bytes can be compared
    assert _quantize(smollm2, out, "Q4_1", "--allow-requantize", "--pure", "--token-embedding-type", "Q8_0",
                     "-t", "2", *opts) == 0


@pytest.mark.native
def test_llama_cpp_loads_our_split_output(smollm2, tmp_path):
    build = _native()
    _copy_split(smollm2, tmp_path / "sm.gguf", "--split-max-size", "40M")
    paths = _shards(tmp_path / "sm", 3)
    _same_tensors(GGUFFile(smollm2), open_gguf(paths[0]))
    cmd = [str(build.tool("llama-completion")), "-m", str(paths[0]), "-p", "The capital of France is", "-n", "4",
           "-t", "2", "--temp", "0", "-no-cnv"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("The capital of France is") and len(r.stdout.strip()) > len("The capital of France is")
    # --keep-split requantizes shard by shard: llama.cpp loads those shards too, and says the same
    assert _quantize(paths[0], tmp_path / "kept.gguf", "Q8_0", "--allow-requantize", "--keep-split", "-t", "2") == 0
    kept = _shards(tmp_path / "kept", 3)
    assert {t.type.name for t in open_gguf(kept[0]).tensors if len(t.shape) == 2} == {"Q8_0"}
    r2 = subprocess.run([*cmd[:2], str(kept[0]), *cmd[3:]], capture_output=True, text=True, timeout=300)
    assert r2.returncode == 0, r2.stderr[-2000:]
    assert r2.stdout.startswith("The capital of France is") and len(r2.stdout.strip()) > len("The capital of France is")
    paths[2].unlink()   # and it did read the other shards
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "sm-00003-of-00003.gguf" in r.stderr


def _llama_gguf_split(build, tmp: Path) -> Path:
    """llama-gguf-split, compiled from the pinned source against the build's static libraries (seconds)."""
    src = Path(build.info.get("tree", "")) / "tools" / "gguf-split" / "gguf-split.cpp"
    cxx = shutil.which("c++") or shutil.which("g++")
    if not src.is_file() or cxx is None:
        pytest.skip(f"no {src} or no C++ compiler")
    b, root = build.build_dir, src.parents[2]
    libs = [b / "common/libllama-common.a", b / "common/libllama-common-base.a", b / "src/libllama.a",
            b / "ggml/src/libggml.a", b / "ggml/src/libggml-cpu.a", b / "ggml/src/libggml-base.a"]
    exe = tmp / "llama-gguf-split"
    r = subprocess.run([cxx, "-O1", "-DGGML_USE_CPU", f"-I{root}/common", f"-I{root}/vendor", f"-I{root}/include",
                        f"-I{root}/ggml/include", str(src), "-o", str(exe), *map(str, libs), "-lpthread", "-lgomp", "-ldl"],
                       capture_output=True, text=True, timeout=600)
    if r.returncode:
        pytest.skip(f"cannot build llama-gguf-split against {b}: {r.stderr[-500:]}")
    return exe


@pytest.mark.native
@pytest.mark.parametrize("opt", [("--split-max-size", "40M"), ("--split-max-tensors", "100")])
def test_shards_match_llama_gguf_split(smollm2, tmp_path, opt):
    """The same shards as llama-gguf-split: the same tensors in each, and the shards after the first
    (split keys, tensor infos, data) byte for byte; the first differs only by gguftool's own records."""
    split = _llama_gguf_split(_native(), tmp_path)
    r = subprocess.run([str(split), *opt, str(smollm2), str(tmp_path / "ref")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    _copy_split(smollm2, tmp_path / "ours.gguf", *opt)
    ref, ours = sorted(tmp_path.glob("ref-*.gguf")), sorted(tmp_path.glob("ours-*.gguf"))
    assert len(ref) == len(ours) > 1
    for i, (a, b) in enumerate(zip(ref, ours)):
        assert a.name.replace("ref", "ours") == b.name
        fa, fb = GGUFFile(a), GGUFFile(b)
        assert [t.name for t in fa.tensors] == [t.name for t in fb.tensors]
        assert list(fa.fields)[-3:] == list(fb.fields)[-3:] == SPLIT_KEYS
        assert [fa.get(k) for k in SPLIT_KEYS] == [fb.get(k) for k in SPLIT_KEYS]
        if i:
            assert a.read_bytes() == b.read_bytes(), b.name
