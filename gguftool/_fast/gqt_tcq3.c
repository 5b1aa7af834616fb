/* TQ3_3 kernels: Viterbi encoder, table decode, vec_dot with Q8_0, fused V accumulation. Layout and math:
 * gqt_tcq3.h. Every float operation of the encoder is mirrored, in the same order, by gguftool/quant/tcq3.py. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#elif defined(_MSC_VER)
#pragma fp_contract(off)
#endif

#include <math.h>
#include "gqt_tcq3.h"

#define QK 64
#define NS 8                    /* trellis states: the last 3 branch bits */
#define FP16_MAX 65504.0f
#define FP16_OVERFLOW 65520.0f  /* the smallest float that rounds to fp16 infinity */
#define UNREACHED 1e300         /* cost of a state the search cannot be in yet */

static inline int is_nonfinite(float v) {
    return (gqt_f32_to_bits(v) & UINT32_C(0x7F800000)) == UINT32_C(0x7F800000);
}

/* subset of window w = b_i << 3 | b_{i-1} << 2 | b_{i-2} << 1 | b_{i-3} */
static inline int subset_of(unsigned w) { return (int) (((w >> 2) & 1) | ((((w >> 3) ^ (w >> 1) ^ w) & 1) << 1)); }

/* The Viterbi searches at the GQT_TQ3_3_SEARCH scales run side by side, one scale per lane of a 4-double
 * vector (GCC/clang vector extensions: AVX2, SSE2 or NEON, each lane the scalar arithmetic exactly).
 * State before value i: st = b_{i-1} << 2 | b_{i-2} << 1 | b_{i-3}, so the window is b_i << 3 | st and the
 * next state is w >> 1; the two ways into state ns differ in the bit that leaves (b_{i-3}), and the window
 * of the way taken is ns << 1 | that bit. */
typedef double  v4d __attribute__((vector_size(32)));
typedef int64_t v4l __attribute__((vector_size(32)));
#define V4(v) ((v4d) {(v), (v), (v), (v)})
#define SEL(m, a, b) ((v4d) (((v4l) (m) & (v4l) (a)) | (~(v4l) (m) & (v4l) (b))))
GQT_STATIC_ASSERT(tq3_3_lanes, GQT_TQ3_3_SEARCH == 4);

GQT_MULTIVERSION
static void viterbi4(const double * x, const double * scales, uint64_t bits[4], uint8_t idx[4][QK]) {
    const v4d d = {scales[0], scales[1], scales[2], scales[3]};
    v4d lev[16], thr[4][3];
    for (int j = 0; j < 16; ++j) lev[j] = d * V4((double) gqt_tq3_3_levels[j]);
    for (int s = 0; s < 4; ++s)
        for (int k = 0; k < 3; ++k)
            thr[s][k] = V4(0.5 * (double) (gqt_tq3_3_levels[s + 4 * k] + gqt_tq3_3_levels[s + 4 * k + 4])) * d;
    v4d cost[NS];
    for (int s = 0; s < NS; ++s) cost[s] = V4(s == 0 ? 0.0 : UNREACHED);
    v4l from[QK], ks[QK];   /* per step and lane: bit ns = the bit that left state ns; 2 bits per subset: its index */
    for (int i = 0; i < QK; ++i) {
        const v4d v = V4(x[i]);
        v4d err[4];
        v4l k4 = {0, 0, 0, 0};
        for (int s = 0; s < 4; ++s) {   /* nearest level of each subset */
            const v4l hi = (v4l) (v >= thr[s][1]);
            const v4l up = (v4l) (v >= SEL(hi, thr[s][2], thr[s][0]));
            const v4d e = v - SEL(hi, SEL(up, lev[s + 12], lev[s + 8]), SEL(up, lev[s + 4], lev[s]));
            err[s] = e * e;
            k4 |= ((hi & 2) | (up & 1)) << (2 * s);
        }
        v4d next[NS];
        v4l f = {0, 0, 0, 0};
        for (int ns = 0; ns < NS; ++ns) {
            const int st0 = (ns << 1) & 7;
            const v4d c0 = cost[st0] + err[subset_of((unsigned) ns << 1)];
            const v4d c1 = cost[st0 | 1] + err[subset_of((unsigned) ns << 1 | 1)];
            const v4l one = (v4l) (c1 < c0);
            next[ns] = SEL(one, c1, c0);
            f |= one & (1 << ns);
        }
        memcpy(cost, next, sizeof(cost));
        from[i] = f;
        ks[i] = k4;
    }
    for (int c = 0; c < 4; ++c) {
        int st = 0;
        for (int s = 1; s < NS; ++s) if (cost[s][c] < cost[st][c]) st = s;
        uint64_t bb = 0;
        for (int i = QK - 1; i >= 0; --i) {
            const int one = (int) (from[i][c] >> st) & 1;
            bb |= (uint64_t) (st >> 2) << i;
            idx[c][i] = (uint8_t) ((ks[i][c] >> (2 * subset_of((unsigned) (st << 1 | one)))) & 3);
            st = ((st << 1) & 7) | one;
        }
        bits[c] = bb;
    }
}

