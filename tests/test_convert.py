"""`gguftool convert`: safetensors reading, name maps, hyperparameters, tokenizer, permutation, and
round trips against files llama.cpp wrote (the SmolLM2 GGUF) and the real MiniLM checkpoint."""
from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from gguftool.cli import main
from gguftool.convert import archs, open_model
from gguftool.errors import GgufToolError
from gguftool.io.reader import GGUFFile
from gguftool.io.safetensors import Checkpoint, SafetensorsFile
from gguftool.quant import codec

from .hf_export import PRE_TOKENIZERS, export_llama, save_file, unpermute


# -- small checkpoints the tests build -------------------------------------------------------------------
def tiny_tokenizer(pre: str = "smollm", n_merges: int = 40) -> dict:
    """A byte-level BPE tokenizer.json: the 256 byte symbols, a few merges, two special tokens."""
    b2u = gguf.vocab.bytes_to_unicode()
    symbols = [b2u[b] for b in range(256)]
    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1}
    for s in symbols:
        vocab[s] = len(vocab)
    merges = []
    letters = "etaoinshrdlu"
    for a in letters:
        for b in letters:
            if len(merges) < n_merges and a != b:
                merges.append(f"{a} {b}")
                vocab[a + b] = len(vocab)
    return {"version": "1.0", "added_tokens": [
        {"id": i, "content": c, "special": True, "normalized": False, "single_word": False, "lstrip": False, "rstrip": False}
        for i, c in enumerate(("<|endoftext|>", "<|im_start|>"))],
        "normalizer": None, "pre_tokenizer": PRE_TOKENIZERS[pre], "post_processor": None,
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "byte_fallback": False, "vocab": vocab, "merges": merges}}


def tiny_checkpoint(d: Path, rng: np.random.Generator, arch: str = "LlamaForCausalLM", n_embd: int = 64,
                    n_ff: int = 128, n_head: int = 4, n_kv: int = 2, n_layer: int = 2, dtype=np.float32,
                    shards: int = 1, extra_cfg: dict | None = None, pre: str = "smollm") -> Path:
    """A random decoder in transformers' layout (llama / qwen2 / qwen3 naming)."""
    d.mkdir(parents=True, exist_ok=True)
    tok = tiny_tokenizer(pre)
    n_vocab = len(tok["model"]["vocab"])
    head_dim = n_embd // n_head
    w: dict[str, np.ndarray] = {"model.embed_tokens.weight": rng.standard_normal((n_vocab, n_embd)),
                                "model.norm.weight": 1 + 0.1 * rng.standard_normal(n_embd),
                                "lm_head.weight": rng.standard_normal((n_vocab, n_embd))}
    for i in range(n_layer):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(n_embd)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(n_embd)
        w[p + "self_attn.q_proj.weight"] = rng.standard_normal((n_head * head_dim, n_embd))
        w[p + "self_attn.k_proj.weight"] = rng.standard_normal((n_kv * head_dim, n_embd))
        w[p + "self_attn.v_proj.weight"] = rng.standard_normal((n_kv * head_dim, n_embd))
        w[p + "self_attn.o_proj.weight"] = rng.standard_normal((n_embd, n_head * head_dim))
        w[p + "mlp.gate_proj.weight"] = rng.standard_normal((n_ff, n_embd))
        w[p + "mlp.up_proj.weight"] = rng.standard_normal((n_ff, n_embd))
        w[p + "mlp.down_proj.weight"] = rng.standard_normal((n_embd, n_ff))
        if arch.startswith("Qwen2"):
            for n in "qkv":
                rows = (n_head if n == "q" else n_kv) * head_dim
                w[p + f"self_attn.{n}_proj.bias"] = rng.standard_normal(rows)
        if arch.startswith("Qwen3"):
            w[p + "self_attn.q_norm.weight"] = 1 + 0.1 * rng.standard_normal(head_dim)
            w[p + "self_attn.k_norm.weight"] = 1 + 0.1 * rng.standard_normal(head_dim)
    bf16 = frozenset()
    if dtype == "bf16":
        bf16 = frozenset(w)
        w = {k: (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16) for k, v in w.items()}
    else:
        w = {k: v.astype(dtype) for k, v in w.items()}
    names = list(w)
    if shards == 1:
        save_file(d / "model.safetensors", w, {"format": "pt"}, bf16=bf16)
    else:
        weight_map = {}
        for s in range(shards):
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {k: w[k] for k in names[s::shards]}
            save_file(d / fname, part, {"format": "pt"}, bf16=bf16 & set(part))
            weight_map.update({k: fname for k in part})
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    cfg = {"architectures": [arch], "hidden_size": n_embd, "intermediate_size": n_ff, "num_attention_heads": n_head,
           "num_key_value_heads": n_kv, "num_hidden_layers": n_layer, "vocab_size": n_vocab, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "max_position_embeddings": 256, "tie_word_embeddings": False, **(extra_cfg or {})}
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "tokenizer.json").write_text(json.dumps(tok))
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|im_start|>", "eos_token": "<|endoftext|>"}))
    return d


