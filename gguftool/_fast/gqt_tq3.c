/* TQ3_0 kernels: quantize, dequantize, vec_dot with Q8_0. Layout and math: gqt_tq3.h, docs/tq3.md.
 * Every float operation below is mirrored, in the same order, by gguftool/quant/tq3.py. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")  /* -march=native must not turn a*b+c into an FMA */
#elif defined(_MSC_VER)
#pragma fp_contract(off)
#endif

#include <math.h>
#include "gqt_tq3.h"
#include "gqt_tq3_codebook.h"

#define QK 32
#define FP16_MAX 65504.0f
#define FP16_OVERFLOW 65520.0f  /* the smallest float that rounds to fp16 infinity */

/* sum over the row's blocks of s_x * d8 * BLOCK_DOT(x, y), zero blocks skipped (keeps 0 * inf out) */
#define VEC_DOT_BLOCKS(sumf, x, y, nb, BLOCK_DOT) do { \
        for (int b_ = 0; b_ < (nb); ++b_) { \
            const float sx_ = gqt_fp16_to_fp32((x)[b_].d); \
            if (sx_ == 0.0f) continue; \
            (sumf) += (sx_ * gqt_fp16_to_fp32((y)[b_].d)) * BLOCK_DOT(&(x)[b_], &(y)[b_]); \
        } \
    } while (0)

static inline int is_nonfinite(float v) {
    return (gqt_f32_to_bits(v) & UINT32_C(0x7F800000)) == UINT32_C(0x7F800000);
}

/* Unnormalised Walsh-Hadamard transform, natural (Sylvester) order: v <- H32 * v, H32 = sqrt(32) H.
 * One butterfly stage per call with a constant span, so the compiler can unroll and vectorise. */
#define FWHT_STAGE(T, v, h)                                            \
    for (int i_ = 0; i_ < QK; i_ += 2 * (h))                           \
        for (int j_ = i_; j_ < i_ + (h); ++j_) {                       \
            const T a_ = (v)[j_], b_ = (v)[j_ + (h)];                  \
            (v)[j_] = a_ + b_; (v)[j_ + (h)] = a_ - b_;                \
        }
#define FWHT32(T, v) \
    FWHT_STAGE(T, v, 1) FWHT_STAGE(T, v, 2) FWHT_STAGE(T, v, 4) FWHT_STAGE(T, v, 8) FWHT_STAGE(T, v, 16)

static inline void fwht32_d(double * v) { FWHT32(double, v) }
static inline void fwht32_f(float * v) { FWHT32(float, v) }
static inline void fwht32_i(int32_t * v) { FWHT32(int32_t, v) }

/* index of the nearest centroid of z / r (r > 0): how many boundaries r*b[k] lie at or below z,
 * found by a branch-free binary search (the thresholds are sorted since rounding is monotone) */
static inline void pick(const double * z, double r, uint8_t * idx) {
    double thr[7];
    for (int k = 0; k < 7; ++k) thr[k] = gqt_tq3_bounds_d[k] * r;
    for (int j = 0; j < QK; ++j) {
        const double v = z[j];
        int q = (v >= thr[3]) << 2;
        q += (v >= thr[q + 1]) << 1;
        q += v >= thr[q];
        idx[j] = (uint8_t) q;
    }
}

/* <z, c[idx]> and <c[idx], c[idx]>, summed in index order */
static inline void moments(const double * z, const uint8_t * idx, double * zc, double * cc) {
    double num = 0.0, den = 0.0;
    for (int j = 0; j < QK; ++j) {
        const double c = gqt_tq3_centroids_d[idx[j]];
        num += z[j] * c;
        den += c * c;
    }
    *zc = num;
    *cc = den;
}

/* a scale in units of z (= sqrt(32) * y) as the fp16 it is stored as */
static inline gqt_fp16 to_fp16_scale(double sz) {
    float s = (float) (sz / GQT_TQ3_SQRT32);
    if (s > FP16_MAX) s = FP16_MAX;  /* saturate rather than store inf */
    return gqt_fp32_to_fp16(s);
}

