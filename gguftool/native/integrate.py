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
KV_FUSED_INCLUDE = '#include "../../../gguftool/gqt_kv_fused.h" // gguftool\n'


def _ours(t: str) -> str:
    """C test: tensor `t` is of one of our cache types"""
    return "(" + " || ".join(f"{t}->type == GGML_TYPE_{c.name}" for c in gtypes.CUSTOM_TYPES if c.kv_cache) + ")"


def _calib_in(mctx: str, k_rot: str, v_rot: str) -> str:
    """build_attn's calibration lines: find the layer's calibration through its K cache tensor, decide which
    sides run it and the rotation inside the kernels (gqt_kv_fused.h), and edit q/k/v of the other sides
    before the rotation. Not with logit soft-capping, which a per-query shift changes."""
    return (
        "    // gguftool: KV calibration (gguftool/gqt_kv_calib.h), inside the kernels where it can be\n"
        "    const gqt_kv_calib_layer * gqt_calib = nullptr;\n"
        "    bool gqt_kq = false, gqt_vq = false;\n"
        "    gqt_kv_fused gqt_fuse;\n"
        "    if (!cparams.training && !hparams.attn_soft_cap) {\n"
        f"        ggml_tensor * gqt_kc = {mctx}->get_k(ctx0, il);\n"
        f"        ggml_tensor * gqt_vc = v_cur ? {mctx}->get_v(ctx0, il) : nullptr;\n"
        "        gqt_calib = gqt_kv_calib_find(gqt_kc);\n"
        "        gqt_kq = ggml_is_quantized(gqt_kc->type);\n"
        "        gqt_vq = gqt_vc && ggml_is_quantized(gqt_vc->type);\n"
        "        gqt_fuse = gqt_kv_fuse_plan(gqt_calib, cparams.flash_attn && kq_b == nullptr && v_mla == nullptr,\n"
        f"                                    gqt_kc, {_ours('gqt_kc')},\n"
        f"                                    gqt_vc, gqt_vc && {_ours('gqt_vc')}, {k_rot}, {v_rot});\n"
        "        gqt_kv_calib_apply_in(ctx0, gqt_calib, gqt_kq && !gqt_fuse.k, gqt_vq && !gqt_fuse.v, &q_cur, &k_cur, &v_cur);\n"
        "    }\n")


def _calib_out(v_rot_if: str, v_rot: str) -> str:
    """after build_attn_mha: mark the fused nodes, the graph's own V rotation and mean for a side not fused"""
    return (
        "    gqt_kv_fuse_mark(gf, gqt_fuse, cur); // gguftool\n"
        f"    if ({v_rot_if}) {{\n        cur = llama_mul_mat_hadamard(ctx0, cur, {v_rot});\n    }}\n"
        "    cur = gqt_kv_calib_apply_out(ctx0, gqt_calib, gqt_vq && !gqt_fuse.v, cur); // gguftool\n")


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

// gguftool: a tile of keys at a time. Vectors of 8 floats in GCC's vector extensions (clang has them too): one
// source for AVX2, SSE2 and NEON, where GGML_F32_VEC's width is not fixed on SVE
typedef float gqt_f8 __attribute__((vector_size(32)));
// loads and stores by memcpy (unaligned); no vector is passed or returned by value, which changes the ABI where
// AVX is off (GCC's -Wpsabi warning)
static inline void gqt_ld8(gqt_f8 * v, const float * p) { memcpy(v, p, sizeof *v); }
static inline void gqt_st8(float * p, const gqt_f8 * v) { memcpy(p, v, sizeof *v); }

static inline float gqt_hsum8(const gqt_f8 * v) {
    typedef float gqt_f4 __attribute__((vector_size(16)));
    gqt_f4 lo, hi;
    memcpy(&lo, v, sizeof lo);
    memcpy(&hi, (const char *) v + sizeof lo, sizeof hi);
    lo += hi;
    return (lo[0] + lo[2]) + (lo[1] + lo[3]);
}