def _convert(*args) -> int:
    return main(["convert", *map(str, args)])


def _f32(st) -> np.ndarray:
    a = np.asarray(st.array())
    return (a.astype(np.uint32) << 16).view(np.float32) if st.dtype == "BF16" else a.astype(np.float32)


# -- safetensors -----------------------------------------------------------------------------------------
def test_safetensors_reader_agrees_with_the_reference_package(tmp_path, rng):
    st = pytest.importorskip("safetensors.numpy")
    ref = {"a": rng.standard_normal((3, 5)).astype(np.float32), "b": rng.standard_normal(7).astype(np.float16),
           "ids": np.arange(6, dtype=np.int64).reshape(2, 3)}
    st.save_file(ref, str(tmp_path / "ref.safetensors"), metadata={"format": "pt"})
    f = SafetensorsFile(tmp_path / "ref.safetensors")
    assert f.metadata == {"format": "pt"}
    for k, v in ref.items():
        assert np.array_equal(f.tensors[k].array(), v) and f.tensors[k].array().dtype == v.dtype
    save_file(tmp_path / "ours.safetensors", ref, {"format": "pt"})
    back = st.load_file(str(tmp_path / "ours.safetensors"))
    assert set(back) == set(ref) and all(np.array_equal(back[k], ref[k]) for k in ref)