/* least-squares scale of z on c[idx]: the Lloyd passes pick the indices against it */
static inline gqt_fp16 ls_scale(const double * z, const uint8_t * idx) {
    double zc, cc;
    moments(z, idx, &zc, &cc);
    return to_fp16_scale(zc / cc);
}

/* 1 when the stored scale saturated: the block's norm is beyond what an fp16 scale holds (values
 * around 1e5 and up). ggml's entry points keep the saturated block (a KV-cache row cannot fail);
 * gguftool's checked entry point refuses it. */
static int quantize_block(const float * x, gqt_block_tq3_0 * out) {
    double z[QK];
    uint8_t idx[QK];
    memset(out, 0, sizeof(*out));
    for (int j = 0; j < QK; ++j) {
        if (is_nonfinite(x[j])) { out->d = 0x7E00; return 0; }  /* NaN scale: decodes to NaN, never to a guess */
        z[j] = (GQT_TQ3_SIGN_WORD >> j) & 1 ? -(double) x[j] : (double) x[j];
    }
    fwht32_d(z);  /* z = sqrt(32) * y, y = H D x; double: no overflow or denormal loss for any float input */
    double n2 = 0.0;
    for (int j = 0; j < QK; ++j) n2 += z[j] * z[j];
    if (n2 == 0.0) return 0;  /* exact zero block, never a made-up scale */
    pick(z, sqrt(n2 / QK), idx);  /* nearest centroid of y * sqrt(32) / ||y|| */
    gqt_fp16 d = ls_scale(z, idx);
    for (int p = 0; p < GQT_TQ3_REFINE_PASSES; ++p) {
        const double s = (double) gqt_fp16_to_fp32(d);
        if (!(s > 0.0)) break;
        pick(z, s * GQT_TQ3_SQRT32, idx);  /* against the fp16 value the decoder will read */
        d = ls_scale(z, idx);
    }
    /* the stored scale is the norm-preserving one, ||y|| / ||c[idx]|| (||x_hat|| = ||x||), on the
     * indices the least-squares passes chose: the least-squares scale shrinks every attention logit
     * by ~3% and cost the K cache perplexity; this one measured best (docs/tq3.md, "Scale") */
    double zc, cc;
    moments(z, idx, &zc, &cc);
    const int saturated = !((float) (sqrt(n2 / cc) / GQT_TQ3_SQRT32) < FP16_OVERFLOW);
    d = to_fp16_scale(sqrt(n2 / cc));
    if ((d & 0x7FFF) == 0) return 0;  /* scale underflowed: the block decodes to zero, store the zero block */
    out->d = d;
    for (int g = 0; g < 4; ++g) {
        uint32_t w = 0;
        for (int i = 0; i < 8; ++i) w |= (uint32_t) idx[8 * g + i] << (3 * i);
        out->qs[3 * g + 0] = (uint8_t) (w & 0xFF);
        out->qs[3 * g + 1] = (uint8_t) ((w >> 8) & 0xFF);
        out->qs[3 * g + 2] = (uint8_t) ((w >> 16) & 0xFF);
    }
    return saturated;
}

/* the block's 32 centroids c[idx[j]] as floats */
static inline void unpack_centroids(const gqt_block_tq3_0 * b, float * v) {
    for (int g = 0; g < 4; ++g) {
        const uint32_t w = (uint32_t) b->qs[3 * g] | (uint32_t) b->qs[3 * g + 1] << 8 | (uint32_t) b->qs[3 * g + 2] << 16;
        for (int i = 0; i < 8; ++i) v[8 * g + i] = gqt_tq3_centroids_f[(w >> (3 * i)) & 7];
    }
}

void gqt_quantize_row_tq3_0_ref(const float * x, void * y, int64_t k) {
    gqt_block_tq3_0 * out = (gqt_block_tq3_0 *) y;
    for (int64_t b = 0; b < k / QK; ++b) quantize_block(x + b * QK, out + b);
}

