"""Lazy safetensors reader: the JSON header is parsed, the data stays memory-mapped until a tensor is read.

A checkpoint directory holds one `model.safetensors`, or shards listed by `model.safetensors.index.json`
(`weight_map`: tensor name -> shard file). Only the header of each shard is read up front; a tensor's
bytes are touched when the converter asks for it, so memory stays near one tensor at a time.
Format: u64 little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data,
offsets relative to the end of the header.
"""
from __future__ import annotations

import json
import math
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import GgufToolError
from .confine import inside

# safetensors dtype -> numpy dtype of the stored bytes (BF16 is kept as its raw uint16 bits)
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}
FLOAT_DTYPES = ("F32", "F16", "BF16")
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
MAX_HEADER = 100 * 2**20  # the reference implementation's own limit


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


@dataclass(frozen=True)
class STensor:
    """One tensor of a safetensors file; `array()` maps it without reading it."""
    name: str
    dtype: str                  # safetensors name: F32, F16, BF16, ...
    shape: tuple[int, ...]
    begin: int                  # absolute file offset
    n_bytes: int
    file: SafetensorsFile

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    def release(self) -> None:
        self.file.release(self.begin, self.n_bytes)

    def array(self) -> np.ndarray:
        """The data, memory-mapped, in the stored dtype (BF16 as uint16 bits), shaped."""
        if self.dtype not in DTYPES:
            raise GgufToolError(f"{self.file.path}: tensor {self.name!r} has dtype {self.dtype}, which gguftool cannot read",
                                hint=f"supported: {', '.join(FLOAT_DTYPES)} (float weights)")
        return self.file.map()[self.begin:self.begin + self.n_bytes].view(DTYPES[self.dtype]).reshape(self.shape)


class SafetensorsFile:
    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._map: np.ndarray | None = None
        if not self.path.is_file():
            raise GgufToolError(f"{self.path}: no such file")
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise GgufToolError(f"{self.path}: too short to be a safetensors file ({size} bytes)")
            n = int.from_bytes(head, "little")
            if n > MAX_HEADER or 8 + n > size:
                raise GgufToolError(f"{self.path}: not a safetensors file (header length {n} does not fit in {size} bytes)",
                                    hint="a truncated download? fetch the file again")
            raw = f.read(n)
        try:
            header = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise GgufToolError(f"{self.path}: corrupt safetensors header ({e})") from None
        except RecursionError:
            raise GgufToolError(f"{self.path}: corrupt safetensors header (nested too deeply)") from None
        if not isinstance(header, dict):
            raise GgufToolError(f"{self.path}: corrupt safetensors header (not a JSON object)")
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        if not isinstance(self.metadata, dict):
            raise GgufToolError(f"{self.path}: corrupt safetensors header (__metadata__ is not an object)")
        base = 8 + n
        self.tensors: dict[str, STensor] = {}
        for name, info in header.items():
            # the reference reader's rules: a dtype name, a list of non-negative integer dimensions, two offsets
            try:
                dtype, shape, (b, e) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
                if not isinstance(dtype, str) or not all(_count(x) for x in (*shape, b, e)):
                    raise ValueError
            except (KeyError, TypeError, ValueError):
                raise GgufToolError(f"{self.path}: tensor {name!r} has a malformed header entry: {str(info)[:200]}") from None
            itemsize = DTYPES[dtype].itemsize if dtype in DTYPES else None
            n_el = math.prod(shape)   # Python ints: a claimed shape cannot wrap around into a small size
            if not (0 <= b <= e) or base + e > size:
                raise GgufToolError(f"{self.path}: tensor {name!r} data [{b}, {e}) lies outside the file ({size} bytes)",
                                    hint="the file is truncated; download it again")
            if itemsize is not None and e - b != n_el * itemsize:
                raise GgufToolError(f"{self.path}: tensor {name!r} holds {e - b} bytes, but {dtype}{list(shape)} needs "
                                    f"{n_el * itemsize}")
            self.tensors[name] = STensor(name, dtype, shape, base + b, e - b, self)

    def map(self) -> np.ndarray:
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        return self._map

    def release(self, begin: int, n_bytes: int) -> None:
        """Drop these pages from this process (they stay in the page cache), so converting a model keeps
        resident memory near one tensor instead of growing to the whole checkpoint."""
        mm = getattr(self._map, "_mmap", None)
        if mm is None or not hasattr(mm, "madvise") or n_bytes <= 0:
            return
        start = begin // mmap.PAGESIZE * mmap.PAGESIZE
        mm.madvise(mmap.MADV_DONTNEED, start, begin + n_bytes - start)

    def close(self) -> None:
        self._map = None


class Checkpoint:
    """All safetensors tensors of a Hugging Face model directory, by name, in file order."""

    def __init__(self, directory: str | os.PathLike[str]):
        self.dir = Path(directory)
        self.files = [SafetensorsFile(p) for p in self._shards()]
        self.tensors: dict[str, STensor] = {}
        for f in self.files:
            for name, t in f.tensors.items():
                if name in self.tensors:
                    raise GgufToolError(f"{self.dir}: tensor {name!r} appears in both {self.tensors[name].file.path.name} "
                                        f"and {f.path.name}")
                self.tensors[name] = t

    def _shards(self) -> list[Path]:
        index = self.dir / INDEX_NAME
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
                names = list(dict.fromkeys(weight_map.values()))  # first-seen order, no duplicates
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, KeyError, TypeError, AttributeError) as e:
                raise GgufToolError(f"{index}: not a safetensors index ({type(e).__name__}: {e})") from None
            paths = [inside(self.dir, n, f"{index}: shard") for n in names]
            missing = [n for n, p in zip(names, paths) if not p.is_file()]
            if missing:
                raise GgufToolError(f"{index} lists shards that are missing: {', '.join(missing[:4])}",
                                    hint="the download is incomplete; run it again (it resumes)")
            return paths
        if (self.dir / SINGLE_NAME).is_file():
            return [self.dir / SINGLE_NAME]
        found = sorted(self.dir.glob("*.safetensors"))
        if not found:
            other = sorted(p.name for p in self.dir.glob("*.bin")) + sorted(p.name for p in self.dir.glob("*.pt*"))
            raise GgufToolError(f"{self.dir}: no *.safetensors weights found"
                                + (f" (only PyTorch pickles: {', '.join(other[:3])})" if other else ""),
                                hint="gguftool reads safetensors only; convert pickles with transformers' "
                                     "save_pretrained(safe_serialization=True)")
        return found

    def __iter__(self) -> Iterator[STensor]:
        return iter(self.tensors.values())

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def __getitem__(self, name: str) -> STensor:
        return self.tensors[name]

    @property
    def n_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors.values())
