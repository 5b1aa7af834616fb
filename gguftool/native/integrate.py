"""Anchored edits that register gguftool's types in the pinned llama.cpp tree.

Every edit names a file, a piece of text known to be in the pinned version (the anchor), and
how many times it must occur. A missing or ambiguous anchor stops the integration with the
file and the anchor, instead of producing a tree that half-compiles. Edits are applied to the
pristine text read from the verified archive, and a file is rewritten only when its content
changes, so CMake rebuilds only what an edit touched.

The enum lines and GGML_TYPE_COUNT are rendered from gguftool/types.py; our kernel sources
(gguftool/_fast/gqt_*.{c,h}) are copied into <tree>/gguftool/kernels/ at build time and
compiled into ggml-base (scalar quantize/dequantize/reference dot) and ggml-cpu (`*_simd.c`,
which gets the CPU arch flags). Nothing here types a second copy of a kernel.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .. import types as gtypes
from ..errors import GgufToolError
from . import source

PACKAGE_DIR = Path(__file__).resolve().parent.parent
KERNEL_DIR = PACKAGE_DIR / "_fast"
PATCH_DIR = Path(__file__).resolve().parent / "patches"



@dataclass(frozen=True)
class Edit:
    path: str            # relative to the llama.cpp root
    anchor: str          # exact text that must be present
    text: str            # text to insert
    where: str = "after"  # "after", "before" or "replace"
    count: int = 1       # exact number of occurrences of the anchor (all are edited)
    why: str = ""

    def apply(self, content: str) -> str:
        found = content.count(self.anchor)
        if found != self.count:
            raise GgufToolError(
                f"llama.cpp integration: anchor not found as expected in {self.path} "
                f"(found {found}x, expected {self.count}x): {self.anchor.strip()[:120]!r}",
                "the pinned llama.cpp source changed; update gguftool/native/integrate.py")
        if self.where == "after":
            new = self.anchor + self.text
        elif self.where == "before":
            new = self.text + self.anchor
        elif self.where == "replace":
            new = self.text
        else:
            raise ValueError(self.where)
        return content.replace(self.anchor, new)


def _families() -> list[str]:
    """Kernel families, one gqt_<family>.h each."""
    return sorted({t.family for t in gtypes.CUSTOM_TYPES})


def _table_decoded() -> list[gtypes.CustomType]:
    """Types whose rows decode by table look-up (gqt_mad_<name> exists): flash attention reads them fused."""
    return [t for t in gtypes.CUSTOM_TYPES if t.table_decode]


def _type_count() -> int:
    return max(t.id for t in gtypes.CUSTOM_TYPES) + 1


def _quantize_type_records() -> str:
    lines = ["    { // gguftool: records of the custom types this output uses (gguftool/types.py)\n",
             "        auto uses = [&](ggml_type t) {\n",
             "            for (const auto & m : metadata) { if (m.target_type == t) { return true; } }\n",
             "            return false;\n",
             "        };\n"]
    for t in gtypes.CUSTOM_TYPES:
        lines.append(f"        if (uses(GGML_TYPE_{t.name})) {{\n            for (auto & c : ctx_outs) {{\n")
        for attr in gtypes.META_FIELDS:
            lines.append(f'                gguf_set_val_u32(c.get(), "{gtypes.META_PREFIX}{t.name}.{attr}", {getattr(t, attr)});\n')
        lines.append("            }\n        }\n")
    lines.append("    }\n")
    return "".join(lines)


def _trait_entries(comment: str, fields) -> str:
    """One designated initializer per type for a ggml traits table; fields(t) -> [(field, C value)]."""
    out = [f"    // {comment}\n"]
    for t in gtypes.CUSTOM_TYPES:
        out.append(f"    [GGML_TYPE_{t.name}] = {{\n"
                   + "".join(f"        .{k:<25}= {v},\n" for k, v in fields(t)) + "    },\n")
    return "".join(out)


def _ggml_traits() -> str:
    # to_float/from_float_ref are the same C functions the Python extension calls.
    return _trait_entries("gguftool types (gguftool/types.py); kernels in gguftool/_fast", lambda t: [
        ("type_name", f'"{t.ggml_name}"'), ("blck_size", t.block_size), ("type_size", t.type_size),
        ("is_quantized", "true"), ("to_float", f"(ggml_to_float_t) gqt_dequantize_row_{t.ggml_name}"),
        ("from_float_ref", f"(ggml_from_float_t) gqt_quantize_row_{t.ggml_name}_ref")])


def _cpu_traits() -> str:
    # from_float quantizes every new KV-cache row at run time: the weights' row quantizer, defaults included;
    # vec_dot is gqt_vec_dot_<type>_<vec_dot type> (the build's best path)
    return _trait_entries("gguftool types: each paired with the activation type of its table entry (gguftool/types.py)",
                          lambda t: [
        ("from_float", f"(ggml_from_float_t) gqt_quantize_row_{t.ggml_name}_ref"),
        ("vec_dot", f"(ggml_vec_dot_t) gqt_vec_dot_{t.ggml_name}_{t.vec_dot_type.lower()}"),
        ("vec_dot_type", f"GGML_TYPE_{t.vec_dot_type}"), ("nrows", 1)])


def _quantize_chunk_cases() -> str:
    return "".join(
        f"        case GGML_TYPE_{t.name}: result = gqt_quantize_{t.ggml_name}(src + start, "
        f"(char *) dst + start_row * row_size, nrows, n_per_row, imatrix); break; // gguftool\n"
        for t in gtypes.CUSTOM_TYPES)


def _validate_cases() -> str:
    *rest, last = gtypes.CUSTOM_TYPES
    nf = "".join(f"type == GGML_TYPE_{t.name} ? {t.fp16_fields} : " for t in rest) + str(last.fp16_fields)
    return (
        "".join(f"        case GGML_TYPE_{t.name}:\n" for t in gtypes.CUSTOM_TYPES) +
        "            {\n"
        "                // gguftool: each block's leading fp16 fields (scale[, zero]), counts from gguftool/types.py\n"
        "                const size_t ts = ggml_type_size(type);\n"
        f"                const int nf = {nf};\n"
        "                for (size_t i = 0; i < nb; ++i) {\n"
        "                    for (int k = 0; k < nf; ++k) {\n"
        "                        ggml_fp16_t h;\n"
        "                        memcpy(&h, (const char *) data + i*ts + 2*k, sizeof(h));\n"
        "                        if (!validate_fp16(h, i)) {\n"
        "                            return false;\n"
        "                        }\n"
        "                    }\n"
        "                }\n"
        "            } break;\n")


def _case_lines(indent: str = "        ") -> str:
    return "".join(f"{indent}case GGML_TYPE_{t.name}: // gguftool\n" for t in gtypes.CUSTOM_TYPES)


KV_CALIB_INCLUDE = '#include "../gguftool/gqt_kv_calib.h" // gguftool\n'
KV_CALIB_OUT = "    cur = gqt_kv_calib_apply_out(ctx0, gqt_calib, gqt_vq, cur); // gguftool\n"


def _calib_in(mctx: str) -> str:
    """build_attn's calibration lines: find the layer's calibration through its K cache tensor and
    edit q/k/v before the rotation. Not with logit soft-capping, which a per-query shift changes."""
    return (
        "    // gguftool: KV calibration (gguftool/gqt_kv_calib.h)\n"
        "    const gqt_kv_calib_layer * gqt_calib = nullptr;\n"
        "    bool gqt_kq = false, gqt_vq = false;\n"
        "    if (!cparams.training && !hparams.attn_soft_cap) {\n"
        f"        ggml_tensor * gqt_kc = {mctx}->get_k(ctx0, il);\n"
        "        gqt_calib = gqt_kv_calib_find(gqt_kc);\n"
        "        gqt_kq = ggml_is_quantized(gqt_kc->type);\n"
        f"        gqt_vq = v_cur && ggml_is_quantized({mctx}->get_v(ctx0, il)->type);\n"
        "        gqt_kv_calib_apply_in(ctx0, gqt_calib, gqt_kq, gqt_vq, &q_cur, &k_cur, &v_cur);\n"
        "    }\n")


_FA_DECODE = """\
#include <cstdlib> // gguftool: getenv
#include <vector>  // gguftool: per-thread accumulators