/* AVX2 on x86-64 by gqt_common.h's rule: compiled in when the build targets it, else picked at run
 * time (the Python wheel and llama.cpp's ggml-base are built for baseline x86-64). */
#if GQT_X86_AVX2
/* 8-wide paths: the same operations on the same operands as the scalar code, so the same bits
 * (integer butterflies are exact; float butterflies pair the same a, b; products and sums keep
 * the canonical order below). test_native_flags_give_the_same_results holds them to it. */
#include <immintrin.h>

#define SGN(j) (((GQT_TQ3_SIGN_WORD >> (j)) & 1) ? -1 : 1)

/* centroids of the 8 indices in a 24-bit group word */
static inline GQT_AVX2_FN __m256 centroids8(const uint8_t * q3) {
    const uint32_t w = (uint32_t) q3[0] | (uint32_t) q3[1] << 8 | (uint32_t) q3[2] << 16;
    const __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int) w),
                                             _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21)), _mm256_set1_epi32(7));
    return _mm256_permutevar8x32_ps(_mm256_loadu_ps(gqt_tq3_centroids_f), idx);
}

/* one butterfly stage inside a register: lanes with bit h clear get v + partner, set get partner - v */
#define BFLY_PS(v, sw, mask) _mm256_blend_ps(_mm256_add_ps(v, sw), _mm256_sub_ps(sw, v), mask)
#define BFLY_EPI16(v, sw, mask) _mm256_blend_epi16(_mm256_add_epi16(v, sw), _mm256_sub_epi16(sw, v), mask)

static inline GQT_AVX2_FN void fwht32_ps(__m256 * r) {  /* r[g] holds values 8g..8g+7 */
    for (int g = 0; g < 4; ++g) {
        r[g] = BFLY_PS(r[g], _mm256_permute_ps(r[g], 0xB1), 0xAA);              /* h = 1 */
        r[g] = BFLY_PS(r[g], _mm256_permute_ps(r[g], 0x4E), 0xCC);              /* h = 2 */
        r[g] = BFLY_PS(r[g], _mm256_permute2f128_ps(r[g], r[g], 0x01), 0xF0);   /* h = 4 */
    }
    for (int g = 0; g < 4; g += 2) {                                            /* h = 8 */
        const __m256 a = r[g], b = r[g + 1];
        r[g] = _mm256_add_ps(a, b); r[g + 1] = _mm256_sub_ps(a, b);
    }
    for (int g = 0; g < 2; ++g) {                                               /* h = 16 */
        const __m256 a = r[g], b = r[g + 2];
        r[g] = _mm256_add_ps(a, b); r[g + 2] = _mm256_sub_ps(a, b);
    }
}

static inline GQT_AVX2_FN void dequantize_block_avx2(const gqt_block_tq3_0 * b, float s, float * y) {
    __m256 r[4];
    for (int g = 0; g < 4; ++g) r[g] = centroids8(b->qs + 3 * g);
    fwht32_ps(r);
    const __m256 m = _mm256_set1_ps(s * GQT_TQ3_INV_SQRT32F);
    for (int g = 0; g < 4; ++g) {
        const int o = 8 * g;
        const __m256 flip = _mm256_castsi256_ps(_mm256_setr_epi32(
            (GQT_TQ3_SIGN_WORD >> (o + 0)) & 1 ? INT32_MIN : 0, (GQT_TQ3_SIGN_WORD >> (o + 1)) & 1 ? INT32_MIN : 0,
            (GQT_TQ3_SIGN_WORD >> (o + 2)) & 1 ? INT32_MIN : 0, (GQT_TQ3_SIGN_WORD >> (o + 3)) & 1 ? INT32_MIN : 0,
            (GQT_TQ3_SIGN_WORD >> (o + 4)) & 1 ? INT32_MIN : 0, (GQT_TQ3_SIGN_WORD >> (o + 5)) & 1 ? INT32_MIN : 0,
            (GQT_TQ3_SIGN_WORD >> (o + 6)) & 1 ? INT32_MIN : 0, (GQT_TQ3_SIGN_WORD >> (o + 7)) & 1 ? INT32_MIN : 0));
        _mm256_storeu_ps(y + o, _mm256_xor_ps(_mm256_mul_ps(r[g], m), flip));
    }
}

