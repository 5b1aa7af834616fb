/* TQ3_1 and TQ3_2 kernels: quantize, dequantize, vec_dot with Q8_0, fused V accumulation. Layout and
 * math: gqt_tq3_1.h. Both types are rows of 32-value code groups (gqt_tq3_codes); a TQ3_1 block holds
 * one group, a TQ3_2 block two under one scale, so every loop below runs over groups g and finds the
 * scale of group g in block g / per (per = groups per block: 1 or 2).
 * Every float operation below is mirrored, in the same order, by gguftool/quant/tq3_1.py. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#elif defined(_MSC_VER)
#pragma fp_contract(off)
#endif

#include <math.h>
#include "gqt_tq3_1.h"

#define QK 32          /* values per code group */
#define QK_MAX 64      /* values per scale, at most (TQ3_2) */
#define FP16_MAX 65504.0f
#define FP16_OVERFLOW 65520.0f  /* the smallest float that rounds to fp16 infinity */

static inline int is_nonfinite(float v) {
    return (gqt_f32_to_bits(v) & UINT32_C(0x7F800000)) == UINT32_C(0x7F800000);
}

/* index of the nearest level to x / d (d > 0): how many midpoints d*m[k] lie at or below x,
 * by a branch-free binary search over the sorted thresholds */
static inline void pick(const double * x, int n, double d, uint8_t * idx) {
    double thr[7];
    for (int k = 0; k < 7; ++k) thr[k] = 0.5 * (double) (gqt_tq3_1_levels[k] + gqt_tq3_1_levels[k + 1]) * d;
    for (int j = 0; j < n; ++j) {
        const double v = x[j];
        int q = (v >= thr[3]) << 2;
        q += (v >= thr[q + 1]) << 1;
        q += v >= thr[q];
        idx[j] = (uint8_t) q;
    }
}

/* <x, L[idx]> and <L[idx], L[idx]>, summed in index order */
static inline void moments(const double * x, int n, const uint8_t * idx, double * xl, double * ll) {
    double num = 0.0, den = 0.0;
    for (int j = 0; j < n; ++j) {
        const double l = (double) gqt_tq3_1_levels[idx[j]];
        num += x[j] * l;
        den += l * l;
    }
    *xl = num;
    *ll = den;
}

static inline gqt_fp16 to_fp16_scale(double d) {
    float s = (float) d;
    if (s > FP16_MAX) s = FP16_MAX;  /* saturate rather than store inf */
    return gqt_fp32_to_fp16(s);
}

static void pack(const uint8_t * idx, gqt_tq3_codes * c) {
    uint32_t h = 0;
    for (int j = 0; j < QK; ++j) h |= (uint32_t) (idx[j] >> 2) << j;
    for (int k = 0; k < 4; ++k) c->qh[k] = (uint8_t) (h >> (8 * k));
    for (int j = 0; j < 8; ++j)
        c->qs[j] = (uint8_t) ((idx[j] & 3) | (idx[j + 8] & 3) << 2 | (idx[j + 16] & 3) << 4 | (idx[j + 24] & 3) << 6);
}

/* n (32 or 64) values under one scale -> *d and n / 32 code groups. Returns 1 when the stored scale
 * saturated (the values are beyond what an fp16 scale holds, around 4e6 and up): ggml's entry points
 * keep the saturated block, gguftool's checked one refuses it. */
static int quantize_group(const float * in, int n, gqt_fp16 * d_out, gqt_tq3_codes * codes) {
    double x[QK_MAX];
    uint8_t idx[QK_MAX];
    *d_out = 0;
    memset(codes, 0, sizeof(gqt_tq3_codes) * (size_t) (n / QK));
    for (int j = 0; j < n; ++j) {
        if (is_nonfinite(in[j])) { *d_out = 0x7E00; return 0; }  /* NaN scale: decodes to NaN, never to a guess */
        x[j] = (double) in[j];
    }
    double n2 = 0.0;
    for (int j = 0; j < n; ++j) n2 += x[j] * x[j];
    if (n2 == 0.0) return 0;
    const double d0 = sqrt(n2 / n) / GQT_TQ3_1_UNIT;
    double xl, ll, best_err = 0.0;
    for (int c = 0; c < GQT_TQ3_1_SEARCH; ++c) {
        uint8_t cand[QK_MAX];
        pick(x, n, d0 * (0.7 + 0.1 * c), cand);
        moments(x, n, cand, &xl, &ll);
        gqt_fp16 d = to_fp16_scale(xl / ll);
        for (int p = 0; p < GQT_TQ3_1_REFINE_PASSES; ++p) {
            const double s = (double) gqt_fp16_to_fp32(d);
            if (!(s > 0.0)) break;
            pick(x, n, s, cand);  /* against the fp16 value the decoder will read */
            moments(x, n, cand, &xl, &ll);
            d = to_fp16_scale(xl / ll);
        }
        moments(x, n, cand, &xl, &ll);
        const double err = n2 - xl * xl / ll;   /* least-squares error of these indices */
        if (c == 0 || err < best_err) {
            best_err = err;
            memcpy(idx, cand, (size_t) n);
        }
    }
    moments(x, n, idx, &xl, &ll);
    const int saturated = !((float) sqrt(n2 / ll) < FP16_OVERFLOW);
    gqt_fp16 d = to_fp16_scale(sqrt(n2 / ll));  /* norm-preserving: ||x_hat|| = ||x|| */
    if ((d & 0x7FFF) == 0) return 0;   /* scale underflowed: store the zero block */
    *d_out = d;
    for (int g = 0; g < n / QK; ++g) pack(idx + QK * g, codes + g);
    return saturated;
}

