/* SIMD dot products of Q4_HQQ / Q4_HQQ_128 rows with ggml block_q8_1 rows (what ggml-cpu
 * registers as vec_dot for our types).
 *
 * A Q4_HQQ block is Q4_1's layout with x = (q - zero) * scale, i.e. Q4_1 with d = scale and
 * m = -scale*zero. Against a Q8_1 block (d8, s8 = d8*sum(q8), q8) one 32-value block gives
 *     scale*d8*sum(q*q8) - scale*zero*s8,
 * so the kernels below are ggml's ggml_vec_dot_q4_1_q8_1 (AVX2 / NEON) with that sign.
 * Q4_HQQ_128 is four such 32-value sub-blocks under one scale/zero.
 *
 * SIMD by gqt_common.h's rule: the native llama.cpp build compiles this file into ggml-cpu with
 * the CPU's arch flags (AVX2 / NEON compiled in); a baseline x86-64 build (the Python extension, a
 * portable ggml-cpu) picks the AVX2 path at run time; elsewhere the scalar reference in gqt_hqq.c
 * runs. Results agree with the reference up to float summation order, not bit for bit. */
#include "gqt_common.h"
#include "gqt_hqq.h"

#include <assert.h>

#if GQT_X86_AVX2
#define GQT_SIMD_AVX2 1
#include <immintrin.h>
#include <math.h>
#elif defined(__ARM_NEON) && defined(__aarch64__)
#define GQT_SIMD_NEON 1
#include <arm_neon.h>
#endif

#if defined(GQT_SIMD_AVX2) && defined(GQT_GGML_FP16_TABLE)
/* Inside ggml-cpu (the native build defines GQT_GGML_FP16_TABLE): ggml's exact fp16 -> fp32
 * table, filled by ggml_cpu_init() before any vec_dot runs. A load instead of vcvtph2ps, which
 * competes for the shuffle port with the nibble unpacking (~1.4x slower loop); the values are
 * the same, so results do not change. */
extern float ggml_table_f32_f16[1 << 16];
#endif

#if defined(GQT_SIMD_AVX2) || defined(GQT_SIMD_NEON)
static inline float gqt_h2f(gqt_fp16 h) {
#if defined(GQT_SIMD_AVX2) && defined(GQT_GGML_FP16_TABLE)
    return ggml_table_f32_f16[h];
#elif defined(GQT_SIMD_AVX2) && defined(__F16C__)
    return _cvtsh_ss(h);            /* exact, like the portable conversion */
#elif defined(GQT_SIMD_NEON)
    __fp16 f;
    memcpy(&f, &h, sizeof(f));
    return (float) f;
#else
    return gqt_fp16_to_fp32(h);
#endif
}
#endif

#if defined(GQT_SIMD_AVX2)
/* 16 bytes of nibbles -> 32 bytes 0..15: low nibbles first (codes 0..15), then high (16..31). */
static inline GQT_AVX2_FN __m256i gqt_nibbles_32(const uint8_t * p) {
    const __m128i tmp = _mm_loadu_si128((const __m128i *) p);
    const __m256i bytes = _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
    return _mm256_and_si256(_mm256_set1_epi8(0x0F), bytes);
}

/* sum of unsigned(ax) * signed(sy) byte products, 8 int32 lanes as float (ggml's mul_sum_us8_pairs_float). */
static inline GQT_AVX2_FN __m256 gqt_mul_sum_us8(const __m256i ax, const __m256i sy) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy));
#elif defined(__AVXVNNI__)
    return _mm256_cvtepi32_ps(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), ax, sy));
#else
    const __m256i dot = _mm256_maddubs_epi16(ax, sy);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), dot));
#endif
}

static inline GQT_AVX2_FN __m256 gqt_fmadd(__m256 a, __m256 b, __m256 c) {
#if defined(__FMA__)
    return _mm256_fmadd_ps(a, b, c);
#else
    return _mm256_add_ps(_mm256_mul_ps(a, b), c);
#endif
}

/* acc + a*b: one fused op where the CPU has FMA (our files build with -ffp-contract=off) */
static inline float gqt_fmaf(float a, float b, float acc) {
#if defined(__FMA__)
    return fmaf(a, b, acc);     /* a single vfmadd with -mfma; _mm_set_ss would add a shuffle to the loop-carried chain */
#else
    return acc + a * b;
#endif
}

static inline GQT_AVX2_FN float gqt_hsum_8(const __m256 x) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}
#endif

