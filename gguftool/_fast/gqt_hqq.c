/* HQQ solver and Q4_HQQ / Q4_HQQ_128 kernels (scalar reference). The math, and why it differs from
 * hqq's torch code, is documented in gguftool/quant/hqq.py, whose numpy reference this file
 * matches byte for byte: same float32 operations in the same order, sequential sums, rounding
 * half-to-even of the clamped value, the shrink's pow in double through libm. */
#include "gqt_hqq.h"

#include <math.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* Scale-search offsets r, in search order: inverse scale (qmax + r) / (max - min).
 * Must equal SCALE_STEPS in gguftool/quant/hqq.py. */
static const float GQT_HQQ_SCALE_STEPS[2 * GQT_HQQ_SCALE_SEARCH_MAX] = {
    0.5f, -0.5f, 1.0f, -1.0f, 0.25f, -0.25f, 0.75f, -0.75f, 1.5f, -1.5f, 2.0f, -2.0f,
};

#define S_INV_CAP 16777216.0f  /* 2^24: 1/2^24 is fp16's smallest step */
#define ZERO_CAP 60000.0f      /* keeps |zero| below fp16's max (65504) */
#define FP16_NAN 0x7E00

typedef struct {
    int group;      /* values per solver group (= block) */
    int qmax;       /* 15 or 31 */
    int stock;      /* 1: ggml Q4_1/Q5_1 (d, m), 0: ours (scale, zero) */
    size_t bytes;   /* bytes per block */
} hqq_target;

static int target_info(int target, hqq_target * t) {
    switch (target) {
    case GQT_TYPE_Q4_HQQ:     t->group = 32;  t->qmax = 15; t->stock = 0; t->bytes = GQT_Q4_HQQ_BYTES;     return 1;
    case GQT_TYPE_Q4_HQQ_128: t->group = 128; t->qmax = 15; t->stock = 0; t->bytes = GQT_Q4_HQQ_128_BYTES; return 1;
    case GQT_HQQ_TARGET_Q4_1: t->group = 32;  t->qmax = 15; t->stock = 1; t->bytes = 20;                   return 1;
    case GQT_HQQ_TARGET_Q5_1: t->group = 32;  t->qmax = 31; t->stock = 1; t->bytes = 24;                   return 1;
    default: return 0;
    }
}

void gqt_hqq_default_params(gqt_hqq_params * p) {
    p->lp_norm = 0.7f;
    p->beta = 10.0f;
    p->kappa = 1.01f;
    p->iters = 20;
    p->early_stop = 1;
    p->scale_search = 1;   /* see HQQParams in hqq.py: ~11% lower MSE than plain HQQ, ~3.5x the time */
}

static int params_ok(const gqt_hqq_params * p) {
    return p->lp_norm > 0.0f && p->lp_norm <= 1.0f && p->beta > 0.0f && isfinite(p->beta) &&
           p->kappa >= 1.0f && isfinite(p->kappa) && p->iters >= 0 && p->iters <= 1000 &&
           (p->early_stop == 0 || p->early_stop == 1) &&
           p->scale_search >= 0 && p->scale_search <= GQT_HQQ_SCALE_SEARCH_MAX;
}

/* rint(clamp(v, 0, qmax)): after the clamp, adding and subtracting 1.5*2^23 rounds half to even
 * exactly (round-to-nearest mode), like np.rint, without a libm call. */
static inline float round_clamped(float v, float qmax) {
    v = v < 0.0f ? 0.0f : (v > qmax ? qmax : v);
    return (v + 12582912.0f) - 12582912.0f;
}

/* sign(r) * relu(|r| - |r|^(p-1) / beta); exactly 0 unless |r| > live_min (see _shrink_floor in hqq.py). */
static inline float shrink_lp(float r, double beta, double pm1, double live_min) {
    const float ar = fabsf(r);
    if (!((double) ar > live_min)) return 0.0f;
    const float t = (float) (pow((double) ar, pm1) / beta);
    const float d = ar - t;
    return d > 0.0f ? copysignf(d, r) : 0.0f;
}