static int quantize_block(const float * in, gqt_block_tq3_1 * out) { return quantize_group(in, QK, &out->d, &out->c); }
static int quantize_block2(const float * in, gqt_block_tq3_2 * out) { return quantize_group(in, 2 * QK, &out->d, out->c); }

static inline void unpack_indices(const gqt_tq3_codes * b, uint8_t * idx) {
    const uint32_t h = (uint32_t) b->qh[0] | (uint32_t) b->qh[1] << 8 | (uint32_t) b->qh[2] << 16 | (uint32_t) b->qh[3] << 24;
    for (int j = 0; j < QK; ++j) idx[j] = (uint8_t) (((b->qs[j & 7] >> (2 * (j >> 3))) & 3) | ((h >> j) & 1) << 2);
}

void gqt_quantize_row_tq3_1_ref(const float * x, void * y, int64_t k) {
    gqt_block_tq3_1 * out = (gqt_block_tq3_1 *) y;
    for (int64_t b = 0; b < k / QK; ++b) quantize_block(x + b * QK, out + b);
}

size_t gqt_quantize_tq3_1(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix) {
    (void) imatrix;
    const size_t row_size = (size_t) (n_per_row / QK) * sizeof(gqt_block_tq3_1);
    for (int64_t r = 0; r < nrows; ++r)
        gqt_quantize_row_tq3_1_ref(src + r * n_per_row, (char *) dst + (size_t) r * row_size, n_per_row);
    return (size_t) nrows * row_size;
}

void gqt_quantize_row_tq3_2_ref(const float * x, void * y, int64_t k) {
    gqt_block_tq3_2 * out = (gqt_block_tq3_2 *) y;
    for (int64_t b = 0; b < k / (2 * QK); ++b) quantize_block2(x + b * 2 * QK, out + b);
}

size_t gqt_quantize_tq3_2(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix) {
    (void) imatrix;
    const size_t row_size = (size_t) (n_per_row / (2 * QK)) * sizeof(gqt_block_tq3_2);
    for (int64_t r = 0; r < nrows; ++r)
        gqt_quantize_row_tq3_2_ref(src + r * n_per_row, (char *) dst + (size_t) r * row_size, n_per_row);
    return (size_t) nrows * row_size;
}

static int quantize_rows_checked(const float * src, void * dst, int64_t nrows, int64_t n_per_row, int per) {
    const int qk = per * QK;
    if (n_per_row <= 0 || n_per_row % qk != 0 || nrows < 0) return GQT_ERR_SHAPE;
    const int64_t n = nrows * n_per_row;
    for (int64_t i = 0; i < n; ++i)
        if (is_nonfinite(src[i])) return GQT_ERR_NONFINITE;
    const size_t bytes = 2 + sizeof(gqt_tq3_codes) * (size_t) per;
    int rc = GQT_OK;
    for (int64_t b = 0; b < n / qk; ++b) {
        uint8_t * blk = (uint8_t *) dst + (size_t) b * bytes;
        gqt_fp16 d;
        gqt_tq3_codes c[2];
        if (quantize_group(src + b * qk, qk, &d, c)) {
            d = 0x7E00;  /* marks the refused block: the caller names its row */
            rc = GQT_ERR_RANGE;
        }
        memcpy(blk, &d, 2);
        memcpy(blk + 2, c, sizeof(gqt_tq3_codes) * (size_t) per);
    }
    return rc;
}

int gqt_tq3_1_quantize_rows(const float * src, void * dst, int64_t nrows, int64_t n_per_row) {
    return quantize_rows_checked(src, dst, nrows, n_per_row, 1);
}