/* level index of value i */
static inline int level_at(uint64_t bits, const uint8_t * idx, int i) {
    const unsigned w = (unsigned) ((i >= 3 ? bits >> (i - 3) : bits << (3 - i)) & 15);
    return subset_of(w) + 4 * idx[i];
}

static inline gqt_fp16 to_fp16_scale(double d) {
    float s = (float) d;
    if (s > FP16_MAX) s = FP16_MAX;  /* saturate rather than store inf */
    return gqt_fp32_to_fp16(s);
}

/* 64 values -> one block. Returns 1 when the scale saturated (beyond fp16): ggml's entry points keep
 * the saturated block, gguftool's checked one refuses it. */
static int quantize_block(const float * in, gqt_block_tq3_3 * out) {
    double x[QK];
    memset(out, 0, sizeof(*out));
    for (int j = 0; j < QK; ++j) {
        if (is_nonfinite(in[j])) { out->d = 0x7E00; return 0; }  /* NaN scale: decodes to NaN, never to a guess */
        x[j] = (double) in[j];
    }
    double n2 = 0.0;
    for (int j = 0; j < QK; ++j) n2 += x[j] * x[j];
    if (n2 == 0.0) return 0;
    const double d0 = sqrt(n2 / QK) / GQT_TQ3_3_UNIT;
    uint64_t best_bits = 0;
    uint8_t best_idx[QK];
    double best_err = 0.0, best_xl = 0.0, best_ll = 1.0;
    uint64_t bits[4];
    uint8_t idx[4][QK];
    const double scales[4] = {d0 * 0.85, d0 * 0.95, d0 * 1.05, d0 * 1.15};
    viterbi4(x, scales, bits, idx);
    for (int c = 0; c < GQT_TQ3_3_SEARCH; ++c) {
        double xl = 0.0, ll = 0.0;
        for (int i = 0; i < QK; ++i) {
            const double l = (double) gqt_tq3_3_levels[level_at(bits[c], idx[c], i)];
            xl += x[i] * l;
            ll += l * l;
        }
        const double err = n2 - xl * xl / ll;   /* least-squares error of these codes */
        if (c == 0 || err < best_err) {
            best_err = err; best_xl = xl; best_ll = ll; best_bits = bits[c];
            memcpy(best_idx, idx[c], QK);
        }
    }
    const double ds = best_xl / best_ll;
    const int saturated = !((float) ds < FP16_OVERFLOW);
    const gqt_fp16 d = to_fp16_scale(ds);
    if (!(best_xl > 0.0) || (d & 0x7FFF) == 0) return 0;   /* scale underflowed: store the zero block */
    out->d = d;
    for (int k = 0; k < 8; ++k) out->qb[k] = (uint8_t) (best_bits >> (8 * k));
    for (int j = 0; j < 16; ++j)
        out->qs[j] = (uint8_t) (best_idx[j] | best_idx[j + 16] << 2 | best_idx[j + 32] << 4 | best_idx[j + 48] << 6);
    return saturated;
}

void gqt_quantize_row_tq3_3_ref(const float * x, void * y, int64_t k) {
    gqt_block_tq3_3 * out = (gqt_block_tq3_3 *) y;
    for (int64_t b = 0; b < k / QK; ++b) quantize_block(x + b * QK, out + b);
}

size_t gqt_quantize_tq3_3(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix) {
    (void) imatrix;
    const size_t row_size = (size_t) (n_per_row / QK) * sizeof(gqt_block_tq3_3);
    for (int64_t r = 0; r < nrows; ++r)
        gqt_quantize_row_tq3_3_ref(src + r * n_per_row, (char *) dst + (size_t) r * row_size, n_per_row);
    return (size_t) nrows * row_size;
}