// gguftool: [*ic0, *ic1) = thread ith's share of the keys row 0 of the mask leaves (decode: one query row);
// the even split of the cells stands when there is no mask or it differs between heads
static void gqt_fa_split(const ggml_tensor * mask, int64_t nek1, int ith, int nth, int64_t * ic0, int64_t * ic1) {
    if (!mask || mask->type != GGML_TYPE_F16 || mask->ne[2] != 1 || mask->ne[3] != 1) {
        return;
    }
    const ggml_fp16_t * mp = (const ggml_fp16_t *) mask->data;
    const ggml_fp16_t ninf = GGML_CPU_FP32_TO_FP16(-INFINITY);
    int64_t n = 0;
    for (int64_t ic = 0; ic < nek1; ++ic) {
        n += mp[ic] != ninf;
    }
    // shares rounded up: thread 0 holds a key whenever one is left, and its range starts at cell 0, where
    // the attention sinks are added
    const int64_t lo = (n * ith + nth - 1) / nth, hi = (n * (ith + 1) + nth - 1) / nth;
    *ic0 = *ic1 = nek1;
    for (int64_t ic = 0, seen = 0; ic < nek1 && lo < hi; ++ic) {
        if (mp[ic] == ninf) {
            continue;
        }
        if (seen == lo) {
            *ic0 = ith == 0 ? 0 : ic;
        }
        if (++seen == hi) {
            *ic1 = ic + 1;
            break;
        }
    }
}

