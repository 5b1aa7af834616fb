"""A Hugging Face checkpoint directory seen as a model source for the quantize pipeline.

`HFModel` is a `pipeline.source.ModelSource`, like a GGUF file: its `write_metadata(writer)` writes
the architecture's hyperparameters and the tokenizer instead of copying a GGUF header. Tensors are read
lazily from the memory-mapped safetensors, one at a time: a tensor's bytes (permuted, if the family
needs it) exist only while it is being written.
"""
from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGUFValueType

from ..errors import GgufToolError
from ..io.reader import RowShape
from ..io.safetensors import FLOAT_DTYPES, Checkpoint, STensor
from ..types import TensorType, stock
from . import archs, vocab

F32, F16, BF16 = (stock(n) for n in ("F32", "F16", "BF16"))
_BY_DTYPE = {"F32": F32, "F16": F16, "BF16": BF16}
# GGUF tensors convert_hf_to_gguf.py always stores as F32 (besides 1-D tensors, norms and biases)
F32_NAMES = ("position_embd.weight", "token_types.weight")


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


@dataclass
class ConvertedTensor(RowShape):
    """One GGUF tensor made from checkpoint data (a pipeline.source.TensorSource)."""
    name: str
    shape: tuple[int, ...]
    type: TensorType
    load: Callable[[], np.ndarray]           # -> array in `type`'s numpy dtype, `shape`
    source: str = ""                        # HF name, for messages
    st: STensor | None = None               # where the bytes come from (None: generated)
    _cache: np.ndarray | None = field(default=None, repr=False)

    @property
    def n_bytes(self) -> int:
        return self.n_elements * self.type.type_size // self.type.block_size

    def raw_rows(self) -> np.ndarray:
        """uint8 [rows, row_bytes]; computed once and kept until `release()` (the pipeline reads it in chunks)."""
        if self._cache is None:
            a = np.ascontiguousarray(self.load())
            if a.shape != self.shape or a.nbytes != self.n_bytes:
                raise GgufToolError(f"internal error: tensor {self.name!r} loaded as {a.dtype}{a.shape}, declared {self.shape}")
            self._cache = a.view(np.uint8).reshape(self.n_rows, -1)
        return self._cache

    def release(self) -> None:
        self._cache = None
        if self.st is not None:
            self.st.release()


