"""llama-quantize's --prune-layers: drop whole blocks, renumber the rest, lower the block count.

As src/llama-quant.cpp's remap_layer does: blocks below the first pruned one keep their number, the
later ones close the gap in order; `<arch>.block_count` becomes the number of blocks left. Per-layer
metadata arrays are left as they are, as llama-quantize leaves them.
"""
from __future__ import annotations

import re
from dataclasses import replace

from gguf import GGUFValueType

from ..errors import GgufToolError
from ..io.imatrix import Imatrix

_BLK = re.compile(r"blk\.(\d+)\.")


def parse_layers(spec: str) -> list[int]:
    try:
        ids = sorted({int(s) for s in spec.split(",")})
    except ValueError:
        raise GgufToolError(f"--prune-layers {spec!r}: expected layer ids such as 3,4,7") from None
    if any(i < 0 for i in ids):
        raise GgufToolError(f"--prune-layers {spec!r}: layer ids are 0 or more")
    return ids


def _rename(name: str, mapping: dict[int, int | None]) -> str | None:
    m = _BLK.search(name)
    if m is None:
        return name
    new = mapping[int(m.group(1))]
    return None if new is None else name[:m.start(1)] + str(new) + name[m.end(1):]


class PrunedSource:
    """A GGUF model source without the pruned blocks, the others renumbered (the data is the source's)."""

    def __init__(self, src, layers: list[int]):
        blocks = sorted({int(m.group(1)) for t in src.tensors if (m := _BLK.search(t.name))})
        missing = [i for i in layers if i not in blocks]
        if missing:
            raise GgufToolError(f"{src.path}: --prune-layers {missing}: the model has blocks 0-{blocks[-1] if blocks else -1}")
        kept = [b for b in blocks if b not in layers]
        if not kept:
            raise GgufToolError(f"{src.path}: --prune-layers would remove every block")
        self.mapping: dict[int, int | None] = {b: None for b in layers} | {b: i for i, b in enumerate(kept)}
        self.src, self.n_blocks, self.pruned = src, len(kept), list(layers)
        self._orig: dict[str, object] = {}
        self.tensors = []
        for t in src.tensors:
            new = _rename(t.name, self.mapping)
            if new is not None:
                r = replace(t, name=new)
                self._orig[new] = t
                self.tensors.append(r)
        self.path, self.paths, self.architecture = src.path, getattr(src, "paths", [src.path]), src.architecture

    def follow(self, imatrix: Imatrix) -> Imatrix:
        """An importance matrix made on the whole model, its entries under the renumbered names (llama-quant.cpp's
        remap_imatrix, the other way round); the pruned blocks' entries dropped."""
        return replace(imatrix, entries={n: v for k, v in imatrix.entries.items() if (n := _rename(k, self.mapping))})

    def __contains__(self, name: str) -> bool:
        return name in self._orig

    def tensor(self, name: str):
        return next(t for t in self.tensors if t.name == name)

    def get(self, key, default=None):
        return self.src.get(key, default)

    def release(self, t) -> None:
        self.src.release(self._orig[t.name])

    def write_metadata(self, w) -> None:
        self.src.write_metadata(w)
        w.add(f"{self.architecture}.block_count", self.n_blocks, GGUFValueType.UINT32)
