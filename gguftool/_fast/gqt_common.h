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

/* C99 static assertion (a negative array size does not compile). */
#define GQT_STATIC_ASSERT(name, cond) typedef char gqt_static_assert_##name[(cond) ? 1 : -1]

/* ggml's block_q8_0 and block_q8_1 (ggml-common.h), byte for byte. */
typedef struct { gqt_fp16 d; int8_t qs[32]; } gqt_block_q8_0;
typedef struct { gqt_fp16 d; gqt_fp16 s; int8_t qs[32]; } gqt_block_q8_1;
GQT_STATIC_ASSERT(q8_0_block, sizeof(gqt_block_q8_0) == 34);
GQT_STATIC_ASSERT(q8_1_block, sizeof(gqt_block_q8_1) == 36);

/* Per-thread storage: the kernels' reusable scratch (never an allocation on ggml's per-row paths). */
#define GQT_THREAD_LOCAL __thread

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

/* The same two conversions on 8 lanes at once, operation for operation (GCC/clang vector extensions):
 * the HQQ solver rounds its scale/zero pairs lane-wise, the bulk fp16 reader converts 8 values a step.
 * fp16 values travel in the low half of 32-bit lanes. */
typedef uint32_t gqt_v8u __attribute__((vector_size(32)));
typedef float    gqt_v8f __attribute__((vector_size(32)));
#define GQT_V8(T, v) ((T) {(v), (v), (v), (v), (v), (v), (v), (v)})
#define GQT_V8_SEL(m, a, b) (((gqt_v8u) (m) & (gqt_v8u) (a)) | (~(gqt_v8u) (m) & (gqt_v8u) (b)))
/* out (gqt_v8f) = gqt_fp16_to_fp32 of each lane of h (gqt_v8u) */
#define GQT_V8_FP16_TO_FP32(out, h) do { \
        const gqt_v8u w_ = (h) << 16, two_w_ = w_ + w_; \
        const gqt_v8f norm_ = (gqt_v8f) ((two_w_ >> 4) + GQT_V8(gqt_v8u, 0xE0u << 23)) * GQT_V8(gqt_v8f, 0x1.0p-112f); \
        const gqt_v8f denorm_ = (gqt_v8f) ((two_w_ >> 17) | GQT_V8(gqt_v8u, 126u << 23)) - GQT_V8(gqt_v8f, 0.5f); \
        (out) = (gqt_v8f) ((w_ & GQT_V8(gqt_v8u, 0x80000000u)) | \
                           GQT_V8_SEL(two_w_ < GQT_V8(gqt_v8u, 1u << 27), denorm_, norm_)); \
    } while (0)
/* out (gqt_v8u) = gqt_fp32_to_fp16 of each lane of f (gqt_v8f) */
#define GQT_V8_FP32_TO_FP16(out, f) do { \
        const gqt_v8u w_ = (gqt_v8u) (f), shl1_w_ = w_ + w_; \
        gqt_v8u bias_ = shl1_w_ & GQT_V8(gqt_v8u, 0xFF000000u); \
        bias_ = GQT_V8_SEL(bias_ < GQT_V8(gqt_v8u, 0x71000000u), GQT_V8(gqt_v8u, 0x71000000u), bias_); \
        const gqt_v8f base_ = (gqt_v8f) ((bias_ >> 1) + GQT_V8(gqt_v8u, 0x07800000u)) + \
            ((gqt_v8f) (w_ & GQT_V8(gqt_v8u, 0x7FFFFFFFu)) * GQT_V8(gqt_v8f, 0x1.0p+112f)) * GQT_V8(gqt_v8f, 0x1.0p-110f); \
        const gqt_v8u bits_ = (gqt_v8u) base_; \
        const gqt_v8u nonsign_ = ((bits_ >> 13) & GQT_V8(gqt_v8u, 0x7C00u)) + (bits_ & GQT_V8(gqt_v8u, 0xFFFu)); \
        (out) = ((w_ & GQT_V8(gqt_v8u, 0x80000000u)) >> 16) | \
                GQT_V8_SEL(shl1_w_ > GQT_V8(gqt_v8u, 0xFF000000u), GQT_V8(gqt_v8u, 0x7E00u), nonsign_); \
    } while (0)

/* One rule for SIMD in every kernel file: a build that targets an ISA (-mavx2, -march=native, arm64's
 * NEON baseline) compiles its path in; a baseline x86-64 build (the wheel, llama.cpp's ggml-base)
 * compiles the AVX2 path too and picks it at run time when the CPU has it. Results never depend on
 * the choice beyond what each kernel documents. Two spellings of that run-time pick:
 *  - code written with GCC/clang vector extensions: GQT_MULTIVERSION, an AVX2 clone chosen by the
 *    loader (the default clone uses SSE2);
 *  - intrinsics: functions marked GQT_AVX2_FN, called when gqt_have_avx2(). GQT_X86_AVX2 is 1 when
 *    the build targets AVX2, 2 when it is picked at run time, 0 without an x86 AVX2 path. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define GQT_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define GQT_MULTIVERSION
#endif

#if defined(__AVX2__)
#define GQT_X86_AVX2 1
#define GQT_AVX2_FN
#elif defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(GQT_NO_RUNTIME_AVX2)
#define GQT_X86_AVX2 2
#define GQT_AVX2_FN __attribute__((target("avx2")))
#else
#define GQT_X86_AVX2 0
#define GQT_AVX2_FN
#endif

#if GQT_X86_AVX2
static inline int gqt_have_avx2(void) {
#if GQT_X86_AVX2 == 1
    return 1;
#else
    static int known = -1;   /* benign race: every thread computes the same value */
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") ? 1 : 0;
    }
    return known;
#endif
}
#endif

/* Error codes returned by the row quantizers with explicit parameters (the Python package reads
 * them from its extension). */
#define GQT_OK 0
#define GQT_ERR_NONFINITE (-1)   /* input holds NaN or +-Inf */
#define GQT_ERR_SHAPE (-2)       /* n_per_row does not divide the block size */
#define GQT_ERR_RANGE (-3)       /* a block's values are too far apart (or too large) for fp16 scale/zero */
#define GQT_ERR_PARAM (-4)       /* unknown target type or solver parameter out of range */

#ifdef __cplusplus
}
#endif