int gqt_tq3_3_quantize_rows(const float * src, void * dst, int64_t nrows, int64_t n_per_row) {
    if (n_per_row <= 0 || n_per_row % QK != 0 || nrows < 0) return GQT_ERR_SHAPE;
    const int64_t n = nrows * n_per_row;
    for (int64_t i = 0; i < n; ++i)
        if (is_nonfinite(src[i])) return GQT_ERR_NONFINITE;
    int rc = GQT_OK;
    gqt_block_tq3_3 * out = (gqt_block_tq3_3 *) dst;
    for (int64_t b = 0; b < n / QK; ++b) {
        if (quantize_block(src + b * QK, out + b)) {
            out[b].d = 0x7E00;  /* marks the refused block: the caller names its row */
            rc = GQT_ERR_RANGE;
        }
    }
    return rc;
}

/* ---------------------------------------------------------------- decode */
static inline uint64_t branch_bits(const gqt_block_tq3_3 * b) {
    uint64_t bits = 0;
    for (int k = 0; k < 8; ++k) bits |= (uint64_t) b->qb[k] << (8 * k);
    return bits;
}

static void levels_scalar(const gqt_block_tq3_3 * b, int8_t * lv) {
    const uint64_t bits = branch_bits(b);
    for (int i = 0; i < QK; ++i) {
        const unsigned w = (unsigned) ((i >= 3 ? bits >> (i - 3) : bits << (3 - i)) & 15);
        const int k = (b->qs[i & 15] >> (2 * (i >> 4))) & 3;
        lv[i] = gqt_tq3_3_levels[subset_of(w) + 4 * k];
    }
}

#if GQT_X86_AVX2
#include <immintrin.h>

/* 32 values' windows: value i's 16-bit lane holds bytes i/8 and i/8 + 1 of E = bits << 3 (65+ bits: the
 * top 3 come from the next byte), shifted left by 7 - i % 8 so the window sits in lane bits 7..10 */
static inline GQT_AVX2_FN __m256i levels32_avx2(const uint8_t * e, const uint8_t * qs, int half) {
    const __m256i lut_sub = _mm256_setr_epi8(0, 2, 2, 0, 1, 3, 3, 1, 2, 0, 0, 2, 3, 1, 1, 3,
                                             0, 2, 2, 0, 1, 3, 3, 1, 2, 0, 0, 2, 3, 1, 1, 3);
    const __m256i lut_lev = _mm256_setr_epi8(-127, -92, -70, -54, -40, -28, -17, -6, 6, 17, 28, 40, 54, 70, 92, 127,
                                             -127, -92, -70, -54, -40, -28, -17, -6, 6, 17, 28, 40, 54, 70, 92, 127);
    __m256i w[2];
    for (int h = 0; h < 2; ++h) {   /* values 32 half + 16 h .. + 15, one per 16-bit lane */
        const int i0 = 32 * half + 16 * h;
        const __m256i src = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) (e + i0 / 8)));
        /* lane t (value i0 + t): bytes t/8 and t/8 + 1 of e + i0/8 */
        const __m256i sel = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                             1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2);
        const __m256i v = _mm256_shuffle_epi8(src, sel);
        const __m256i mul = _mm256_setr_epi16(128, 64, 32, 16, 8, 4, 2, 1, 128, 64, 32, 16, 8, 4, 2, 1);
        w[h] = _mm256_and_si256(_mm256_srli_epi16(_mm256_mullo_epi16(v, mul), 7), _mm256_set1_epi16(15));
    }
    /* 16-bit lanes -> bytes in value order */
    __m256i win = _mm256_permute4x64_epi64(_mm256_packus_epi16(w[0], w[1]), 0xD8);
    /* indices: byte j of qs holds values j, j+16, j+32, j+48 */
    const __m128i q = _mm_loadu_si128((const __m128i *) qs);
    const __m128i m3 = _mm_set1_epi8(3);
    const __m128i k0 = _mm_and_si128(_mm_srli_epi16(q, 4 * half), m3), k1 = _mm_and_si128(_mm_srli_epi16(q, 4 * half + 2), m3);
    const __m256i k = _mm256_set_m128i(k1, k0);
    const __m256i j = _mm256_or_si256(_mm256_shuffle_epi8(lut_sub, win), _mm256_slli_epi16(k, 2));
    return _mm256_shuffle_epi8(lut_lev, j);
}

static inline GQT_AVX2_FN void levels_avx2(const gqt_block_tq3_3 * b, __m256i * l0, __m256i * l1) {
    uint8_t e[24] = {0};   /* bits << 3, byte-wise, padded for the 16-byte loads */
    const uint64_t bits = branch_bits(b);
    const uint64_t lo = bits << 3;
    for (int k = 0; k < 8; ++k) e[k] = (uint8_t) (lo >> (8 * k));
    e[8] = (uint8_t) (bits >> 61);
    *l0 = levels32_avx2(e, b->qs, 0);
    *l1 = levels32_avx2(e, b->qs, 1);
}

