/* Grouped K dots for decode's flash attention over stock symmetric cache blocks: see gqt_kv_dot.h. No FMA
 * contraction: every path (and every compiler) gives the same bits. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#elif defined(_MSC_VER)
#pragma fp_contract(off)
#endif

#include "gqt_kv_dot.h"
#include "gqt_tcq3.h"

#include <string.h>

typedef struct { gqt_fp16 d; uint8_t qs[16]; } blk_q4_0;               /* x = d * ((nibble) - 8) */
typedef struct { gqt_fp16 d; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_0; /* x = d * ((nibble | bit << 4) - 16) */
typedef struct { gqt_fp16 d; uint8_t qs[16]; } blk_iq4_nl;             /* x = d * kvalues[nibble] */
GQT_STATIC_ASSERT(kv_dot_q4_0, sizeof(blk_q4_0) == 18);
GQT_STATIC_ASSERT(kv_dot_q5_0, sizeof(blk_q5_0) == 22);
GQT_STATIC_ASSERT(kv_dot_iq4_nl, sizeof(blk_iq4_nl) == 18);

/* ggml's kvalues_iq4nl */
static const int8_t iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* byte j of a block: values j (low nibble) and j + 16 (high nibble) in Q4_0, Q5_0 and IQ4_NL */
static void levels_scalar(int kind, const void * row, int64_t nb, int8_t * lv, float * d) {
    for (int64_t b = 0; b < nb; ++b, lv += 32) {
        switch (kind) {
        case GQT_KV_DOT_Q4_0: {
            const blk_q4_0 * x = (const blk_q4_0 *) row + b;
            d[b] = gqt_fp16_to_fp32(x->d);
            for (int j = 0; j < 16; ++j) { lv[j] = (int8_t) ((x->qs[j] & 15) - 8); lv[j + 16] = (int8_t) ((x->qs[j] >> 4) - 8); }
            break;
        }
        case GQT_KV_DOT_Q5_0: {
            const blk_q5_0 * x = (const blk_q5_0 *) row + b;
            uint32_t qh;
            memcpy(&qh, x->qh, 4);
            d[b] = gqt_fp16_to_fp32(x->d);
            for (int j = 0; j < 16; ++j) {
                lv[j] = (int8_t) (((x->qs[j] & 15) | ((qh >> j) & 1) << 4) - 16);
                lv[j + 16] = (int8_t) (((x->qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16);
            }
            break;
        }
        case GQT_KV_DOT_Q8_0: {
            const gqt_block_q8_0 * x = (const gqt_block_q8_0 *) row + b;
            d[b] = gqt_fp16_to_fp32(x->d);
            memcpy(lv, x->qs, 32);
            break;
        }
        default: {
            const blk_iq4_nl * x = (const blk_iq4_nl *) row + b;
            d[b] = gqt_fp16_to_fp32(x->d);
            for (int j = 0; j < 16; ++j) { lv[j] = iq4nl_values[x->qs[j] & 15]; lv[j + 16] = iq4nl_values[x->qs[j] >> 4]; }
            break;
        }
        }
    }
}

/* s[g] over blocks j of (d_j * yd_j,g) * isum_j,g, one head: the arithmetic every path keeps per head */
static void dot_heads_scalar(int64_t n, const int8_t * lv, const float * d, const char * y, size_t y_stride,
                             const float * yd, int G, float * s, int s_stride) {
    const int G4 = (G + 3) & ~3;
    for (int g = 0; g < G; ++g) {
        const gqt_block_q8_0 * yb = (const gqt_block_q8_0 *) (y + (size_t) g * y_stride);
        float sumf = 0.0f;
        for (int64_t j = 0; j < n / 32; ++j) {
            int32_t isum = 0;
            for (int i = 0; i < 32; ++i) isum += (int32_t) lv[32 * j + i] * (int32_t) yb[j].qs[i];
            sumf += (d[j] * yd[j * G4 + g]) * (float) isum;
        }
        s[g * s_stride] = sumf;
    }
}

#if GQT_X86_AVX2
#include <immintrin.h>

static GQT_AVX2_FN void levels_avx2(int kind, const void * row, int64_t nb, int8_t * lv, float * d) {
    const __m128i m4 = _mm_set1_epi8(15);
    for (int64_t b = 0; b < nb; ++b, lv += 32) {
        if (kind == GQT_KV_DOT_Q8_0) {
            const gqt_block_q8_0 * x = (const gqt_block_q8_0 *) row + b;
            d[b] = gqt_fp16_to_fp32(x->d);
            memcpy(lv, x->qs, 32);
            continue;
        }
        if (kind == GQT_KV_DOT_Q5_0) {
            const blk_q5_0 * x = (const blk_q5_0 *) row + b;
            uint32_t qh;
            memcpy(&qh, x->qh, 4);
            d[b] = gqt_fp16_to_fp32(x->d);
            const __m128i q = _mm_loadu_si128((const __m128i *) x->qs);
            /* byte t of the 32: 0x10 where bit t of qh is set */
            const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
            const __m256i bit = _mm256_set1_epi64x((long long) 0x8040201008040201ULL);
            const __m256i h = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(
                _mm256_shuffle_epi8(_mm256_set1_epi32((int) qh), sel), bit), bit), _mm256_set1_epi8(0x10));
            const __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
            _mm256_storeu_si256((__m256i *) lv, _mm256_sub_epi8(_mm256_or_si256(nib, h), _mm256_set1_epi8(16)));
            continue;
        }
        const blk_q4_0 * x = (const blk_q4_0 *) row + b;   /* Q4_0 and IQ4_NL share the layout */
        d[b] = gqt_fp16_to_fp32(x->d);
        const __m128i q = _mm_loadu_si128((const __m128i *) x->qs);
        __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
        if (kind == GQT_KV_DOT_Q4_0) {
            lo = _mm_sub_epi8(lo, _mm_set1_epi8(8));
            hi = _mm_sub_epi8(hi, _mm_set1_epi8(8));
        } else {
            const __m128i kv = _mm_loadu_si128((const __m128i *) iq4nl_values);
            lo = _mm_shuffle_epi8(kv, lo);
            hi = _mm_shuffle_epi8(kv, hi);
        }
        _mm_storeu_si128((__m128i *) lv, lo);
        _mm_storeu_si128((__m128i *) (lv + 16), hi);
    }
}

/* four heads in the lanes of one accumulator; rows past G repeat the last */
static GQT_AVX2_FN void dot_heads_avx2(int64_t n, const int8_t * lv, const float * d, const char * y, size_t y_stride,
                                       const float * yd, int G, float * s, int s_stride) {
    const int G4 = (G + 3) & ~3;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int g0 = 0; g0 < G; g0 += 4) {
        const gqt_block_q8_0 * yr[4];
        for (int i = 0; i < 4; ++i) yr[i] = (const gqt_block_q8_0 *) (y + (size_t) (g0 + i < G ? g0 + i : G - 1) * y_stride);
        __m128 acc = _mm_setzero_ps();
        for (int64_t j = 0; j < n / 32; ++j) {
            const __m256i l = _mm256_loadu_si256((const __m256i *) (lv + 32 * j));
            const __m256i a = _mm256_sign_epi8(l, l);
            __m256i p[4];
            for (int i = 0; i < 4; ++i) {
                const __m256i q = _mm256_loadu_si256((const __m256i *) yr[i][j].qs);
                /* |l| * sign(l) q: each pair sum <= 2 * 127 * 127 fits int16 */
                p[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(a, _mm256_sign_epi8(q, l)), ones);
            }
            const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
            const __m128i t = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            const __m128 scale = _mm_mul_ps(_mm_set1_ps(d[j]), _mm_loadu_ps(yd + (size_t) j * G4 + g0));
            acc = _mm_add_ps(acc, _mm_mul_ps(scale, _mm_cvtepi32_ps(t)));
        }
        float out[4];
        _mm_storeu_ps(out, acc);
        for (int i = 0; i < 4 && g0 + i < G; ++i) s[(g0 + i) * s_stride] = out[i];
    }
}
#endif