int gqt_tq3_2_quantize_rows(const float * src, void * dst, int64_t nrows, int64_t n_per_row) {
    return quantize_rows_checked(src, dst, nrows, n_per_row, 2);
}

/* group g of a row of blocks with `per` groups each: its codes, and its block's scale */
static inline const gqt_tq3_codes * codes_of(const void * row, int per, int64_t g) {
    return (const gqt_tq3_codes *) ((const uint8_t *) row + (size_t) (g / per) * (2 + 12 * (size_t) per) + 2 + 12 * (size_t) (g % per));
}
static inline float scale_of(const void * row, int per, int64_t g) {
    gqt_fp16 h;
    memcpy(&h, (const uint8_t *) row + (size_t) (g / per) * (2 + 12 * (size_t) per), sizeof(h));
    return gqt_fp16_to_fp32(h);
}
GQT_STATIC_ASSERT(tq3_codes, sizeof(gqt_tq3_codes) == 12);

/* ---------------------------------------------------------------- decode and dot, scalar */
static inline void dequantize_block_scalar(const gqt_tq3_codes * b, float d, float * y) {
    uint8_t idx[QK];
    unpack_indices(b, idx);
    for (int j = 0; j < QK; ++j) y[j] = d * (float) gqt_tq3_1_levels[idx[j]];
}

static inline int32_t block_dot_scalar(const gqt_tq3_codes * x, const gqt_block_q8_0 * y) {
    uint8_t idx[QK];
    int32_t sum = 0;
    unpack_indices(x, idx);
    for (int j = 0; j < QK; ++j) sum += (int32_t) gqt_tq3_1_levels[idx[j]] * (int32_t) y->qs[j];
    return sum;
}

/* sum over groups of (d_x d_y) * <L[idx], q>, zero-scale groups skipped (keeps 0 * inf out) */
#define VEC_DOT(BLOCK_DOT, PER) do { \
        const gqt_block_q8_0 * y = (const gqt_block_q8_0 *) vy; \
        float sumf = 0.0f; \
        for (int g = 0; g < n / QK; ++g) { \
            const float dx = scale_of(vx, PER, g); \
            if (dx == 0.0f) continue; \
            sumf += (dx * gqt_fp16_to_fp32(y[g].d)) * (float) BLOCK_DOT(codes_of(vx, PER, g), &y[g]); \
        } \
        *s = sumf; \
    } while (0)

/* ---------------------------------------------------------------- AVX2 (same bits: integer dots) */
#if GQT_X86_AVX2
#include <immintrin.h>

/* the block's 32 levels as int8, value j in byte j */
static inline GQT_AVX2_FN __m256i levels_avx2(const gqt_tq3_codes * b) {
    uint64_t lo;
    uint32_t h;
    memcpy(&lo, b->qs, 8);
    memcpy(&h, b->qh, 4);
    /* byte j of 64-bit lane g is qs[j] >> 2g: value 8g + j's low bits */
    const __m256i q = _mm256_and_si256(_mm256_srlv_epi64(_mm256_set1_epi64x((long long) lo), _mm256_setr_epi64x(0, 2, 4, 6)),
                                       _mm256_set1_epi8(3));
    /* byte j gets byte j/8 of h, then its bit j%8 (ggml's bytes_from_bits_32) */
    const __m256i bits = _mm256_set1_epi64x((long long) 0x8040201008040201ULL);
    __m256i hb = _mm256_shuffle_epi8(_mm256_set1_epi32((int) h),
        _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    hb = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, bits), bits), _mm256_set1_epi8(4));
    const __m256i lut = _mm256_setr_epi8(-127, -81, -46, -15, 15, 46, 81, 127, 0, 0, 0, 0, 0, 0, 0, 0,
                                         -127, -81, -46, -15, 15, 46, 81, 127, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm256_shuffle_epi8(lut, _mm256_or_si256(q, hb));
}

static inline GQT_AVX2_FN int32_t block_dot_avx2(const gqt_tq3_codes * x, const gqt_block_q8_0 * y) {
    const __m256i l = levels_avx2(x);
    const __m256i q = _mm256_loadu_si256((const __m256i *) y->qs);
    /* |l| * sign(l) q: no level is 0 or -128, each pair sum <= 2 * 127 * 127 fits int16 */
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(l, l), _mm256_sign_epi8(q, l));
    const __m256i p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
    const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(p32), _mm256_extracti128_si256(p32, 1));
    const __m128i s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0xB1)));
}