// s[g*T + t] = q[g] . K[t] for NG heads and n decoded keys, two keys at a time: each row is loaded once for all
// the heads and each query chunk once for both keys, and the 2*NG sums are independent chains
template <int NG>
static void gqt_fa_dot_tile(int64_t D, int n, const float * K, const float * const * q, float * s, int T) {
    const int64_t D8 = D & ~(int64_t) 7;
    int t = 0;
    for (; t + 2 <= n; t += 2) {
        const float * k0 = K + t*D, * k1 = k0 + D;
        gqt_f8 a[NG][2];
        for (int g = 0; g < NG; ++g) a[g][0] = a[g][1] = gqt_f8 {};
        for (int64_t d = 0; d < D8; d += 8) {
            gqt_f8 x0, x1, y;
            gqt_ld8(&x0, k0 + d);
            gqt_ld8(&x1, k1 + d);
            for (int g = 0; g < NG; ++g) {
                gqt_ld8(&y, q[g] + d);
                a[g][0] += y * x0;
                a[g][1] += y * x1;
            }
        }
        for (int g = 0; g < NG; ++g) {
            float r0 = gqt_hsum8(&a[g][0]), r1 = gqt_hsum8(&a[g][1]);
            for (int64_t e = D8; e < D; ++e) { r0 += q[g][e] * k0[e]; r1 += q[g][e] * k1[e]; }
            s[g*T + t] = r0;
            s[g*T + t + 1] = r1;
        }
    }
    for (; t < n; ++t) {
        const float * k0 = K + t*D;
        for (int g = 0; g < NG; ++g) {
            gqt_f8 a = {};
            for (int64_t d = 0; d < D8; d += 8) {
                gqt_f8 x, y;
                gqt_ld8(&x, k0 + d);
                gqt_ld8(&y, q[g] + d);
                a += x * y;
            }
            float r = gqt_hsum8(&a);
            for (int64_t e = D8; e < D; ++e) r += q[g][e] * k0[e];
            s[g*T + t] = r;
        }
    }
}

// acc[g][0..D) += sum over t < n of w[g*T + t] * V[t]: the accumulators stay in registers over the tile, where a
// mad per key and head loads and stores them every time
template <int NG>
static void gqt_fa_mad_tile(int64_t D, int n, const float * V, const float * w, int T, float * const * acc) {
    int64_t d = 0;
    for (; d + 16 <= D; d += 16) {
        gqt_f8 a[NG][2];
        for (int g = 0; g < NG; ++g) { gqt_ld8(&a[g][0], acc[g] + d); gqt_ld8(&a[g][1], acc[g] + d + 8); }
        for (int t = 0; t < n; ++t) {
            gqt_f8 v0, v1;
            gqt_ld8(&v0, V + t*D + d);
            gqt_ld8(&v1, V + t*D + d + 8);
            for (int g = 0; g < NG; ++g) {
                const float x = w[g*T + t];
                a[g][0] += x * v0;
                a[g][1] += x * v1;
            }
        }
        for (int g = 0; g < NG; ++g) { gqt_st8(acc[g] + d, &a[g][0]); gqt_st8(acc[g] + d + 8, &a[g][1]); }
    }
    for (; d < D; ++d) {
        for (int g = 0; g < NG; ++g) {
            for (int t = 0; t < n; ++t) acc[g][d] += w[g*T + t] * V[t*D + d];
        }
    }
}

