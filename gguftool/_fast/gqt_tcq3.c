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

/* The subset of value i is b_{i-1} | (b_i ^ b_{i-2} ^ b_{i-3}) << 1: for a whole block, bit i of s0 and
 * of s1 (the branch word shifted and xored; zeros come in below value 0), so every decode path only
 * spreads two 64-bit words to bytes. */
static inline void subset_words(const gqt_block_tq3_3 * b, uint64_t * s0, uint64_t * s1) {
    const uint64_t bits = branch_bits(b);
    *s0 = bits << 1;
    *s1 = bits ^ (bits << 2) ^ (bits << 3);
}

static void levels_scalar(const gqt_block_tq3_3 * b, int8_t * lv) {
    uint64_t s0, s1;
    subset_words(b, &s0, &s1);
    for (int i = 0; i < QK; ++i) {
        const int k = (b->qs[i & 15] >> (2 * (i >> 4))) & 3;
        lv[i] = gqt_tq3_3_levels[(int) ((s0 >> i) & 1) + 2 * (int) ((s1 >> i) & 1) + 4 * k];
    }
}

#if GQT_X86_AVX2
#include <immintrin.h>

/* byte t = 0xFF where bit t of w is set, 32 bits */
static inline GQT_AVX2_FN __m256i spread32_avx2(uint32_t w) {
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long) 0x8040201008040201ULL);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int) w), sel);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* levels of values 32 half .. 32 half + 31 */
static inline GQT_AVX2_FN __m256i levels32_avx2(uint64_t s0, uint64_t s1, const uint8_t * qs, int half) {
    const __m256i lut_lev = _mm256_setr_epi8(-127, -92, -70, -54, -40, -28, -17, -6, 6, 17, 28, 40, 54, 70, 92, 127,
                                             -127, -92, -70, -54, -40, -28, -17, -6, 6, 17, 28, 40, 54, 70, 92, 127);
    const __m256i sub = _mm256_or_si256(_mm256_and_si256(spread32_avx2((uint32_t) (s0 >> (32 * half))), _mm256_set1_epi8(1)),
                                        _mm256_and_si256(spread32_avx2((uint32_t) (s1 >> (32 * half))), _mm256_set1_epi8(2)));
    /* indices: byte j of qs holds values j, j+16, j+32, j+48 (4 x 2 bits; 16-bit shifts, then & 3 per byte) */
    const __m128i q = _mm_loadu_si128((const __m128i *) qs);
    const __m128i m3 = _mm_set1_epi8(3);
    const __m128i k0 = _mm_and_si128(_mm_srli_epi16(q, 4 * half), m3), k1 = _mm_and_si128(_mm_srli_epi16(q, 4 * half + 2), m3);
    const __m256i j = _mm256_or_si256(sub, _mm256_slli_epi16(_mm256_set_m128i(k1, k0), 2));
    return _mm256_shuffle_epi8(lut_lev, j);
}

static inline GQT_AVX2_FN void levels_avx2(const gqt_block_tq3_3 * b, __m256i * l0, __m256i * l1) {
    uint64_t s0, s1;
    subset_words(b, &s0, &s1);
    *l0 = levels32_avx2(s0, s1, b->qs, 0);
    *l1 = levels32_avx2(s0, s1, b->qs, 1);
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

/* y[0..31] = m * l (acc = 0) or y + m * l (acc = 1), float32, multiply then add as the scalar loops */
static inline GQT_AVX2_FN void floats32_avx2(__m256i l, __m256 m, float * y, int acc) {
    const __m128i lo = _mm256_castsi256_si128(l), hi = _mm256_extracti128_si256(l, 1);
    const __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int g = 0; g < 4; ++g) {
        __m256 f = _mm256_mul_ps(m, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[g])));
        if (acc) f = _mm256_add_ps(_mm256_loadu_ps(y + 8 * g), f);
        _mm256_storeu_ps(y + 8 * g, f);
    }
}

static GQT_AVX2_FN void dequantize_row_avx2(const gqt_block_tq3_3 * x, float * y, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, y += QK) {
        const float d = gqt_fp16_to_fp32(x[b].d);
        if (d == 0.0f) { for (int j = 0; j < QK; ++j) y[j] = 0.0f; continue; }
        __m256i l0, l1;
        levels_avx2(&x[b], &l0, &l1);
        floats32_avx2(l0, _mm256_set1_ps(d), y, 0);
        floats32_avx2(l1, _mm256_set1_ps(d), y + 32, 0);
    }
}