/* hqq's proximal loop for the zero of one block with inverse scale s; returns the final zero. */
static float solve_zero(const float * W_f, int G, float s, float z, float qmax, const gqt_hqq_params * p) {
    double beta = (double) p->beta;
    const double kappa = (double) p->kappa;
    const double pm1 = (double) p->lp_norm - 1.0;
    const float Gf = (float) G;
    float best = INFINITY;
    for (int it = 0; it < p->iters; it++) {
        const double live_min = pow(1.0 / beta, 1.0 / (1.0 - pm1)) * (1.0 - 1e-4);
        float zsum = 0.0f, esum = 0.0f;
        for (int j = 0; j < G; j++) {
            const float W_q = round_clamped(W_f[j] * s + z, qmax);
            const float W_r = (W_q - z) / s;
            const float r = W_f[j] - W_r;
            const float W_e = shrink_lp(r, beta, pm1, live_min);
            zsum += W_q - (W_f[j] - W_e) * s;
            esum += fabsf(r);
        }
        const float err = esum / Gf;
        z = zsum / Gf;   /* hqq keeps the zero of the step that did not improve */
        if (p->early_stop) {
            if (err < best) best = err;
            else break;
        }
        beta *= kappa;
    }
    return z;
}

/* Codes nearest to x on the grid of the stored fp16 pair; returns the block's squared error. */
static float encode(const float * W_f, int G, float qmax, int stock, uint16_t a, uint16_t b, uint8_t * q) {
    const float sc = gqt_fp16_to_fp32(a), bb = gqt_fp16_to_fp32(b);
    float sq = 0.0f;
    for (int j = 0; j < G; j++) {
        float W_q, W_r;
        if (stock) {
            W_q = sc != 0.0f ? round_clamped((W_f[j] - bb) / sc, qmax) : 0.0f;
            W_r = sc * W_q + bb;
        } else {
            W_q = sc != 0.0f ? round_clamped(W_f[j] / sc + bb, qmax) : 0.0f;
            W_r = (W_q - bb) * sc;
        }
        const float d = W_f[j] - W_r;
        sq += d * d;
        q[j] = (uint8_t) W_q;
    }
    return sq;
}

/* Least-squares refit of the stored pair to the chosen codes (x ~ A*q + C), like the inner step of
 * llama.cpp's make_qkx2_quants; the codes are then chosen again. Kept only while it lowers the
 * block's squared error `*best`; at most LS_ROUNDS rounds. Sums in float32, left to right. */
#define LS_ROUNDS 2
static void ls_refit(const float * x, int G, float qmax, int stock, uint16_t * a, uint16_t * b, uint8_t * q,
                     float best) {
    uint8_t qc[128];
    const float n = (float) G;
    for (int round = 0; round < LS_ROUNDS; round++) {
        float sq = 0.0f, sqq = 0.0f, sx = 0.0f, sqx = 0.0f;
        for (int j = 0; j < G; j++) {
            const float qj = (float) q[j];
            sq += qj;
            sqq += qj * qj;
            sx += x[j];
            sqx += qj * x[j];
        }
        const float D = n * sqq - sq * sq;
        if (!(D > 0.0f)) return;
        const float A = (n * sqx - sq * sx) / D;
        const float C = (sx - A * sq) / n;
        const uint16_t na = gqt_fp32_to_fp16(A);
        const float naf = gqt_fp16_to_fp32(na);
        if (!(naf > 0.0f) || !isfinite(naf)) return;
        const uint16_t nb = gqt_fp32_to_fp16(stock ? C : -C / naf);
        if (!isfinite(gqt_fp16_to_fp32(nb))) return;
        const float sqe = encode(x, G, qmax, stock, na, nb, qc);
        if (!(sqe < best)) return;
        best = sqe;
        *a = na;
        *b = nb;
        memcpy(q, qc, (size_t) G);
    }
}