// the templates for 1..4 heads, over the group's heads four at a time
template <template <int> class F, typename... A>
static void gqt_fa_heads(int64_t G, A... a) {
    for (int64_t g = 0; g < G; g += 4) {
        switch (G - g < 4 ? G - g : 4) {
            case 1: F<1>::run(g, a...); break;
            case 2: F<2>::run(g, a...); break;
            case 3: F<3>::run(g, a...); break;
            default: F<4>::run(g, a...); break;
        }
    }
}
template <int NG> struct gqt_fa_dot_heads {
    static void run(int64_t g, int64_t D, int n, const float * K, const float * const * q, float * s, int T) {
        gqt_fa_dot_tile<NG>(D, n, K, q + g, s + g*T, T);
    }
};
template <int NG> struct gqt_fa_mad_heads {
    static void run(int64_t g, int64_t D, int n, const float * V, const float * w, int T, float * const * acc) {
        gqt_fa_mad_tile<NG>(D, n, V, w + g*T, T, acc + g);
    }
};

// gguftool: decode with grouped-query attention reads each quantized K and V row once for all the query heads
// that share it, where upstream's chunk code reads it once per head. The keys go in tiles: the tile's V rows
// are decoded (to_float), its scores turned into weights by one vectorized exp per head, and the weighted rows
// added to every head's accumulator with the accumulators held in registers. A TQ3_3, Q4_0, Q5_0, Q8_0 or
// IQ4_NL K row becomes int8 levels once and is dotted with all the group's queries at once in Q8_0
// (gqt_kv_dot.h, four heads per accumulator; at Gemma 3's 4 heads of 256 the op took 0.82x the time of
// decoding a TQ3_3 row to floats, 0.90x that of q5_0's and iq4_nl's vec_dot per head); a TQ3_1/TQ3_2 K row is
// decoded (table look-up) and dotted with each head's exact f32 query; other K types keep their own vec_dot
// with the query in their dot type, quantized once per call (decoded to floats, q5_0 and iq4_nl keys ran 1.3x
// slower). false: not this case, the caller runs upstream's code.
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
    const int64_t G = nh / nhk, G4 = (G + 3) & ~3;
    // a K type of an integer per value and a scale per block (gqt_kv_dot.h): each row turned into int8 levels
    // once and dotted with the group's Q8_0 queries (as upstream's chunk code and prefill take the query), where
    // its vec_dot unpacks it once per head; other table-decoded K rows are decoded to floats
    const int k_levels = ggml_get_type_traits_cpu(k->type)->vec_dot_type != GGML_TYPE_Q8_0 ? -1 :
        k->type == GGML_TYPE_Q4_0 ? GQT_KV_DOT_Q4_0 : k->type == GGML_TYPE_Q5_0 ? GQT_KV_DOT_Q5_0 :
        k->type == GGML_TYPE_Q8_0 ? GQT_KV_DOT_Q8_0 : k->type == GGML_TYPE_IQ4_NL ? GQT_KV_DOT_IQ4_NL :
        k->type == GGML_TYPE_TQ3_3 ? GQT_KV_DOT_TQ3_3 : -1;
    const bool k_decode = k_levels < 0 && (@TABLE_DECODED@);
    const ggml_type k_dot_type = ggml_get_type_traits_cpu(k->type)->vec_dot_type;
    ggml_vec_dot_t const kq_vec_dot = ggml_get_type_traits_cpu(k->type)->vec_dot;
    const size_t q_row = ggml_row_size(k_dot_type, DK);
    // keys per tile: the tile's decoded rows (16 KiB) stay in L1 while every head reads them
    const int T = (int) std::max<int64_t>(4, std::min<int64_t>(32, 2048 / std::max(DK, DV)));
    // per thread: the group's queries in K's dot type, the tile's decoded K and V rows, its scores (then
    // weights) per head, and [M, S, VKQ] per head (the partials of the threads share cache lines, and writing
    // them per key made two threads slower than one)
    static thread_local std::vector<char> q_dot;
    static thread_local std::vector<float> q_d, k_d;
    static thread_local std::vector<int8_t> k_lv;
    static thread_local std::vector<float> buf;
    buf.resize(T*(DK + DV) + G*T + G*(2 + DV));
    float * Kt = buf.data(), * Vt = Kt + T*DK, * st = Vt + T*DV, * acc = st + G*T;
    static thread_local std::vector<float *> vkq;
    static thread_local std::vector<const float *> qh;
    static thread_local std::vector<float> qbuf;   // the group's queries where the node rotates them
    vkq.resize(G);
    qh.resize(G);
    qbuf.resize(G*DK);
    int64_t cell[32];
    const ggml_fp16_t * mp = mask ? (const ggml_fp16_t *) mask->data : NULL;
    const ggml_fp16_t ninf = GGML_CPU_FP32_TO_FP16(-INFINITY);
    // online softmax: one more score s with no value row (a sink) into p = [M, S, VKQ]
    auto add_sink = [DV](float * p, float s) {
        if (s > p[0]) {
            const float ms = expf(p[0] - s);
            p[0] = s;
            ggml_vec_scale_f32(DV, p + 2, ms);
            p[1] = p[1]*ms + 1.0f;
        } else {
            p[1] += expf(s - p[0]);
        }
    };
    if (!k_decode) {
        q_dot.resize(G * q_row);
        q_d.assign(G4 * (DK/32), 0.0f);
        k_lv.resize(DK);
        k_d.resize(DK/32);
    }
    for (int64_t hk = 0; hk < nhk; ++hk) {
        for (int64_t g = 0; g < G; ++g) {
            float * p = acc + g * (2 + DV);
            p[0] = -INFINITY;
            p[1] = 0.0f;
            memset(p + 2, 0, DV * sizeof(float));
            vkq[g] = p + 2;
            qh[g] = gqt_fa_q(dst, hk*G + g, (const float *) ((const char *) q->data + (hk*G + g)*q->nb[2]),
                             qbuf.data() + g*DK);
            if (!k_decode) {
                ggml_get_type_traits_cpu(k_dot_type)->from_float(qh[g], q_dot.data() + g*q_row, DK);
                if (k_levels >= 0) {   // its Q8_0 scales as floats, once per call
                    const gqt_block_q8_0 * yb = (const gqt_block_q8_0 *) (q_dot.data() + g*q_row);
                    for (int64_t j = 0; j < DK/32; ++j) {
                        q_d[j*G4 + g] = gqt_fp16_to_fp32(yb[j].d);
                    }
                }
            }
        }
        for (int64_t ic = ic0; ic < ic1; ) {
            // the next tile: up to T keys the mask leaves
            int n = 0;
            for (; ic < ic1 && n < T; ++ic) {
                if (!mp || mp[ic] != ninf) {
                    cell[n++] = ic;
                }
            }
            if (n == 0) {
                break;
            }
            const char * k_base = (const char *) k->data + hk*k->nb[2];
            const char * v_base = (const char *) v->data + hk*v->nb[2];
            if (k_decode) {
                for (int t = 0; t < n; ++t) {
                    k_to_float(k_base + cell[t]*k->nb[1], Kt + t*DK, DK);
                }
                gqt_fa_heads<gqt_fa_dot_heads>(G, DK, n, (const float *) Kt, (const float * const *) qh.data(), st, T);
            } else if (k_levels >= 0) {
                for (int t = 0; t < n; ++t) {
                    gqt_kv_levels(k_levels, k_base + cell[t]*k->nb[1], DK, k_lv.data(), k_d.data());
                    gqt_kv_dot_heads(DK, k_lv.data(), k_d.data(), q_dot.data(), q_row, q_d.data(), (int) G, st + t, T);
                }
            } else {
                for (int t = 0; t < n; ++t) {
                    for (int64_t g = 0; g < G; ++g) {
                        kq_vec_dot(DK, st + g*T + t, 0, k_base + cell[t]*k->nb[1], 0, q_dot.data() + g*q_row, 0, 1);
                    }
                }
            }
            for (int t = 0; t < n; ++t) {
                v_to_float(v_base + cell[t]*v->nb[1], Vt + t*DV, DV);
            }
            for (int64_t g = 0; g < G; ++g) {
                const int64_t h = hk*G + g;
                const float hs = max_bias > 0.0f ? (h < n_head_log2 ? powf(m0, h + 1) : powf(m1, 2*(h - n_head_log2) + 1)) : 1.0f;
                float * s = st + g*T, * p = acc + g*(2 + DV);
                float mx = -INFINITY;
                for (int t = 0; t < n; ++t) {
                    float x = s[t]*scale;
                    if (softcap != 0.0f) {
                        x = softcap*tanhf(x);
                    }
                    s[t] = x + (mp ? hs*GGML_CPU_FP16_TO_FP32(mp[cell[t]]) : 0.0f);
                    mx = std::max(mx, s[t]);
                }
                if (mx > p[0]) {   // a new maximum: rescale what is there
                    if (p[1] != 0.0f) {
                        const float ms = expf(p[0] - mx);
                        ggml_vec_scale_f32(DV, p + 2, ms);
                        p[1] *= ms;
                    }
                    p[0] = mx;
                }
                p[1] += (float) ggml_vec_soft_max_f32(n, s, s, p[0]);   // the scores become weights
            }
            gqt_fa_heads<gqt_fa_mad_heads>(G, DV, n, (const float *) Vt, (const float *) st, T, vkq.data());
        }
        for (int64_t g = 0; g < G; ++g) {
            float * p = acc + g*(2 + DV);
            if (sinks && ic0 == 0) {   // as upstream's chunk code: the chunk that starts at cell 0 adds them
                add_sink(p, ((const float *) sinks->data)[hk*G + g]);
            }
            memcpy(partials + (hk*G + g) * partial_stride, p, (2 + DV) * sizeof(float));
        }
    }
    return true;
}