/* the int8 block, sign-flipped and rotated in int16 (|H32 D q| <= 32 * 128 fits) */
static inline GQT_AVX2_FN void rotate_q8_avx2(const int8_t * qs, __m256i * lo, __m256i * hi) {
    __m256i a = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) qs));
    __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) (qs + 16)));
    a = _mm256_sign_epi16(a, _mm256_setr_epi16(SGN(0), SGN(1), SGN(2), SGN(3), SGN(4), SGN(5), SGN(6), SGN(7),
                                               SGN(8), SGN(9), SGN(10), SGN(11), SGN(12), SGN(13), SGN(14), SGN(15)));
    b = _mm256_sign_epi16(b, _mm256_setr_epi16(SGN(16), SGN(17), SGN(18), SGN(19), SGN(20), SGN(21), SGN(22), SGN(23),
                                               SGN(24), SGN(25), SGN(26), SGN(27), SGN(28), SGN(29), SGN(30), SGN(31)));
    const __m256i swap1 = _mm256_setr_epi8(2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13,
                                           2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    __m256i * r[2] = {&a, &b};
    for (int i = 0; i < 2; ++i) {
        __m256i v = *r[i];
        v = BFLY_EPI16(v, _mm256_shuffle_epi8(v, swap1), 0xAA);                 /* h = 1 */
        v = BFLY_EPI16(v, _mm256_shuffle_epi32(v, 0xB1), 0xCC);                 /* h = 2 */
        v = BFLY_EPI16(v, _mm256_shuffle_epi32(v, 0x4E), 0xF0);                 /* h = 4 */
        const __m256i sw = _mm256_permute2x128_si256(v, v, 0x01);               /* h = 8 */
        v = _mm256_blend_epi32(_mm256_add_epi16(v, sw), _mm256_sub_epi16(sw, v), 0xF0);
        *r[i] = v;
    }
    *lo = _mm256_add_epi16(a, b);                                               /* h = 16 */
    *hi = _mm256_sub_epi16(a, b);
}

static inline GQT_AVX2_FN float block_dot_avx2(const gqt_block_tq3_0 * x, const gqt_block_q8_0 * y) {
    __m256i lo, hi;
    rotate_q8_avx2(y->qs, &lo, &hi);
    const __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(lo)));
    const __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(lo, 1)));
    const __m256 w2 = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(hi)));
    const __m256 w3 = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(hi, 1)));
    __m256 acc = _mm256_add_ps(_mm256_mul_ps(centroids8(x->qs + 0), w0), _mm256_mul_ps(centroids8(x->qs + 3), w1));
    acc = _mm256_add_ps(acc, _mm256_mul_ps(centroids8(x->qs + 6), w2));
    acc = _mm256_add_ps(acc, _mm256_mul_ps(centroids8(x->qs + 9), w3));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

static GQT_AVX2_FN void dequantize_row_avx2(const gqt_block_tq3_0 * in, float * y, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, y += QK) {
        const float s = gqt_fp16_to_fp32(in[b].d);
        if (s == 0.0f) { for (int j = 0; j < QK; ++j) y[j] = 0.0f; continue; }
        dequantize_block_avx2(&in[b], s, y);
    }
}

static GQT_AVX2_FN float vec_dot_avx2(const gqt_block_tq3_0 * x, const gqt_block_q8_0 * y, int nb) {
    float sumf = 0.0f;
    VEC_DOT_BLOCKS(sumf, x, y, nb, block_dot_avx2);
    return sumf;
}
#endif

#if defined(__ARM_NEON) && defined(__aarch64__)
/* 4-wide arm64 paths, same operations on the same operands as the scalar code (see the AVX2 note). */
#include <arm_neon.h>