static inline GQT_AVX2_FN int32_t dot32_avx2(__m256i l, const gqt_block_q8_0 * y) {
    const __m256i q = _mm256_loadu_si256((const __m256i *) y->qs);
    /* |l| * sign(l) q: no level is 0 or -128, each pair sum <= 2 * 127 * 127 fits int16 */
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(l, l), _mm256_sign_epi8(q, l));
    const __m256i p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
    const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(p32), _mm256_extracti128_si256(p32, 1));
    const __m128i s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0xB1)));
}

static GQT_AVX2_FN void levels_of_avx2(const gqt_block_tq3_3 * b, int8_t * lv) {
    __m256i l0, l1;
    levels_avx2(b, &l0, &l1);
    _mm256_storeu_si256((__m256i *) lv, l0);
    _mm256_storeu_si256((__m256i *) (lv + 32), l1);
}

static GQT_AVX2_FN void vec_dot_avx2(int n, float * s, const gqt_block_tq3_3 * x, const gqt_block_q8_0 * y) {
    float sumf = 0.0f;
    for (int b = 0; b < n / QK; ++b) {
        const float dx = gqt_fp16_to_fp32(x[b].d);
        if (dx == 0.0f) continue;
        __m256i l0, l1;
        levels_avx2(&x[b], &l0, &l1);
        sumf += (dx * gqt_fp16_to_fp32(y[2 * b].d)) * (float) dot32_avx2(l0, &y[2 * b]);
        sumf += (dx * gqt_fp16_to_fp32(y[2 * b + 1].d)) * (float) dot32_avx2(l1, &y[2 * b + 1]);
    }
    *s = sumf;
}
#endif

/* ---------------------------------------------------------------- arm64 NEON (same bits) */
#if defined(__ARM_NEON) && defined(__aarch64__)
#include <arm_neon.h>

/* the subsets of 4 values from the 7 bits of E = bits << 3 that their windows span, one per byte */
#define SUB_W(w) ((((w) >> 2) & 1) | (((((w) >> 3) ^ ((w) >> 1) ^ (w)) & 1) << 1))
#define SUB4(f) (SUB_W((f) & 15) | SUB_W(((f) >> 1) & 15) << 8 | SUB_W(((f) >> 2) & 15) << 16 | SUB_W(((f) >> 3) & 15) << 24),
#define SUB8(f) SUB4(f) SUB4((f) + 1)
#define SUB16(f) SUB8(f) SUB8((f) + 2)
#define SUB32(f) SUB16(f) SUB16((f) + 4)
#define SUB64(f) SUB32(f) SUB32((f) + 8)
#define SUB128(f) SUB64(f) SUB64((f) + 16) SUB64((f) + 32) SUB64((f) + 48)
static const uint32_t sub4[128] = {SUB128(0) SUB128(64)};

/* levels of values 16 m .. 16 m + 15 */
static inline int8x16_t levels16_neon(uint64_t bits, const uint8x16_t qs, int m) {
    uint32_t w[4];
    for (int t = 0; t < 4; ++t) {
        const int g = 4 * m + t;   /* values 4 g .. 4 g + 3: bits 4 g .. 4 g + 6 of E */
        w[t] = sub4[(g == 0 ? bits << 3 : bits >> (4 * g - 3)) & 127];
    }
    const uint8x16_t sub = vreinterpretq_u8_u32(vld1q_u32(w));
    const uint8x16_t idx = vandq_u8(vshlq_u8(qs, vdupq_n_s8((int8_t) (-2 * m))), vdupq_n_u8(3));
    return vqtbl1q_s8(vld1q_s8(gqt_tq3_3_levels), vorrq_u8(sub, vshlq_n_u8(idx, 2)));
}

static void levels_of_neon(const gqt_block_tq3_3 * b, int8_t * lv) {
    const uint64_t bits = branch_bits(b);
    const uint8x16_t qs = vld1q_u8(b->qs);
    for (int m = 0; m < 4; ++m) vst1q_s8(lv + 16 * m, levels16_neon(bits, qs, m));
}