// gguftool: decode with grouped-query attention reads each quantized V row once for all the query heads
// that share it (to_float, then one f32 mad per head), where upstream's chunk code decodes the row once
// per head; a TQ3 K row likewise (decoded by table look-up, dotted with each head's exact f32 query),
// while other K types keep their own vec_dot with the query in their dot type, quantized once per call
// (their decode is scalar C and costs more than the dots: q5_0 and iq4_nl keys ran 1.3x slower decoded).
// false: not this case, the caller runs upstream's code.
static bool gqt_fa_grouped(const ggml_compute_params * params, const ggml_tensor * dst, int64_t ic0, int64_t ic1,
                           float * partials, int64_t partial_stride) {
    static const bool off = getenv("GGUFTOOL_FA_GROUPED") && atoi(getenv("GGUFTOOL_FA_GROUPED")) == 0;
    const ggml_tensor * q = dst->src[0], * k = dst->src[1], * v = dst->src[2];
    const ggml_tensor * mask = dst->src[3], * sinks = dst->src[4];
    const int64_t DK = k->ne[0], DV = v->ne[0], nh = q->ne[2], nhk = k->ne[2];
    ggml_to_float_t const k_to_float = ggml_get_type_traits(k->type)->to_float;
    ggml_to_float_t const v_to_float = ggml_get_type_traits(v->type)->to_float;
    if (off || params->use_ref || !ggml_is_quantized(k->type) || !ggml_is_quantized(v->type) || !k_to_float ||
        !v_to_float || nh % nhk || nh / nhk < 2 || v->ne[2] != nhk || k->ne[3] != 1 || v->ne[3] != 1 ||
        (mask && (mask->ne[2] != 1 || mask->ne[3] != 1))) {
        return false;
    }
    float scale = 1.0f, max_bias = 0.0f, softcap = 0.0f;
    memcpy(&scale,    (const float *) dst->op_params + 0, sizeof(float));
    memcpy(&max_bias, (const float *) dst->op_params + 1, sizeof(float));
    memcpy(&softcap,  (const float *) dst->op_params + 2, sizeof(float));
    if (softcap != 0.0f) {
        scale /= softcap;
    }
    const uint32_t n_head_log2 = 1u << (uint32_t) floor(log2(nh));
    const float m0 = powf(2.0f, -(max_bias       ) / n_head_log2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / n_head_log2);
    const int64_t G = nh / nhk;
    const bool k_decode = @TABLE_DECODED@;
    const ggml_type k_dot_type = ggml_get_type_traits_cpu(k->type)->vec_dot_type;
    ggml_vec_dot_t const kq_vec_dot = ggml_get_type_traits_cpu(k->type)->vec_dot;
    const size_t q_row = ggml_row_size(k_dot_type, DK);
    static thread_local std::vector<char> q_dot;   // the group's queries in K's dot type
    float * Kf = (float *) params->wdata + params->ith * (DK + 2*DV + CACHE_LINE_SIZE_F32);
    float * Vf = Kf + DK;
    const ggml_fp16_t * mp = mask ? (const ggml_fp16_t *) mask->data : NULL;
    // [M, S, VKQ] of the group's heads, local to the thread: the partials of the threads share cache
    // lines, and writing them per key made two threads slower than one
    static thread_local std::vector<float> acc;
    acc.resize(G * (2 + DV));
    // online softmax: one more score s (and its value row, none for a sink) into p = [M, S, VKQ]
    auto add = [DV](float * p, float s, const float * row) {
        float w = 1.0f;
        if (s > p[0]) {   // a new maximum: rescale what is there, this score weighs 1
            const float ms = expf(p[0] - s);
            p[0] = s;
            ggml_vec_scale_f32(DV, p + 2, ms);
            p[1] *= ms;
        } else {
            w = expf(s - p[0]);
        }
        p[1] += w;
        if (row) {
            ggml_vec_mad_f32(DV, p + 2, row, w);
        }
    };
    if (!k_decode) {
        q_dot.resize(G * q_row);
    }
    for (int64_t hk = 0; hk < nhk; ++hk) {
        for (int64_t g = 0; g < G; ++g) {
            float * p = acc.data() + g * (2 + DV);
            p[0] = -INFINITY;
            p[1] = 0.0f;
            memset(p + 2, 0, DV * sizeof(float));
            if (!k_decode) {
                ggml_get_type_traits_cpu(k_dot_type)->from_float(
                    (const float *) ((const char *) q->data + (hk*G + g)*q->nb[2]), q_dot.data() + g*q_row, DK);
            }
        }
        for (int64_t ic = ic0; ic < ic1; ++ic) {
            const float mv = mp ? GGML_CPU_FP16_TO_FP32(mp[ic]) : 0.0f;
            if (mv == -INFINITY) {
                continue;
            }
            const char * k_data = (const char *) k->data + ic*k->nb[1] + hk*k->nb[2];
            if (k_decode) {
                k_to_float(k_data, Kf, DK);
            }
            v_to_float((const char *) v->data + ic*v->nb[1] + hk*v->nb[2], Vf, DV);
            for (int64_t h = hk*G; h < (hk + 1)*G; ++h) {
                const float slope = max_bias > 0.0f ? (h < n_head_log2 ? powf(m0, h + 1) : powf(m1, 2*(h - n_head_log2) + 1)) : 1.0f;
                float s;
                if (k_decode) {
                    ggml_vec_dot_f32(DK, &s, 0, Kf, 0, (const float *) ((const char *) q->data + h*q->nb[2]), 0, 1);
                } else {
                    kq_vec_dot(DK, &s, 0, k_data, 0, q_dot.data() + (h - hk*G)*q_row, 0, 1);
                }
                s *= scale;
                if (softcap != 0.0f) {
                    s = softcap*tanhf(s);
                }
                add(acc.data() + (h - hk*G) * (2 + DV), s + slope*mv, Vf);
            }
        }
        for (int64_t h = hk*G; h < (hk + 1)*G; ++h) {
            float * p = acc.data() + (h - hk*G) * (2 + DV);
            if (sinks && ic0 == 0) {   // as upstream's chunk code: the chunk that starts at cell 0 adds them
                add(p, ((const float *) sinks->data)[h], nullptr);
            }
            memcpy(partials + h * partial_stride, p, (2 + DV) * sizeof(float));
        }
    }
    return true;
}

