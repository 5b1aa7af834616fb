"""What the quantize pipeline reads: a model source and its tensors, declared once.

Two kinds implement it: a GGUF file (gguftool.io.reader.GGUFFile) and a Hugging Face checkpoint
converted on the fly (gguftool.convert.HFModel). The pipeline relies on these members only.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from ..types import TensorType


@runtime_checkable
class TensorSource(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...      # numpy order: (..., rows, n_per_row)
    @property
    def type(self) -> TensorType: ...
    @property
    def n_elements(self) -> int: ...
    @property
    def n_per_row(self) -> int: ...
    @property
    def n_rows(self) -> int: ...
    @property
    def n_bytes(self) -> int: ...

    def raw_rows(self) -> np.ndarray:
        """The data as uint8 [rows, row_bytes]."""
        ...


@runtime_checkable
class ModelSource(Protocol):
    @property
    def path(self) -> Path: ...
    @property
    def architecture(self) -> str: ...
    @property
    def tensors(self) -> Sequence[TensorSource]: ...

    def __contains__(self, name: str) -> bool: ...

    def release(self, t: TensorSource) -> None:
        """The pipeline is done with `t`: its memory may go."""
        ...

    def write_metadata(self, w) -> None:
        """Every key-value pair of the output's header into a gguftool.io.writer.StreamingWriter."""
        ...
