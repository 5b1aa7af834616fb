"""llama.cpp's split GGUF (llama-gguf-split): one model as shards `<prefix>-00001-of-00003.gguf`, ...

Facts from the pinned llama.cpp (tools/gguf-split/gguf-split.cpp, src/llama-model-loader.cpp):
every shard is a whole GGUF file with split.no (u16, 0-based), split.tensors.count (i32, tensors of
all shards) and split.count (u16), in that order; the model's metadata lives in the first shard
only; names follow llama_split_path ("%s-%05d-of-%05d.gguf"); llama.cpp must be given the first
shard and checks each shard's split.no, duplicate tensor names and split.tensors.count.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import GGUF_DEFAULT_ALIGNMENT, GGUFValueType, Keys
from gguf.gguf_writer import SHARD_NAME_FORMAT  # gguf-py's copy of llama_split_path's format

from ..errors import GgufToolError
from ..types import TensorType
from .reader import GGUFFile, ModelMetadata, Tensor
from .writer import StreamingWriter, _os_error, check_output_path

SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = (Keys.Split.LLM_KV_SPLIT_NO, Keys.Split.LLM_KV_SPLIT_COUNT,
                                        Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT)
SPLIT_KEYS = (SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS)
SHARD_NAME = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


def shard_path(prefix: str | os.PathLike[str], no: int, count: int) -> Path:
    """Shard `no` (0-based) of `count`, named as llama_split_path names it."""
    return Path(SHARD_NAME_FORMAT.format(str(prefix), no + 1, count))


def output_prefix(out: str | os.PathLike[str]) -> str:
    """`-o out.gguf` -> shards out-00001-of-0000N.gguf (llama-quantize --keep-split drops .gguf too)."""
    s = str(out)
    return s[:-len(".gguf")] if s.endswith(".gguf") else s


def shard_layout(sizes: Sequence[int], max_tensors: int = 0, max_size: int = 0) -> list[int]:
    """The shard of each tensor (data sizes in file order), by llama-gguf-split's rule: a new shard when
    the current one holds max_tensors tensors, or when the next tensor (padded to the alignment) would
    take its tensor data past max_size bytes (metadata is not counted). A tensor bigger than max_size
    sits alone (where llama-gguf-split refuses a too-big first tensor)."""
    shard, count, size, out = 0, 0, 0, []
    for n in sizes:
        n = -(-n // GGUF_DEFAULT_ALIGNMENT) * GGUF_DEFAULT_ALIGNMENT
        if count and ((max_tensors and count >= max_tensors) or (max_size and size + n > max_size)):
            shard, count, size = shard + 1, 0, 0
        out.append(shard)
        count, size = count + 1, size + n
    return out


# -- reading ---------------------------------------------------------------------
def open_gguf(path: str | os.PathLike[str]) -> GGUFFile | SplitGGUF:
    """A GGUF model: the file itself, or, for a shard of a split model, the whole model."""
    f = GGUFFile(path)
    return f if f.get(SPLIT_COUNT) is None else SplitGGUF.from_shard(f)


class SplitGGUF(ModelMetadata):
    """All shards of a split model as one GGUFFile-like model: every tensor of every shard, the first
    shard's metadata without the split keys (they describe files, not the model)."""

    def __init__(self, shards: list[GGUFFile]):
        self.shards = shards
        first = shards[0]
        self.path = first.path
        self.alignment = first.alignment
        self.fields = {k: f for k, f in first.fields.items() if k not in SPLIT_KEYS}
        self.tensors: list[Tensor] = [t for s in shards for t in s.tensors]
        self._shard_of: dict[str, int] = {}
        for i, s in enumerate(shards):
            for t in s.tensors:
                if t.name in self._shard_of:
                    raise GgufToolError(f"{s.path}: tensor {t.name!r} is also in {shards[self._shard_of[t.name]].path}",
                                        hint="the shards belong to different models; download the split again")
                self._shard_of[t.name] = i
        want = first.get(SPLIT_TENSORS)
        if len(shards) > 1 and want != len(self.tensors):
            raise GgufToolError(f"{first.path}: {SPLIT_TENSORS} says {want} tensors, the {len(shards)} shards hold "
                                f"{len(self.tensors)}", hint="a shard is from another model or damaged")

    @classmethod
    def from_shard(cls, f: GGUFFile) -> SplitGGUF:
        no, count = f.get(SPLIT_NO, 0), f.get(SPLIT_COUNT)
        if not isinstance(count, int) or not isinstance(no, int) or not 0 <= no < max(count, 1):
            raise GgufToolError(f"{f.path}: invalid split metadata ({SPLIT_NO}={no!r}, {SPLIT_COUNT}={count!r})")
        if count <= 1:   # one shard (or llama-gguf-split --merge's output, split.count = 0)
            return cls([f])
        m = SHARD_NAME.search(f.path.name)
        if not m or (int(m.group(1)), int(m.group(2))) != (no + 1, count):
            raise GgufToolError(f"{f.path}: is shard {no + 1} of {count} of a split model, but its name does not "
                                f"end in -{no + 1:05d}-of-{count:05d}.gguf", hint="rename it as llama-gguf-split did")
        prefix = str(f.path)[:-len(m.group(0))]
        shards = []
        for i in range(count):
            p = shard_path(prefix, i, count)
            if i == no:
                shards.append(f)
                continue
            if not p.is_file():
                raise GgufToolError(f"{p}: missing: shard {i + 1} of {count} of the split model {f.path.name}",
                                    hint="download every shard into the same folder")
            s = GGUFFile(p)
            if (s.get(SPLIT_COUNT), s.get(SPLIT_NO)) != (count, i):
                raise GgufToolError(f"{p}: says it is shard {SPLIT_NO}={s.get(SPLIT_NO)!r} of {SPLIT_COUNT}="
                                    f"{s.get(SPLIT_COUNT)!r}, but {f.path.name} says {SPLIT_COUNT}={count} "
                                    f"(and this name is shard {i})", hint="the shards come from different splits")
            shards.append(s)
        return cls(shards)

    @property
    def paths(self) -> list[Path]:
        return [s.path for s in self.shards]

    def shard_of(self, name: str) -> int:
        return self._shard_of[name]

    # -- the GGUFFile interface, over the shards --------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        return self.shards[0].get(key, default) if key in self.fields else default

    def raw_value(self, key: str) -> bytes | None:
        return self.shards[0].raw_value(key)

    def field_type(self, key: str):
        return self.shards[0].field_type(key)

    def tensor(self, name: str) -> Tensor:
        if name not in self._shard_of:
            raise GgufToolError(f"{self.path}: no tensor named {name!r} in its {len(self.shards)} shards")
        return self.shards[self._shard_of[name]].tensor(name)

    def release(self, t: Tensor) -> None:
        self.shards[self._shard_of[t.name]].release(t)

    def __contains__(self, name: str) -> bool:
        return name in self._shard_of