"""

def edits() -> list[Edit]:
    up = source.PINNED.ggml_type_count
    kernels_h = "".join(f'#include "gqt_{f}.h" // gguftool\n' for f in _families())
    return [
        Edit("ggml/include/ggml.h", f"        GGML_TYPE_COUNT   = {up},\n",
             gtypes.render_ggml_enum_lines() + f"        GGML_TYPE_COUNT   = {_type_count()}, // gguftool: max id + 1\n",
             where="replace", why="enum ids from gguftool/types.py; type tables are sized by COUNT"),
        # ggml-base: type traits, quantize_chunk
        Edit("ggml/src/ggml.c", '#include "ggml-quants.h"\n', kernels_h),
        Edit("ggml/src/ggml.c", "    [4] = { // GGML_TYPE_Q4_2\n", _ggml_traits(), where="before"),
        Edit("ggml/src/ggml.c",
             "        case GGML_TYPE_Q4_1:    result = quantize_q4_1   (src + start, (char *) dst + start_row * row_size, nrows, n_per_row, imatrix); break;\n",
             _quantize_chunk_cases()),
        Edit("ggml/src/ggml-quants.c",
             "        case GGML_TYPE_I8:\n        case GGML_TYPE_I16:\n        case GGML_TYPE_I32:\n        case GGML_TYPE_I64:\n            // nothing to validate\n",
             _validate_cases(), where="before", why="ggml_validate_row_data: check the fp16 fields"),
        # ggml-cpu: from_float / vec_dot / vec_dot_type
        Edit("ggml/src/ggml-cpu/ggml-cpu.c", '#include "ggml-cpu-impl.h"\n',
             kernels_h),
        Edit("ggml/src/ggml-cpu/ggml-cpu.c",
             "static const struct ggml_type_traits_cpu type_traits_cpu[GGML_TYPE_COUNT] = {\n", _cpu_traits()),
        # every op switch that lists Q4_1 handles quantized types generically (to_float /
        # from_float) or aborts for all of them: add, add1, acc, out_prod, set, get_rows, clamp
        Edit("ggml/src/ggml-cpu/ops.cpp", "        case GGML_TYPE_Q4_1:\n", _case_lines(), count=7),
        # decode (one query row): upstream splits the keys over the threads only for an f16/f32 cache and
        # otherwise gives each thread whole heads (9 heads on 2 threads: one thread does 5); the split
        # path's chunk code is type-generic (vec_dot for K, to_float for V), so quantized caches take it too
        Edit("ggml/src/ggml-cpu/ops.cpp",
             "    const bool use_split_kv_path = !use_ref && (neq1 == 1 && neq3 == 1) && kv_is_f32_or_f16 && (k->type == v->type) && q->type == GGML_TYPE_F32 && nek1 >= 512;\n",
             "    const bool use_split_kv_path = !use_ref && (neq1 == 1 && neq3 == 1) && q->type == GGML_TYPE_F32 && nek1 >= 512; // gguftool: any cache type\n",
             where="replace"),
        # flash attention reads a V row of a table-decoded type (TQ3_1/2/3) by accumulating its blocks straight
        # into the output (gqt_mad_<name>), where upstream converts every row to floats first and then adds them
        Edit("ggml/src/ggml-cpu/ops.cpp", '#include "vec.h"\n',
             "".join(f'#include "gqt_{f}.h" // gguftool\n' for f in sorted({t.family for t in _table_decoded()}))),
        Edit("ggml/src/ggml-cpu/ops.cpp",
             "    ggml_to_float_t   const v_to_float     = ggml_get_type_traits(v->type)->to_float;\n",
             "    void (* const v_mad)(int64_t, float *, const void *, float) = params->use_ref ? NULL : // gguftool\n"
             + "".join(f"        v->type == GGML_TYPE_{t.name} ? gqt_mad_{t.ggml_name} :\n" for t in _table_decoded())
             + "        NULL;\n"),
        Edit("ggml/src/ggml-cpu/ops.cpp",
             "                if (v_to_float) {\n                    v_to_float(v_data, V32, DV);\n",
             "                if (v_mad) { // gguftool\n"
             "                    v_mad(DV, VKQ32, v_data, vs);\n"
             "                } else if (v_to_float) {\n                    v_to_float(v_data, V32, DV);\n",
             where="replace"),
        # decode's key split counts the keys the mask leaves, not the cells: a sliding-window layer holds its
        # window somewhere in a ring of cells twice its size, and an even split of the cells could give one
        # thread every key that is not masked while the other waits (the wait costs most with quantized
        # caches, whose keys cost more to read)
        Edit("ggml/src/ggml-cpu/ops.cpp", "static void ggml_compute_forward_flash_attn_ext_f16(\n",
             _FA_DECODE.replace("@TABLE_DECODED@", " || ".join(f"k->type == GGML_TYPE_{t.name}"
                                                                for t in _table_decoded())), where="before"),
        Edit("ggml/src/ggml-cpu/ops.cpp",
             "        const int64_t ic_start = ith * chunk_size;\n"
             "        const int64_t ic_end   = std::min(ic_start + chunk_size, nek1);\n",
             "        int64_t ic_start = ith * chunk_size;\n"
             "        int64_t ic_end   = std::min(ic_start + chunk_size, nek1);\n"
             "        gqt_fa_split(dst->src[3], nek1, ith, nth, &ic_start, &ic_end); // gguftool\n",
             where="replace"),
        Edit("ggml/src/ggml-cpu/ops.cpp",
             "        if (ic_start < nek1) {\n            for (int64_t q_head = 0; q_head < neq2; q_head++) {\n",
             "        if (ic_start < ic_end && gqt_fa_grouped(params, dst, ic_start, ic_end, chunk_partials, partial_stride)) {\n"
             "            // gguftool: every query head of a K/V head at once\n"
             "        } else if (ic_start < ic_end) {\n            for (int64_t q_head = 0; q_head < neq2; q_head++) {\n",
             where="replace"),
        # every thread leaves partials (an empty range: M = -inf, S = 0, which the reduction skips), so it
        # reads them all instead of the ranges an even split would have given
        Edit("ggml/src/ggml-cpu/ops.cpp",
             "        ggml_flash_attn_ext_reduce_partials(params, dst, nth, chunk_size);\n",
             "        ggml_flash_attn_ext_reduce_partials(params, dst, nth, 0); // gguftool: see gqt_fa_split\n",
             where="replace"),
        # --cache-type-k/-v: upstream's list, then ours
        Edit("common/arg.cpp", "    GGML_TYPE_Q5_1,\n};\n",
             "    GGML_TYPE_Q5_1,\n"
             + "".join(f"    GGML_TYPE_{t.name}, // gguftool\n" for t in gtypes.CUSTOM_TYPES if t.kv_cache) + "};\n",
             where="replace"),
        # llama-bench -ctk/-ctv: accept every type name ggml knows (ours included)
        Edit("tools/llama-bench/llama-bench.cpp",
             '    if (s == "iq4_nl") {\n        return GGML_TYPE_IQ4_NL;\n    }\n',
             "    for (int i = 0; i < GGML_TYPE_COUNT; ++i) { // gguftool: custom types by name\n"
             "        const char * name = ggml_type_name((ggml_type) i);\n"
             "        if (name && s == name && ggml_type_size((ggml_type) i) > 0) {\n"
             "            return (ggml_type) i;\n"
             "        }\n"
             "    }\n"),
        # llama-quantize: a file type per custom type (ftype value = type id, cast: llama.h stays
        # untouched so only three files recompile); rows that a type's block does not divide fall
        # back to its table fallback (llama.cpp's own rule for the rest)
        Edit("src/llama-quant.cpp", "        case LLAMA_FTYPE_MOSTLY_IQ3_M:   return GGML_TYPE_IQ3_S;\n",
             "".join(f"        case (llama_ftype) {t.id}: return GGML_TYPE_{t.name}; // gguftool\n"
                     for t in gtypes.CUSTOM_TYPES)),
        Edit("src/llama-quant.cpp", "            case GGML_TYPE_Q6_K:    return_type = GGML_TYPE_Q8_0;   break;\n",
             "".join(f"            case GGML_TYPE_{t.name}: return_type = GGML_TYPE_{t.fallback}; break; // gguftool\n"
                     for t in gtypes.CUSTOM_TYPES if t.fallback)),
        Edit("src/llama-model-loader.cpp",
             '        case LLAMA_FTYPE_MOSTLY_Q4_1:      name = LLAMA_FTYPE_PREFIX "Q4_1"; break;\n',
             "".join(f'        case (llama_ftype) {t.id}: name = LLAMA_FTYPE_PREFIX "{t.name}"; break; // gguftool\n'
                     for t in gtypes.CUSTOM_TYPES)),
        Edit("src/llama-model-loader.cpp",
             "            case GGML_TYPE_Q4_1:    ftype = LLAMA_FTYPE_MOSTLY_Q4_1;    break;\n",
             "".join(f"            case GGML_TYPE_{t.name}: ftype = (llama_ftype) {t.id}; break; // gguftool\n"
                     for t in gtypes.CUSTOM_TYPES)),
        Edit("tools/quantize/quantize.cpp",
             '    { "Q4_1",     LLAMA_FTYPE_MOSTLY_Q4_1,     " 4.78G, +0.4511 ppl @ Llama-3-8B",  },\n',
             "".join(f'    {{ "{t.name}", (llama_ftype) {t.id}, " {t.bpw:.2f} bpw, gguftool type {t.id}", }},\n'
                     for t in gtypes.CUSTOM_TYPES)),
        # llama-quantize records the custom types its output uses, as gguftool's writer does (a
        # reader checks them against its own table)
        Edit("src/llama-quant.cpp", "    // Set split info if needed\n", _quantize_type_records(), where="before"),
        # -fa auto already turns flash attention on for a quantized V cache (which needs it), but
        # says so at INFO level, hidden by default: make it a visible warning
        Edit("src/llama-context.cpp",
             '            LLAMA_LOG_INFO("%s: enabling flash_attn since it is required for quantized V cache\\n", __func__);\n',
             '            LLAMA_LOG_WARN("%s: enabling flash_attn since it is required for quantized V cache (%s)\\n", '
             '__func__, ggml_type_name(params.type_v)); // gguftool: visible by default\n',
             where="replace"),
        # KV calibration (gguftool/native/patches/gqt_kv_calib.h): loaded with the model, bound to
        # each layer's K cache tensor, applied around the attention of both KV-cache graph builders
        Edit("src/CMakeLists.txt", "    llama-kv-cache.cpp\n", "    ../gguftool/gqt_kv_calib.cpp # gguftool\n"),
        Edit("src/llama-model.cpp", '#include "llama-model.h"\n', KV_CALIB_INCLUDE, count=1),
        Edit("src/llama-model.cpp", "bool llama_model_base::load_tensors(llama_model_loader & ml) {\n",
             "    gqt_kv_calib_load(this, ml.metadata, hparams); // gguftool\n"
             "    gqt_kv_plan_load(this, ml.metadata, (int) hparams.n_layer_all); // gguftool\n"),
        Edit("src/llama-model.cpp", "llama_model::~llama_model() {\n", "    gqt_kv_calib_forget(this); // gguftool\n"),
        Edit("src/llama-kv-cache.cpp", '#include "llama-kv-cache.h"\n', KV_CALIB_INCLUDE, count=1),
        Edit("src/llama-kv-cache.cpp",
             "        ggml_tensor * k = has_k ? ggml_new_tensor_3d(ctx, type_k, n_embd_k_gqa, kv_size, n_stream) : nullptr;\n"
             "        ggml_tensor * v = has_v ? ggml_new_tensor_3d(ctx, type_v, n_embd_v_gqa, kv_size, n_stream) : nullptr;\n",
             "        ggml_tensor * k = has_k ? ggml_new_tensor_3d(ctx, gqt_kv_layer_type(&model, il, type_k, false), n_embd_k_gqa, kv_size, n_stream) : nullptr; // gguftool\n"
             "        ggml_tensor * v = has_v ? ggml_new_tensor_3d(ctx, gqt_kv_layer_type(&model, il, type_v, true), n_embd_v_gqa, kv_size, n_stream) : nullptr; // gguftool\n",
             where="replace"),
        Edit("src/llama-kv-cache.cpp", "        layers.push_back({ il, k, v, k_stream, v_stream, });\n",
             "        gqt_kv_calib_bind(k, &model, il); // gguftool\n"),
        Edit("src/llama-graph.cpp", '#include "llama-graph.h"\n', KV_CALIB_INCLUDE, count=1),
        Edit("src/llama-graph.cpp",
             "    if (inp->self_k_rot) {\n        q_cur = llama_mul_mat_hadamard(ctx0, q_cur, inp->self_k_rot);\n",
             _calib_in("inp->mctx"), where="before"),
        Edit("src/llama-graph.cpp",
             "    if (inp->self_v_rot) {\n        cur = llama_mul_mat_hadamard(ctx0, cur, inp->self_v_rot);\n    }\n",
             KV_CALIB_OUT),
        Edit("src/llama-graph.cpp",
             "    auto * k_rot = is_swa ? inp->self_k_rot_swa : inp->self_k_rot;\n"
             "    auto * v_rot = is_swa ? inp->self_v_rot_swa : inp->self_v_rot;\n",
             _calib_in("(is_swa ? inp->mctx->get_swa() : inp->mctx->get_base())")),
        Edit("src/llama-graph.cpp", "    if (v_rot) {\n        cur = llama_mul_mat_hadamard(ctx0, cur, v_rot);\n    }\n",
             KV_CALIB_OUT),
        # build our kernels into ggml-base / ggml-cpu (after all backends are added)
        Edit("ggml/src/CMakeLists.txt", "target_link_libraries(ggml-base PRIVATE Threads::Threads)\n",
             "include(${CMAKE_CURRENT_SOURCE_DIR}/../../gguftool/gguftool.cmake) # gguftool kernels\n"),
    ]


CMAKE_TEMPLATE = """\
# Generated by gguftool/native/integrate.py: gguftool's kernels, compiled from the files the
# Python extension compiles (copied from gguftool/_fast, hashes in manifest.json).
set(GQT_DIR "${CMAKE_CURRENT_LIST_DIR}/kernels")
set(GQT_BASE_SOURCES @BASE@)
set(GQT_CPU_SOURCES @CPU@)
list(TRANSFORM GQT_BASE_SOURCES PREPEND "${GQT_DIR}/")
list(TRANSFORM GQT_CPU_SOURCES PREPEND "${GQT_DIR}/")
target_sources(ggml-base PRIVATE ${GQT_BASE_SOURCES})
target_include_directories(ggml-base PRIVATE ${GQT_DIR})
if (TARGET ggml-cpu)
    target_sources(ggml-cpu PRIVATE ${GQT_CPU_SOURCES})
    target_include_directories(ggml-cpu PRIVATE ${GQT_DIR})