/* One block -> (a, b) fp16 pair and G codes. GQT_OK or GQT_ERR_RANGE. */
static int solve_block(const float * x, const hqq_target * t, const gqt_hqq_params * p,
                       uint16_t * a, uint16_t * b, uint8_t * q) {
    const int G = t->group;
    const float qmax = (float) t->qmax;
    float mn = x[0], mx = x[0];
    for (int j = 1; j < G; j++) {
        if (x[j] < mn) mn = x[j];
        if (x[j] > mx) mx = x[j];
    }
    mn = mn + 0.0f;   /* -0 -> +0: numpy's min/max may return either zero */
    mx = mx + 0.0f;
    if (mn == mx) {   /* constant block: scale = c, zero = -1, codes 0 (stock: d = m = c) */
        const uint16_t c = gqt_fp32_to_fp16(mn);
        if (!isfinite(gqt_fp16_to_fp32(c))) return GQT_ERR_RANGE;
        *a = c;
        *b = t->stock ? c : gqt_fp32_to_fp16(-1.0f);
        memset(q, 0, (size_t) G);
        return GQT_OK;
    }
    const float amn = fabsf(mn), amx = fabsf(mx);
    const float zcap = ZERO_CAP / (amn > amx ? amn : amx);
    const float cap = S_INV_CAP < zcap ? S_INV_CAP : zcap;
    float best = INFINITY;
    uint8_t qc[128];
    for (int k = -1; k < 2 * p->scale_search; k++) {
        const float r = k < 0 ? 0.0f : GQT_HQQ_SCALE_STEPS[k];
        float s_inv = (qmax + r) / (mx - mn);
        if (!(s_inv < cap)) s_inv = cap;   /* also catches +inf */
        const uint16_t sh = gqt_fp32_to_fp16(1.0f / s_inv);
        const float shf = gqt_fp16_to_fp32(sh);
        if (!isfinite(shf)) return GQT_ERR_RANGE;
        const float s = 1.0f / shf;
        const float z = solve_zero(x, G, s, -mn * s, qmax, p);
        const uint16_t zb = t->stock ? gqt_fp32_to_fp16(-(shf * z)) : gqt_fp32_to_fp16(z);
        const float sq = encode(x, G, qmax, t->stock, sh, zb, qc);
        if (sq < best) {
            best = sq;
            *a = sh;
            *b = zb;
            memcpy(q, qc, (size_t) G);
        }
    }
    if (p->scale_search > 0) ls_refit(x, G, qmax, t->stock, a, b, q, best);
    return GQT_OK;
}

static void put16(uint8_t * p, uint16_t v) { memcpy(p, &v, 2); }
static uint16_t get16(const uint8_t * p) { uint16_t v; memcpy(&v, p, 2); return v; }

/* Per 32-value sub-block: byte j = code j | code j+16 << 4. */
static void pack_nibbles(const uint8_t * q, int G, uint8_t * out) {
    for (int b = 0; b < G / 32; b++)
        for (int j = 0; j < 16; j++)
            out[16 * b + j] = (uint8_t) ((q[32 * b + j] & 0x0F) | ((q[32 * b + j + 16] & 0x0F) << 4));
}

static void pack_block(const hqq_target * t, uint16_t a, uint16_t b, const uint8_t * q, uint8_t * out) {
    put16(out, a);
    put16(out + 2, b);
    if (t->qmax == 31) {   /* Q5_1: uint32 qh, bit j = bit 4 of code j */
        uint32_t qh = 0;
        for (int j = 0; j < 32; j++) qh |= (uint32_t) ((q[j] >> 4) & 1) << j;
        memcpy(out + 4, &qh, 4);
        pack_nibbles(q, 32, out + 8);
    } else {
        pack_nibbles(q, t->group, out + 4);
    }
}

static void unpack_block(const hqq_target * t, const uint8_t * in, uint8_t * q) {
    const uint8_t * qs = in + (t->qmax == 31 ? 8 : 4);
    for (int b = 0; b < t->group / 32; b++)
        for (int j = 0; j < 16; j++) {
            q[32 * b + j] = qs[16 * b + j] & 0x0F;
            q[32 * b + j + 16] = qs[16 * b + j] >> 4;
        }
    if (t->qmax == 31) {
        uint32_t qh;
        memcpy(&qh, in + 4, 4);
        for (int j = 0; j < 32; j++) q[j] |= (uint8_t) (((qh >> j) & 1) << 4);
    }
}

