"""Architectures gguftool converts: Hugging Face class name -> llama.cpp architecture, hyperparameters,
tensor-name rules and weight transforms.

Names are mapped with gguf's own tables (`gguf.get_tensor_name_map`), the same ones llama.cpp's
convert_hf_to_gguf.py uses; hyperparameter keys and the per-family tweaks below follow that script
(conversion/base.py TextModel.set_gguf_parameters, llama.py, qwen.py, bert.py of the pinned llama.cpp).
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from ..errors import GgufToolError
from ..io.confine import inside

Transform = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Arch:
    name: str                                   # our label (docs, errors)
    hf_names: tuple[str, ...]                   # config.json "architectures" values
    gguf_arch: gguf.MODEL_ARCH
    vocab: str                                  # "bpe-or-spm" (decoders) or "wpm" (BERT)
    permute_qk: bool = False                    # llama family: rotary halves -> interleaved (llama.cpp's layout)
    strip_prefixes: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()                  # HF tensors that llama.cpp does not use
    examples: tuple[str, ...] = field(default=())

    @property
    def gguf_name(self) -> str:
        return gguf.MODEL_ARCH_NAMES[self.gguf_arch]


ARCHS = (
    Arch("llama", ("LlamaForCausalLM", "LLaMAForCausalLM", "MistralForCausalLM", "LlamaModel"), gguf.MODEL_ARCH.LLAMA,
         "bpe-or-spm", permute_qk=True, examples=("HuggingFaceTB/SmolLM2-135M-Instruct", "mistralai/Mistral-7B-v0.3")),
    Arch("qwen2", ("Qwen2ForCausalLM", "Qwen2Model"), gguf.MODEL_ARCH.QWEN2, "bpe-or-spm",
         examples=("Qwen/Qwen2.5-0.5B-Instruct",)),
    Arch("qwen3", ("Qwen3ForCausalLM", "Qwen3Model"), gguf.MODEL_ARCH.QWEN3, "bpe-or-spm",
         examples=("Qwen/Qwen3-0.6B",)),
    Arch("bert", ("BertModel", "BertForMaskedLM"), gguf.MODEL_ARCH.BERT, "wpm", strip_prefixes=("bert.",),
         skip=("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias", "cls.predictions", "cls.seq_relationship"),
         examples=("sentence-transformers/all-MiniLM-L6-v2", "BAAI/bge-small-en-v1.5")),
)
BY_HF_NAME = {n: a for a in ARCHS for n in a.hf_names}
SUPPORTED = tuple(n for a in ARCHS for n in a.hf_names)
# never weights (buffers some checkpoints carry)
IGNORED_SUFFIXES = (".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")


MAX_LAYERS = 512          # llama.cpp's LLAMA_MAX_LAYERS: it refuses models with more blocks
U32 = 2**32 - 1           # hyperparameters are written as uint32
# config.json keys gguftool reads: integer keys with their range, numbers that must be positive and finite.
# Bounds keep what a config claims from driving work or memory (layers, heads and widths far beyond any model).
CONFIG_INTEGERS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("num_hidden_layers", "n_layers", "n_layer", "num_layers"), (1, MAX_LAYERS)),
    **dict.fromkeys(("max_position_embeddings", "n_ctx", "n_positions", "max_length"), (0, U32)),
    **dict.fromkeys(("hidden_size", "n_embd", "dim"), (1, 2**20)),
    **dict.fromkeys(("intermediate_size", "n_inner", "hidden_dim"), (1, U32)),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_key_value_heads", "n_kv_heads"), (1, 2**16)),
    "head_dim": (1, 2**16), "vocab_size": (1, 2**31 - 1), "type_vocab_size": (1, 2**16),
}
CONFIG_NUMBERS = ("rms_norm_eps", "norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon", "rope_theta",
                  "rotary_emb_base")
ROPE_NUMBERS = ("factor", "rope_theta", "low_freq_factor", "high_freq_factor")


def shown(v: Any) -> str:
    return f"the string {v!r}" if isinstance(v, str) else repr(v)


def checked_int(v: Any, where: str, key: str, lo: int, hi: int | None = None) -> int:
    """An integer of a JSON file (an integral float like 4.0 is taken as 4), in [lo, hi]."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool):
        raise GgufToolError(f"{where}: `{key}` must be an integer, not {shown(v)}")
    if v < lo or (hi is not None and v > hi):
        raise GgufToolError(f"{where}: `{key}` = {v}: must be " + (f"{lo} to {hi}" if hi is not None else f"at least {lo}"))
    return v