#if defined(GQT_SIMD_NEON)
static inline int32x4_t gqt_vdotq(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    const int16x8_t p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    const int16x8_t p1 = vmull_s8(vget_high_s8(a), vget_high_s8(b));
    return vaddq_s32(acc, vaddq_s32(vpaddlq_s16(p0), vpaddlq_s16(p1)));
#endif
}

/* int32x4 partial sums of one 32-code sub-block against one q8_1 block. */
static inline int32x4_t gqt_neon_sub(const uint8_t * qs, const int8_t * q8) {
    const uint8x16_t v = vld1q_u8(qs);
    const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F)));
    const int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
    return gqt_vdotq(gqt_vdotq(vdupq_n_s32(0), lo, vld1q_s8(q8)), hi, vld1q_s8(q8 + 16));
}
#endif

#if defined(GQT_SIMD_AVX2)
static GQT_AVX2_FN float dot_q4_hqq_avx2(int n, const gqt_block_q4_hqq * x, const gqt_block_q8_1 * y) {
    const int nb = n / GQT_Q4_HQQ_BLOCK;
    /* two independent accumulator pairs: the loop-carried adds, not the arithmetic, bound this loop */
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float summs0 = 0.0f, summs1 = 0.0f;
    int ib = 0;
    for (; ib + 1 < nb; ib += 2) {
        const float sc0 = gqt_h2f(x[ib].scale), sc1 = gqt_h2f(x[ib + 1].scale);
        summs0 = gqt_fmaf(sc0 * gqt_h2f(x[ib].zero), gqt_h2f(y[ib].s), summs0);
        summs1 = gqt_fmaf(sc1 * gqt_h2f(x[ib + 1].zero), gqt_h2f(y[ib + 1].s), summs1);
        const __m256 d0 = _mm256_set1_ps(sc0 * gqt_h2f(y[ib].d));
        const __m256 d1 = _mm256_set1_ps(sc1 * gqt_h2f(y[ib + 1].d));
        acc0 = gqt_fmadd(d0, gqt_mul_sum_us8(gqt_nibbles_32(x[ib].qs), _mm256_loadu_si256((const __m256i *) y[ib].qs)), acc0);
        acc1 = gqt_fmadd(d1, gqt_mul_sum_us8(gqt_nibbles_32(x[ib + 1].qs), _mm256_loadu_si256((const __m256i *) y[ib + 1].qs)), acc1);
    }
    for (; ib < nb; ++ib) {
        const float sc = gqt_h2f(x[ib].scale);
        summs0 = gqt_fmaf(sc * gqt_h2f(x[ib].zero), gqt_h2f(y[ib].s), summs0);
        const __m256 d = _mm256_set1_ps(sc * gqt_h2f(y[ib].d));
        acc0 = gqt_fmadd(d, gqt_mul_sum_us8(gqt_nibbles_32(x[ib].qs), _mm256_loadu_si256((const __m256i *) y[ib].qs)), acc0);
    }
    return gqt_hsum_8(_mm256_add_ps(acc0, acc1)) - (summs0 + summs1);
}

static GQT_AVX2_FN float dot_q4_hqq_128_avx2(int n, const gqt_block_q4_hqq_128 * x, const gqt_block_q8_1 * y) {
    const int nb = n / GQT_Q4_HQQ_128_BLOCK;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int ib = 0; ib < nb; ++ib) {
        const float sc = gqt_h2f(x[ib].scale);
        const gqt_block_q8_1 * yb = y + 4 * ib;
        const float s8 = gqt_h2f(yb[0].s) + gqt_h2f(yb[1].s) + gqt_h2f(yb[2].s) + gqt_h2f(yb[3].s);
        summs = gqt_fmaf(sc * gqt_h2f(x[ib].zero), s8, summs);
        for (int k = 0; k < 4; ++k) {
            const __m256 d = _mm256_set1_ps(sc * gqt_h2f(yb[k].d));
            const __m256i qx = gqt_nibbles_32(x[ib].qs + 16 * k);
            const __m256i qy = _mm256_loadu_si256((const __m256i *) yb[k].qs);
            acc = gqt_fmadd(d, gqt_mul_sum_us8(qx, qy), acc);
        }
    }
    return gqt_hsum_8(acc) - summs;
}
#endif

