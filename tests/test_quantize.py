"""`gguftool quantize` end to end: plans, standard-type bytes, streaming, and bad input."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, quants

from gguftool.cli import main
from gguftool.io.reader import GGUFFile
from gguftool.pipeline import plan as planning
from gguftool.pipeline import quantize as qpipe

from .conftest import tiny_llama


def _quantize(*args) -> int:
    return main(["quantize", *map(str, args)])


@pytest.mark.parametrize("target", ["Q8_0", "Q4_0"])
def test_smollm2_requantize_is_llamacpp_reference_bytes(tmp_path, smollm2, target):
    out = tmp_path / f"smol-{target}.gguf"
    assert _quantize(smollm2, out, target, "--allow-requantize", "--threads", "2") == 0
    src, dst = GGUFFile(smollm2), GGUFFile(out)
    qt = GGMLQuantizationType[target]
    checked = 0
    for t in src.tensors:
        u = dst.tensor(t.name)
        if len(t.shape) < 2:
            assert u.type == t.type and np.array_equal(u.raw_rows(), t.raw_rows())
            continue
        if t.name == "token_embd.weight":  # tied output: kept at Q8_0
            assert u.type.name == "Q8_0"
            continue
        assert u.type.name == target
        # gguf.quants is a bit-exact numpy port of ggml's quantize_row_*_ref; dequantize with it too.
        x = quants.dequantize(t.raw_rows(), GGMLQuantizationType[t.type.name])
        assert np.array_equal(u.raw_rows(), quants.quantize(x, qt)), t.name
        checked += 1
    assert checked == 210
    # the stock reader reads our standard-type output, and metadata survived
    r = GGUFReader(out)
    assert len(r.tensors) == len(src.tensors)
    assert dst.get("tokenizer.ggml.tokens") == src.get("tokenizer.ggml.tokens")
    assert dst.get("general.file_type") == {"Q8_0": 7, "Q4_0": 2}[target]


def test_tensor_type_rules_on_a_real_model(tmp_path, smollm2):
    out = tmp_path / "smol-q41.gguf"
    assert _quantize(smollm2, out, "Q4_1", "--allow-requantize", "--pure",
                     "--tensor-type", "blk\\.[0-9]\\.=Q8_0", "--tensor-type", "blk=Q5_1") == 0
    src, dst = GGUFFile(smollm2), GGUFFile(out)
    for name in ("blk.3.attn_q.weight", "blk.12.ffn_up.weight", "blk.29.ffn_down.weight"):
        assert dst.tensor(name).type.name == ("Q8_0" if name.startswith("blk.3.") else "Q5_1")
    assert dst.tensor("token_embd.weight").type.name == "Q4_1"
    # --pure sends the tied embedding to the target too (Q8_0 -> Q4_1, llama.cpp's reference bytes)
    x = quants.dequantize(src.tensor("token_embd.weight").raw_rows(), GGMLQuantizationType.Q8_0)
    assert np.array_equal(dst.tensor("token_embd.weight").raw_rows(), quants.quantize(x, GGMLQuantizationType.Q4_1))


def test_pipeline_chunks_and_threads_give_the_same_bytes(tmp_path, rng, monkeypatch):
    src_path = tiny_llama(tmp_path / "t.gguf", rng)
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    assert _quantize(src_path, a, "Q5_0", "--threads", "1") == 0
    monkeypatch.setattr(qpipe, "CHUNK_VALUES", 3 * 128)  # 3-row chunks
    assert _quantize(src_path, b, "Q5_0", "--threads", "2") == 0
    assert a.read_bytes() == b.read_bytes()


def test_default_mixing_follows_llama_quantize(tmp_path, rng):
    f = GGUFFile(tiny_llama(tmp_path / "t.gguf", rng))
    p = planning.make_plan(f, planning.Options(target="Q4_0"))
    to = {s.tensor.name: s.out_type.name for s in p.steps}
    assert to["output_norm.weight"] == "F32" and to["blk.0.attn_norm.weight"] == "F32"
    assert to["output.weight"] == "Q8_0" and to["token_embd.weight"] == "Q4_0"
    assert to["blk.1.ffn_down.weight"] == "Q4_0"
    pure = planning.make_plan(f, planning.Options(target="Q4_0", pure=True))
    assert {s.out_type.name for s in pure.steps if len(s.tensor.shape) == 2} == {"Q4_0"}
    left = planning.make_plan(f, planning.Options(target="Q4_0", leave_output_tensor=True,
                                                  token_embedding_type="Q8_0",
                                                  tensor_types=[planning.parse_tensor_type("attn_v=Q5_1"),
                                                                planning.parse_tensor_type("attn=Q8_0")]))
    to = {s.tensor.name: s.out_type.name for s in left.steps}
    assert to["output.weight"] == "F32" and to["token_embd.weight"] == "Q8_0"
    assert to["blk.0.attn_v.weight"] == "Q5_1" and to["blk.0.attn_k.weight"] == "Q8_0"  # first match wins


def test_rows_that_do_not_divide_the_block_fall_back(tmp_path, rng):
    from .conftest import write_gguf
    path = write_gguf(tmp_path / "odd.gguf", {
        "blk.0.ffn_down.weight": (rng.standard_normal((8, 48)).astype(np.float32), None),   # 48 % 32 != 0
        "blk.0.ffn_up.weight": (rng.standard_normal((8, 64)).astype(np.float32), None)})
    p = planning.make_plan(GGUFFile(path), planning.Options(target="Q4_0"))
    steps = {s.tensor.name: s for s in p.steps}
    assert steps["blk.0.ffn_down.weight"].out_type.name == "F16"
    assert "does not divide Q4_0's block" in steps["blk.0.ffn_down.weight"].note
    assert steps["blk.0.ffn_up.weight"].out_type.name == "Q4_0"


def test_dry_run_prints_plan_and_writes_nothing(tmp_path, rng, capsys):
    src = tiny_llama(tmp_path / "t.gguf", rng)
    out = tmp_path / "never.gguf"
    assert _quantize(src, out, "Q4_1", "--dry-run", "--format", "json") == 0
    plan = json.loads(capsys.readouterr().out)
    assert not out.exists()
    assert {r["name"] for r in plan["tensors"]} == {t.name for t in GGUFFile(src).tensors}
    real = tmp_path / "real.gguf"
    assert _quantize(src, real, "Q4_1") == 0
    assert GGUFFile(real).get("gguftool.hqq.defaults") is None   # recorded only where the HQQ solver ran
    assert plan["output_bytes"] == sum(t.n_bytes for t in GGUFFile(real).tensors)


@pytest.mark.parametrize("bad, target", [(np.nan, "Q8_0"), (-np.inf, "Q4_HQQ"), (np.inf, "BF16")])
def test_nan_weights_refused_and_no_output(tmp_path, rng, capsys, bad, target):
    from .conftest import write_gguf
    w = rng.standard_normal((4, 64)).astype(np.float32)
    w[2, 5] = bad
    src = write_gguf(tmp_path / "nan.gguf", {"blk.0.attn_q.weight": (w, None)})
    out = tmp_path / "o.gguf"
    assert _quantize(src, out, target) == 1
    err = capsys.readouterr().err
    assert "blk.0.attn_q.weight" in err and f"{bad} at row 2, column 5" in err and "Traceback" not in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["nan.gguf"]


def test_huge_finite_weights_are_not_mistaken_for_inf(tmp_path, rng):
    """The NaN/Inf check first sums a chunk: values whose sum overflows must still pass."""
    from .conftest import write_gguf
    w = np.full((4, 64), 3e38, np.float32)
    src = write_gguf(tmp_path / "big.gguf", {"blk.0.attn_q.weight": (w, None)})
    out = tmp_path / "o.gguf"
    assert _quantize(src, out, "F32") == 0
    assert np.array_equal(GGUFFile(out).tensor("blk.0.attn_q.weight").data, w)


def test_refusals_are_clean_errors(tmp_path, smollm2, capsys):
    before = smollm2.stat().st_mtime_ns
    out = tmp_path / "o.gguf"
    assert _quantize(smollm2, out, "Q4_0") == 1
    assert "already quantized" in capsys.readouterr().err
    assert _quantize(smollm2, smollm2, "Q4_0", "--allow-requantize") == 1
    assert "output path is the input" in capsys.readouterr().err
    assert _quantize(smollm2, out, "Q8_K", "--allow-requantize") == 1   # ggml's internal dot type: no file holds it
    assert "unknown quantization type 'Q8_K'" in capsys.readouterr().err
    assert smollm2.stat().st_mtime_ns == before and not out.exists()


def test_cli_prints_no_traceback_unless_debug(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 40)
    r = subprocess.run([sys.executable, "-m", "gguftool", "inspect", str(bad)], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "gguftool", "inspect", str(bad)], capture_output=True, text=True,
                       env={**__import__("os").environ, "GGUFTOOL_DEBUG": "1"})
    assert "Traceback" in r.stderr


def test_inspect_json(tmp_path, smollm2, capsys):
    assert main(["inspect", str(smollm2), "--format", "json", "--tensors"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["architecture"] == "llama" and len(info["tensors"]) == 272
    assert info["types"]["Q4_1"]["tensors"] == 210 and info["types"]["Q8_0"]["tensors"] == 1
    assert abs(info["parameters"] - 134.5e6) < 0.1e6
    assert 5.7 < info["bits_per_weight"] < 5.8


def _gguf_dump(*args) -> str:   # upstream's gguf-dump, from the installed gguf package
    r = subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_dump", *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_inspect_takes_gguf_dumps_flags(tmp_path, smollm2, capsys):
    """--json (with --json-array, --no-tensors), --data-offset and --data-alignment print what gguf-dump
    prints, byte for byte, on a stock file and a 64-aligned one; on a file of our types, which gguf-dump
    cannot read, every offset --json gives points at its key's or tensor's record."""
    tiny = tiny_llama(tmp_path / "t.gguf", np.random.default_rng(1))
    aligned, ours_types = tmp_path / "a.gguf", tmp_path / "h.gguf"
    assert main(["quantize", str(tiny), str(aligned), "Q8_0", "--override-kv", "general.alignment=int:64"]) == 0
    assert main(["quantize", str(tiny), str(ours_types), "Q4_HQQ"]) == 0
    capsys.readouterr()
    for f in (smollm2, aligned):
        for flag in ("--data-offset", "--data-alignment"):
            assert main(["inspect", str(f), flag]) == 0
            assert capsys.readouterr().out.strip() == _gguf_dump(flag, f).strip(), (f, flag)
        for flags in ([], ["--json-array"], ["--no-tensors"]):
            assert main(["inspect", str(f), "--json", *flags]) == 0
            assert capsys.readouterr().out == _gguf_dump("--json", *flags, f) + "\n", (f, flags)
    assert _gguf_dump("--data-alignment", aligned).strip() == "64"
    assert main(["inspect", str(ours_types), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    raw = ours_types.read_bytes()

    def name_at(offset: int) -> str:   # a key-value pair and a tensor info both start with their name
        n = int.from_bytes(raw[offset:offset + 8], "little")
        return raw[offset + 8:offset + 8 + n].decode()

    assert {t["type"] for t in doc["tensors"].values()} >= {"Q4_HQQ", "F32"}
    assert all(name_at(t["offset"]) == name for name, t in doc["tensors"].items())
    keys = {k: v for k, v in doc["metadata"].items() if not k.startswith("GGUF.")}
    assert "gguftool.type.Q4_HQQ.id" in keys and all(name_at(v["offset"]) == k for k, v in keys.items())
    assert doc["metadata"]["GGUF.tensor_count"]["value"] == len(doc["tensors"])


def test_f16_decoder_is_exact_for_every_pattern():
    """F16 inputs are decoded by our C cast (numpy's is scalar and slow): all 65536 bit patterns
    must give numpy's float32 bits (NaN stays NaN; its payload is not part of the contract)."""
    from gguftool._fast import _convert  # noqa: F401  (built by the install: the C path, not numpy's fallback)
    from gguftool.quant import codec
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    ours = codec("F16").dequantize(np.repeat(h[None, :], 3, axis=0).view(np.uint8))
    ref = h.view(np.float16).astype(np.float32)
    assert ours.shape == (3, 1 << 16) and ours.dtype == np.float32
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(ours[1]), nan)
    assert np.array_equal(ours[1][~nan].view(np.uint32), ref[~nan].view(np.uint32))