def test_safetensors_bad_files_name_the_problem(tmp_path, rng):
    good = save_file(tmp_path / "m.safetensors", {"w": rng.standard_normal((4, 4)).astype(np.float32)})
    data = good.read_bytes()
    (tmp_path / "trunc.safetensors").write_bytes(data[:-10])
    with pytest.raises(GgufToolError, match="truncated"):
        SafetensorsFile(tmp_path / "trunc.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(GgufToolError, match="not a safetensors file"):
        SafetensorsFile(tmp_path / "junk.safetensors")
    (tmp_path / "tiny.safetensors").write_bytes(b"\x01")
    with pytest.raises(GgufToolError, match="too short"):
        SafetensorsFile(tmp_path / "tiny.safetensors")


def test_sharded_index_and_missing_shard(tmp_path, rng):
    d = tiny_checkpoint(tmp_path / "m", rng, shards=3)
    ck = Checkpoint(d)
    assert len(ck.files) == 3 and len(ck.tensors) == 3 + 2 * 9
    (d / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(GgufToolError, match="model-00002-of-00003.safetensors"):
        Checkpoint(d)


# -- architecture rules ----------------------------------------------------------------------------------
def test_permutation_is_llamacpp_interleaving():
    # one head of dim 4: HF keeps rotary pairs as (first half, second half) rows; llama.cpp interleaves them
    w = np.arange(8, dtype=np.float32).reshape(4, 2)
    assert np.array_equal(archs.permute(w, 1), w[[0, 2, 1, 3]])
    x = np.random.default_rng(0).standard_normal((3 * 8, 5))
    assert np.array_equal(unpermute(archs.permute(x, 3), 3), x)
    assert not np.array_equal(archs.permute(x, 3), x)


def test_unsupported_architecture_is_named(tmp_path, rng):
    d = tiny_checkpoint(tmp_path / "m", rng, arch="GPT2LMHeadModel")
    with pytest.raises(GgufToolError) as e:
        open_model(d)
    assert "GPT2LMHeadModel" in e.value.message and "LlamaForCausalLM" in e.value.hint and "BertModel" in e.value.hint
    out = tmp_path / "o.gguf"
    assert _convert(d, out) == 1 and not out.exists()


@pytest.mark.parametrize("arch,gguf_arch,pre", [("LlamaForCausalLM", "llama", "smollm"),
                                                ("Qwen2ForCausalLM", "qwen2", "qwen2"),
                                                ("Qwen3ForCausalLM", "qwen3", "qwen2"),
                                                ("MistralForCausalLM", "llama", "llama-bpe")])
def test_decoder_families_f32_values_and_names(tmp_path, rng, arch, gguf_arch, pre):
    d = tiny_checkpoint(tmp_path / "m", rng, arch=arch, pre=pre, shards=2)
    out = tmp_path / "o.gguf"
    assert _convert(d, out, "--outtype", "f32") == 0
    f = GGUFFile(out)
    ck = Checkpoint(d)
    assert f.architecture == gguf_arch and f.get("tokenizer.ggml.pre") == pre
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[gguf_arch.upper()], 2)
    assert len(f.tensors) == len(ck.tensors)
    for st in ck:
        gname = names.get_name(st.name, try_suffixes=(".weight", ".bias"))
        x = _f32(st)
        if arch in ("LlamaForCausalLM", "MistralForCausalLM") and (".q_proj." in st.name or ".k_proj." in st.name):
            x = archs.permute(x, 4 if ".q_proj." in st.name else 2)
        assert np.array_equal(f.tensor(gname).data, x), st.name
    p = gguf_arch + "."
    assert (f.get(p + "block_count"), f.get(p + "embedding_length"), f.get(p + "attention.head_count_kv")) == (2, 64, 2)
    assert f.get(p + "attention.layer_norm_rms_epsilon") == pytest.approx(1e-5)
    if arch.startswith("Qwen3"):
        assert "blk.1.attn_k_norm.weight" in f
    if arch.startswith("Qwen2"):
        assert f.tensor("blk.0.attn_q.bias").type.name == "F32"
    assert f.get("tokenizer.ggml.bos_token_id") == 1 and f.get("tokenizer.ggml.eos_token_id") == 0
    assert f.get("tokenizer.ggml.token_type")[:3] == [3, 3, 1]  # specials are CONTROL
    assert len(f.get("tokenizer.ggml.merges")) == 40


def test_bf16_checkpoint_to_f16_and_q8_0_match_gguf_quants(tmp_path, rng):
    d = tiny_checkpoint(tmp_path / "m", rng, dtype="bf16")
    ck = Checkpoint(d)
    for outtype, qt in (("f16", GGMLQuantizationType.F16), ("q8_0", GGMLQuantizationType.Q8_0), ("bf16", None)):
        out = tmp_path / f"o-{outtype}.gguf"
        assert _convert(d, out, "--outtype", outtype) == 0
        f = GGUFFile(out)
        w = ck["model.layers.1.mlp.up_proj.weight"]
        t = f.tensor("blk.1.ffn_up.weight")
        if qt is None:  # bf16 in, bf16 out: the bits are copied
            assert t.type.name == "BF16" and np.array_equal(t.raw_rows().view(np.uint16), w.array())
        else:
            ref = quants.dequantize(w.array().view(np.uint8), GGMLQuantizationType.BF16)  # gguf's own bf16 decode
            assert np.array_equal(t.raw_rows(), quants.quantize(ref, qt).view(np.uint8).reshape(t.n_rows, -1))
        assert f.tensor("blk.0.attn_norm.weight").type.name == "F32"  # norms are F32, as llama.cpp keeps them


def test_llama3_rope_scaling_adds_rope_freqs(tmp_path, rng):
    rs = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
    d = tiny_checkpoint(tmp_path / "m", rng, extra_cfg={"rope_scaling": rs, "rope_theta": 500000.0}, pre="llama-bpe")
    out = tmp_path / "o.gguf"
    assert _convert(d, out, "--outtype", "f32") == 0
    freqs = GGUFFile(out).tensor("rope_freqs.weight").data
    assert freqs.shape == (8,) and freqs[0] == 1.0 and freqs[-1] == 8.0  # high frequencies kept, low ones scaled


def test_unknown_pre_tokenizer_asks_for_a_name(tmp_path, rng):
    d = tiny_checkpoint(tmp_path / "m", rng)
    tok = json.loads((d / "tokenizer.json").read_text())
    tok["pre_tokenizer"] = {"type": "Whitespace"}
    (d / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(GgufToolError) as e:
        open_model(d).metadata_writer()
    assert "pre-tokenizer" in e.value.message and "--tokenizer-pre" in e.value.hint
    out = tmp_path / "o.gguf"
    assert _convert(d, out, "--tokenizer-pre", "gpt-2") == 0
    assert GGUFFile(out).get("tokenizer.ggml.pre") == "gpt-2"


def test_non_float_weight_is_refused(tmp_path, rng):
    d = tmp_path / "m"
    tiny_checkpoint(d, rng)
    w = {k: np.array(v.array()) for k, v in Checkpoint(d).tensors.items()}  # copies: the file is rewritten
    w["model.layers.0.mlp.up_proj.weight"] = w["model.layers.0.mlp.up_proj.weight"].astype(np.int32)
    save_file(d / "model.safetensors", w)
    with pytest.raises(GgufToolError, match="up_proj.weight.*I32"):
        open_model(d)


# -- real data -------------------------------------------------------------------------------------------
def _reference_load(path: Path) -> dict[str, np.ndarray]:
    """safetensors read straight from the format description (not through gguftool's reader)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    dt = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
    return {k: np.frombuffer(raw, dt[v["dtype"]], count=int(np.prod(v["shape"])), offset=8 + n + v["data_offsets"][0])
            .reshape(v["shape"]) for k, v in header.items()}


def test_minilm_real_checkpoint_f32_f16_q8_0(tmp_path, minilm_dir):
    ref = _reference_load(minilm_dir / "model.safetensors")
    cfg = json.loads((minilm_dir / "config.json").read_text())
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, cfg["num_hidden_layers"])
    outs = {}
    for outtype in ("f32", "f16", "q8_0"):
        outs[outtype] = tmp_path / f"minilm-{outtype}.gguf"
        assert _convert(minilm_dir, outs[outtype], "--outtype", outtype) == 0
    files = {k: GGUFFile(v) for k, v in outs.items()}
    checked = 0
    for hf, x in ref.items():
        g = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        if g is None:
            assert hf in ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
            continue
        assert np.array_equal(files["f32"].tensor(g).data, x)
        big = x.ndim == 2 and g not in ("position_embd.weight", "token_types.weight")
        t16, t8 = files["f16"].tensor(g), files["q8_0"].tensor(g)
        if big:
            assert t16.type.name == "F16" and np.array_equal(t16.data, x.astype(np.float16))
            assert t8.type.name == "Q8_0"
            assert np.array_equal(t8.raw_rows(), quants.quantize(x, GGMLQuantizationType.Q8_0).reshape(t8.n_rows, -1))
        else:
            assert t16.type.name == t8.type.name == "F32" and np.array_equal(t16.data, x)
        checked += 1
    assert checked == 101
    f = files["f32"]
    assert f.architecture == "bert" and f.get("bert.attention.causal") is False
    assert f.get("bert.pooling_type") == int(gguf.PoolingType.MEAN)  # from 1_Pooling/config.json
    assert (f.get("bert.block_count"), f.get("bert.embedding_length"), f.get("bert.feed_forward_length")) == (6, 384, 1536)
    assert f.get("bert.attention.layer_norm_epsilon") == pytest.approx(1e-12)
    tokens = f.get("tokenizer.ggml.tokens")
    vocab = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert len(tokens) == cfg["vocab_size"] == 30522
    for word in ("hello", "##ing", "[CLS]", "the"):
        i = vocab.index(word)
        assert tokens[i] == (word if word.startswith("[") else word[2:] if word.startswith("##") else "\u2581" + word)
    assert f.get("tokenizer.ggml.model") == "bert" and f.get("tokenizer.ggml.token_type_count") == 2
    assert (f.get("tokenizer.ggml.cls_token_id", 101), f.get("tokenizer.ggml.seperator_token_id")) == (101, 102)


@pytest.fixture(scope="session")
def smol_hf(tmp_path_factory, smollm2) -> Path:
    """SmolLM2 rebuilt in transformers' layout, first 2 of 30 blocks (full model: the native tests)."""
    return export_llama(smollm2, tmp_path_factory.mktemp("smol") / "hf", n_layers=2)


def test_smollm2_round_trip_f32_is_exact_and_tokenizer_matches(tmp_path, smollm2, smol_hf):
    out = tmp_path / "smol-f32.gguf"
    assert _convert(smol_hf, out, "--outtype", "f32") == 0
    src, dst = GGUFFile(smollm2), GGUFFile(out)
    assert len(dst.tensors) == 2 + 2 * 9  # tied output: no output.weight
    for t in dst.tensors:
        s = src.tensor(t.name)
        assert np.array_equal(t.data, codec(s.type.name).dequantize(s.raw_rows()).reshape(s.shape)), t.name
    # tokenizer and hyperparameters: what llama.cpp's own converter wrote into the source file
    for key in src.fields:
        if key.startswith(("tokenizer.", "llama.")) and key != "llama.block_count":
            assert dst.get(key) == src.get(key), key


@pytest.mark.slow
def test_smollm2_round_trip_to_q4_1_reproduces_the_source_bytes(tmp_path, smollm2, smol_hf):
    # the source weights sit on a Q4_1 grid (token_embd on Q8_0): requantizing their exact float values with
    # llama.cpp's reference quantizers must give the very same blocks back
    out = tmp_path / "smol-q4_1.gguf"
    assert _convert(smol_hf, out, "--outtype", "Q4_1", "--threads", "2") == 0
    src, dst = GGUFFile(smollm2), GGUFFile(out)
    for t in dst.tensors:
        s = src.tensor(t.name)
        assert t.type == s.type and np.array_equal(t.raw_rows(), s.raw_rows()), t.name
    assert dst.get("general.file_type") == src.get("general.file_type") == 3


def test_convert_dry_run_and_q4_hqq_plan(tmp_path, smol_hf, capsys):
    pytest.importorskip("gguftool._fast._hqq")
    assert _convert(smol_hf, tmp_path / "x.gguf", "--outtype", "Q4_HQQ", "--dry-run", "--format", "json") == 0
    plan = json.loads(capsys.readouterr().out)
    to = {r["name"]: r["to"] for r in plan["tensors"]}
    assert to["blk.0.attn_q.weight"] == "Q4_HQQ" and to["token_embd.weight"] == "Q8_0" and to["output_norm.weight"] == "F32"
    assert not (tmp_path / "x.gguf").exists()


def test_sentencepiece_style_tokenizer_json_becomes_llama_vocab(tmp_path, rng):
    # Mistral v0.1-v0.3 / Llama 2 ship SentencePiece BPE as tokenizer.json with byte_fallback
    d = tiny_checkpoint(tmp_path / "m", rng, arch="MistralForCausalLM")
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials + [f"<0x{b:02X}>" for b in range(256)] + ["▁t", "he", "▁the", "▁a"])}
    tok = {"version": "1.0", "normalizer": {"type": "Sequence", "normalizers": [
               {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
           "pre_tokenizer": None, "decoder": {"type": "Sequence", "decoders": []},
           "added_tokens": [{"id": i, "content": t, "special": True, "normalized": False} for i, t in enumerate(specials)],
           "model": {"type": "BPE", "byte_fallback": True, "unk_token": "<unk>", "vocab": vocab,
                     "merges": ["▁ t", "h e", "▁t he", "▁ a"]}}
    (d / "tokenizer.json").write_text(json.dumps(tok))
    cfg = json.loads((d / "config.json").read_text())
    cfg["vocab_size"] = len(vocab) + 2  # padded embedding rows, as many checkpoints have
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    w = {k: np.array(v.array()) for k, v in Checkpoint(d).tensors.items()}
    for k in ("model.embed_tokens.weight", "lm_head.weight"):
        w[k] = rng.standard_normal((len(vocab) + 2, 64)).astype(np.float32)
    save_file(d / "model.safetensors", w)
    out = tmp_path / "o.gguf"
    assert _convert(d, out, "--outtype", "f32") == 0
    f = GGUFFile(out)
    T = gguf.TokenType
    assert f.get("tokenizer.ggml.model") == "llama"
    types, scores, tokens = f.get("tokenizer.ggml.token_type"), f.get("tokenizer.ggml.scores"), f.get("tokenizer.ggml.tokens")
    assert types[:3] == [T.CONTROL] * 3 and types[3:259] == [T.BYTE] * 256 and types[259] == T.NORMAL
    assert types[-2:] == [T.UNUSED] * 2 and tokens[-1] == f"[PAD{len(vocab) + 1}]"
    assert scores[259] > scores[260] > scores[261]  # earlier pieces merge first, as in SentencePiece
    assert (f.get("tokenizer.ggml.bos_token_id"), f.get("tokenizer.ggml.eos_token_id")) == (1, 2)


def test_both_input_kinds_are_model_sources(tmp_path, rng):
    """The pipeline's declared protocol: a converted checkpoint and a GGUF file both satisfy it."""
    from gguftool.pipeline.source import ModelSource, TensorSource

    from .conftest import tiny_llama
    model = open_model(tiny_checkpoint(tmp_path / "m", rng))
    gguf_file = GGUFFile(tiny_llama(tmp_path / "t.gguf", rng))
    for src in (model, gguf_file):
        assert isinstance(src, ModelSource), type(src)
        assert all(isinstance(t, TensorSource) for t in src.tensors)
    assert not isinstance(object(), ModelSource)