#define SGN(j) (((GQT_TQ3_SIGN_WORD >> (j)) & 1) ? -1 : 1)
#define FLIP(j) (((GQT_TQ3_SIGN_WORD >> (j)) & 1) ? UINT32_C(0x80000000) : 0u)

static const uint32_t gqt_tq3_odd_u32[4] = {0, ~0u, 0, ~0u};
static const uint16_t gqt_tq3_odd_u16[8] = {0, 0xFFFF, 0, 0xFFFF, 0, 0xFFFF, 0, 0xFFFF};
static const uint16_t gqt_tq3_bit1_u16[8] = {0, 0, 0xFFFF, 0xFFFF, 0, 0, 0xFFFF, 0xFFFF};

static inline void fwht32_neon_f(float32x4_t * r) {  /* r[i] holds values 4i..4i+3 */
    const uint32x4_t odd = vld1q_u32(gqt_tq3_odd_u32);
    for (int i = 0; i < 8; ++i) {
        float32x4_t sw = vrev64q_f32(r[i]);                                                 /* h = 1 */
        r[i] = vbslq_f32(odd, vsubq_f32(sw, r[i]), vaddq_f32(r[i], sw));
        sw = vextq_f32(r[i], r[i], 2);                                                      /* h = 2 */
        r[i] = vcombine_f32(vget_low_f32(vaddq_f32(r[i], sw)), vget_high_f32(vsubq_f32(sw, r[i])));
    }
    for (int h = 1; h < 8; h <<= 1)                                                         /* h = 4, 8, 16 */
        for (int i = 0; i < 8; i += 2 * h)
            for (int j = i; j < i + h; ++j) {
                const float32x4_t a = r[j], b = r[j + h];
                r[j] = vaddq_f32(a, b); r[j + h] = vsubq_f32(a, b);
            }
}

static inline void fwht32_neon_s16(int16x8_t * r) {  /* r[i] holds values 8i..8i+7 */
    const uint16x8_t odd = vld1q_u16(gqt_tq3_odd_u16), bit1 = vld1q_u16(gqt_tq3_bit1_u16);
    for (int i = 0; i < 4; ++i) {
        int16x8_t sw = vrev32q_s16(r[i]);                                                   /* h = 1 */
        r[i] = vbslq_s16(odd, vsubq_s16(sw, r[i]), vaddq_s16(r[i], sw));
        sw = vreinterpretq_s16_s32(vrev64q_s32(vreinterpretq_s32_s16(r[i])));               /* h = 2 */
        r[i] = vbslq_s16(bit1, vsubq_s16(sw, r[i]), vaddq_s16(r[i], sw));
        sw = vextq_s16(r[i], r[i], 4);                                                      /* h = 4 */
        r[i] = vcombine_s16(vget_low_s16(vaddq_s16(r[i], sw)), vget_high_s16(vsubq_s16(sw, r[i])));
    }
    for (int h = 1; h < 4; h <<= 1)                                                         /* h = 8, 16 */
        for (int i = 0; i < 4; i += 2 * h)
            for (int j = i; j < i + h; ++j) {
                const int16x8_t a = r[j], b = r[j + h];
                r[j] = vaddq_s16(a, b); r[j + h] = vsubq_s16(a, b);
            }
}