"""

# FLASH_ATTN_EXT's and SET_ROWS's part of the fused calibration and rotation (patches/gqt_kv_fused.h)
_KV_FUSED_FA = """\
// gguftool: the fused calibration and rotation of a FLASH_ATTN_EXT node (gqt_kv_fused.h)
static inline const int32_t * gqt_fa_fused(const ggml_tensor * dst) {
    return dst->op_params[GQT_FA_FUSED_PARAM] == GQT_KV_FUSED_MAGIC ? dst->op_params + GQT_FA_FUSED_PARAM : NULL;
}

// query row pq of head h as the keys were written (times the calibration's scales, rotated): pq itself where
// the node has no K side, else buf (DK floats)
static const float * gqt_fa_q(const ggml_tensor * dst, int64_t h, const float * pq, float * buf) {
    const int32_t * f = gqt_fa_fused(dst);
    const ggml_tensor * s = dst->src[5];
    if (!f || (f[1] == 0 && !s)) {
        return pq;
    }
    const int64_t DK = dst->src[1]->ne[0];
    if (s) {
        const float * sh = (const float *) s->data + h*DK;
        for (int64_t j = 0; j < DK; ++j) {
            buf[j] = pq[j]*sh[j];
        }
    } else {
        memcpy(buf, pq, DK*sizeof(float));
    }
    if (f[1]) {
        gqt_fwht_groups(buf, DK, f[1]);
    }
    return buf;
}

