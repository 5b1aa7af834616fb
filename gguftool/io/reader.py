"""GGUF reader for every upstream type and ours, on top of gguf.GGUFReader.

gguf.GGUFReader parses the header and metadata well but turns every tensor type into its
GGMLQuantizationType enum, which refuses ids it does not know (ours, and upstream ids newer than
the installed package). We reuse its parsing and replace only the tensor step, so nothing is forked.
"""
from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFEndian, GGUFReader, GGUFValueType
from gguf.gguf_reader import ReaderField

from .. import types as registry
from ..errors import GgufToolError
from ..types import TensorType, tensor_type

_PLAIN_DTYPES = {
    GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


class RowShape:
    """Row geometry of anything with a numpy-order `shape`: the pipeline works row by row."""
    shape: tuple[int, ...]

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def n_per_row(self) -> int:
        return self.shape[-1]

    @property
    def n_rows(self) -> int:
        return self.n_elements // self.shape[-1]


@dataclass(frozen=True)
class Tensor(RowShape):
    name: str
    shape: tuple[int, ...]      # numpy order: (..., rows, n_per_row); GGUF's ne reversed
    type: TensorType
    offset: int                 # absolute file offset of the data
    n_bytes: int
    data: np.ndarray            # memory-mapped: typed for plain types, uint8 [.., rows, row_bytes] for blocks

    def raw_rows(self) -> np.ndarray:
        """The data as uint8 [rows, row_bytes]."""
        return self.data.view(np.uint8).reshape(self.n_rows, -1)


class _Reader(GGUFReader):
    """gguf.GGUFReader with two speed-ups and its own tensor step.

    gguf-py reads every metadata value through a np.memmap slice (each slice runs memmap's Python
    hooks) and builds one part per array element: 21 s of CPU for Gemma 3's 262k-token vocabulary.
    Here slices come from a plain ndarray view of the same map; an array of scalars is one part
    (which `ReaderField.contents()` reads the same way), and an array of strings is one `_Strings`
    part that keeps the file's bytes and decodes only when asked (`_field_value`). The file is
    parsed in the same order with the same checks; nested arrays keep gguf-py's own path."""

    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> np.ndarray:
        plain = self.__dict__.get("_plain")
        if plain is None or plain.base is not self.data:
            plain = self._plain = self.data.view(np.ndarray)
        dtype, count = np.dtype(dtype), int(count)
        arr = plain[offset:offset + dtype.itemsize * count].view(dtype)[:count]
        if len(arr) != count:   # gguf-py would go on with a short slice: a cut string, a missing dimension
            raise ValueError(f"{count} value(s) at byte {offset} run past the end of the file ({len(plain)} bytes)")
        order = self.byte_order if override_order is None else override_order
        return arr if order == "I" else arr.view(arr.dtype.newbyteorder(order))

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list[Any], list[int], list[GGUFValueType]]:
        if raw_type != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        if len(raw_itype) < 1 or len(alen) < 1:
            raise ValueError("array header runs past the end of the file")
        itype, n, offs = GGUFValueType(int(raw_itype[0])), int(alen[0]), orig_offs + 12
        types = [GGUFValueType.ARRAY] + ([itype] if n else [])   # gguf-py records no item type when empty
        nptype = self.gguf_scalar_to_np.get(itype)
        if nptype is not None:
            vals = self._get(offs, nptype, n)
            if len(vals) != n:
                raise ValueError(f"array of {n} values runs past the end of the file")
            return 12 + int(vals.nbytes), [raw_itype, alen, vals], [2] if n else [], types
        if itype != GGUFValueType.STRING or not n:
            return super()._get_field_parts(orig_offs, raw_type)
        mv, size = memoryview(self._plain), len(self._plain)
        u64 = struct.Struct("<Q" if self.endianess == GGUFEndian.LITTLE else ">Q").unpack_from
        starts: list[int] = []
        add = starts.append
        try:   # the hot loop of a big vocabulary: bounds are checked by unpack_from, and once at the end
            for _ in range(n):
                add(offs + 8)
                offs += 8 + u64(mv, offs)[0]
        except struct.error:
            raise ValueError("string array runs past the end of the file") from None
        if offs > size:
            raise ValueError("the last string of an array runs past the end of the file")
        base = orig_offs + 12
        at = np.array(starts, np.int64)
        lens = np.diff(at, append=offs + 8) - 8
        strings = _Strings(mv[base:offs], at - base, lens)
        return offs - orig_offs, [raw_itype, alen, strings], [2], types

    def _build_fields(self, offs: int, count: int) -> int:
        self.kv_end = super()._build_fields(offs, count)   # where the last key-value pair ends
        return self.kv_end

    def _build_tensors(self, start_offs: int, fields: list[ReaderField]) -> None:
        size = len(self.data)
        self.gt_tensors: list[Tensor] = []
        seen: set[str] = set()
        for field in fields:
            _nl, name_data, _nd, dims, raw_dtype, offset_tensor = field.parts
            name = bytes(name_data).decode("utf-8", errors="replace")
            where = f"tensor {name!r}: "
            if name in seen:
                raise GgufToolError(f"{where}duplicated tensor name")
            seen.add(name)
            ne = [int(d) for d in dims]
            if len(ne) > 4:   # GGML_MAX_DIMS: llama.cpp refuses such a file
                raise GgufToolError(f"{where}{len(ne)} dimensions; GGUF tensors have at most 4")
            if any(d <= 0 for d in ne):
                raise GgufToolError(f"{where}invalid dimensions {ne}")
            t = tensor_type(int(raw_dtype[0]), where)
            n = math.prod(ne)  # Python ints: a corrupt shape cannot overflow into a small size
            if ne[0] % t.block_size:
                raise GgufToolError(f"{where}row of {ne[0]} values does not divide {t.name}'s block of {t.block_size}")
            n_bytes = n // t.block_size * t.type_size
            offs = int(start_offs + int(offset_tensor[0]))
            if offs % self.alignment:
                raise GgufToolError(f"{where}data offset {offs} is not aligned to {self.alignment}")
            if offs + n_bytes > size:
                raise GgufToolError(f"{where}data runs past the end of the file ({offs + n_bytes} > {size} bytes)",
                                    hint="the file is truncated; download or convert it again")
            shape = tuple(reversed(ne))
            dtype = _PLAIN_DTYPES.get(t.id) if not t.custom else None
            if dtype is not None:
                data = self.data[offs:offs + n_bytes].view(dtype).reshape(shape)
            else:
                data = self.data[offs:offs + n_bytes].reshape(*shape[:-1], ne[0] // t.block_size * t.type_size)
            self.gt_tensors.append(Tensor(name, shape, t, offs, n_bytes, data))
        self.tensor_info_offsets = [f.offset for f in fields]   # where each tensor's info record starts
        ordered = sorted(self.gt_tensors, key=lambda t: t.offset)
        for a, b in zip(ordered, ordered[1:]):   # llama.cpp lays tensors out one after another
            if b.offset < a.offset + a.n_bytes:
                raise GgufToolError(f"tensor {b.name!r}: its data overlaps tensor {a.name!r}'s "
                                    f"(bytes {b.offset} < {a.offset} + {a.n_bytes})", hint="the file is corrupt")
        # gguf's own ReaderTensor list is not built: it cannot represent our types.
        self.tensors = []


class _Strings:
    """A metadata array of strings as the file holds them: string i is buf[starts[i]:starts[i] + lens[i]]
    (buf: the array's payload, length prefixes included)."""

    def __init__(self, buf: memoryview, starts: np.ndarray, lens: np.ndarray):
        self.buf, self.starts, self.lens = buf, starts, lens

    def check_utf8(self) -> None:
        """All string bytes, concatenated, are valid UTF-8 (one decode instead of one per string)."""
        keep = np.ones(len(self.buf), bool)
        keep[(self.starts[:, None] - np.arange(8, 0, -1)).reshape(-1)] = False   # the length prefixes
        np.frombuffer(self.buf, np.uint8)[keep].tobytes().decode("utf-8")

    def decode(self) -> list[str]:
        b = self.buf
        return [str(b[i:i + n], "utf-8") for i, n in zip(self.starts.tolist(), self.lens.tolist())]


def _field_value(field: ReaderField) -> Any:
    last = field.parts[-1]
    if isinstance(last, _Strings):
        return last.decode()
    v = field.contents()
    if isinstance(v, np.generic):
        v = v.item()
    return v


# -- metadata values: what gguftool and llama.cpp read is checked once, when a file is opened -----------
_INTEGERS = frozenset({GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
                       GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64})
_KINDS = {"integer": (_INTEGERS, "an integer", "integers"),
          "number": (_INTEGERS | {GGUFValueType.FLOAT32, GGUFValueType.FLOAT64}, "a number", "numbers"),
          "string": (frozenset({GGUFValueType.STRING}), "a string", "strings"),
          "bool": (frozenset({GGUFValueType.BOOL}), "true or false", "bools")}
LLAMA_MAX_LAYERS = 512   # llama-hparams.h: per-layer arrays have this many entries; llama.cpp refuses more blocks


@dataclass(frozen=True)
class Want:
    """What a metadata key must hold: a scalar of `kind`, an array of `item`s, or either (`per_block`: then an
    array has one value per block, as llama.cpp's get_key_or_arr reads it)."""
    kind: str | None = None       # the scalar's kind (None: no scalar)
    item: str | None = None       # the array items' kind (None: no array)
    lo: float | None = None
    hi: float | None = None
    per_block: bool = False

    def describe(self) -> str:
        parts = [_KINDS[self.kind][1]] if self.kind else []
        if self.item:
            parts.append(f"an array of {_KINDS[self.item][2]}" + (" (one per block)" if self.per_block else ""))
        return " or ".join(parts)


_COUNT = Want("integer", lo=0)
_PER_BLOCK = Want("integer", "integer", lo=0, per_block=True)
_TOKEN_ID = Want("integer", lo=0)
GENERAL_KEYS: dict[str, Want] = {
    "general.architecture": Want("string"), "general.name": Want("string"),
    "general.file_type": _COUNT, "general.quantization_version": _COUNT, "general.alignment": Want("integer", lo=1),
    "split.no": _COUNT, "split.count": Want("integer", lo=0, hi=99999), "split.tensors.count": _COUNT,
    "tokenizer.ggml.model": Want("string"), "tokenizer.ggml.pre": Want("string"), "tokenizer.chat_template": Want("string"),
    "tokenizer.ggml.tokens": Want(item="string"), "tokenizer.ggml.merges": Want(item="string"),
    "tokenizer.ggml.scores": Want(item="number"), "tokenizer.ggml.token_type": Want(item="integer"),
    **{f"tokenizer.ggml.{t}_token_id": _TOKEN_ID for t in ("bos", "eos", "unknown", "seperator", "padding", "cls",
                                                             "mask", "eot", "eom")},
    **{f"tokenizer.ggml.{b}": Want("bool") for b in ("add_bos_token", "add_eos_token", "add_sep_token",
                                                     "add_space_prefix", "remove_extra_whitespaces")},
}
ARCH_KEYS: dict[str, Want] = {   # after "<general.architecture>."
    "block_count": Want("integer", lo=1, hi=LLAMA_MAX_LAYERS),
    "context_length": _COUNT, "embedding_length": _COUNT, "vocab_size": _COUNT, "expert_count": _COUNT,
    "expert_used_count": _COUNT, "rope.dimension_count": _COUNT, "attention.key_length": _COUNT,
    "attention.value_length": _COUNT, "attention.sliding_window": _COUNT, "pooling_type": _COUNT,
    "feed_forward_length": _PER_BLOCK, "attention.head_count": _PER_BLOCK, "attention.head_count_kv": _PER_BLOCK,
    "attention.layer_norm_rms_epsilon": Want("number", lo=0), "attention.layer_norm_epsilon": Want("number", lo=0),
    "rope.freq_base": Want("number", lo=0), "rope.scaling.factor": Want("number", lo=0),
    "attention.sliding_window_pattern": Want("integer", "bool", lo=0), "attention.causal": Want("bool"),
}


def _type_name(f: ReaderField) -> str:
    t = GGUFValueType(f.types[0])
    if t != GGUFValueType.ARRAY:
        return f"a {t.name.lower()}"
    if len(f.types) < 2:
        return "an empty array"
    item = GGUFValueType(f.types[1])
    return "an array of arrays" if item == GGUFValueType.ARRAY else f"an array of {item.name.lower()}s"


def check_metadata(path: Path, fields: dict[str, ReaderField]) -> None:
    """Every key gguftool or llama.cpp reads holds the type and range they read (llama.cpp's loader refuses a
    key of the wrong type too); a per-block array has one value per block; token scores and types one per
    token. Keys nobody reads may hold anything."""
    def fail(key: str, problem: str):
        raise GgufToolError(f"{path}: metadata {key!r} {problem}",
                            hint="llama.cpp refuses such a file too: it is damaged or was written by a broken tool; "
                                 "convert or download the model again")

    def want_of(key: str) -> Want | None:
        return _want_of(key, arch)

    arch = None
    if "general.architecture" in fields:
        f = fields["general.architecture"]
        if list(f.types) != [GGUFValueType.STRING]:
            fail("general.architecture", f"is {_type_name(f)}, not a string")
        arch = _field_value(f)
    lengths: dict[str, int] = {}
    for key, f in fields.items():
        want = want_of(key)
        if want is None:
            continue
        main = GGUFValueType(f.types[0])
        if main == GGUFValueType.ARRAY:
            item = GGUFValueType(f.types[1]) if len(f.types) > 1 else None
            ok = want.item is not None and (item is None or item in _KINDS[want.item][0])
        else:
            ok = want.kind is not None and main in _KINDS[want.kind][0]
        if not ok:
            fail(key, f"is {_type_name(f)}, not {want.describe()}")
        if main == GGUFValueType.ARRAY:
            lengths[key] = n = int(f.parts[4][0])   # key length, key, type, item type, count
            if n and (want.lo is not None or want.hi is not None) and want.item != "bool":
                vals = np.asarray(f.parts[-1])
                for bad in (vals.min(), vals.max()):
                    if (want.lo is not None and bad < want.lo) or (want.hi is not None and bad > want.hi):
                        fail(key, f"holds {bad.item()}: {_range(want)}")
            continue
        v = _field_value(f)
        if isinstance(v, float) and not math.isfinite(v):
            fail(key, f"= {v}: not a finite number")
        if (want.lo is not None and v < want.lo) or (want.hi is not None and v > want.hi):
            fail(key, f"= {v}: {_range(want)}")
    n_layer = fields.get(f"{arch}.block_count")
    for key, n in lengths.items():
        w = want_of(key)
        if w is not None and w.per_block and n_layer is not None and n != _field_value(n_layer):
            fail(key, f"holds {n} values, one per block: {arch}.block_count is {_field_value(n_layer)}")
    heads, embd = fields.get(f"{arch}.attention.head_count"), fields.get(f"{arch}.embedding_length")
    if heads is not None and embd is not None and f"{arch}.attention.key_length" not in fields \
            and isinstance(n := _field_value(heads), int) and n > 0 and _field_value(embd) % n:
        # llama.cpp's head size is then embedding_length / head_count
        fail(f"{arch}.attention.head_count", f"= {n} does not divide {arch}.embedding_length = {_field_value(embd)}, "
             f"and no {arch}.attention.key_length gives the head size")
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        if key in lengths and "tokenizer.ggml.tokens" in lengths and lengths[key] != lengths["tokenizer.ggml.tokens"]:
            fail(key, f"holds {lengths[key]} values, but tokenizer.ggml.tokens holds {lengths['tokenizer.ggml.tokens']}")


def _want_of(key: str, arch: str | None) -> Want | None:
    if key in GENERAL_KEYS:
        return GENERAL_KEYS[key]
    if key.startswith(registry.META_PREFIX):
        return _COUNT
    return ARCH_KEYS.get(key[len(arch) + 1:]) if arch and key.startswith(arch + ".") else None


def value_problem(key: str, arch: str | None, vtype: GGUFValueType, value: Any) -> str | None:
    """What is wrong with writing the scalar `value` of `vtype` under `key` in a model of `arch` (as
    --override-kv does), by the rules check_metadata reads files with; None when nothing is."""
    want = _want_of(key, arch)
    if want is None:
        return None
    if want.kind is None or vtype not in _KINDS[want.kind][0]:
        return f"is a {vtype.name.lower()} here, but gguftool and llama.cpp read {want.describe()} there"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and (
            (want.lo is not None and value < want.lo) or (want.hi is not None and value > want.hi)):
        return f"= {value}: {_range(want)}"
    return None


def _range(w: Want) -> str:
    if w.hi is None:
        return f"must be at least {w.lo:g}"
    return f"must be {w.lo:g} to {w.hi:g}"


class ModelMetadata:
    """What a GGUF model derives from its `fields` and its `get(key, default)`: one file (GGUFFile) or a
    split model (io/split.py)."""
    fields: dict[str, ReaderField]

    @property
    def metadata(self) -> dict[str, Any]:
        return {k: self.get(k) for k in self.fields}

    @property
    def architecture(self) -> str:
        return str(self.get("general.architecture", "unknown"))

    def write_metadata(self, w) -> None:
        """Into a StreamingWriter: this model's header, for a requantized copy."""
        w.copy_metadata(self)


def require_gguf_path(path: Path, what: str = "GGUF file") -> Path:
    """The path, if it is a regular file; else the error says what it is instead (a checkpoint folder, a FIFO)."""
    if path.is_dir():
        checkpoint = (path / "config.json").is_file()
        raise GgufToolError(f"{path}: is a directory, not a {what}",
                            hint="it holds a Hugging Face checkpoint: `gguftool convert DIR OUT.gguf --outtype TYPE`"
                            if checkpoint else "give the .gguf file itself")
    if path.exists() and not path.is_file():   # a FIFO or device: mmap would fail or block
        raise GgufToolError(f"{path}: not a regular file, so not a {what}")
    if not path.is_file():
        raise GgufToolError(f"{path}: no such {what}")
    return path


class GGUFFile(ModelMetadata):
    """A parsed GGUF file: metadata, tensors (memory-mapped) and the gguftool type records."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = require_gguf_path(Path(path))
        if self.path.stat().st_size < 24:
            raise GgufToolError(f"{self.path}: too short to be a GGUF file ({self.path.stat().st_size} bytes)")
        try:
            r = _Reader(self.path, "r")
        except GgufToolError as e:
            raise GgufToolError(f"{self.path}: {e.message}", e.hint) from None
        except (ValueError, IndexError, KeyError, UnicodeDecodeError, OverflowError, MemoryError, TypeError) as e:
            if "magic" in str(e):
                raise GgufToolError(f"{self.path}: not a GGUF file (bad magic)") from None
            raise GgufToolError(f"{self.path}: corrupt or truncated GGUF header ({type(e).__name__}: {e})") from None
        self._reader = r
        self.alignment = int(r.alignment)
        self.data_offset = int(r.data_offset)
        self.fields: dict[str, ReaderField] = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
        for k, f in self.fields.items():  # check every value once, so that reading one later cannot fail
            try:
                if isinstance(f.parts[-1], _Strings):
                    f.parts[-1].check_utf8()
                else:
                    _field_value(f)
            except (UnicodeDecodeError, ValueError, IndexError) as e:
                raise GgufToolError(f"{self.path}: metadata {k!r} holds an invalid value ({type(e).__name__})") from None
        check_metadata(self.path, self.fields)
        # Each value's bytes (type id + payload) for a byte-for-byte copy; pairs are contiguous in the file.
        offsets = [f.offset for f in self.fields.values()] + [r.kv_end]
        self._value_spans = {k: (f.offset + 8 + int(f.parts[0][0]), offsets[i + 1])
                             for i, (k, f) in enumerate(self.fields.items())}
        self._little = r.endianess == GGUFEndian.LITTLE
        self.tensors: list[Tensor] = r.gt_tensors
        self._by_name = {t.name: t for t in self.tensors}
        self._check_type_records()

    @property
    def paths(self) -> list[Path]:
        """The files of this model (a split model has several: gguftool.io.split)."""
        return [self.path]

    # -- metadata --------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        f = self.fields.get(key)
        if f is None:
            return default
        try:
            return _field_value(f)
        except UnicodeDecodeError:   # a string cut inside a character passes the check in __init__
            raise GgufToolError(f"{self.path}: metadata {key!r} holds invalid UTF-8") from None

    def raw_value(self, key: str) -> bytes | None:
        """The value of `key` as the file stores it (uint32 type id, then the payload), or None for a
        big-endian file."""
        if not self._little:
            return None
        start, end = self._value_spans[key]
        return self._reader.data[start:end].tobytes()

    def field_type(self, key: str) -> tuple[GGUFValueType, GGUFValueType | None]:
        f = self.fields[key]
        main = GGUFValueType(f.types[0])
        return main, (GGUFValueType(f.types[-1]) if main == GGUFValueType.ARRAY and len(f.types) > 1 else None)

    def dump(self, filename: str, arrays: bool = False, tensors: bool = True) -> dict:
        """The file as `gguf-dump --json` shows it, key for key (its layout, read for every type, ours too):
        each header field and key with its index, value type and record offset; arrays' values only with
        `arrays` (gguf-dump's --json-array); each tensor's GGUF-order shape, type and info-record offset."""
        r = self._reader
        metadata = {}
        for i, f in enumerate(r.fields.values()):
            entry = metadata[f.name] = {"index": i, "type": f.types[0].name if f.types else "UNKNOWN",
                                        "offset": f.offset}
            if f.types[:1] == [GGUFValueType.ARRAY]:
                entry["array_types"] = [t.name for t in f.types][1:]
                if not arrays:
                    continue
            entry["value"] = _field_value(f)
        out = {"filename": filename, "endian": r.endianess.name, "metadata": metadata, "tensors": {}}
        if tensors:
            out["tensors"] = {t.name: {"index": i, "shape": list(reversed(t.shape)), "type": t.type.name, "offset": o}
                              for i, (t, o) in enumerate(zip(self.tensors, r.tensor_info_offsets))}
        return out

    # -- tensors ---------------------------------------------------------------
    def tensor(self, name: str) -> Tensor:
        try:
            return self._by_name[name]
        except KeyError:
            raise GgufToolError(f"{self.path}: no tensor named {name!r}") from None

    def release(self, t: Tensor) -> None:
        """Drop a tensor's pages from this process (they stay in the page cache): streaming a model
        then keeps resident memory near one tensor instead of growing to the whole file."""
        mm = getattr(self._reader.data, "_mmap", None)
        if mm is None or not hasattr(mm, "madvise"):
            return
        page = mmap.PAGESIZE
        start = t.offset // page * page
        mm.madvise(mmap.MADV_DONTNEED, start, t.offset + t.n_bytes - start)

    def __contains__(self, name: str) -> bool:
        return name in self._by_name


    def _check_type_records(self) -> None:
        """Every gguftool type record in the file must agree with our table."""
        recorded: dict[str, dict[str, int]] = {}
        for key in self.fields:
            if key.startswith(registry.META_PREFIX):
                tname, _, attr = key[len(registry.META_PREFIX):].rpartition(".")
                recorded.setdefault(tname, {})[attr] = int(self.get(key))
        for tname, rec in recorded.items():
            ours = registry.lookup(tname)
            if ours is None:
                raise GgufToolError(f"{self.path}: records gguftool type {tname} which this version does not know",
                                    hint="upgrade gguftool")
            for attr in registry.META_FIELDS:
                if attr in rec and rec[attr] != getattr(ours, attr):
                    raise GgufToolError(
                        f"{self.path}: its record of {tname} says {attr}={rec[attr]}, but this gguftool has "
                        f"{attr}={getattr(ours, attr)}: the file was written with an incompatible type table",
                        hint="requantize from the original model with this gguftool version")
