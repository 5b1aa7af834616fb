/* TQ3_0 kernels: quantize, dequantize, vec_dot with Q8_0. Layout and math: gqt_tq3.h, docs/tq3.md.
 * Every float operation below is mirrored, in the same order, by gguftool/quant/tq3.py. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")  /* -march=native must not turn a*b+c into an FMA */
#endif

#include <math.h>
#include "gqt_tq3.h"
#include "gqt_tq3_codebook.h"

#define QK 32
#define TQ3_REFINE_PASSES 2  /* Lloyd passes after the first pick: -5% then -2.4% MSE (docs/tq3.md) */
#define FP16_MAX 65504.0f

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

/* least-squares scale of z on c[idx], in units of y = z / sqrt(32), as the fp16 it is stored as */
static inline gqt_fp16 ls_scale(const double * z, const uint8_t * idx) {
    double num = 0.0, den = 0.0;
    for (int j = 0; j < QK; ++j) {
        const double c = gqt_tq3_centroids_d[idx[j]];
        num += z[j] * c;
        den += c * c;
    }
    float s = (float) (num / den / GQT_TQ3_SQRT32);
    if (s > FP16_MAX) s = FP16_MAX;  /* saturate rather than store inf */
    return gqt_fp32_to_fp16(s);
}

static void quantize_block(const float * x, gqt_block_tq3_0 * out) {
    double z[QK];
    uint8_t idx[QK];
    memset(out, 0, sizeof(*out));
    for (int j = 0; j < QK; ++j) {
        if (is_nonfinite(x[j])) { out->d = 0x7E00; return; }  /* NaN scale: decodes to NaN, never to a guess */
        z[j] = (GQT_TQ3_SIGN_WORD >> j) & 1 ? -(double) x[j] : (double) x[j];
    }
    fwht32_d(z);  /* z = sqrt(32) * y, y = H D x; double: no overflow or denormal loss for any float input */
    double n2 = 0.0;
    for (int j = 0; j < QK; ++j) n2 += z[j] * z[j];
    if (n2 == 0.0) return;  /* exact zero block, never a made-up scale */
    pick(z, sqrt(n2 / QK), idx);  /* nearest centroid of y * sqrt(32) / ||y|| */
    gqt_fp16 d = ls_scale(z, idx);
    for (int p = 0; p < TQ3_REFINE_PASSES; ++p) {
        const double s = (double) gqt_fp16_to_fp32(d);
        if (!(s > 0.0)) break;
        pick(z, s * GQT_TQ3_SQRT32, idx);  /* against the fp16 value the decoder will read */
        d = ls_scale(z, idx);
    }
    if ((d & 0x7FFF) == 0) return;  /* scale underflowed: the block decodes to zero, store the zero block */
    out->d = d;
    for (int g = 0; g < 4; ++g) {
        uint32_t w = 0;
        for (int i = 0; i < 8; ++i) w |= (uint32_t) idx[8 * g + i] << (3 * i);
        out->qs[3 * g + 0] = (uint8_t) (w & 0xFF);
        out->qs[3 * g + 1] = (uint8_t) ((w >> 8) & 0xFF);
        out->qs[3 * g + 2] = (uint8_t) ((w >> 16) & 0xFF);
    }
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

void gqt_dequantize_row_tq3_0(const void * x, float * y, int64_t k) {
    const gqt_block_tq3_0 * in = (const gqt_block_tq3_0 *) x;
    for (int64_t b = 0; b < k / QK; ++b, y += QK) {
        const float s = gqt_fp16_to_fp32(in[b].d);
        if (s == 0.0f) { for (int j = 0; j < QK; ++j) y[j] = 0.0f; continue; }
        float v[QK];
        unpack_centroids(&in[b], v);
        fwht32_f(v);
        const float m = s * GQT_TQ3_INV_SQRT32F;
        for (int j = 0; j < QK; ++j) {
            const float t = v[j] * m;
            y[j] = (GQT_TQ3_SIGN_WORD >> j) & 1 ? -t : t;
        }
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
    gqt_quantize_tq3_0(src, dst, nrows, n_per_row, NULL);
    return GQT_OK;
}

/* <x_hat, y> = <D H (s c[idx]), d8 q> = s d8 <c[idx], H D q> / sqrt(32): rotate the int8 block
 * exactly in integers (|H32 D q| <= 32 * 128) instead of decoding x. */
void gqt_vec_dot_tq3_0_q8_0(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc) {
    (void) bs; (void) bx; (void) by; (void) nrc;
    const gqt_block_tq3_0 * x = (const gqt_block_tq3_0 *) vx;
    const gqt_block_q8_0 * y = (const gqt_block_q8_0 *) vy;
    float sumf = 0.0f;
    for (int b = 0; b < n / QK; ++b) {
        const float sx = gqt_fp16_to_fp32(x[b].d);
        if (sx == 0.0f) continue;  /* zero block; also keeps 0 * inf out */
        float c[QK];
        int32_t w[QK];
        unpack_centroids(&x[b], c);
        for (int j = 0; j < QK; ++j) w[j] = (GQT_TQ3_SIGN_WORD >> j) & 1 ? -(int32_t) y[b].qs[j] : (int32_t) y[b].qs[j];
        fwht32_i(w);
        float dot = 0.0f;
        for (int j = 0; j < QK; ++j) dot += c[j] * (float) w[j];
        sumf += (sx * gqt_fp16_to_fp32(y[b].d)) * dot;
    }
    *s = sumf * GQT_TQ3_INV_SQRT32F;
}