static GQT_AVX2_FN void dequantize_row_avx2(const void * in, int per, float * y, int64_t ng) {
    for (int64_t g = 0; g < ng; ++g, y += QK) {
        const float d = scale_of(in, per, g);
        if (d == 0.0f) { for (int j = 0; j < QK; ++j) y[j] = 0.0f; continue; }
        const __m256i l = levels_avx2(codes_of(in, per, g));
        const __m256 m = _mm256_set1_ps(d);
        const __m128i l0 = _mm256_castsi256_si128(l), l1 = _mm256_extracti128_si256(l, 1);
        _mm256_storeu_ps(y + 0, _mm256_mul_ps(m, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(l0))));
        _mm256_storeu_ps(y + 8, _mm256_mul_ps(m, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(l0, 8)))));
        _mm256_storeu_ps(y + 16, _mm256_mul_ps(m, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(l1))));
        _mm256_storeu_ps(y + 24, _mm256_mul_ps(m, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(l1, 8)))));
    }
}

static GQT_AVX2_FN void mad_row_avx2(const void * in, int per, float * acc, float s, int64_t ng) {
    for (int64_t g = 0; g < ng; ++g, acc += QK) {
        const __m256 m = _mm256_set1_ps(s * scale_of(in, per, g));
        const __m256i l = levels_avx2(codes_of(in, per, g));
        const __m128i l0 = _mm256_castsi256_si128(l), l1 = _mm256_extracti128_si256(l, 1);
        const __m128i part[4] = {l0, _mm_srli_si128(l0, 8), l1, _mm_srli_si128(l1, 8)};
        for (int g = 0; g < 4; ++g) {
            const __m256 v = _mm256_mul_ps(m, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[g])));
            _mm256_storeu_ps(acc + 8 * g, _mm256_add_ps(_mm256_loadu_ps(acc + 8 * g), v));
        }
    }
}

static GQT_AVX2_FN void vec_dot_avx2(int n, float * s, const void * vx, const void * vy, int per) {
    if (per == 1) VEC_DOT(block_dot_avx2, 1); else VEC_DOT(block_dot_avx2, 2);
}
#endif

/* ---------------------------------------------------------------- arm64 NEON (same bits) */
#if defined(__ARM_NEON) && defined(__aarch64__)
#include <arm_neon.h>

static inline void levels_neon(const gqt_tq3_codes * b, int8x16_t * v0, int8x16_t * v1) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    static const int8_t lut[16] = {-127, -81, -46, -15, 15, 46, 81, 127, 0, 0, 0, 0, 0, 0, 0, 0};
    const uint8x8_t q = vld1_u8(b->qs), m3 = vdup_n_u8(3);
    const uint8x16_t lo0 = vcombine_u8(vand_u8(q, m3), vand_u8(vshr_n_u8(q, 2), m3));
    const uint8x16_t lo1 = vcombine_u8(vand_u8(vshr_n_u8(q, 4), m3), vshr_n_u8(q, 6));
    const uint8x16_t bits = vld1q_u8(bit), four = vdupq_n_u8(4);
    const uint8x16_t h0 = vandq_u8(vtstq_u8(vcombine_u8(vdup_n_u8(b->qh[0]), vdup_n_u8(b->qh[1])), bits), four);
    const uint8x16_t h1 = vandq_u8(vtstq_u8(vcombine_u8(vdup_n_u8(b->qh[2]), vdup_n_u8(b->qh[3])), bits), four);
    const int8x16_t t = vld1q_s8(lut);
    *v0 = vqtbl1q_s8(t, vorrq_u8(lo0, h0));
    *v1 = vqtbl1q_s8(t, vorrq_u8(lo1, h1));
}

static inline int32_t block_dot_neon(const gqt_tq3_codes * x, const gqt_block_q8_0 * y) {
    int8x16_t l0, l1;
    levels_neon(x, &l0, &l1);
    const int8x16_t q0 = vld1q_s8(y->qs), q1 = vld1q_s8(y->qs + 16);
    int32x4_t acc = vpaddlq_s16(vmull_s8(vget_low_s8(l0), vget_low_s8(q0)));
    acc = vpadalq_s16(acc, vmull_s8(vget_high_s8(l0), vget_high_s8(q0)));
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(l1), vget_low_s8(q1)));
    acc = vpadalq_s16(acc, vmull_s8(vget_high_s8(l1), vget_high_s8(q1)));
    return vaddvq_s32(acc);
}