static inline void dequantize_block_neon(const gqt_block_tq3_0 * b, float s, float * y) {
    static const uint32_t flip[QK] = {
        FLIP(0), FLIP(1), FLIP(2), FLIP(3), FLIP(4), FLIP(5), FLIP(6), FLIP(7), FLIP(8), FLIP(9), FLIP(10),
        FLIP(11), FLIP(12), FLIP(13), FLIP(14), FLIP(15), FLIP(16), FLIP(17), FLIP(18), FLIP(19), FLIP(20),
        FLIP(21), FLIP(22), FLIP(23), FLIP(24), FLIP(25), FLIP(26), FLIP(27), FLIP(28), FLIP(29), FLIP(30), FLIP(31)};
    float c[QK];
    float32x4_t r[8];
    unpack_centroids(b, c);
    for (int i = 0; i < 8; ++i) r[i] = vld1q_f32(c + 4 * i);
    fwht32_neon_f(r);
    const float32x4_t m = vdupq_n_f32(s * GQT_TQ3_INV_SQRT32F);
    for (int i = 0; i < 8; ++i)
        vst1q_f32(y + 4 * i, vreinterpretq_f32_u32(veorq_u32(vreinterpretq_u32_f32(vmulq_f32(r[i], m)),
                                                             vld1q_u32(flip + 4 * i))));
}

static inline float block_dot_neon(const gqt_block_tq3_0 * x, const gqt_block_q8_0 * y) {
    static const int16_t sgn[QK] = {
        SGN(0), SGN(1), SGN(2), SGN(3), SGN(4), SGN(5), SGN(6), SGN(7), SGN(8), SGN(9), SGN(10), SGN(11),
        SGN(12), SGN(13), SGN(14), SGN(15), SGN(16), SGN(17), SGN(18), SGN(19), SGN(20), SGN(21), SGN(22),
        SGN(23), SGN(24), SGN(25), SGN(26), SGN(27), SGN(28), SGN(29), SGN(30), SGN(31)};
    float c[QK];
    unpack_centroids(x, c);
    const int8x16_t q0 = vld1q_s8(y->qs), q1 = vld1q_s8(y->qs + 16);
    int16x8_t w[4] = {vmovl_s8(vget_low_s8(q0)), vmovl_s8(vget_high_s8(q0)),
                      vmovl_s8(vget_low_s8(q1)), vmovl_s8(vget_high_s8(q1))};
    for (int i = 0; i < 4; ++i) w[i] = vmulq_s16(w[i], vld1q_s16(sgn + 8 * i));
    fwht32_neon_s16(w);
    float32x4_t p[8];
    for (int i = 0; i < 4; ++i) {
        p[2 * i] = vmulq_f32(vld1q_f32(c + 8 * i), vcvtq_f32_s32(vmovl_s16(vget_low_s16(w[i]))));
        p[2 * i + 1] = vmulq_f32(vld1q_f32(c + 8 * i + 4), vcvtq_f32_s32(vmovl_s16(vget_high_s16(w[i]))));
    }
    /* lanes 0..3 and 4..7 of the canonical 8-lane order, then its fixed tree */
    const float32x4_t lo = vaddq_f32(vaddq_f32(vaddq_f32(p[0], p[2]), p[4]), p[6]);
    const float32x4_t hi = vaddq_f32(vaddq_f32(vaddq_f32(p[1], p[3]), p[5]), p[7]);
    const float32x4_t s4 = vaddq_f32(lo, hi);
    const float32x2_t s2 = vadd_f32(vget_low_f32(s4), vget_high_f32(s4));
    return vget_lane_f32(s2, 0) + vget_lane_f32(s2, 1);
}
#endif

void gqt_dequantize_row_tq3_0(const void * x, float * y, int64_t k) {
    const gqt_block_tq3_0 * in = (const gqt_block_tq3_0 *) x;
#if GQT_X86_AVX2
    if (gqt_have_avx2()) { dequantize_row_avx2(in, y, k / QK); return; }
#endif
    for (int64_t b = 0; b < k / QK; ++b, y += QK) {
        const float s = gqt_fp16_to_fp32(in[b].d);
        if (s == 0.0f) { for (int j = 0; j < QK; ++j) y[j] = 0.0f; continue; }
#if defined(__ARM_NEON) && defined(__aarch64__)
        dequantize_block_neon(&in[b], s, y);
#else
        float v[QK];
        unpack_centroids(&in[b], v);
        fwht32_f(v);
        const float m = s * GQT_TQ3_INV_SQRT32F;
        for (int j = 0; j < QK; ++j) {
            const float t = v[j] * m;
            y[j] = (GQT_TQ3_SIGN_WORD >> j) & 1 ? -t : t;
        }
#endif
    }
}

