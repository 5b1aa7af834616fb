"""THE type table: every GGML type gguftool adds, in one place for Python and C.

Id policy
---------
GGUF stores a tensor's type as a uint32 and llama.cpp sizes its type tables with
GGML_TYPE_COUNT, so an id must be unique across every runtime that may open the file.
Taken ranges, as of 2026-12:

    0-42      upstream ggml (Q1_0=41, Q2_0=42, GGML_TYPE_COUNT=43), grows upward from 43
    43-127    upstream growth zone: never used here
    36, 97-99, 133-158, 202-399   ik_llama.cpp
    41-47     TurboQuant forks (collide with upstream already)
    40        a Q4_HQQ fork (collides with upstream NVFP4)

gguftool owns 512-543. Ids are never reused: a retired type stays in RETIRED with its id.
A layout change bumps `layout_version`; files record (id, name, block, bytes, layout) per
custom type, and a reader that finds a disagreement refuses the file.

The C header `gguftool/_fast/gqt_types.h` and the ggml enum lines for the native build are
rendered from this table (`python -m gguftool.types --write-header`); a test fails when the
committed header is stale.

Adding a type: one CustomType entry below, then its kernels under the names the integration
expects - in gqt_<family>.h/.c: gqt_quantize_row_<name>_ref, gqt_dequantize_row_<name>,
gqt_quantize_<name> and gqt_vec_dot_<name>_<vec_dot type> with its portable _ref twin - and a
codec that gguftool.quant.<family> registers for it. Everything else (ggml traits, vec_dot pairing,
row validation, file types, cache-type lists, fallbacks, CLI help) is derived from the entry.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from .errors import GgufToolError

GGUFTOOL_ID_RANGE = range(512, 544)
UPSTREAM_TYPE_COUNT = 43  # GGML_TYPE_COUNT of the pinned llama.cpp (ggml 0.25.3): upstream ids are 0..42
# Ranges that other projects use or will use; an id here is a collision.
FOREIGN_RANGES = {
    "upstream ggml (incl. growth zone)": range(0, 128),
    "ik_llama.cpp": [36, 97, 98, 99, *range(133, 159), *range(202, 400)],
    "TurboQuant forks": range(41, 48),
}


@dataclass(frozen=True)
class TensorType:
    """A GGML tensor type: what every layer needs to size, label and pair its data."""
    name: str            # GGUF/Python name, upper case (ggml's type_name is name.lower())
    id: int
    block_size: int      # values per block
    type_size: int       # bytes per block
    custom: ClassVar[bool] = False

    @property
    def bpw(self) -> float:
        return 8.0 * self.type_size / self.block_size

    @property
    def ggml_name(self) -> str:
        return self.name.lower()

    @property
    def quantized(self) -> bool:
        return self.block_size > 1 or self.name == "BF16"


@dataclass(frozen=True)
class CustomType(TensorType):
    """One of gguftool's own types: everything the Python package, the C kernels and the llama.cpp
    integration need to know about it. Adding a type is one entry here plus its kernels."""
    layout_version: int
    doc: str
    family: str          # gguftool.quant.<family> holds its codec, gqt_<family>.[ch] its kernels
    code_bits: int       # bits per stored code (4-bit HQQ codes: 0..15)
    fp16_fields: int     # leading fp16 fields of a block (scale[, zero]): ggml_validate_row_data checks them
    vec_dot_type: str    # ggml's activation type it is multiplied with (what the block's math pairs with)
    fallback: str | None = None   # type used where a row does not divide block_size (None: llama.cpp's rule)
    kv_cache: bool = True         # accepted by --cache-type-k/-v
    table_decode: bool = False    # rows decode by table look-up (gqt_mad_<name> exists): flash attention adds
                                  # V rows straight from the blocks and decode converts K rows once per KV head
    custom: ClassVar[bool] = True


CUSTOM_TYPES: tuple[CustomType, ...] = (
    CustomType("Q4_HQQ", 512, 32, 20, 1,
               "fp16 scale, fp16 zero, 16 B of 4-bit codes (byte j: code j | code j+16 << 4); x = (q - zero) * scale",
               family="hqq", code_bits=4, fp16_fields=2, vec_dot_type="Q8_1"),
    CustomType("Q4_HQQ_128", 513, 128, 68, 1,
               "fp16 scale, fp16 zero, 64 B of codes packed as four Q4_HQQ-style 32-value sub-blocks; x = (q - zero) * scale",
               family="hqq", code_bits=4, fp16_fields=2, vec_dot_type="Q8_1", fallback="Q4_HQQ"),
    CustomType("TQ3_0", 514, 32, 14, 1,
               "fp16 scale, 12 B of 3-bit Lloyd-Max indices of the sign-flipped Walsh-Hadamard rotated block",
               family="tq3", code_bits=3, fp16_fields=1, vec_dot_type="Q8_0"),
    CustomType("TQ3_1", 515, 32, 14, 1,
               "fp16 scale, 4 B of index bit 2, 8 B of index bits 0-1; x = d * L[idx], L the integer 3-bit "
               "Lloyd-Max levels; no rotation of its own (for caches llama.cpp rotates head-wide)",
               family="tq3_1", code_bits=3, fp16_fields=1, vec_dot_type="Q8_0", table_decode=True),
    CustomType("TQ3_2", 516, 64, 26, 1,
               "fp16 scale, then two 12-byte groups of TQ3_1's codes (values 0-31, 32-63); x = d * L[idx]: "
               "TQ3_1 with one scale per 64 values (a head of dim 64)",
               family="tq3_1", code_bits=3, fp16_fields=1, vec_dot_type="Q8_0", fallback="TQ3_1", table_decode=True),
    CustomType("TQ3_3", 517, 64, 26, 1,
               "fp16 scale, 8 B of trellis branch bits, 16 B of 2-bit indices (byte j: values j, j+16, j+32, j+48); "
               "x = d * L[subset + 4 idx], the subset from the branch bits of the value and the 3 before it "
               "(an 8-state trellis code over 16 levels, 3 bits per value)",
               family="tcq3", code_bits=3, fp16_fields=1, vec_dot_type="Q8_0", fallback="TQ3_1", table_decode=True),
)
RETIRED: tuple[CustomType, ...] = ()  # never reuse these ids

BY_NAME = {t.name: t for t in CUSTOM_TYPES}
BY_ID = {t.id: t for t in CUSTOM_TYPES}
RETIRED_IDS = {t.id: t for t in RETIRED}

# Stock types gguftool writes, bit-identical to llama.cpp's reference quantizers (gguf.quants).
STOCK_PRODUCIBLE = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
# Stock types only ggml's own C quantizers write (through the native build's library, gguftool/native/ggml_lib.py).
NATIVE_STOCK = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS",
                "IQ3_S", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "Q1_0", "Q2_0")
# Upstream types of the pinned ggml that the installed gguf package does not know yet: name -> (id, values and
# bytes per block), from ggml-common.h (a test reads them there). gguf's own entry wins once it has one.
UPSTREAM_UNKNOWN_TO_GGUF = {"Q2_0": (42, 64, 18)}
PRODUCIBLE = STOCK_PRODUCIBLE + NATIVE_STOCK + tuple(BY_NAME)
# Stock layouts the HQQ solver can also fill (x = d*q + m, Q4_HQQ's math): name -> bits per code.
HQQ_STOCK_TARGETS = {"Q4_1": 4, "Q5_1": 5}
# Stock KV-cache types gguftool sizes and validates, most bits first (llama.cpp also takes iq4_nl).
STOCK_CACHE_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "IQ4_NL")
CACHE_TYPES = tuple(n.lower() for n in STOCK_CACHE_TYPES) + tuple(t.ggml_name for t in CUSTOM_TYPES if t.kv_cache)

# GGUF metadata keys under which a file records the custom types it uses.
META_PREFIX = "gguftool.type."
META_FIELDS = ("id", "block_size", "type_size", "layout_version")


def of_family(family: str) -> tuple[CustomType, ...]:
    return tuple(t for t in CUSTOM_TYPES if t.family == family)


def hqq_targets() -> dict[str, TensorType]:
    """Every type the HQQ solver writes: ours of the hqq family, then the stock layouts."""
    return {**{t.name: t for t in of_family("hqq")}, **{n: stock(n) for n in HQQ_STOCK_TARGETS}}


def code_bits(t: TensorType) -> int:
    return t.code_bits if isinstance(t, CustomType) else HQQ_STOCK_TARGETS[t.name]


def lookup(name_or_id: str | int) -> CustomType | None:
    if isinstance(name_or_id, int):
        return BY_ID.get(name_or_id)
    return BY_NAME.get(name_or_id.upper())


def stock(name: str) -> TensorType:
    """An upstream type by name, sized by the installed gguf package (or, where it lacks the type, by the
    pinned ggml: UPSTREAM_UNKNOWN_TO_GGUF)."""
    import gguf

    try:
        t = gguf.GGMLQuantizationType[name]
    except KeyError:
        if name not in UPSTREAM_UNKNOWN_TO_GGUF:
            raise
        return TensorType(name, *UPSTREAM_UNKNOWN_TO_GGUF[name])
    block, size = gguf.GGML_QUANT_SIZES[t]
    return TensorType(t.name, int(t), block, size)


def upstream_name(type_id: int) -> str | None:
    """The name of upstream ggml type `type_id`, as far as the installed gguf package and the pinned ggml know."""
    import gguf

    try:
        return gguf.GGMLQuantizationType(type_id).name
    except ValueError:
        return next((n for n, (i, _, _) in UPSTREAM_UNKNOWN_TO_GGUF.items() if i == type_id), None)


def tensor_type(type_id: int, where: str = "") -> TensorType:
    """The type behind a GGUF type id, or a clear error for ids we cannot read."""
    custom = lookup(type_id)
    if custom is not None:
        return custom
    name = upstream_name(type_id)
    if name is not None:
        return stock(name)
    if type_id in RETIRED_IDS:
        problem = f"type id {type_id} is the retired gguftool type {RETIRED_IDS[type_id].name}"
    elif type_id in GGUFTOOL_ID_RANGE:
        problem = f"type id {type_id} is in gguftool's range but unknown to this version (written by a newer gguftool?)"
    elif type_id < UPSTREAM_TYPE_COUNT:
        problem = (f"type id {type_id} is an upstream ggml id that neither the installed gguf package nor the "
                   "pinned ggml knows (a type ggml removed, or one newer than the pin)")
    else:
        problem = f"unknown tensor type id {type_id} (not upstream ggml, not gguftool: a fork's private type?)"
    raise GgufToolError(f"{where}{problem}",
                        hint="upgrade gguf/gguftool, or requantize the file with the tool that wrote it")


def collisions(upstream_ids: dict[str, int] | None = None) -> list[str]:
    """Every way our table collides with itself, the installed gguf enum, foreign ranges or `upstream_ids`."""
    import gguf

    problems = []
    seen: dict[int, str] = {}
    for t in CUSTOM_TYPES + RETIRED:
        if t.id in seen:
            problems.append(f"{t.name} reuses id {t.id} of {seen[t.id]}")
        seen[t.id] = t.name
        if t.id not in GGUFTOOL_ID_RANGE:
            problems.append(f"{t.name} id {t.id} is outside gguftool's range {GGUFTOOL_ID_RANGE}")
        for owner, ids in FOREIGN_RANGES.items():
            if t.id in ids:
                problems.append(f"{t.name} id {t.id} lies in the range of {owner}")
    for member in gguf.GGMLQuantizationType:
        if member.value in seen:
            problems.append(f"{seen[member.value]} id {member.value} collides with gguf's {member.name}")
        if member.name in BY_NAME:
            problems.append(f"name {member.name} collides with gguf's type of the same name")
    for name, value in (upstream_ids or {}).items():
        if value in seen and name.upper() != seen[value]:
            problems.append(f"{seen[value]} id {value} collides with {name}")
    return problems


def render_c_header() -> str:
    lines = [
        "/* Generated by `python -m gguftool.types --write-header` from gguftool/types.py. Do not edit. */",
        "#pragma once",
        "",
    ]
    for t in CUSTOM_TYPES:
        n = t.name
        lines += [
            f"/* {t.name}: {t.doc} */",
            f"#define GQT_TYPE_{n} {t.id}",
            f"#define GQT_{n}_BLOCK {t.block_size}",
            f"#define GQT_{n}_BYTES {t.type_size}",
            f"#define GQT_{n}_LAYOUT {t.layout_version}",
            f"#define GQT_{n}_BITS {t.code_bits}",
            "",
        ]
    lines.append(f"#define GQT_TYPE_MAX {max(t.id for t in CUSTOM_TYPES)}")
    lines += ["", "/* Every type, for code that treats each the same way: X(NAME, name, vec_dot type name). Each has",
              " * gqt_vec_dot_<name>_<vec_dot type> (the build's best path) and a portable _ref twin. */",
              "#define GQT_FOR_EACH_TYPE(X) \\"]
    lines += [f"    X({t.name}, {t.ggml_name}, {t.vec_dot_type.lower()})" + (" \\" if i + 1 < len(CUSTOM_TYPES) else "")
              for i, t in enumerate(CUSTOM_TYPES)]
    lines.append("")
    lines.append("/* Stock ggml layouts the HQQ solver also writes (ggml type id, values and bytes per block, bits per code). */")
    for n in HQQ_STOCK_TARGETS:
        t = stock(n)
        lines += [f"#define GQT_HQQ_TARGET_{n} {t.id}", f"#define GQT_{n}_BLOCK {t.block_size}",
                  f"#define GQT_{n}_BYTES {t.type_size}", f"#define GQT_{n}_BITS {HQQ_STOCK_TARGETS[n]}"]
    return "\n".join(lines) + "\n"


def render_ggml_enum_lines() -> str:
    """Enum entries spliced into ggml.h's `enum ggml_type` by the native integration."""
    return "".join(f"        GGML_TYPE_{t.name} = {t.id}, // gguftool\n" for t in CUSTOM_TYPES)


HEADER_PATH = Path(__file__).parent / "_fast" / "gqt_types.h"


def _main(argv: list[str]) -> int:
    if argv == ["--write-header"]:
        HEADER_PATH.write_text(render_c_header())
        return 0
    print(render_c_header(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