static inline void dequantize_block_neon(const gqt_tq3_codes * b, float d, float * y) {
    int8x16_t l[2];
    levels_neon(b, &l[0], &l[1]);
    const float32x4_t m = vdupq_n_f32(d);
    for (int i = 0; i < 2; ++i) {
        const int16x8_t lo = vmovl_s8(vget_low_s8(l[i])), hi = vmovl_s8(vget_high_s8(l[i]));
        vst1q_f32(y + 16 * i + 0, vmulq_f32(m, vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)))));
        vst1q_f32(y + 16 * i + 4, vmulq_f32(m, vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo)))));
        vst1q_f32(y + 16 * i + 8, vmulq_f32(m, vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)))));
        vst1q_f32(y + 16 * i + 12, vmulq_f32(m, vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi)))));
    }
}
static inline void mad_block_neon(const gqt_tq3_codes * b, float m, float * acc) {
    int8x16_t l[2];
    levels_neon(b, &l[0], &l[1]);
    const float32x4_t mv = vdupq_n_f32(m);
    for (int i = 0; i < 2; ++i) {
        const int16x8_t lo = vmovl_s8(vget_low_s8(l[i])), hi = vmovl_s8(vget_high_s8(l[i]));
        const int16x4_t part[4] = {vget_low_s16(lo), vget_high_s16(lo), vget_low_s16(hi), vget_high_s16(hi)};
        for (int g = 0; g < 4; ++g) {
            float * a = acc + 16 * i + 4 * g;
            vst1q_f32(a, vaddq_f32(vld1q_f32(a), vmulq_f32(mv, vcvtq_f32_s32(vmovl_s16(part[g])))));
        }
    }
}
#define block_dot block_dot_neon
#define dequantize_block dequantize_block_neon
#define mad_block mad_block_neon
#else
static inline void mad_block_scalar(const gqt_tq3_codes * b, float m, float * acc) {
    uint8_t idx[QK];
    unpack_indices(b, idx);
    for (int j = 0; j < QK; ++j) acc[j] = acc[j] + m * (float) gqt_tq3_1_levels[idx[j]];
}
#define block_dot block_dot_scalar
#define dequantize_block dequantize_block_scalar
#define mad_block mad_block_scalar
#endif

static void dequantize_row(const void * x, int per, float * y, int64_t k) {
#if GQT_X86_AVX2
    if (gqt_have_avx2()) { dequantize_row_avx2(x, per, y, k / QK); return; }
#endif
    for (int64_t g = 0; g < k / QK; ++g, y += QK) {
        const float d = scale_of(x, per, g);
        if (d == 0.0f) { for (int j = 0; j < QK; ++j) y[j] = 0.0f; continue; }
        dequantize_block(codes_of(x, per, g), d, y);
    }
}

static void mad_row(int64_t k, float * acc, const void * x, float s, int per) {
#if GQT_X86_AVX2
    if (gqt_have_avx2()) { mad_row_avx2(x, per, acc, s, k / QK); return; }
#endif
    for (int64_t g = 0; g < k / QK; ++g, acc += QK) mad_block(codes_of(x, per, g), s * scale_of(x, per, g), acc);
}

static void vec_dot(int n, float * s, const void * vx, const void * vy, int per) {
#if GQT_X86_AVX2
    if (gqt_have_avx2()) { vec_dot_avx2(n, s, vx, vy, per); return; }
#endif
    if (per == 1) VEC_DOT(block_dot, 1); else VEC_DOT(block_dot, 2);
}

void gqt_dequantize_row_tq3_1(const void * x, float * y, int64_t k) { dequantize_row(x, 1, y, k); }
void gqt_dequantize_row_tq3_2(const void * x, float * y, int64_t k) { dequantize_row(x, 2, y, k); }
void gqt_mad_tq3_1(int64_t k, float * acc, const void * x, float s) { mad_row(k, acc, x, s, 1); }
void gqt_mad_tq3_2(int64_t k, float * acc, const void * x, float s) { mad_row(k, acc, x, s, 2); }

void gqt_vec_dot_tq3_1_q8_0(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc) {
    (void) bs; (void) bx; (void) by; (void) nrc;
    vec_dot(n, s, vx, vy, 1);
}

void gqt_vec_dot_tq3_2_q8_0(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc) {
    (void) bs; (void) bx; (void) by; (void) nrc;
    vec_dot(n, s, vx, vy, 2);
}

void gqt_vec_dot_tq3_1_q8_0_ref(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc) {
    (void) bs; (void) bx; (void) by; (void) nrc;
    VEC_DOT(block_dot_scalar, 1);
}

void gqt_vec_dot_tq3_2_q8_0_ref(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc) {
    (void) bs; (void) bx; (void) by; (void) nrc;
    VEC_DOT(block_dot_scalar, 2);
}