static int all_finite(const float * x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* Quantize nblocks consecutive blocks. A failing block is written with NaN scale and zero and
 * codes 0; the first error code is returned. */
static int quantize_blocks(const hqq_target * t, const float * x, uint8_t * y, int64_t nblocks,
                           const gqt_hqq_params * p) {
    int rc = GQT_OK;
    uint8_t q[128];
    for (int64_t i = 0; i < nblocks; i++) {
        const float * xb = x + i * t->group;
        uint16_t a = FP16_NAN, b = FP16_NAN;
        int e = all_finite(xb, t->group) ? solve_block(xb, t, p, &a, &b, q) : GQT_ERR_NONFINITE;
        if (e != GQT_OK) {
            a = b = FP16_NAN;
            memset(q, 0, sizeof q);
            if (rc == GQT_OK) rc = e;
        }
        pack_block(t, a, b, q, y + i * (int64_t) t->bytes);
    }
    return rc;
}

size_t gqt_hqq_row_size(int target, int64_t n_per_row) {
    hqq_target t;
    if (!target_info(target, &t) || n_per_row < 0 || n_per_row % t.group) return 0;
    return (size_t) (n_per_row / t.group) * t.bytes;
}

int gqt_hqq_quantize_rows(int target, const float * src, void * dst, int64_t nrows, int64_t n_per_row,
                          const gqt_hqq_params * p) {
    hqq_target t;
    gqt_hqq_params def;
    if (!target_info(target, &t)) return GQT_ERR_PARAM;
    if (p == NULL) { gqt_hqq_default_params(&def); p = &def; }
    if (!params_ok(p)) return GQT_ERR_PARAM;
    if (n_per_row <= 0 || n_per_row % t.group || nrows < 0) return GQT_ERR_SHAPE;
    if (!all_finite(src, nrows * n_per_row)) return GQT_ERR_NONFINITE;
    return quantize_blocks(&t, src, (uint8_t *) dst, nrows * (n_per_row / t.group), p);
}

int gqt_hqq_dequantize_rows(int target, const void * src, float * dst, int64_t nrows, int64_t n_per_row) {
    hqq_target t;
    if (!target_info(target, &t)) return GQT_ERR_PARAM;
    if (n_per_row <= 0 || n_per_row % t.group || nrows < 0) return GQT_ERR_SHAPE;
    const int64_t nb = nrows * (n_per_row / t.group);
    const uint8_t * in = (const uint8_t *) src;
    uint8_t q[128];
    for (int64_t i = 0; i < nb; i++, in += t.bytes) {
        const float a = gqt_fp16_to_fp32(get16(in)), b = gqt_fp16_to_fp32(get16(in + 2));
        float * y = dst + i * t.group;
        unpack_block(&t, in, q);
        for (int j = 0; j < t.group; j++)
            y[j] = t.stock ? a * (float) q[j] + b : ((float) q[j] - b) * a;
    }
    return GQT_OK;
}

/* ------------------------------------------------------------------ ggml type-trait entry points */

static void quantize_row_default(int target, const float * x, void * y, int64_t k) {
    hqq_target t;
    gqt_hqq_params p;
    target_info(target, &t);
    gqt_hqq_default_params(&p);
    quantize_blocks(&t, x, (uint8_t *) y, k / t.group, &p);
}

static void quantize_row_plain(int target, const float * x, void * y, int64_t k) {
    hqq_target t;
    gqt_hqq_params p;
    target_info(target, &t);
    gqt_hqq_default_params(&p);
    p.scale_search = 0;
    quantize_blocks(&t, x, (uint8_t *) y, k / t.group, &p);
}

void gqt_quantize_row_q4_hqq(const float * x, void * y, int64_t k) {
    quantize_row_plain(GQT_TYPE_Q4_HQQ, x, y, k);
}

void gqt_quantize_row_q4_hqq_128(const float * x, void * y, int64_t k) {
    quantize_row_plain(GQT_TYPE_Q4_HQQ_128, x, y, k);
}

void gqt_quantize_row_q4_hqq_ref(const float * x, void * y, int64_t k) {
    quantize_row_default(GQT_TYPE_Q4_HQQ, x, y, k);
}

void gqt_quantize_row_q4_hqq_128_ref(const float * x, void * y, int64_t k) {
    quantize_row_default(GQT_TYPE_Q4_HQQ_128, x, y, k);
}

size_t gqt_quantize_q4_hqq(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix) {
    (void) imatrix;
    quantize_row_default(GQT_TYPE_Q4_HQQ, src, dst, nrows * n_per_row);
    return (size_t) nrows * gqt_hqq_row_size(GQT_TYPE_Q4_HQQ, n_per_row);
}

size_t gqt_quantize_q4_hqq_128(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix) {
    (void) imatrix;
    quantize_row_default(GQT_TYPE_Q4_HQQ_128, src, dst, nrows * n_per_row);
    return (size_t) nrows * gqt_hqq_row_size(GQT_TYPE_Q4_HQQ_128, n_per_row);
}

void gqt_dequantize_row_q4_hqq(const void * x, float * y, int64_t k) {
    gqt_hqq_dequantize_rows(GQT_TYPE_Q4_HQQ, x, y, 1, k);
}

void gqt_dequantize_row_q4_hqq_128(const void * x, float * y, int64_t k) {
    gqt_hqq_dequantize_rows(GQT_TYPE_Q4_HQQ_128, x, y, 1, k);
}

/* dot(x, y) over n values, x in blocks of `sub` 32-value sub-blocks sharing one scale/zero, y in
 * ggml block_q8_1. Per 32 values: (q - zero)*scale . d8*q8 = (scale*d8)*sum(q*q8) + (-(scale*zero))*s8,
 * with s8 = d8*sum(q8) as ggml stores it; accumulated in block order (ggml's q4_1 generic form). */
static float vec_dot_q8_1(int n, const uint8_t * x, size_t block_bytes, int sub, const gqt_block_q8_1 * y) {
    float sumf = 0.0f;
    const int nb = n / (32 * sub);
    for (int ib = 0; ib < nb; ib++, x += block_bytes) {
        const float scale = gqt_fp16_to_fp32(get16(x));
        const float zero = gqt_fp16_to_fp32(get16(x + 2));
        const float m = -(scale * zero);
        for (int b = 0; b < sub; b++, y++) {
            const uint8_t * qs = x + 4 + 16 * b;
            int sumi = 0;
            for (int j = 0; j < 16; j++)
                sumi += (qs[j] & 0x0F) * y->qs[j] + (qs[j] >> 4) * y->qs[j + 16];
            const float d8 = gqt_fp16_to_fp32(y->d), s8 = gqt_fp16_to_fp32(y->s);
            sumf += (scale * d8) * (float) sumi + m * s8;
        }
    }
    return sumf;
}

void gqt_vec_dot_q4_hqq_q8_1_ref(int n, float * s, size_t bs, const void * vx, size_t bx,
                                 const void * vy, size_t by, int nrc) {
    (void) bs; (void) bx; (void) by; (void) nrc;   /* nrc == 1: one row pair, as ggml calls it */
    *s = vec_dot_q8_1(n, (const uint8_t *) vx, GQT_Q4_HQQ_BYTES, 1, (const gqt_block_q8_1 *) vy);
}

void gqt_vec_dot_q4_hqq_128_q8_1_ref(int n, float * s, size_t bs, const void * vx, size_t bx,
                                     const void * vy, size_t by, int nrc) {
    (void) bs; (void) bx; (void) by; (void) nrc;
    *s = vec_dot_q8_1(n, (const uint8_t *) vx, GQT_Q4_HQQ_128_BYTES, 4, (const gqt_block_q8_1 *) vy);
}