size_t gqt_quantize_tq3_0(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix) {
    (void) imatrix;
    const size_t row_size = (size_t) (n_per_row / QK) * sizeof(gqt_block_tq3_0);
    for (int64_t r = 0; r < nrows; ++r)
        gqt_quantize_row_tq3_0_ref(src + r * n_per_row, (char *) dst + (size_t) r * row_size, n_per_row);
    return (size_t) nrows * row_size;
}

int gqt_tq3_0_quantize_rows(const float * src, void * dst, int64_t nrows, int64_t n_per_row) {
    if (n_per_row <= 0 || n_per_row % QK != 0 || nrows < 0) return GQT_ERR_SHAPE;
    const int64_t n = nrows * n_per_row;
    for (int64_t i = 0; i < n; ++i)
        if (is_nonfinite(src[i])) return GQT_ERR_NONFINITE;
    gqt_block_tq3_0 * out = (gqt_block_tq3_0 *) dst;
    int rc = GQT_OK;
    for (int64_t b = 0; b < n / QK; ++b)
        if (quantize_block(src + b * QK, out + b)) {
            out[b].d = 0x7E00;  /* marks the refused block: the caller names its row */
            rc = GQT_ERR_RANGE;
        }
    return rc;
}

/* <c[idx], H32 D q> with the int8 block rotated exactly in integers; the 32 products are summed
 * in the canonical 8-lane order: lane l = ((p[l] + p[l+8]) + p[l+16]) + p[l+24], then
 * ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)) -- what an 8-wide SIMD unit does naturally. */
static inline float block_dot_scalar(const gqt_block_tq3_0 * x, const gqt_block_q8_0 * y) {
    float c[QK], a[8];
    int32_t w[QK];
    unpack_centroids(x, c);
    for (int j = 0; j < QK; ++j) w[j] = (GQT_TQ3_SIGN_WORD >> j) & 1 ? -(int32_t) y->qs[j] : (int32_t) y->qs[j];
    fwht32_i(w);
    for (int l = 0; l < 8; ++l)
        a[l] = ((c[l] * (float) w[l] + c[l + 8] * (float) w[l + 8]) + c[l + 16] * (float) w[l + 16]) + c[l + 24] * (float) w[l + 24];
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

#if defined(__ARM_NEON) && defined(__aarch64__)
#define block_dot block_dot_neon
#else
#define block_dot block_dot_scalar
#endif


/* <x_hat, y> = <D H (s c[idx]), d8 q> = s d8 <c[idx], H D q> = s d8 <c[idx], H32 D q> / sqrt(32):
 * rotate the int8 block instead of decoding x. */
void gqt_vec_dot_tq3_0_q8_0(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc) {
    (void) bs; (void) bx; (void) by; (void) nrc;
    const gqt_block_tq3_0 * x = (const gqt_block_tq3_0 *) vx;
    const gqt_block_q8_0 * y = (const gqt_block_q8_0 *) vy;
#if GQT_X86_AVX2
    if (gqt_have_avx2()) { *s = vec_dot_avx2(x, y, n / QK) * GQT_TQ3_INV_SQRT32F; return; }
#endif
    float sumf = 0.0f;
    VEC_DOT_BLOCKS(sumf, x, y, n / QK, block_dot);
    *s = sumf * GQT_TQ3_INV_SQRT32F;
}

void gqt_vec_dot_tq3_0_q8_0_ref(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc) {
    (void) bs; (void) bx; (void) by; (void) nrc;
    const gqt_block_tq3_0 * x = (const gqt_block_tq3_0 *) vx;
    const gqt_block_q8_0 * y = (const gqt_block_q8_0 *) vy;
    float sumf = 0.0f;
    VEC_DOT_BLOCKS(sumf, x, y, n / QK, block_dot_scalar);
    *s = sumf * GQT_TQ3_INV_SQRT32F;
}