// output row o (DV floats, normalized) of head h back in the model's domain: rotated back, plus the mean
static void gqt_fa_out(const ggml_tensor * dst, int64_t h, float * o) {
    const int32_t * f = gqt_fa_fused(dst);
    if (!f) {
        return;
    }
    const int64_t DV = dst->src[2]->ne[0];
    if (f[2]) {
        gqt_fwht_groups(o, DV, f[2]);
    }
    if (dst->src[6]) {
        const float * m = (const float *) dst->src[6]->data + h*DV;
        for (int64_t d = 0; d < DV; ++d) {
            o[d] = o[d] + m[d];
        }
    }
}

"""

_KV_FUSED_SET_ROWS = """\
// gguftool: a row of a fused SET_ROWS node as the cache stores it ((row - mean) * mul, rotated; gqt_kv_fused.h)
static const float * gqt_set_rows_row(const ggml_tensor * dst, const float * row, int64_t nc) {
    if (dst->op_params[0] != GQT_KV_FUSED_MAGIC) {
        return row;
    }
    static thread_local std::vector<float> buf;
    buf.resize(nc);
    const float * mean = dst->src[3] ? (const float *) dst->src[3]->data : NULL;
    const float * mul = dst->src[4] ? (const float *) dst->src[4]->data : NULL;
    for (int64_t j = 0; j < nc; ++j) {
        float x = row[j];
        if (mean) {
            x = x - mean[j];
        }
        if (mul) {
            x = x*mul[j];
        }
        buf[j] = x;
    }
    if (dst->op_params[1]) {
        gqt_fwht_groups(buf.data(), nc, dst->op_params[1]);
    }
    return buf.data();
}

