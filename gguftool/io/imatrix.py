"""Importance matrices, as llama-imatrix writes them and llama-quantize reads them.

Two formats (pinned common/imatrix-loader.cpp):
  GGUF:   tensors `<weight>.in_sum2` (f32, n_per_row x n_mat) and `<weight>.counts` (f32, n_mat);
          keys imatrix.datasets / imatrix.chunk_count / imatrix.chunk_size.
  legacy: int32 n; n x (int32 len, name, int32 ncall, int32 nval, f32[nval]); optional int32 chunk
          count, int32 len, dataset name.
Both become {weight name: float32 [n_mat * n_per_row]} by llama-quantize's normalisation
(sums / count per matrix; a matrix never seen counts as ones).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGUFValueType

from ..errors import GgufToolError


@dataclass
class Imatrix:
    path: Path
    entries: dict[str, np.ndarray]          # weight name -> float32 [n_mat * n_per_row]
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    legacy: bool = False

    def select(self, include: list[str] | None = None, exclude: list[str] | None = None) -> Imatrix:
        """llama-quantize's --include-weights / --exclude-weights: substrings of the weight names."""
        e = {k: v for k, v in self.entries.items() if not any(s in k for s in exclude or ())}
        if include:
            e = {k: v for k, v in e.items() if any(s in k for s in include)}
        return Imatrix(self.path, e, self.datasets, self.chunk_count, self.legacy)


def load(path: str | Path) -> Imatrix:
    path = Path(path)
    if path.is_dir():
        raise GgufToolError(f"{path} is a directory, not an importance matrix file")
    if path.exists() and not path.is_file():   # a FIFO or a device such as /dev/zero: it would never end
        raise GgufToolError(f"{path}: not a regular file, so not an importance matrix file")
    try:
        with path.open("rb") as f:
            head = f.read(4)
    except OSError as e:
        raise GgufToolError(f"{path}: cannot read the importance matrix: {e.strerror}") from None
    return _load_gguf(path) if head == b"GGUF" else _load_legacy(path)


def _load_gguf(path: Path) -> Imatrix:
    from gguf import GGUFReader, Keys
    try:
        r = GGUFReader(path)
    except Exception as e:   # gguf's reader raises bare ValueError/struct errors on corrupt files
        raise GgufToolError(f"{path}: not a readable GGUF importance matrix ({e})") from None
    fields = {f.name: f for f in r.fields.values()}
    keys = Keys.IMatrix
    missing = [k for k in (keys.DATASETS, keys.CHUNK_COUNT, keys.CHUNK_SIZE) if k not in fields]
    if missing:   # llama-quantize: "missing imatrix metadata"
        raise GgufToolError(f"{path}: missing imatrix metadata ({', '.join(missing)}): is it an imatrix file?")
    sums, counts = {}, {}
    for t in r.tensors:
        if t.tensor_type.name != "F32":
            raise GgufToolError(f"{path}: tensor {t.name} is {t.tensor_type.name}; imatrix sums and counts must be F32")
        for suffix, into in ((".in_sum2", sums), (".counts", counts)):
            if t.name.endswith(suffix):
                into[t.name[: -len(suffix)]] = np.asarray(t.data, np.float32).reshape(-1)
    if not sums and not counts:
        raise GgufToolError(f"{path}: no importance data in the file")
    entries = {}
    for name in sorted(set(sums) | set(counts)):
        if name not in sums or name not in counts:
            raise GgufToolError(f"{path}: {name} has {'sums' if name in sums else 'counts'} but no "
                                f"{'counts' if name in sums else 'sums'}")
        if not (np.isfinite(sums[name]).all() and np.isfinite(counts[name]).all()):
            raise GgufToolError(f"{path}: {name}: the sums or counts hold NaN or infinity",
                                hint="remake the imatrix (`gguftool imatrix MODEL`)")
        s, c = sums[name], np.round(counts[name]).astype(np.float32)   # counts are whole token counts (lround)
        if c.size == 0 or s.size % c.size:
            raise GgufToolError(f"{path}: {name}: {s.size} sums do not split into {c.size} matrices")
        s = s.reshape(c.size, -1)
        entries[name] = np.where(c[:, None] > 0, s / np.where(c > 0, c, 1)[:, None], np.float32(1)).reshape(-1)
    _whole_number(path, fields[keys.CHUNK_SIZE])   # checked, as llama.cpp reads it; not used here
    chunk_count = _whole_number(path, fields[keys.CHUNK_COUNT])
    ds = fields[keys.DATASETS]
    if ds.types != [GGUFValueType.ARRAY, GGUFValueType.STRING]:
        raise GgufToolError(f"{path}: metadata {keys.DATASETS} is {_type_name(ds)}, expected an array of strings")
    datasets = [bytes(ds.parts[i]).decode("utf-8", "replace") for i in ds.data]
    return Imatrix(path, entries, datasets, chunk_count)


_INTEGER_TYPES = (GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
                  GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64)


def _type_name(field) -> str:
    return " of ".join(t.name.lower() for t in field.types) or "empty"


def _whole_number(path: Path, field) -> int:
    """An imatrix count (chunk_count, chunk_size): one integer >= 0; llama.cpp reads them as int32."""
    if len(field.types) != 1 or field.types[0] not in _INTEGER_TYPES:
        raise GgufToolError(f"{path}: metadata {field.name} is {_type_name(field)}, expected an integer")
    value = int(field.parts[-1][0])
    if value < 0:
        raise GgufToolError(f"{path}: metadata {field.name} is {value}, expected a count (>= 0)")
    return value


def _load_legacy(path: Path) -> Imatrix:
    data = path.read_bytes()
    pos = 0

    def take(fmt: str, what: str):
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise GgufToolError(f"{path}: truncated legacy importance matrix (reading {what} at byte {pos})")
        v = struct.unpack_from(fmt, data, pos)
        pos += size
        return v

    (n,) = take("<i", "the entry count")
    if n < 1 or n > len(data) // 12:
        raise GgufToolError(f"{path}: not an importance matrix (GGUF or legacy .dat): it claims {n} entries")
    entries = {}
    for i in range(n):
        (length,) = take("<i", f"the name length of entry {i + 1}")
        if not 0 < length <= len(data) - pos:
            raise GgufToolError(f"{path}: entry {i + 1} has a name of {length} bytes")
        (raw,) = take(f"<{length}s", f"the name of entry {i + 1}")
        name = raw.decode("utf-8", "replace")
        ncall, nval = take("<ii", f"the sizes of {name}")
        if nval < 1 or 4 * nval > len(data) - pos:
            raise GgufToolError(f"{path}: {name} claims {nval} values; the file holds {(len(data) - pos) // 4} more")
        sums = np.frombuffer(data, np.float32, nval, pos).copy()
        pos += 4 * nval
        # llama-quantize: the file holds (raw / count) * ncall, so divide by ncall again
        entries[name] = sums / np.float32(ncall) if ncall > 0 else sums
    chunks, datasets = 0, []
    if pos + 4 <= len(data):
        (chunks,) = take("<i", "the chunk count")
        if pos + 4 <= len(data):
            (length,) = take("<i", "the dataset name length")
            if 0 < length <= len(data) - pos:
                datasets = [take(f"<{length}s", "the dataset name")[0].decode("utf-8", "replace")]
    return Imatrix(path, entries, datasets, chunks, legacy=True)