static void vec_dot_neon(int n, float * s, const gqt_block_tq3_3 * x, const gqt_block_q8_0 * y) {
    float sumf = 0.0f;
    for (int b = 0; b < n / QK; ++b) {
        const float dx = gqt_fp16_to_fp32(x[b].d);
        if (dx == 0.0f) continue;
        const uint64_t bits = branch_bits(&x[b]);
        const uint8x16_t qs = vld1q_u8(x[b].qs);
        for (int g = 0; g < 2; ++g) {
            const int8x16_t l0 = levels16_neon(bits, qs, 2 * g), l1 = levels16_neon(bits, qs, 2 * g + 1);
            const int8x16_t q0 = vld1q_s8(y[2 * b + g].qs), q1 = vld1q_s8(y[2 * b + g].qs + 16);
            int32x4_t acc = vpaddlq_s16(vmull_s8(vget_low_s8(l0), vget_low_s8(q0)));
            acc = vpadalq_s16(acc, vmull_s8(vget_high_s8(l0), vget_high_s8(q0)));
            acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(l1), vget_low_s8(q1)));
            acc = vpadalq_s16(acc, vmull_s8(vget_high_s8(l1), vget_high_s8(q1)));
            sumf += (dx * gqt_fp16_to_fp32(y[2 * b + g].d)) * (float) vaddvq_s32(acc);
        }
    }
    *s = sumf;
}
#endif

void gqt_tq3_3_levels_of(const void * block, int8_t * lv) {
#if GQT_X86_AVX2
    if (gqt_have_avx2()) { levels_of_avx2((const gqt_block_tq3_3 *) block, lv); return; }
#elif defined(__ARM_NEON) && defined(__aarch64__)
    levels_of_neon((const gqt_block_tq3_3 *) block, lv); return;
#endif
    levels_scalar((const gqt_block_tq3_3 *) block, lv);
}

void gqt_dequantize_row_tq3_3(const void * vx, float * y, int64_t k) {
    const gqt_block_tq3_3 * x = (const gqt_block_tq3_3 *) vx;
    int8_t lv[QK];
    for (int64_t b = 0; b < k / QK; ++b, y += QK) {
        const float d = gqt_fp16_to_fp32(x[b].d);
        if (d == 0.0f) { for (int j = 0; j < QK; ++j) y[j] = 0.0f; continue; }
        gqt_tq3_3_levels_of(&x[b], lv);
        for (int j = 0; j < QK; ++j) y[j] = d * (float) lv[j];
    }
}

void gqt_mad_tq3_3(int64_t k, float * acc, const void * vx, float s) {
    const gqt_block_tq3_3 * x = (const gqt_block_tq3_3 *) vx;
    int8_t lv[QK];
    for (int64_t b = 0; b < k / QK; ++b, acc += QK) {
        const float m = s * gqt_fp16_to_fp32(x[b].d);
        gqt_tq3_3_levels_of(&x[b], lv);
        for (int j = 0; j < QK; ++j) acc[j] = acc[j] + m * (float) lv[j];
    }
}

/* sum over 32-value groups of (d_x d_y) * <levels, q>, zero-scale blocks skipped (keeps 0 * inf out) */
static void vec_dot_levels(int n, float * s, const gqt_block_tq3_3 * x, const gqt_block_q8_0 * y,
                           void (* levels)(const gqt_block_tq3_3 *, int8_t *)) {
    float sumf = 0.0f;
    int8_t lv[QK];
    for (int b = 0; b < n / QK; ++b) {
        const float dx = gqt_fp16_to_fp32(x[b].d);
        if (dx == 0.0f) continue;
        levels(&x[b], lv);
        for (int g = 0; g < 2; ++g) {
            int32_t isum = 0;
            for (int j = 0; j < 32; ++j) isum += (int32_t) lv[32 * g + j] * (int32_t) y[2 * b + g].qs[j];
            sumf += (dx * gqt_fp16_to_fp32(y[2 * b + g].d)) * (float) isum;
        }
    }
    *s = sumf;
}

static void levels_any(const gqt_block_tq3_3 * b, int8_t * lv) { gqt_tq3_3_levels_of(b, lv); }

void gqt_vec_dot_tq3_3_q8_0(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc) {
    (void) bs; (void) bx; (void) by; (void) nrc;
#if GQT_X86_AVX2
    if (gqt_have_avx2()) { vec_dot_avx2(n, s, (const gqt_block_tq3_3 *) vx, (const gqt_block_q8_0 *) vy); return; }
#elif defined(__ARM_NEON) && defined(__aarch64__)
    vec_dot_neon(n, s, (const gqt_block_tq3_3 *) vx, (const gqt_block_q8_0 *) vy); return;
#endif
    vec_dot_levels(n, s, (const gqt_block_tq3_3 *) vx, (const gqt_block_q8_0 *) vy, levels_any);
}

void gqt_vec_dot_tq3_3_q8_0_ref(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc) {
    (void) bs; (void) bx; (void) by; (void) nrc;
    vec_dot_levels(n, s, (const gqt_block_tq3_3 *) vx, (const gqt_block_q8_0 *) vy, levels_scalar);
}