static GQT_AVX2_FN void mad_row_avx2(const gqt_block_tq3_3 * x, float * acc, float s, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, acc += QK) {
        const __m256 m = _mm256_set1_ps(s * gqt_fp16_to_fp32(x[b].d));
        __m256i l0, l1;
        levels_avx2(&x[b], &l0, &l1);
        floats32_avx2(l0, m, acc, 1);
        floats32_avx2(l1, m, acc + 32, 1);
    }
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

/* byte t = 0xFF where bit t of w is set, 16 bits */
static inline uint8x16_t spread16_neon(uint16_t w) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    return vtstq_u8(vcombine_u8(vdup_n_u8((uint8_t) w), vdup_n_u8((uint8_t) (w >> 8))), vld1q_u8(bit));
}

/* levels of values 16 m .. 16 m + 15 */
static inline int8x16_t levels16_neon(uint64_t s0, uint64_t s1, const uint8x16_t qs, int m) {
    const uint8x16_t sub = vorrq_u8(vandq_u8(spread16_neon((uint16_t) (s0 >> (16 * m))), vdupq_n_u8(1)),
                                    vandq_u8(spread16_neon((uint16_t) (s1 >> (16 * m))), vdupq_n_u8(2)));
    const uint8x16_t idx = vandq_u8(vshlq_u8(qs, vdupq_n_s8((int8_t) (-2 * m))), vdupq_n_u8(3));
    return vqtbl1q_s8(vld1q_s8(gqt_tq3_3_levels), vorrq_u8(sub, vshlq_n_u8(idx, 2)));
}

static void levels_of_neon(const gqt_block_tq3_3 * b, int8_t * lv) {
    uint64_t s0, s1;
    subset_words(b, &s0, &s1);
    const uint8x16_t qs = vld1q_u8(b->qs);
    for (int m = 0; m < 4; ++m) vst1q_s8(lv + 16 * m, levels16_neon(s0, s1, qs, m));
}

static void vec_dot_neon(int n, float * s, const gqt_block_tq3_3 * x, const gqt_block_q8_0 * y) {
    float sumf = 0.0f;
    for (int b = 0; b < n / QK; ++b) {
        const float dx = gqt_fp16_to_fp32(x[b].d);
        if (dx == 0.0f) continue;
        uint64_t s0, s1;
        subset_words(&x[b], &s0, &s1);
        const uint8x16_t qs = vld1q_u8(x[b].qs);
        for (int g = 0; g < 2; ++g) {
            const int8x16_t l0 = levels16_neon(s0, s1, qs, 2 * g), l1 = levels16_neon(s0, s1, qs, 2 * g + 1);
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

#if GQT_X86_AVX2
static GQT_AVX2_FN void row_levels_avx2(const gqt_block_tq3_3 * x, int64_t nb, int8_t * lv, float * d) {
    for (int64_t b = 0; b < nb; ++b) {
        levels_of_avx2(&x[b], lv + QK * b);
        d[2 * b] = d[2 * b + 1] = gqt_fp16_to_fp32(x[b].d);
    }
}
#endif

void gqt_tq3_3_row_levels(const void * row, int64_t k, int8_t * lv, float * d) {
    const gqt_block_tq3_3 * x = (const gqt_block_tq3_3 *) row;
#if GQT_X86_AVX2
    if (gqt_have_avx2()) { row_levels_avx2(x, k / QK, lv, d); return; }
#endif
    for (int64_t b = 0; b < k / QK; ++b) {
        gqt_tq3_3_levels_of(&x[b], lv + QK * b);
        d[2 * b] = d[2 * b + 1] = gqt_fp16_to_fp32(x[b].d);
    }
}

void gqt_dequantize_row_tq3_3(const void * vx, float * y, int64_t k) {
    const gqt_block_tq3_3 * x = (const gqt_block_tq3_3 *) vx;
#if GQT_X86_AVX2
    if (gqt_have_avx2()) { dequantize_row_avx2(x, y, k / QK); return; }
#endif
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
#if GQT_X86_AVX2
    if (gqt_have_avx2()) { mad_row_avx2(x, acc, s, k / QK); return; }
#endif
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