def test_hqq_parameters_checked_before_writing_and_ignored_ones_named(tmp_path, rng, capsys, monkeypatch):
    from gguftool.quant import hqq
    src = tiny_llama(tmp_path / "t.gguf", rng)
    out = tmp_path / "o.gguf"
    calls = []
    monkeypatch.setattr(hqq, "quantize_hqq", lambda *a, **k: calls.append(1))   # must not be reached
    assert _quantize(src, out, "Q4_HQQ", "--hqq-refit", "9") == 1
    assert "HQQ refit must be in 0..8, got 9" in capsys.readouterr().err
    assert not calls and not out.exists()
    monkeypatch.undo()
    assert _quantize(src, out, "Q4_1", "--hqq-refit", "1") == 0    # the reference Q4_1 takes no HQQ parameter
    assert "HQQ parameters ['refit'] ignored" in capsys.readouterr().err
    out.unlink()
    assert _quantize(src, out, "Q4_0", "--solver", "hqq") == 0       # Q4_0 has no HQQ solver
    assert "HQQ parameters ['solver'] ignored" in capsys.readouterr().err
    assert GGUFFile(out).get("gguftool.hqq.defaults") is None


def test_precedence_follows_llama_quantize(tmp_path, rng):
    """llama_tensor_get_type's order: kept tensors (position embeddings) whatever the rules say, then
    --token-embedding-type (it beats --output-tensor-type on a tied embedding), then output.weight's
    --output-tensor-type, then the --tensor-type rules."""
    from .conftest import write_gguf
    m = {n: (rng.standard_normal((8, 64)).astype(np.float32), None) for n in
         ("token_embd.weight", "position_embd.weight", "token_types.weight", "blk.0.attn_q.weight")}
    f = GGUFFile(write_gguf(tmp_path / "tied.gguf", m))   # no output.weight: token_embd is the output
    opts = planning.Options(target="Q4_0", output_tensor_type="Q5_0", token_embedding_type="Q8_0",
                            tensor_types=[planning.parse_tensor_type("embd|types|attn=Q5_1")])
    to = {s.tensor.name: s.out_type.name for s in planning.make_plan(f, opts).steps}
    assert to == {"token_embd.weight": "Q8_0", "position_embd.weight": "F32", "token_types.weight": "F32",
                  "blk.0.attn_q.weight": "Q5_1"}
    only_out = planning.Options(target="Q4_0", output_tensor_type="Q5_0")
    assert {s.tensor.name: s.out_type.name for s in planning.make_plan(f, only_out).steps}["token_embd.weight"] == "Q5_0"