class HFModel:
    """config.json + tokenizer.json + safetensors of one model directory, converted lazily."""

    def __init__(self, model_dir: str | Path, *, tokenizer_pre: str | None = None, name: str | None = None,
                 extra_metadata: dict[str, str] | None = None):
        self.path = Path(model_dir)
        if not self.path.is_dir():
            raise GgufToolError(f"{self.path}: not a directory", hint="give the folder holding config.json and *.safetensors")
        self.config = archs.load_config(self.path)
        self.arch, self.hf_arch = archs.detect(self.config, self.path)
        self.architecture = self.arch.gguf_name
        self.tokenizer_pre = tokenizer_pre
        self.model_name = name
        self.extra_metadata = dict(extra_metadata or {})
        self.checkpoint = Checkpoint(self.path)
        self.tensors: list[ConvertedTensor] = self._map_tensors()
        self._by_name = {t.name: t for t in self.tensors}
        self._check_vocab_size()
        # every input file is read (and checked) here, before planning: a bad one is one error, nothing half-planned
        self._tokenizer = vocab.load_checked(self.path, self.config["vocab_size"])
        if self.arch.name in archs.POOLED:
            archs.pooling_type(self.path)
        self._card = self._read_card()
        self.fields: dict[str, Any] = {}  # no GGUF header to carry over

    # -- tensors ---------------------------------------------------------------
    def _map_tensors(self) -> list[ConvertedTensor]:
        cfg, arch = self.config, self.arch
        n_blocks = archs.block_count(cfg)
        names = gguf.get_tensor_name_map(arch.gguf_arch, n_blocks)
        prefix = "model." if self.hf_arch in ("LlamaModel", "Qwen2Model", "Qwen3Model") else ""
        out: list[ConvertedTensor] = []
        unmapped: list[str] = []
        extra = archs.rope_freqs(cfg)
        if extra is not None:
            out.append(ConvertedTensor("rope_freqs.weight", extra.shape, F32, lambda e=extra: e, "(rope scaling)"))
        for st in self.checkpoint:
            hf = archs.hf_name(arch, st.name)
            if hf is None:
                continue
            hf = prefix + hf
            gname = names.get_name(hf, try_suffixes=(".weight", ".bias"))
            if gname is None:
                unmapped.append(st.name)
                continue
            if st.dtype not in FLOAT_DTYPES:
                raise GgufToolError(f"{st.file.path}: tensor {st.name!r} has dtype {st.dtype}; gguftool converts "
                                    f"{', '.join(FLOAT_DTYPES)} weights", hint="dequantize the checkpoint first")
            out.append(self._tensor(gname, st, archs.transform_for(arch, cfg, hf, st.shape)))
        if unmapped:
            raise GgufToolError(f"{self.path}: {len(unmapped)} tensor(s) have no {arch.gguf_name} name in gguf's tables: "
                                f"{', '.join(unmapped[:5])}{' ...' if len(unmapped) > 5 else ''}",
                                hint="an unusual variant of this architecture; llama.cpp would not load it either")
        seen: set[str] = set()
        for t in out:
            if t.name in seen:
                raise GgufToolError(f"{self.path}: two checkpoint tensors map to {t.name!r}")
            seen.add(t.name)
        if not out:
            raise GgufToolError(f"{self.path}: no weights to convert")
        return out

    def _read_card(self) -> gguf.Metadata:
        """gguf's model metadata (general.*) from README.md's YAML front matter and config.json, read once, here:
        a card gguf cannot read (not YAML, not UTF-8, values of the wrong type) is an error naming it."""
        try:
            import yaml
            errors: tuple[type[BaseException], ...] = (yaml.YAMLError,)
        except ImportError:
            errors = ()
        try:
            meta = gguf.Metadata.load(None, self.path, self.model_name, self.n_params)
            if meta.name is None:
                meta.name = self.path.name
            if meta.size_label is None and self.n_params > 0:
                meta.size_label = gguf.size_label(self.n_params, 0, 0, 0)
            meta.set_gguf_meta_model(gguf.GGUFWriter(None, self.architecture))   # its values must write, too
        except (*errors, TypeError, ValueError, AttributeError, KeyError, IndexError, UnicodeDecodeError,
                RecursionError, struct.error) as e:
            raise GgufToolError(f"{self.path}: gguf cannot read the model card metadata (README.md, config.json, "
                                f"generation_config.json) "
                                f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})",
                                hint="fix README.md's YAML front matter (between the --- lines) or remove it") from None
        return meta

    def _check_vocab_size(self) -> None:
        """The vocabulary is as large as the token embedding (llama.cpp loads nothing else): config.json's
        vocab_size must agree, and without one the embedding gives it. Token lists are built to this size,
        so what a config or tokenizer.json claims cannot make them larger than the real weights."""
        emb = self._by_name.get("token_embd.weight")
        if emb is None or len(emb.shape) != 2:
            raise GgufToolError(f"{self.path}: no token embedding (2-D) among the checkpoint's weights",
                                hint="llama.cpp needs token_embd.weight; is the checkpoint complete?")
        rows, claimed = emb.shape[0], self.config.get("vocab_size")
        if claimed is not None and claimed != rows:
            raise GgufToolError(f"{self.path / 'config.json'}: `vocab_size` is {claimed}, but the embedding {emb.source} "
                                f"has {rows} rows", hint="config.json does not belong to these weights")
        self.config["vocab_size"] = rows
        hidden = archs.find(self.config, archs.HIDDEN_KEYS)
        if hidden != emb.shape[1]:   # llama.cpp checks every tensor's shape against these numbers when it loads
            raise GgufToolError(f"{self.path / 'config.json'}: `hidden_size` is {hidden}, but the embedding {emb.source} "
                                f"has {emb.shape[1]} columns", hint="config.json does not belong to these weights")
        n_head = archs.find(self.config, archs.HEAD_KEYS)
        n_kv = archs.find(self.config, ("num_key_value_heads", "n_kv_heads")) or n_head
        head_dim = self.config.get("head_dim") or hidden // n_head
        for t in self.tensors:
            want = {"attn_q.weight": n_head * head_dim, "attn_k.weight": n_kv * head_dim,
                    "attn_v.weight": n_kv * head_dim}.get(t.name.split(".", 2)[-1]) if t.name.startswith("blk.") else None
            if want is not None and t.shape[0] != want:
                raise GgufToolError(f"{self.path}: {t.source} has {t.shape[0]} rows, but config.json's heads give "
                                    f"{want} (num_attention_heads {n_head}, num_key_value_heads {n_kv}, head size "
                                    f"{head_dim})", hint="config.json does not belong to these weights")

    def _tensor(self, gname: str, st: STensor, transform: archs.Transform | None) -> ConvertedTensor:
        shape = st.shape if st.shape else (1,)
        if len(shape) > 4 or 0 in shape:   # what GGUF (GGML_MAX_DIMS) and llama.cpp hold; an empty one has no rows
            raise GgufToolError(f"{st.file.path}: tensor {st.name!r} has shape {list(st.shape)}; a GGUF tensor has "
                                "1 to 4 dimensions, none of them 0")
        # 1-D tensors, norms, biases and embeddings of positions / token types are F32 in llama.cpp's files
        force_f32 = len(shape) == 1 or gname.endswith("_norm.weight") or not gname.endswith(".weight") or gname in F32_NAMES
        ttype = F32 if force_f32 else _BY_DTYPE[st.dtype]

        def load() -> np.ndarray:
            a = st.array().reshape(shape)
            if transform is not None:
                a = transform(a)
            if ttype is F32 and st.dtype != "F32":
                a = _bf16_to_f32(a) if st.dtype == "BF16" else a.astype(np.float32)
            return a
        return ConvertedTensor(gname, shape, ttype, load, st.name, st)

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def tensor(self, name: str) -> ConvertedTensor:
        try:
            return self._by_name[name]
        except KeyError:
            raise GgufToolError(f"{self.path}: no tensor {name!r} after conversion") from None

    def release(self, t: ConvertedTensor) -> None:
        t.release()

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    # -- metadata --------------------------------------------------------------
    def metadata_writer(self) -> gguf.GGUFWriter:
        """All key/values of the converted file in a gguf.GGUFWriter used only as a collector (never written):
        gguf's metadata and vocabulary helpers write into it."""
        g = gguf.GGUFWriter(None, self.architecture)
        g.add_type(gguf.GGUFType.MODEL)
        self._card.set_gguf_meta_model(g)
        archs.write_hparams(self.arch, self.config, g, self.path)
        self.tokenizer_pre = vocab.write_vocab(self.arch.vocab, self.arch.name, self.path, self.config, g, self.tokenizer_pre,
                                              self._tokenizer)
        g.add_quantization_version(gguf.GGML_QUANT_VERSION)
        return g

    def write_metadata(self, w) -> None:
        """Into a StreamingWriter: everything `metadata_writer` collected, plus the conversion record."""
        for key, v in self.metadata_writer().kv_data[0].items():
            w.add(key, v.value, v.type, v.sub_type)
        for k, v in {"convert.source": self.hf_arch, **self.extra_metadata}.items():
            w.add(f"gguftool.{k}", v, GGUFValueType.STRING)


def open_model(model_dir: str | Path, **kw) -> HFModel:
    return HFModel(model_dir, **kw)