"""

# ggml_compute_forward_set_rows_impl: fewer rows than threads (a decode step writes one row per layer, with
# n_tasks > 1 only for our types): each thread quantizes its share of the blocks of every row
_SET_ROWS_SPLIT = """\
    if constexpr (std::is_same_v<src_t, float>) { // gguftool
        const int64_t bs = ggml_blck_size(dst->type), nblk = nc / bs;
        if (nth > 1 && nr < nth && nblk >= nth) {
            const int64_t b0 = nblk*ith/nth, b1 = nblk*(ith + 1)/nth;
            for (int64_t i03 = 0; i03 < ne03; ++i03) {
                for (int64_t i02 = 0; i02 < ne02; ++i02) {
                    for (int64_t i = 0; i < nr; ++i) {
                        const int64_t i1 = *(idx_t *) ((char *) src1->data + i*nb10 + (i02%ne11)*nb11 + (i03%ne12)*nb12);
                        GGML_ASSERT(i1 >= 0 && i1 < ne1);
                        from_float(gqt_set_rows_row(dst, (const float *) ((char *) src0->data + i*nb01 + i02*nb02 + i03*nb03), nc) + b0*bs,
                                   (char *) dst->data + i1*nb1 + i02*nb2 + i03*nb3 + b0*ggml_type_size(dst->type),
                                   (b1 - b0)*bs);
                    }
                }
            }
            return;
        }
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
             "".join(f'#include "gqt_{f}.h" // gguftool\n' for f in sorted({t.family for t in _table_decoded()}))
             + '#include "gqt_kv_dot.h" // gguftool\n' + KV_FUSED_INCLUDE + "#include <vector> // gguftool\n"),
        # the calibration and rotation inside SET_ROWS and FLASH_ATTN_EXT (patches/gqt_kv_fused.h): the
        # cache's rows on their way in, the query before its dots, the output after its normalization
        Edit("ggml/src/ggml-cpu/ops.cpp", "template<typename src_t, typename idx_t>\nstatic void ggml_compute_forward_set_rows_impl(\n",
             _KV_FUSED_SET_ROWS,
             where="before"),
        Edit("ggml/src/ggml-cpu/ops.cpp",
             "                    from_float(\n"
             "                            (const float *) ((char *) src0->data +  i*nb01 + i02*nb02 + i03*nb03),\n",
             "                    from_float(gqt_set_rows_row(dst, // gguftool\n"
             "                            (const float *) ((char *) src0->data +  i*nb01 + i02*nb02 + i03*nb03), nc),\n",
             where="replace"),
        Edit("ggml/src/ggml-cpu/ops.cpp", "static void ggml_compute_forward_flash_attn_ext_f16_one_chunk(\n",
             _KV_FUSED_FA, where="before"),
        Edit("ggml/src/ggml-cpu/ops.cpp",
             "        q_to_vec_dot(pq, Q_q, DK);\n",
             "        static thread_local std::vector<float> gqt_qbuf; // gguftool\n"
             "        gqt_qbuf.resize(DK);\n"
             "        q_to_vec_dot(gqt_fa_q(dst, iq2, pq, gqt_qbuf.data()), Q_q, DK);\n", where="replace"),
        Edit("ggml/src/ggml-cpu/ops.cpp", "            ggml_vec_scale_f32(DV, VKQ32, S_inv);\n\n            // dst indices\n",
             "            ggml_vec_scale_f32(DV, VKQ32, S_inv);\n            gqt_fa_out(dst, iq2, VKQ32); // gguftool\n\n"
             "            // dst indices\n", where="replace"),
        Edit("ggml/src/ggml-cpu/ops.cpp", "            ggml_vec_scale_f32(DV, VKQ_final, S_inv);\n        }\n",
             "        gqt_fa_out(dst, q_head, VKQ_final); // gguftool\n"),
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
        # writing the cache: upstream runs SET_ROWS on one thread (a FIXME about GPU offload); our types'
        # quantizers search (TQ3_3's Viterbi costs ~15 us a 256-value row), so every thread takes a share,
        # and a decode step's single row is split by blocks
        Edit("ggml/src/ggml-cpu/ggml-cpu.c",
             "                //n_tasks = n_threads;\n                n_tasks = 1;\n",
             "                if (node->op == GGML_OP_SET_ROWS && " + _ours("node")
             + ") { // gguftool\n                    n_tasks = n_threads;\n                }\n"),
        Edit("ggml/src/ggml-cpu/ops.cpp",
             "    ggml_from_float_t const from_float = ggml_get_type_traits_cpu(dst->type)->from_float;\n",
             _SET_ROWS_SPLIT),
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
        # build_attn, unified cache: the calibration, then the rotation for a side not fused
        Edit("src/llama-graph.cpp",
             "    if (inp->self_k_rot) {\n        q_cur = llama_mul_mat_hadamard(ctx0, q_cur, inp->self_k_rot);\n",
             _calib_in("inp->mctx", "inp->self_k_rot", "inp->self_v_rot")
             + "    if (inp->self_k_rot && !gqt_fuse.k) { // gguftool\n"
               "        q_cur = llama_mul_mat_hadamard(ctx0, q_cur, inp->self_k_rot);\n", where="replace"),
        Edit("src/llama-graph.cpp",
             "    if (inp->self_v_rot) {\n        v_cur = llama_mul_mat_hadamard(ctx0, v_cur, inp->self_v_rot);\n",
             "    if (inp->self_v_rot && !gqt_fuse.v) { // gguftool\n"
             "        v_cur = llama_mul_mat_hadamard(ctx0, v_cur, inp->self_v_rot);\n", where="replace"),
        Edit("src/llama-graph.cpp",
             "    if (inp->self_v_rot) {\n        cur = llama_mul_mat_hadamard(ctx0, cur, inp->self_v_rot);\n    }\n",
             _calib_out("inp->self_v_rot && !gqt_fuse.v", "inp->self_v_rot"), where="replace"),
        # build_attn, sliding-window pair of caches: a fused side's rotation matrix is left out of the graph
        Edit("src/llama-graph.cpp",
             "    auto * k_rot = is_swa ? inp->self_k_rot_swa : inp->self_k_rot;\n"
             "    auto * v_rot = is_swa ? inp->self_v_rot_swa : inp->self_v_rot;\n",
             _calib_in("(is_swa ? inp->mctx->get_swa() : inp->mctx->get_base())", "k_rot", "v_rot")
             + "    if (gqt_fuse.k) k_rot = nullptr; // gguftool\n    if (gqt_fuse.v) v_rot = nullptr; // gguftool\n"),
        Edit("src/llama-graph.cpp", "    if (v_rot) {\n        cur = llama_mul_mat_hadamard(ctx0, cur, v_rot);\n    }\n",
             _calib_out("v_rot", "v_rot"), where="replace"),
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
    for name in ("gqt_check.c", "gqt_kvdump.cpp", "gqt_kv_calib.h", "gqt_kv_calib.cpp", "gqt_kv_fused.h",
                 "gqt_ggml_lib.c"):
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