@pytest.mark.native
def test_tied_embedding_types_equal_llama_quantize(tmp_path, smollm2):
    from gguftool.errors import GgufToolError
    from gguftool.native import tools
    try:
        lq = tools.tool("llama-quantize")
    except GgufToolError as e:
        pytest.skip(e.message)
    ref, ours = tmp_path / "lq.gguf", tmp_path / "ours.gguf"
    flags = ["--allow-requantize", "--output-tensor-type", "q5_0", "--token-embedding-type", "q8_0"]
    r = subprocess.run([str(lq), *flags, str(smollm2), str(ref), "Q4_0", "2"], capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-1500:]
    assert _quantize(smollm2, ours, "Q4_0", *flags, "--threads", "2") == 0
    a, b = GGUFFile(ref), GGUFFile(ours)
    assert {t.name: t.type.name for t in a.tensors} == {t.name: t.type.name for t in b.tensors}
    assert a.tensor("token_embd.weight").type.name == "Q8_0"


def test_inspect_reads_what_upstream_gguf_reader_refuses(tmp_path, rng, capsys):
    """README and inspect's help say so: upstream's reader stops on our type ids, gguftool inspect reads them."""
    src = tiny_llama(tmp_path / "t.gguf", rng)
    out = tmp_path / "t-hqq.gguf"
    assert _quantize(src, out, "Q4_HQQ", "--pure") == 0
    with pytest.raises(ValueError, match="512"):
        GGUFReader(out)
    capsys.readouterr()
    assert main(["inspect", str(out), "--tensors", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["types"]["Q4_HQQ"]["tensors"] == sum(1 for t in GGUFFile(src).tensors if len(t.shape) == 2)