def checked_number(v: Any, where: str, key: str) -> float:
    """A finite number above 0 (epsilons, rope bases and factors)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise GgufToolError(f"{where}: `{key}` must be a number, not {shown(v)}")
    if not math.isfinite(v) or v <= 0:
        raise GgufToolError(f"{where}: `{key}` = {v}: must be above 0 and finite")
    return v


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file that must hold an object: errors name the file."""
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GgufToolError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:
        raise GgufToolError(f"{path}: not valid JSON (nested too deeply)") from None
    if not isinstance(d, dict):
        raise GgufToolError(f"{path}: not a JSON object")
    return d


def load_config(model_dir: Path) -> dict[str, Any]:
    """config.json with every value gguftool reads checked (type and range), once, here."""
    path = model_dir / "config.json"
    if not path.is_file():
        raise GgufToolError(f"{model_dir}: no config.json (is this a Hugging Face model directory?)")
    cfg = read_json_object(path)
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers keep the LLM's settings here
        cfg = {**cfg, **cfg["text_config"]}
    names = cfg.get("architectures")
    if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise GgufToolError(f"{path}: `architectures` must be a list of class names, not {shown(names)}")
    for key, (lo, hi) in CONFIG_INTEGERS.items():
        if cfg.get(key) is not None:
            cfg[key] = checked_int(cfg[key], str(path), key, lo, hi)
    for key in CONFIG_NUMBERS:
        if cfg.get(key) is not None:
            checked_number(cfg[key], str(path), key)
    for key in ("rope_scaling", "rope_parameters"):
        if cfg.get(key) is not None and not isinstance(cfg[key], dict):
            raise GgufToolError(f"{path}: `{key}` must be an object, not {shown(cfg[key])}")
    rp, rkey = rope_params(cfg), "rope_parameters" if cfg.get("rope_parameters") else "rope_scaling"
    for key in ROPE_NUMBERS:
        if rp.get(key) is not None:
            checked_number(rp[key], str(path), f"{rkey}.{key}")
    if rp.get("original_max_position_embeddings") is not None:
        checked_int(rp["original_max_position_embeddings"], str(path), f"{rkey}.original_max_position_embeddings", 1, U32)
    elif rp.get("rope_type") == "yarn":
        raise GgufToolError(f"{path}: `{rkey}.original_max_position_embeddings` is missing (yarn scaling needs it)")
    for keys in (LAYER_KEYS, HIDDEN_KEYS, HEAD_KEYS):
        if find(cfg, keys) is None:
            raise GgufToolError(f"{path}: lacks `{keys[0]}`" + (f" (or {', '.join(keys[1:])})" if len(keys) > 1 else ""))
    n_head, n_kv, hidden = find(cfg, HEAD_KEYS), find(cfg, ("num_key_value_heads", "n_kv_heads")), find(cfg, HIDDEN_KEYS)
    if cfg.get("head_dim") is None and hidden % n_head:
        raise GgufToolError(f"{path}: hidden_size {hidden} is not a multiple of num_attention_heads {n_head}")
    if n_kv is not None and n_head % n_kv:
        raise GgufToolError(f"{path}: num_attention_heads {n_head} is not a multiple of num_key_value_heads {n_kv}")
    return cfg


def detect(cfg: dict[str, Any], where: Path) -> tuple[Arch, str]:
    names = cfg.get("architectures") or []
    if not isinstance(names, list) or not names:
        raise GgufToolError(f"{where}/config.json has no \"architectures\" entry",
                            hint=f"gguftool converts: {', '.join(SUPPORTED)}")
    for n in names:
        if n in BY_HF_NAME:
            return BY_HF_NAME[n], n
    raise GgufToolError(f"{where}: architecture {', '.join(map(str, names))} is not supported by gguftool convert",
                        hint=f"supported: {', '.join(SUPPORTED)}; for others use llama.cpp's convert_hf_to_gguf.py, "
                             "then `gguftool quantize`")