def model_paths(path: str | os.PathLike[str]) -> list[Path]:
    """Every file of the model at `path`: its shards for a split model, else the file itself."""
    return open_gguf(path).paths


# -- writing ---------------------------------------------------------------------
@dataclass(frozen=True)
class SplitSpec:
    """How to split an output: at most max_tensors tensors / max_size bytes of tensor data per shard,
    or `layout` (tensor name -> shard, e.g. the input's for --keep-split)."""
    max_tensors: int = 0
    max_size: int = 0
    layout: Mapping[str, int] | None = None


class SplitWriter(StreamingWriter):
    """A StreamingWriter whose output is a split model. Metadata and tensors are declared as for
    StreamingWriter (its records and copies included); begin() deals the tensors into shards, each a
    StreamingWriter with its own temporary file, and commit() renames them only once all are written."""

    def __init__(self, out: str | os.PathLike[str], arch: str, spec: SplitSpec, inputs: Sequence[Path] = ()):
        super().__init__(out, arch)
        self.spec, self.inputs = spec, list(inputs)
        self._infos: list[tuple[str, tuple[int, ...], TensorType]] = []
        self.shards: list[StreamingWriter] = []
        self._route: Iterator[int] = iter(())

    def add_tensor_info(self, name: str, shape: tuple[int, ...], ttype: TensorType) -> int:
        self._infos.append((name, tuple(shape), ttype))
        return super().add_tensor_info(name, shape, ttype)

    def layout(self) -> list[int]:
        if self.spec.layout is not None:
            return [self.spec.layout[name] for name, _, _ in self._infos]
        return shard_layout([n for _, n in self._order], self.spec.max_tensors, self.spec.max_size)

    @property
    def paths(self) -> list[Path]:
        return [s.out for s in self.shards]

    def begin(self) -> None:
        self._record_custom_types()   # into the model's metadata, which only the first shard holds
        route = self.layout()
        n = max(route, default=0) + 1
        prefix = output_prefix(self.out)
        for i in range(n):
            path = shard_path(prefix, i, n)
            check_output_path(path, self.inputs)
            s = StreamingWriter(path, self._w.arch)
            s._w.kv_data[0] = dict(self._w.kv_data[0]) if i == 0 else {}
            for key, value, vtype in ((SPLIT_NO, i, GGUFValueType.UINT16),
                                      (SPLIT_TENSORS, len(route), GGUFValueType.INT32),
                                      (SPLIT_COUNT, n, GGUFValueType.UINT16)):
                s.add(key, value, vtype)
            for (name, shape, ttype), j in zip(self._infos, route):
                if j == i:
                    s.add_tensor_info(name, shape, ttype)
            s._custom_used.clear()   # recorded once, above, for the whole model
            self.shards.append(s)
        self._route = iter(route)
        for s in self.shards:
            s.begin()

    def write_chunks(self, chunks) -> None:
        self.shards[next(self._route)].write_chunks(chunks)

    def commit(self) -> None:
        """StreamingWriter.commit in two steps: every shard whole on disk, then every rename."""
        try:
            for s in self.shards:
                s.finish()
        except OSError as e:
            self.abort()
            raise _os_error(self.out, e) from None
        except GgufToolError:
            self.abort()
            raise
        done: list[Path] = []
        try:
            for s in self.shards:
                os.replace(s.tmp, s.out)
                done.append(s.out)
        except OSError as e:
            for p in done:   # an incomplete set would load as a broken model: none or all
                p.unlink(missing_ok=True)
            self.abort()
            raise _os_error(self.out, e) from None

    def abort(self) -> None:
        for s in self.shards:
            s.abort()
        super().abort()