endif()
# byte parity with the Python build: no FMA contraction in our files
set_source_files_properties(${GQT_BASE_SOURCES} ${GQT_CPU_SOURCES}
    TARGET_DIRECTORY ggml-base ggml-cpu PROPERTIES COMPILE_OPTIONS "-ffp-contract=off")
# the SIMD dots may read ggml-cpu's fp16 -> fp32 table (exact, cheaper than vcvtph2ps)
set_source_files_properties(${GQT_CPU_SOURCES}
    TARGET_DIRECTORY ggml-cpu PROPERTIES COMPILE_DEFINITIONS "GQT_GGML_FP16_TABLE=1")

# parity / SIMD check harness (gguftool/native/patches/gqt_check.c)
add_executable(gguftool-check ${CMAKE_CURRENT_LIST_DIR}/gqt_check.c)
target_include_directories(gguftool-check PRIVATE ${GQT_DIR} ${CMAKE_CURRENT_LIST_DIR}/../ggml/include)
target_link_libraries(gguftool-check PRIVATE ggml ggml-base)
if (TARGET ggml-cpu)
    target_link_libraries(gguftool-check PRIVATE ggml-cpu)
endif()

# attention-input dump for offline KV calibration (gguftool/native/patches/gqt_kvdump.cpp)
add_executable(gguftool-kvdump ${CMAKE_CURRENT_LIST_DIR}/gqt_kvdump.cpp)
target_link_libraries(gguftool-kvdump PRIVATE llama-common llama ${CMAKE_THREAD_LIBS_INIT})