def find(cfg: dict[str, Any], keys: tuple[str, ...], required: bool = False) -> Any:
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    if required:
        raise GgufToolError(f"config.json lacks {' / '.join(keys)}")
    return None


LAYER_KEYS = ("num_hidden_layers", "n_layers", "n_layer", "num_layers")
HIDDEN_KEYS = ("hidden_size", "n_embd", "dim")
HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads")


def block_count(cfg: dict[str, Any]) -> int:
    return int(find(cfg, LAYER_KEYS, required=True))


def rope_params(cfg: dict[str, Any]) -> dict[str, Any]:
    rp = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    rp = dict(rp["full_attention"]) if isinstance(rp.get("full_attention"), dict) else rp
    theta = find(cfg, ("rope_theta", "rotary_emb_base"))
    if "rope_theta" not in rp and theta is not None:
        rp["rope_theta"] = theta
    if "rope_type" not in rp and "type" in rp:
        rp["rope_type"] = rp["type"]
    return rp


def write_hparams(arch: Arch, cfg: dict[str, Any], g: gguf.GGUFWriter, model_dir: Path) -> None:
    """Hyperparameters as convert_hf_to_gguf.py writes them for these families."""
    g.add_block_count(block_count(cfg))
    if (v := find(cfg, ("max_position_embeddings", "n_ctx", "n_positions", "max_length"))) is not None:
        g.add_context_length(int(v))
    if (v := find(cfg, ("hidden_size", "n_embd", "dim"))) is not None:
        g.add_embedding_length(int(v))
    if (v := find(cfg, ("intermediate_size", "n_inner", "hidden_dim"))) is not None:
        g.add_feed_forward_length(int(v))
    if (v := find(cfg, ("num_attention_heads", "n_head", "n_heads"))) is not None:
        g.add_head_count(int(v))
    if (v := find(cfg, ("num_key_value_heads", "n_kv_heads"))) is not None:
        g.add_head_count_kv(int(v))
    rp = rope_params(cfg)
    rtype, factor = rp.get("rope_type"), rp.get("factor")
    if rtype is not None and not isinstance(rtype, str):
        raise GgufToolError(f"{model_dir / 'config.json'}: `rope_scaling.rope_type` must be a string, not {shown(rtype)}")
    if rtype == "linear" and factor is not None:
        g.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        g.add_rope_scaling_factor(factor)
    elif rtype == "yarn" and factor is not None:
        g.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        g.add_rope_scaling_factor(factor)
        g.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
    elif rtype not in (None, "default", "llama3"):
        raise GgufToolError(f"{model_dir}: rope scaling {rtype!r} is not supported by gguftool convert",
                            hint="supported: linear, yarn, llama3")
    if arch.gguf_arch != gguf.MODEL_ARCH.BERT and (theta := rp.get("rope_theta")) is not None:
        g.add_rope_freq_base(theta)
    if (v := find(cfg, ("rms_norm_eps", "norm_eps"))) is not None:
        g.add_layer_norm_rms_eps(v)
    if (v := find(cfg, ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"))) is not None:
        g.add_layer_norm_eps(v)
    head_dim = cfg.get("head_dim")
    if head_dim is None and arch.name == "llama":
        # transformers' LlamaConfig default, which convert_hf_to_gguf.py sees
        head_dim = find(cfg, HIDDEN_KEYS) // find(cfg, HEAD_KEYS)
    if head_dim is not None:
        g.add_key_length(int(head_dim))
        g.add_value_length(int(head_dim))
    if arch.name == "llama":
        g.add_vocab_size(int(cfg["vocab_size"]))
        g.add_rope_dimension_count(int(cfg.get("head_dim") or find(cfg, HIDDEN_KEYS) // find(cfg, HEAD_KEYS)))
    if arch.name == "bert":
        g.add_causal_attention(False)
    if arch.name in POOLED:
        pooling = pooling_type(model_dir)
        if pooling is not None:
            g.add_pooling_type(pooling)


POOLED = ("bert", "qwen2", "qwen3")   # families whose sentence-transformers pooling llama.cpp applies


def pooling_type(model_dir: Path) -> gguf.PoolingType | None:
    """sentence-transformers' pooling module (modules.json -> */config.json), as llama.cpp reads it."""
    modules = model_dir / "modules.json"
    if not modules.is_file():
        return None
    try:
        mods = json.loads(modules.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise GgufToolError(f"{modules}: not valid JSON ({e})") from None
    if not isinstance(mods, list):
        raise GgufToolError(f"{modules}: must be a list of modules, not {type(mods).__name__}")
    for i, m in enumerate(mods):
        if not isinstance(m, dict):
            raise GgufToolError(f"{modules}: `[{i}]` must be an object with `type` and `path`, not {shown(m)}")
    path = next((m.get("path") for m in mods if str(m.get("type", "")).endswith("Pooling")), None)
    if path is None:
        return None
    pool_file = inside(model_dir, path, f"{modules}: pooling module") / "config.json"
    if not pool_file.is_file():
        raise GgufToolError(f"{modules}: the pooling module's {pool_file} is missing")
    pool = read_json_object(pool_file)
    if pool.get("pooling_mode_mean_tokens"):
        return gguf.PoolingType.MEAN
    if pool.get("pooling_mode_cls_token"):
        return gguf.PoolingType.CLS
    if pool.get("pooling_mode_lasttoken"):
        return gguf.PoolingType.LAST
    mode = {"mean": gguf.PoolingType.MEAN, "cls": gguf.PoolingType.CLS, "lasttoken": gguf.PoolingType.LAST}
    if isinstance(pool.get("pooling_mode"), str) and pool["pooling_mode"] in mode:
        return mode[pool["pooling_mode"]]
    raise GgufToolError(f"{model_dir / path}: only mean, cls and last-token pooling are supported")


def hf_name(arch: Arch, name: str) -> str | None:
    """The HF tensor name after the family's renames, or None for tensors llama.cpp does not use."""
    if name.endswith(IGNORED_SUFFIXES):
        return None
    for p in arch.strip_prefixes:
        if name.startswith(p):
            name = name[len(p):]
    if arch.gguf_arch == gguf.MODEL_ARCH.BERT:
        if name.endswith(".gamma"):
            name = name[:-6] + ".weight"
        elif name.endswith(".beta"):
            name = name[:-5] + ".bias"
    if any(name == s or name.startswith(s + ".") for s in arch.skip):
        return None
    if "language_model." in name:
        name = name.replace("language_model.", "")
    return name


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF's rotary layout (first half / second half of each head) -> llama.cpp's (interleaved pairs).
    The same reshuffle as convert_hf_to_gguf.py's LlamaModel.permute; works on weights and biases."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def transform_for(arch: Arch, cfg: dict[str, Any], name: str, shape: tuple[int, ...] = ()) -> Transform | None:
    """The weight transform of HF tensor `name` (shape: as stored; checked against the head count it needs)."""
    if not arch.permute_qk:
        return None
    n_head = int(find(cfg, ("num_attention_heads", "n_heads"), required=True))
    n_kv = int(find(cfg, ("num_key_value_heads", "n_kv_heads")) or n_head)
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        n, key = n_head, "num_attention_heads"
    elif name.endswith(("k_proj.weight", "k_proj.bias")):
        n, key = n_kv, "num_key_value_heads"
    else:
        return None
    if shape and (shape[0] % (2 * n)):
        raise GgufToolError(f"{name}: {shape[0]} rows do not split into {key}={n} heads of an even size, as the rotary "
                            "layout needs", hint="config.json does not match the weights")
    return lambda w: permute(w, n)


def rope_freqs(cfg: dict[str, Any]) -> np.ndarray | None:
    """Llama 3.x 'llama3' rope scaling: per-frequency factors stored as rope_freqs.weight (as llama.cpp expects)."""
    rp = rope_params(cfg)
    if str(rp.get("rope_type", "")).lower() != "llama3":
        return None
    base = rp.get("rope_theta", 10000.0)
    dim = cfg.get("head_dim") or find(cfg, HIDDEN_KEYS) // find(cfg, HEAD_KEYS)
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor = rp.get("factor", 8.0)
    lo, hi = rp.get("low_freq_factor", 1.0), rp.get("high_freq_factor", 4.0)
    old_ctx = rp.get("original_max_position_embeddings", 8192)
    lo_wavelen, hi_wavelen = old_ctx / lo, old_ctx / hi
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < hi_wavelen:
            out.append(1.0)
        elif wavelen > lo_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)