#if defined(__ARM_NEON) && defined(__aarch64__)
#include <arm_neon.h>

static void dot_heads_neon(int64_t n, const int8_t * lv, const float * d, const char * y, size_t y_stride,
                           const float * yd, int G, float * s, int s_stride) {
    const int G4 = (G + 3) & ~3;
    for (int g = 0; g < G; ++g) {
        const gqt_block_q8_0 * yb = (const gqt_block_q8_0 *) (y + (size_t) g * y_stride);
        float sumf = 0.0f;
        for (int64_t j = 0; j < n / 32; ++j) {
            const int8x16_t l0 = vld1q_s8(lv + 32 * j), l1 = vld1q_s8(lv + 32 * j + 16);
            const int8x16_t q0 = vld1q_s8(yb[j].qs), q1 = vld1q_s8(yb[j].qs + 16);
            int32x4_t a = vpaddlq_s16(vmull_s8(vget_low_s8(l0), vget_low_s8(q0)));
            a = vpadalq_s16(a, vmull_s8(vget_high_s8(l0), vget_high_s8(q0)));
            a = vpadalq_s16(a, vmull_s8(vget_low_s8(l1), vget_low_s8(q1)));
            a = vpadalq_s16(a, vmull_s8(vget_high_s8(l1), vget_high_s8(q1)));
            sumf += (d[j] * yd[j * G4 + g]) * (float) vaddvq_s32(a);
        }
        s[g * s_stride] = sumf;
    }
}
#endif

void gqt_kv_levels(int kind, const void * row, int64_t n, int8_t * lv, float * d) {
    if (kind == GQT_KV_DOT_TQ3_3) {   /* its own (SIMD) level decode, gqt_tcq3.c */
        gqt_tq3_3_row_levels(row, n, lv, d);
        return;
    }
#if GQT_X86_AVX2
    if (gqt_have_avx2()) { levels_avx2(kind, row, n / 32, lv, d); return; }
#endif
    levels_scalar(kind, row, n / 32, lv, d);
}

void gqt_kv_dot_heads(int64_t n, const int8_t * lv, const float * d, const void * vy, size_t y_stride,
                      const float * yd, int G, float * s, int s_stride) {
#if GQT_X86_AVX2
    if (gqt_have_avx2()) { dot_heads_avx2(n, lv, d, (const char *) vy, y_stride, yd, G, s, s_stride); return; }
#elif defined(__ARM_NEON) && defined(__aarch64__)
    dot_heads_neon(n, lv, d, (const char *) vy, y_stride, yd, G, s, s_stride); return;
#endif
    dot_heads_scalar(n, lv, d, (const char *) vy, y_stride, yd, G, s, s_stride);
}
