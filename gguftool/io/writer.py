"""GGUF writer: gguf.GGUFWriter, streamed tensor by tensor into a temporary file renamed at the end.

Tensor infos are declared first (types and sizes are known from the plan), then data is written
one tensor at a time, so memory stays near the largest tensor. Custom type ids pass straight
through GGUFWriter (it packs the id as a uint32); the file records each custom type it uses.
"""
from __future__ import annotations

import contextlib
import errno
import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFEndian, GGUFValueType, GGUFWriter

from .. import __version__
from .. import types as registry
from ..errors import GgufToolError
from ..types import TensorType
from .reader import GGUFFile


def check_output_path(out: Path, inputs: list[Path]) -> None:
    for src in inputs:
        same_file = out.exists() and src.exists() and os.path.samefile(out, src)
        if same_file or out.resolve() == src.resolve():
            raise GgufToolError(f"{out}: output path is the input file", hint="choose another output name")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise GgufToolError(f"{out}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise GgufToolError(f"{out}: directory {parent} is not writable")
    if out.is_dir():
        raise GgufToolError(f"{out}: is a directory")


class RawValue(bytes):
    """A metadata value copied byte for byte from a little-endian GGUF file: uint32 type id, then payload."""


class _Writer(GGUFWriter):
    """gguf.GGUFWriter that writes RawValue as is, and packs metadata arrays of scalars in one numpy
    step and of strings in one join (gguf-py packs them element by element: about a second for a
    262k-token vocabulary). Same bytes; everything else, checks included, is gguf-py's."""

    def _pack_val(self, val: Any, vtype: GGUFValueType, add_vtype: bool, sub_type: GGUFValueType | None = None) -> bytes:
        if isinstance(val, RawValue):
            assert self.endianess == GGUFEndian.LITTLE and add_vtype
            return bytes(val)
        fmt = self._simple_value_packing.get(sub_type) if sub_type is not None else None
        if vtype != GGUFValueType.ARRAY or not len(val) or (fmt is None and sub_type != GGUFValueType.STRING):
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        end = ">" if self.endianess == GGUFEndian.BIG else "<"
        head = (self._pack("I", vtype) if add_vtype else b"") + self._pack("I", sub_type) + self._pack("Q", len(val))
        if fmt is not None:
            return head + np.asarray(val, dtype=np.dtype(end + fmt)).tobytes()
        length = struct.Struct(end + "Q").pack
        enc = (v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in val)
        return head + b"".join(length(len(e)) + e for e in enc)


class StreamingWriter:
    """Declare tensors with `add_tensor_info`, then `begin()`, then `write()` each in order, then `commit()`."""

    def __init__(self, out: str | os.PathLike[str], arch: str):
        self.out = Path(out)
        self.tmp = self.out.with_name(f".{self.out.name}.{os.getpid()}.tmp")
        _remove_stale_temporaries(self.out)
        self._w = _Writer(None, arch)
        self._custom_used: set[str] = set()
        self._order: list[tuple[str, int]] = []

    # -- metadata --------------------------------------------------------------
    def add(self, key: str, value: Any, vtype: GGUFValueType, sub_type: GGUFValueType | None = None) -> None:
        if key == "general.architecture":
            return  # GGUFWriter writes it from `arch`
        self._w.kv_data[0].pop(key, None)
        self._w.add_key_value(key, value, vtype, sub_type)

    def remove(self, key: str) -> None:
        """Drop `key` if it was added (or copied)."""
        self._w.kv_data[0].pop(key, None)

    def copy_metadata(self, src: GGUFFile, skip_prefixes: tuple[str, ...] = ()) -> None:
        """Every key of `src` (but gguftool's type records and skip_prefixes), byte for byte where the
        byte order allows: decoding and re-encoding a 262k-token vocabulary costs about a second."""
        for key in src.fields:
            if key.startswith(registry.META_PREFIX) or key.startswith(skip_prefixes):
                continue
            main, sub = src.field_type(key)
            raw = src.raw_value(key) if self._w.endianess == GGUFEndian.LITTLE else None
            self.add(key, src.get(key) if raw is None else RawValue(raw), main, sub)

    def add_tool_record(self, extra: dict[str, str] | None = None) -> None:
        self.add("gguftool.version", __version__, GGUFValueType.STRING)
        for k, v in (extra or {}).items():
            self.add(f"gguftool.{k}", v, GGUFValueType.STRING)

    # -- tensors ---------------------------------------------------------------
    def add_tensor_info(self, name: str, shape: tuple[int, ...], ttype: TensorType) -> int:
        n = int(np.prod(shape, dtype=np.int64))
        nbytes = n // ttype.block_size * ttype.type_size
        # shape is numpy order; a float32 placeholder dtype keeps GGUFWriter from reinterpreting byte shapes.
        self._w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes, raw_dtype=ttype.id)  # type: ignore[arg-type]
        if ttype.custom:
            self._custom_used.add(ttype.name)
        self._order.append((name, nbytes))
        return nbytes

    def _record_custom_types(self) -> None:
        for tname in sorted(self._custom_used):
            t = registry.BY_NAME[tname]
            for attr in registry.META_FIELDS:
                self.add(f"{registry.META_PREFIX}{tname}.{attr}", getattr(t, attr), GGUFValueType.UINT32)

    def begin(self) -> None:
        self._record_custom_types()
        try:
            self._w.write_header_to_file(self.tmp)
            self._w.write_kv_data_to_file()
            self._w.write_ti_data_to_file()
        except OSError as e:
            self.abort()
            raise _os_error(self.out, e) from None

    def write(self, data: np.ndarray) -> None:
        self.write_chunks([data])

    def write_chunks(self, chunks: Iterable[np.ndarray]) -> None:
        """The next declared tensor's data, given in pieces (row chunks), so it is never whole in memory."""
        w = self._w
        assert w.fout is not None and len(w.fout) == 1
        fout = w.fout[0]
        name = next(iter(w.tensors[0]))
        ti = w.tensors[0].pop(name)
        try:
            w.write_padding(fout, fout.tell())
            written = 0
            for c in chunks:
                c = np.ascontiguousarray(c)
                fout.write(c.data.cast("B"))  # not tofile(): its short-write error carries no errno
                written += c.nbytes
            if written != ti.nbytes:
                raise GgufToolError(f"internal error: tensor {name!r} produced {written} bytes, {ti.nbytes} declared")
            w.write_padding(fout, written)
        except OSError as e:
            self.abort()
            raise _os_error(self.out, e) from None

    def commit(self) -> None:
        try:
            assert self._w.fout is not None
            for f in self._w.fout:
                f.flush()
                os.fsync(f.fileno())
            self._w.close()
            os.replace(self.tmp, self.out)
        except OSError as e:
            self.abort()
            raise _os_error(self.out, e) from None

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._w.close()
        with contextlib.suppress(FileNotFoundError):
            self.tmp.unlink()

    @contextlib.contextmanager
    def session(self) -> Iterator[StreamingWriter]:
        """Removes the temporary file on any error or interrupt; the output name is only ever a whole file."""
        try:
            yield self
        except BaseException:
            self.abort()
            raise


def _remove_stale_temporaries(out: Path) -> None:
    """Temporary files left by a writer that was killed (SIGKILL, power loss) for the same output."""
    for p in out.parent.glob(f".{out.name}.*.tmp"):
        pid = p.name[len(out.name) + 2:-4]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                p.unlink()
        except PermissionError:
            pass  # another user's live process


def _os_error(out: Path, e: OSError) -> GgufToolError:
    if e.errno == errno.ENOSPC:
        return GgufToolError(f"{out}: disk full while writing; the partial file was removed",
                             hint="free space or choose another directory")
    return GgufToolError(f"{out}: write failed: {e.strerror or e}")
