"""GGUF writer: gguf.GGUFWriter, streamed tensor by tensor into a temporary file renamed at the end.

Tensor infos are declared first (types and sizes are known from the plan), then data is written
one tensor at a time, so memory stays near the largest tensor. Custom type ids pass straight
through GGUFWriter (it packs the id as a uint32); the file records each custom type it uses.
"""
from __future__ import annotations

import contextlib
import errno
import glob
import os
import stat
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFEndian, GGUFValueType, GGUFWriter, Keys

from .. import __version__
from .. import types as registry
from ..errors import GgufToolError
from ..types import TensorType
from .reader import GGUFFile


def check_output_path(out: Path, inputs: list[Path]) -> None:
    """Before any work: `out` may be written (then renamed over) without destroying an input or
    something that is not a file. An input that is a directory (a checkpoint) protects every file in it."""
    check_replaceable(out)
    for src in inputs:
        if out.resolve() == src.resolve() or _is_input_file(out, src):
            what = "a file of the input checkpoint" if src.is_dir() else "the input file"
            raise GgufToolError(f"{out}: output path is {what} {src}", hint="choose another output name")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise GgufToolError(f"{out}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise GgufToolError(f"{out}: directory {parent} is not writable")


def check_replaceable(out: Path) -> None:
    """An existing `out` must be a regular file (or a link to one). The output is renamed over it, so a
    FIFO, a socket or a device node - as root, /dev/null itself - would be replaced, never written to."""
    try:
        st = os.stat(out)   # follows a symlink: a link to a device is refused too
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as e:
        raise GgufToolError(f"{out}: cannot use this output path: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise GgufToolError(f"{out}: is a directory", hint="give a file name for the output")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a device node" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file")
        raise GgufToolError(f"{out}: exists and is {kind}; gguftool writes regular files and will not replace it",
                            hint="choose another output name")


def _is_input_file(out: Path, src: Path) -> bool:
    """`out` is `src`, or one of the files under the checkpoint directory `src`, by inode: symlinks and
    hard links count. A GGUF file there is not one (convert reads none): a previous output, rewritten."""
    try:
        o = os.stat(out)
    except OSError:
        return False   # no such output yet: it cannot be an input
    if not src.is_dir():
        return src.exists() and os.path.samefile(out, src)
    if stat.S_ISREG(o.st_mode):   # (opening a FIFO would block)
        with contextlib.suppress(OSError), open(out, "rb") as f:
            if f.read(4) == b"GGUF":
                return False
    seen = set()
    for root, dirs, files in os.walk(src, followlinks=True):   # a checkpoint may link its sub-folders
        st = os.stat(root)
        if (st.st_dev, st.st_ino) in seen:
            dirs.clear()   # a link loop
            continue
        seen.add((st.st_dev, st.st_ino))
        for f in files:
            with contextlib.suppress(OSError):
                s = os.stat(os.path.join(root, f))
                if (s.st_dev, s.st_ino) == (o.st_dev, o.st_ino):
                    return True
    return False


def temporary_path(out: Path, tag: str) -> Path:
    """The hidden sibling `.NAME.TAG` that `out` is written to before the rename. NAME is shortened so
    that it fits NAME_MAX whenever `out`'s own name does (255 bytes is a legal name); the room kept
    is for the longest tag, so the same output always gets the same shortened NAME."""
    return out.with_name(f".{_temporary_stem(out)}.{tag}")


_TAG_ROOM = 24   # ".{pid}.tmp" (pids have at most 7 digits on Linux), ".kv-calibrate"


def _temporary_stem(out: Path) -> str:
    try:
        limit = os.pathconf(out.parent if str(out.parent) else ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    stem = out.name
    while stem and len(os.fsencode(stem)) + 1 + _TAG_ROOM > limit:
        stem = stem[:-1]
    return stem


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


def _alignment(value: Any, vtype: GGUFValueType) -> int:
    """general.alignment as gguf requires it: a uint32 power of two."""
    if isinstance(value, RawValue):
        vtype, value = GGUFValueType(struct.unpack_from("<I", value)[0]), struct.unpack_from("<I", value, 4)[0]
    a = int(value) if vtype == GGUFValueType.UINT32 else 0
    if a <= 0 or a & (a - 1):
        raise GgufToolError(f"general.alignment {value!r} ({vtype.name}) is not a uint32 power of two")
    return a


class StreamingWriter:
    """Declare tensors with `add_tensor_info`, then `begin()`, then `write()` each in order, then `commit()`."""

    def __init__(self, out: str | os.PathLike[str], arch: str):
        self.out = Path(out)
        self.tmp = temporary_path(self.out, f"{os.getpid()}.tmp")
        _remove_stale_temporaries(self.out)
        self._w = _Writer(None, arch)
        self._custom_used: set[str] = set()
        self._order: list[tuple[str, int]] = []

    # -- metadata --------------------------------------------------------------
    def add(self, key: str, value: Any, vtype: GGUFValueType, sub_type: GGUFValueType | None = None) -> None:
        if key == "general.architecture":
            return  # GGUFWriter writes it from `arch`
        if key == Keys.General.ALIGNMENT:   # the data must follow the alignment the header declares
            self._w.data_alignment = _alignment(value, vtype)
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

    def planned_bytes(self) -> int:
        """The size of the file begin() ... commit() will write, computed without writing it: the header,
        metadata and tensor infos packed by gguf-py's own packers, the padding to the data alignment after
        them and after every tensor (as write_chunks pads), and the declared tensor data."""
        w = self._w
        self._record_custom_types()   # as begin() will (adding them again there changes nothing)
        n = 4 + 4 + 8 + 8   # magic, version, tensor count, metadata count
        for key, val in w.kv_data[0].items():
            n += len(w._pack_val(key, GGUFValueType.STRING, add_vtype=False))
            n += len(w._pack_val(val.value, val.type, add_vtype=True, sub_type=val.sub_type))
        for name, ti in w.tensors[0].items():
            n += len(w._pack_val(name, GGUFValueType.STRING, add_vtype=False)) + 4 + 8 * len(ti.shape) + 4 + 8
        n = GGUFWriter.ggml_pad(n, w.data_alignment)
        return n + sum(GGUFWriter.ggml_pad(ti.nbytes, w.data_alignment) for ti in w.tensors[0].values())

    def begin(self) -> None:
        check_replaceable(self.out)   # before the work, and again at the rename (commit)
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

    def finish(self) -> None:
        """The temporary file whole on disk and closed, the output name still replaceable (no rename)."""
        assert self._w.fout is not None
        for f in self._w.fout:
            f.flush()
            os.fsync(f.fileno())
        self._w.close()
        check_replaceable(self.out)

    def commit(self) -> None:
        try:
            self.finish()
            os.replace(self.tmp, self.out)
        except OSError as e:
            self.abort()
            raise _os_error(self.out, e) from None
        except GgufToolError:
            self.abort()
            raise

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
    stem = _temporary_stem(out)
    for p in out.parent.glob(f".{glob.escape(stem)}.*.tmp"):
        pid = p.name[len(stem) + 2:-4]
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
