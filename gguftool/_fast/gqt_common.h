/* Shared by every gguftool kernel: fp16 conversion bit-identical to ggml's portable path,
 * and ggml's activation blocks (Q8_0, Q8_1) that our types are paired with in vec_dot.
 * Plain C99; compiled both by the Python extension and inside the native llama.cpp build.
 * Must not be built with -ffast-math: the fp16 rounding relies on IEEE float arithmetic. */
#pragma once
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include "gqt_types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t gqt_fp16;

/* ggml's block_q8_0 and block_q8_1 (ggml-common.h), byte for byte. */
typedef struct { gqt_fp16 d; int8_t qs[32]; } gqt_block_q8_0;
typedef struct { gqt_fp16 d; gqt_fp16 s; int8_t qs[32]; } gqt_block_q8_1;

static inline float gqt_f32_from_bits(uint32_t w) { float f; memcpy(&f, &w, 4); return f; }
static inline uint32_t gqt_f32_to_bits(float f) { uint32_t w; memcpy(&w, &f, 4); return w; }

/* ggml_compute_fp16_to_fp32 (ggml-impl.h), exact for every input. */
static inline float gqt_fp16_to_fp32(gqt_fp16 h) {
    const uint32_t w = (uint32_t) h << 16;
    const uint32_t sign = w & UINT32_C(0x80000000);
    const uint32_t two_w = w + w;
    const uint32_t exp_offset = UINT32_C(0xE0) << 23;
    const float normalized_value = gqt_f32_from_bits((two_w >> 4) + exp_offset) * 0x1.0p-112f;
    const uint32_t magic_mask = UINT32_C(126) << 23;
    const float denormalized_value = gqt_f32_from_bits((two_w >> 17) | magic_mask) - 0.5f;
    const uint32_t denormalized_cutoff = UINT32_C(1) << 27;
    const uint32_t result = sign |
        (two_w < denormalized_cutoff ? gqt_f32_to_bits(denormalized_value) : gqt_f32_to_bits(normalized_value));
    return gqt_f32_from_bits(result);
}

/* ggml_compute_fp32_to_fp16: round to nearest even, like numpy's astype(np.float16) and F16C. */
static inline gqt_fp16 gqt_fp32_to_fp16(float f) {
    const float scale_to_inf = 0x1.0p+112f;
    const float scale_to_zero = 0x1.0p-110f;
    float base = ((f < 0 ? -f : f) * scale_to_inf) * scale_to_zero;
    const uint32_t w = gqt_f32_to_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & UINT32_C(0x80000000);
    uint32_t bias = shl1_w & UINT32_C(0xFF000000);
    if (bias < UINT32_C(0x71000000)) bias = UINT32_C(0x71000000);
    base = gqt_f32_from_bits((bias >> 1) + UINT32_C(0x07800000)) + base;
    const uint32_t bits = gqt_f32_to_bits(base);
    const uint32_t exp_bits = (bits >> 13) & UINT32_C(0x00007C00);
    const uint32_t mantissa_bits = bits & UINT32_C(0x00000FFF);
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (gqt_fp16) ((sign >> 16) | (shl1_w > UINT32_C(0xFF000000) ? UINT16_C(0x7E00) : nonsign));
}

/* Functions written with GCC/clang vector extensions get an AVX2 clone on x86-64 Linux (picked at
 * load time; the default clone uses SSE2), since neither the wheel nor ggml-base is built with
 * -march. Elsewhere (arm64: NEON is the baseline) they compile once. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define GQT_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define GQT_MULTIVERSION
#endif

/* Error codes returned by the row quantizers with explicit parameters (the Python package reads
 * them from its extension). */
#define GQT_OK 0
#define GQT_ERR_NONFINITE (-1)   /* input holds NaN or +-Inf */
#define GQT_ERR_SHAPE (-2)       /* n_per_row does not divide the block size */
#define GQT_ERR_RANGE (-3)       /* a block's values are too far apart (or too large) for fp16 scale/zero */
#define GQT_ERR_PARAM (-4)       /* unknown target type or solver parameter out of range */
#define GQT_ERR_NOMEM (-5)       /* a workspace could not be allocated */

#ifdef __cplusplus
}
#endif