# ggml's quantizers for Python's ctypes (gguftool/native/patches/gqt_ggml_lib.c): ggml-base in a
# shared library beside the tools; ggml-base holds no hot kernels, so PIC costs the tools nothing
set_target_properties(ggml-base PROPERTIES POSITION_INDEPENDENT_CODE ON)
add_library(gguftool-ggml SHARED ${CMAKE_CURRENT_LIST_DIR}/gqt_ggml_lib.c)
target_include_directories(gguftool-ggml PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../ggml/include)
target_link_libraries(gguftool-ggml PRIVATE ggml-base)
set_target_properties(gguftool-ggml PROPERTIES PREFIX "" SUFFIX ".so"
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
"""


PYTHON_ONLY = {"gqt_convert.c", "gqt_convert.h"}   # the fp16 cast behind the Python reader: not a ggml kernel


def kernel_files(kernel_dir: Path = KERNEL_DIR) -> list[Path]:
    return sorted(p for p in [*kernel_dir.glob("gqt_*.c"), *kernel_dir.glob("gqt_*.h")] if p.name not in PYTHON_ONLY)


def required_kernels_present(kernel_dir: Path = KERNEL_DIR) -> list[str]:
    """Names of the kernel files the integration needs that are missing."""
    need = ["gqt_common.h", "gqt_types.h", *(f"gqt_{f}{ext}" for f in _families() for ext in (".h", ".c"))]
    return [n for n in need if not (kernel_dir / n).is_file()]


def _write_if_changed(path: Path, data: bytes) -> bool:
    if path.is_file() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".gguftool-tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return True


def inputs_digest(kernel_dir: Path = KERNEL_DIR) -> dict[str, str]:
    """sha256 of everything that decides the patched tree (for the build cache key)."""
    d = {"sdist": source.PINNED.sha256, "types": gtypes.render_ggml_enum_lines()}
    for p in kernel_files(kernel_dir):
        d[f"kernels/{p.name}"] = hashlib.sha256(p.read_bytes()).hexdigest()
    for p in sorted(PATCH_DIR.glob("*")):
        if p.is_file():
            d[f"patches/{p.name}"] = hashlib.sha256(p.read_bytes()).hexdigest()
    d["integrate.py"] = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    return d


def integrate(tree: Path, kernel_dir: Path = KERNEL_DIR, log=print) -> dict:
    """Apply all edits to `tree` (unpacked pinned llama.cpp) and copy our kernels in.

    Returns the manifest (edited files, kernel hashes) that is also written to
    <tree>/gguftool/manifest.json."""
    missing = required_kernels_present(kernel_dir)
    if missing:
        raise GgufToolError(f"kernel sources missing from {kernel_dir}: {', '.join(missing)}",
                            "run from a complete gguftool checkout or installation")
    all_edits = edits()
    paths = sorted({e.path for e in all_edits})
    gq = tree / "gguftool"
    manifest_path = gq / "manifest.json"
    old = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    # files edited by an earlier integration but not by this one go back to pristine
    stale = sorted(set(old.get("edited", [])) - set(paths))
    pristine = source.read_pristine(paths + stale)
    changed = []
    for rel in stale:
        if _write_if_changed(tree / rel, pristine[rel].encode()):
            changed.append(rel)
    for rel in paths:
        text = pristine[rel]
        for e in all_edits:
            if e.path == rel:
                text = e.apply(text)
        if _write_if_changed(tree / rel, text.encode()):
            changed.append(rel)

    kfiles = kernel_files(kernel_dir)
    kernels = {}
    for p in kfiles:
        data = p.read_bytes()
        kernels[p.name] = hashlib.sha256(data).hexdigest()
        if _write_if_changed(gq / "kernels" / p.name, data):
            changed.append(f"gguftool/kernels/{p.name}")
    # kernel files that disappeared from the package must not linger in the build
    for p in sorted((gq / "kernels").glob("*")):
        if p.name not in kernels:
            p.unlink()
            changed.append(f"gguftool/kernels/{p.name} (removed)")
    csrc = [p.name for p in kfiles if p.suffix == ".c"]
    cpu = [n for n in csrc if "_simd" in n]
    base = [n for n in csrc if n not in cpu]
    cmake = CMAKE_TEMPLATE.replace("@BASE@", " ".join(base)).replace("@CPU@", " ".join(cpu))
    if _write_if_changed(gq / "gguftool.cmake", cmake.encode()):
        changed.append("gguftool/gguftool.cmake")
    for name in ("gqt_check.c", "gqt_kvdump.cpp", "gqt_kv_calib.h", "gqt_kv_calib.cpp", "gqt_ggml_lib.c"):
        if _write_if_changed(gq / name, (PATCH_DIR / name).read_bytes()):
            changed.append(f"gguftool/{name}")

    manifest = {
        "llama_commit": source.PINNED.llama_commit,
        "sdist_sha256": source.PINNED.sha256,
        "edited": paths,
        "kernels": kernels,
        "base_sources": base,
        "cpu_sources": cpu,
        "type_count": _type_count(),
    }
    _write_if_changed(manifest_path, (json.dumps(manifest, indent=1) + "\n").encode())
    if changed:
        log(f"integration: updated {len(changed)} file(s): {', '.join(changed[:8])}{' ...' if len(changed) > 8 else ''}")
    return manifest


def check_enum_collisions() -> list[str]:
    """Collisions of our ids with the upstream enum in the pinned (pristine) ggml.h."""
    text = source.read_pristine(["ggml/include/ggml.h"])["ggml/include/ggml.h"]
    ids = {m.group(1): int(m.group(2)) for m in re.finditer(r"GGML_TYPE_(\w+)\s*=\s*(\d+)", text)}
    ids.pop("COUNT", None)
    return gtypes.collisions(ids)
