"""Test fixtures that write Hugging Face checkpoints: a safetensors writer, and GGUF (llama family) ->
HF checkpoint directory, the reverse of `convert`.

Weights are de-quantized to float32 safetensors with q/k put back in HF's rotary layout, and a
byte-level BPE tokenizer.json is rebuilt from the GGUF vocabulary and merges. Tests use it to
make a real decoder checkpoint in HF layout from the SmolLM2 GGUF package (the hub hosts no
such files we can reach), so the converter can be checked against a file llama.cpp wrote.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from gguftool.convert.vocab import LLAMA3_RX, QWEN2_RX
from gguftool.errors import GgufToolError
from gguftool.io.reader import GGUFFile
from gguftool.quant import codec


def save_file(path: str | os.PathLike[str], tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None,
              bf16: frozenset[str] = frozenset()) -> Path:
    """Write a safetensors file (tests and the test hub build checkpoints with it). Names in `bf16` hold
    uint16 bf16 bits. Tensors are stored in the given order, 8-byte aligned as the reference writer does."""
    names = {np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<i8"): "I64", np.dtype("<i4"): "I32"}
    header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    arrays = []
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        dt = "BF16" if name in bf16 else names.get(a.dtype.newbyteorder("<"))
        if dt is None:
            raise ValueError(f"{name}: dtype {a.dtype} not supported by save_file")
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        arrays.append(a)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    path = Path(path)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for a in arrays:
            a.tofile(f)
    return path


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of gguftool.convert.archs.permute: llama.cpp layout -> HF layout."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# llama.cpp name -> transformers' LlamaForCausalLM name ({i}: block)
LLAMA_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}
PRE_TOKENIZERS = {
    "smollm": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
    "gpt-2": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    "llama-bpe": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_RX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
    "qwen2": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2_RX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
}
CONTROL = 3


def _hf_name(gname: str) -> str:
    parts = gname.split(".")
    if parts[0] == "blk":
        key = ".".join(["blk", "{i}", *parts[2:]])
        if key in LLAMA_NAMES:
            return LLAMA_NAMES[key].format(i=parts[1])
    elif gname in LLAMA_NAMES:
        return LLAMA_NAMES[gname]
    raise GgufToolError(f"export: no transformers name for tensor {gname!r}")


def export_llama(src: str | Path, out_dir: str | Path, n_layers: int | None = None) -> Path:
    """Write config.json, model.safetensors (float32), tokenizer.json and tokenizer_config.json.
    n_layers: keep only the first blocks (a smaller model for quick tests)."""
    f = GGUFFile(src)
    if f.architecture != "llama":
        raise GgufToolError(f"{src}: export handles the llama architecture, not {f.architecture}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    a = "llama."
    n_total = int(f.get(a + "block_count"))
    n = n_total if n_layers is None else min(n_layers, n_total)
    n_head, n_kv = int(f.get(a + "attention.head_count")), int(f.get(a + "attention.head_count_kv"))
    tokens = list(f.get("tokenizer.ggml.tokens"))
    tied = "output.weight" not in f
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": int(f.get(a + "embedding_length")), "intermediate_size": int(f.get(a + "feed_forward_length")),
        "num_attention_heads": n_head, "num_key_value_heads": n_kv, "num_hidden_layers": n,
        "max_position_embeddings": int(f.get(a + "context_length")), "vocab_size": len(tokens),
        "rms_norm_eps": float(f.get(a + "attention.layer_norm_rms_epsilon")),
        "rope_theta": float(f.get(a + "rope.freq_base", 10000.0)), "tie_word_embeddings": tied,
        "hidden_act": "silu", "torch_dtype": "float32",
        "bos_token_id": f.get("tokenizer.ggml.bos_token_id"), "eos_token_id": f.get("tokenizer.ggml.eos_token_id"),
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    weights: dict[str, np.ndarray] = {}
    for t in f.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n:
            continue
        x = np.asarray(codec(t.type.name).dequantize(t.raw_rows()), dtype=np.float32).reshape(t.shape)
        if t.name.endswith("attn_q.weight"):
            x = unpermute(x, n_head)
        elif t.name.endswith("attn_k.weight"):
            x = unpermute(x, n_kv)
        weights[_hf_name(t.name)] = x
    save_file(out / "model.safetensors", weights, {"format": "pt"})
    _write_tokenizer(f, out, tokens)
    return out


def _write_tokenizer(f: GGUFFile, out: Path, tokens: list[str]) -> None:
    if f.get("tokenizer.ggml.model") != "gpt2":
        raise GgufToolError("export: only byte-level BPE (gpt2) vocabularies can be rebuilt")
    pre = f.get("tokenizer.ggml.pre", "gpt-2")
    if pre not in PRE_TOKENIZERS:
        raise GgufToolError(f"export: no tokenizer.json pre-tokenizer for llama.cpp's {pre!r}")
    types = list(f.get("tokenizer.ggml.token_type"))
    merges = list(f.get("tokenizer.ggml.merges"))
    special = [i for i, ty in enumerate(types) if ty == CONTROL]
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i in special],
        "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[pre],
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges},
    }
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    tcfg: dict[str, object] = {"add_prefix_space": bool(f.get("tokenizer.ggml.add_space_prefix", False)),
                               "model_max_length": int(f.get("llama.context_length", 2048))}
    for kind in ("bos", "eos", "unknown", "padding"):
        i = f.get(f"tokenizer.ggml.{kind}_token_id")
        if i is not None:
            tcfg[{"unknown": "unk", "padding": "pad"}.get(kind, kind) + "_token"] = tokens[int(i)]
    if (tmpl := f.get("tokenizer.chat_template")) is not None:
        tcfg["chat_template"] = tmpl
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2, ensure_ascii=False))