#if defined(GQT_SIMD_NEON)
static float dot_q4_hqq_neon(int n, const gqt_block_q4_hqq * x, const gqt_block_q8_1 * y) {
    const int nb = n / GQT_Q4_HQQ_BLOCK;
    float32x4_t sumv0 = vdupq_n_f32(0.0f);
    float32x4_t sumv1 = vdupq_n_f32(0.0f);
    float summs = 0.0f;
    int ib = 0;
    for (; ib + 1 < nb; ib += 2) {
        const float sc0 = gqt_h2f(x[ib].scale), sc1 = gqt_h2f(x[ib + 1].scale);
        summs += sc0 * gqt_h2f(x[ib].zero) * gqt_h2f(y[ib].s) + sc1 * gqt_h2f(x[ib + 1].zero) * gqt_h2f(y[ib + 1].s);
        const int32x4_t p0 = gqt_neon_sub(x[ib].qs, y[ib].qs);
        const int32x4_t p1 = gqt_neon_sub(x[ib + 1].qs, y[ib + 1].qs);
        sumv0 = vmlaq_n_f32(sumv0, vcvtq_f32_s32(p0), sc0 * gqt_h2f(y[ib].d));
        sumv1 = vmlaq_n_f32(sumv1, vcvtq_f32_s32(p1), sc1 * gqt_h2f(y[ib + 1].d));
    }
    for (; ib < nb; ++ib) {
        const float sc = gqt_h2f(x[ib].scale);
        summs += sc * gqt_h2f(x[ib].zero) * gqt_h2f(y[ib].s);
        sumv0 = vmlaq_n_f32(sumv0, vcvtq_f32_s32(gqt_neon_sub(x[ib].qs, y[ib].qs)), sc * gqt_h2f(y[ib].d));
    }
    return vaddvq_f32(sumv0) + vaddvq_f32(sumv1) - summs;
}

static float dot_q4_hqq_128_neon(int n, const gqt_block_q4_hqq_128 * x, const gqt_block_q8_1 * y) {
    const int nb = n / GQT_Q4_HQQ_128_BLOCK;
    float32x4_t sumv0 = vdupq_n_f32(0.0f);
    float32x4_t sumv1 = vdupq_n_f32(0.0f);
    float summs = 0.0f;
    for (int ib = 0; ib < nb; ++ib) {
        const float sc = gqt_h2f(x[ib].scale);
        const gqt_block_q8_1 * yb = y + 4 * ib;
        const float s8 = gqt_h2f(yb[0].s) + gqt_h2f(yb[1].s) + gqt_h2f(yb[2].s) + gqt_h2f(yb[3].s);
        summs += sc * gqt_h2f(x[ib].zero) * s8;
        sumv0 = vmlaq_n_f32(sumv0, vcvtq_f32_s32(gqt_neon_sub(x[ib].qs +  0, yb[0].qs)), sc * gqt_h2f(yb[0].d));
        sumv1 = vmlaq_n_f32(sumv1, vcvtq_f32_s32(gqt_neon_sub(x[ib].qs + 16, yb[1].qs)), sc * gqt_h2f(yb[1].d));
        sumv0 = vmlaq_n_f32(sumv0, vcvtq_f32_s32(gqt_neon_sub(x[ib].qs + 32, yb[2].qs)), sc * gqt_h2f(yb[2].d));
        sumv1 = vmlaq_n_f32(sumv1, vcvtq_f32_s32(gqt_neon_sub(x[ib].qs + 48, yb[3].qs)), sc * gqt_h2f(yb[3].d));
    }
    return vaddvq_f32(sumv0) + vaddvq_f32(sumv1) - summs;
}
#endif

void gqt_vec_dot_q4_hqq_q8_1(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc) {
    assert(n % GQT_Q4_HQQ_BLOCK == 0);
    assert(nrc == 1);
#if defined(GQT_SIMD_AVX2)
    if (gqt_have_avx2()) { *s = dot_q4_hqq_avx2(n, vx, vy); return; }
#elif defined(GQT_SIMD_NEON)
    *s = dot_q4_hqq_neon(n, vx, vy);
    return;
#endif
    gqt_vec_dot_q4_hqq_q8_1_ref(n, s, bs, vx, bx, vy, by, nrc);
}

void gqt_vec_dot_q4_hqq_128_q8_1(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc) {
    assert(n % GQT_Q4_HQQ_128_BLOCK == 0);
    assert(nrc == 1);
#if defined(GQT_SIMD_AVX2)
    if (gqt_have_avx2()) { *s = dot_q4_hqq_128_avx2(n, vx, vy); return; }
#elif defined(GQT_SIMD_NEON)
    *s = dot_q4_hqq_128_neon(n, vx, vy);
    return;
#endif
    gqt_vec_dot_q4_hqq_128_q8_1_ref(n, s, bs, vx, bx, vy, by, nrc);
}
