/* See kq_search.h. Plain C99 + GCC/clang vector extensions (8 float lanes; SSE2 by default, an AVX2
 * clone picked at load time). Must not be built with -ffast-math or FMA contraction: the error of a
 * candidate is computed with the float operations of ggml's dequantize, and the value codes are
 * chosen by the same IEEE rounding in the vector and the scalar code. */
#include <math.h>
#include <stdlib.h>   /* abs */
#pragma GCC diagnostic ignored "-Wpsabi"   /* 8-lane vectors passed between static inline helpers only */
#include <string.h>

#include "gqt_common.h"
#include "kq_search.h"

#define QK GQT_KQ_QK
#define MAGIC 12582912.f            /* 1.5 * 2^23: (v + MAGIC) - MAGIC rounds |v| < 2^22 to nearest even */
#define PATTERN_MOVES 8             /* pattern-search steps per sub-block and round */

typedef gqt_v8f v8f;
typedef int32_t v8i __attribute__((vector_size(32)));

static const float ONES[QK] = {
#define O8 1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f
#define O64 O8, O8, O8, O8, O8, O8, O8, O8
    O64, O64, O64, O64
#undef O64
#undef O8
};

static inline v8f ld8(const float * p) { v8f v; memcpy(&v, p, sizeof v); return v; }
static inline v8f clamp8(v8f v, float lo, float hi) {
    const v8f L = GQT_V8(v8f, lo), H = GQT_V8(v8f, hi);
    v = (v8f) GQT_V8_SEL(v < L, L, v);
    return (v8f) GQT_V8_SEL(v > H, H, v);
}
static inline float hsum8(v8f v) {
    return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}
static inline float round_clamp(float v, float lo, float hi) {
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    return (v + MAGIC) - MAGIC;
}
static inline float fp16_round(float f) { return gqt_fp16_to_fp32(gqt_fp32_to_fp16(f)); }
static inline int finite_fp16(float f) { return isfinite(fp16_round(f)); }
static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }
static inline int nearest(float v, int lo, int hi) {    /* v finite or not; clamped first */
    if (!(v > (float) lo)) return lo;                   /* NaN goes low */
    if (v > (float) hi) return hi;
    return (int) ((v + MAGIC) - MAGIC);
}

/* ------------------------------------------------------------------ Q4_K / Q5_K: x = (d*sc)*q - dmin*m */

typedef struct {
    float d, dmin;
    int sc[8], m[8];
} qk_params;

/* error of 32 values for xhat = s*q - o, q = round(clamp((x + o)/s, 0, nmax)) (s == 0: xhat = -o) */
static inline float qk_sub_err(const float * x, const float * w, float nmax, float s, float o) {
    v8f e = GQT_V8(v8f, 0.f);
    const v8f O = GQT_V8(v8f, o), S = GQT_V8(v8f, s);
    if (s == 0.f) {
        for (int k = 0; k < 32; k += 8) { const v8f r = ld8(x + k) + O; e += ld8(w + k) * (r * r); }
        return hsum8(e);
    }
    const v8f I = GQT_V8(v8f, 1.f / s), M = GQT_V8(v8f, MAGIC);
    for (int k = 0; k < 32; k += 8) {
        const v8f xv = ld8(x + k);
        const v8f q = (clamp8((xv + O) * I, 0.f, nmax) + M) - M;
        const v8f r = xv - (S * q - O);
        e += ld8(w + k) * (r * r);
    }
    return hsum8(e);
}

static inline void qk_sub_codes(const float * x, float nmax, float s, float o, uint8_t * L) {
    if (s == 0.f) { memset(L, 0, 32); return; }
    const float inv = 1.f / s;
    for (int i = 0; i < 32; ++i) L[i] = (uint8_t) round_clamp((x[i] + o) * inv, 0.f, nmax);
}

static inline float qk_err_at(const float * x, const float * w, float nmax, const qk_params * p, int j, int sc, int m) {
    return qk_sub_err(x + 32 * j, w + 32 * j, nmax, p->d * (float) sc, p->dmin * (float) m);
}

static double qk_block_err(const float * x, const float * w, float nmax, const qk_params * p, float * sub) {
    double e = 0;
    for (int j = 0; j < 8; ++j) {
        const float ej = qk_err_at(x, w, nmax, p, j, p->sc[j], p->m[j]);
        if (sub) sub[j] = ej;
        e += ej;
    }
    return e;
}

/* the best (sc, m) of sub-block j for fixed d, dmin; returns its error (never above `cur`) */
static float qk_search_sub(const float * x, const float * w, float nmax, qk_params * p, int j, float cur) {
    const float * xj = x + 32 * j, * wj = w + 32 * j;
    int bs = p->sc[j], bm = p->m[j];
    float best = cur;
    const int use_m = p->dmin != 0.f;
    for (int it = 0; it < 2; ++it) {
        int moved = 0;
        /* least-squares (a, b) for the current codes: x ~ a*q - b, rounded onto the grid */
        uint8_t L[32];
        qk_sub_codes(xj, nmax, p->d * (float) bs, p->dmin * (float) bm, L);
        double Sw = 0, Sq = 0, Sqq = 0, Sx = 0, Sxq = 0;
        for (int i = 0; i < 32; ++i) {
            const double wi = wj[i], q = L[i];
            Sw += wi; Sq += wi * q; Sqq += wi * q * q; Sx += wi * xj[i]; Sxq += wi * xj[i] * q;
        }
        const double det = Sqq * Sw - Sq * Sq;
        if (det > 0 && Sw > 0 && p->d != 0.f) {
            const double a = (Sxq * Sw - Sq * Sx) / det, b = (Sq * a - Sx) / Sw;
            const int cs = nearest((float) (a / p->d), 0, 63);
            const int cm = use_m ? nearest((float) (b / p->dmin), 0, 63) : bm;
            if (cs != bs || cm != bm) {
                const float e = qk_err_at(x, w, nmax, p, j, cs, cm);
                if (e < best) { best = e; bs = cs; bm = cm; moved = 1; }
            }
        }
        /* pattern search: the best of the 8 (or 2) neighbours, while it improves */
        for (int step = 0; step < PATTERN_MOVES; ++step) {
            int ns = bs, nm = bm;
            float nb = best;
            for (int ds = -1; ds <= 1; ++ds) {
                for (int dm = -1; dm <= 1; ++dm) {
                    if ((ds == 0 && dm == 0) || (!use_m && dm != 0)) continue;
                    const int s = bs + ds, m = bm + dm;
                    if (s < 0 || s > 63 || m < 0 || m > 63) continue;
                    const float e = qk_err_at(x, w, nmax, p, j, s, m);
                    if (e < nb) { nb = e; ns = s; nm = m; }
                }
            }
            if (ns == bs && nm == bm) break;
            best = nb; bs = ns; bm = nm; moved = 1;
        }
        if (!moved) break;
    }
    p->sc[j] = bs; p->m[j] = bm;
    return best;
}

/* least-squares (d, dmin) for the integer scales and the current codes, rounded to fp16 */
static int qk_refit(const float * x, const float * w, float nmax, const qk_params * p, qk_params * out) {
    double Suu = 0, Suv = 0, Svv = 0, Sxu = 0, Sxv = 0;
    for (int j = 0; j < 8; ++j) {
        uint8_t L[32];
        qk_sub_codes(x + 32 * j, nmax, p->d * (float) p->sc[j], p->dmin * (float) p->m[j], L);
        const double sc = p->sc[j], m = p->m[j];
        for (int i = 0; i < 32; ++i) {
            const double wi = w[32 * j + i], u = sc * L[i], xi = x[32 * j + i];
            Suu += wi * u * u; Suv += wi * u * m; Svv += wi * m * m; Sxu += wi * xi * u; Sxv += wi * xi * m;
        }
    }
    *out = *p;
    const double det = Suv * Suv - Suu * Svv;   /* x ~ d*u - dmin*v */
    double d, e;
    if (Svv > 0 && det != 0) {
        d = (Suv * Sxv - Sxu * Svv) / det;
        e = (Suu * Sxv - Suv * Sxu) / det;
    } else if (Suu > 0) {
        d = Sxu / Suu;
        e = p->dmin;
    } else {
        return 0;
    }
    if (!finite_fp16((float) d) || !finite_fp16((float) e)) return 0;
    out->d = fp16_round((float) d);
    out->dmin = fp16_round((float) e);
    return out->d != p->d || out->dmin != p->dmin;
}

/* the least-squares pair x ~ a*q - b (b >= 0) of one sub-block for the codes q of (s, o) */
static int qk_ls(const float * x, const float * w, float nmax, float s, float o, float * a, float * b) {
    uint8_t L[32];
    qk_sub_codes(x, nmax, s, o, L);
    double Sw = 0, Sq = 0, Sqq = 0, Sx = 0, Sxq = 0;
    for (int i = 0; i < 32; ++i) {
        const double wi = w[i], q = L[i];
        Sw += wi; Sq += wi * q; Sqq += wi * q * q; Sx += wi * x[i]; Sxq += wi * x[i] * q;
    }
    const double det = Sqq * Sw - Sq * Sq;
    if (!(det > 0) || !(Sw > 0)) return 0;
    double A = (Sxq * Sw - Sq * Sx) / det, B = (Sq * A - Sx) / Sw;
    if (B < 0) { B = 0; A = Sxq / Sqq; }   /* the min is never above 0 in these layouts */
    if (!(A > 0)) return 0;
    *a = (float) A; *b = (float) B;
    return 1;
}

/* the best continuous (scale, min) of one sub-block for the weighted squared error: the inverse scales
 * (nmax + k/10)/(max - min), k = -10..10 (the range of ggml's make_qkx2_quants, which weights its
 * objective by |x| instead), each refit by least squares, scored with the codes re-chosen */
#define QK_STEPS 61
static void qk_continuous(const float * x, const float * w, float nmax, float * a_out, float * b_out) {
    float mn = x[0], mx = x[0];
    for (int i = 1; i < 32; ++i) { mn = x[i] < mn ? x[i] : mn; mx = x[i] > mx ? x[i] : mx; }
    if (mn > 0) mn = 0;
    *a_out = 0; *b_out = -mn;
    if (!(mx > mn)) return;
    float ba = (mx - mn) / nmax, bb = -mn, be = qk_sub_err(x, w, nmax, ba, bb);
    for (int k = 0; k < QK_STEPS; ++k) {
        const float iscale = (nmax - 1.5f + 0.05f * (float) k) / (mx - mn);
        float a, b;
        if (!qk_ls(x, w, nmax, 1.f / iscale, -mn, &a, &b)) continue;
        const float e = qk_sub_err(x, w, nmax, a, b);
        if (e < be) { be = e; ba = a; bb = b; }
    }
    for (int it = 0; it < 2; ++it) {   /* codes of the best pair -> its least-squares pair, while it helps */
        float a, b;
        if (!qk_ls(x, w, nmax, ba, bb, &a, &b)) break;
        const float e = qk_sub_err(x, w, nmax, a, b);
        if (!(e < be)) break;
        be = e; ba = a; bb = b;
    }
    *a_out = ba; *b_out = bb;
}

static void qk_rounds(const float * x, const float * w, float nmax, qk_params * p, int rounds, float * sub, double * E_io) {
    double E = *E_io;
    for (int r = 0; r < rounds; ++r) {
        double En = 0;
        for (int j = 0; j < 8; ++j) { sub[j] = qk_search_sub(x, w, nmax, p, j, sub[j]); En += sub[j]; }
        int changed = En < E;
        E = En < E ? En : E;
        qk_params q;
        if (qk_refit(x, w, nmax, p, &q) && q.d != 0.f) {
            float subq[8];
            const double Eq = qk_block_err(x, w, nmax, &q, subq);
            if (Eq < E) { *p = q; E = Eq; memcpy(sub, subq, 8 * sizeof *sub); changed = 1; }
        }
        if (!changed) break;
    }
    *E_io = E;
}

/* the super-block scales for the continuous sub-block pairs (a, b): max/63 times a factor in
 * 1 +- QK_GRID_STEPS/100 (the integer grid the pairs round onto moves with it), first d, then dmin,
 * each scored by the block's error with the codes re-chosen */
#define QK_GRID_STEPS 6
static void qk_on_grid(const float * a, const float * b, qk_params * q) {
    for (int j = 0; j < 8; ++j) {
        q->sc[j] = nearest(a[j] / q->d, 0, 63);
        q->m[j] = q->dmin != 0.f ? nearest(b[j] / q->dmin, 0, 63) : 0;
    }
}
static int qk_grid(const float * x, const float * w, float nmax, const float * a, const float * b, float amax, float bmax,
                   qk_params * q) {
    q->d = fp16_round(amax / 63.f);
    q->dmin = fp16_round(bmax / 63.f);
    if (q->d == 0.f || !isfinite(q->d) || !isfinite(q->dmin)) return 0;
    qk_on_grid(a, b, q);
    double best = qk_block_err(x, w, nmax, q, NULL);
    for (int pass = 0; pass < 2; ++pass) {
        if (pass == 1 && q->dmin == 0.f) break;
        const float base = pass == 0 ? amax : bmax;
        float keep = pass == 0 ? q->d : q->dmin;
        for (int k = -QK_GRID_STEPS; k <= QK_GRID_STEPS; ++k) {
            if (k == 0) continue;
            qk_params c = *q;
            const float v = fp16_round(base / 63.f * (1.f + 0.01f * (float) k));
            if (v == 0.f || !isfinite(v)) continue;
            if (pass == 0) c.d = v; else c.dmin = v;
            qk_on_grid(a, b, &c);
            const double e = qk_block_err(x, w, nmax, &c, NULL);
            if (e < best) { best = e; keep = v; }
        }
        if (pass == 0) q->d = keep; else q->dmin = keep;
        qk_on_grid(a, b, q);
    }
    return 1;
}

static double qk_refine_block(const float * x, const float * w, float nmax, qk_params * p, int rounds, double * before) {
    float sub[8];
    double E = qk_block_err(x, w, nmax, p, sub);
    *before = E;
    if (p->d == 0.f) return E;
    qk_rounds(x, w, nmax, p, rounds, sub, &E);
    /* a second start: each sub-block's continuous optimum, put on the 6-bit grid of max/63 */
    float a[8], b[8], amax = 0, bmax = 0;
    for (int j = 0; j < 8; ++j) {
        qk_continuous(x + 32 * j, w + 32 * j, nmax, &a[j], &b[j]);
        amax = a[j] > amax ? a[j] : amax; bmax = b[j] > bmax ? b[j] : bmax;
    }
    qk_params q;
    if (!qk_grid(x, w, nmax, a, b, amax, bmax, &q)) return E;
    float subq[8];
    double Eq = qk_block_err(x, w, nmax, &q, subq);
    qk_rounds(x, w, nmax, &q, rounds, subq, &Eq);
    if (Eq < E) { *p = q; E = Eq; }
    return E;
}

static void qk_unpack(const uint8_t * b, qk_params * p) {
    uint16_t h;
    memcpy(&h, b, 2); p->d = gqt_fp16_to_fp32(h);
    memcpy(&h, b + 2, 2); p->dmin = gqt_fp16_to_fp32(h);
    const uint8_t * q = b + 4;
    for (int j = 0; j < 8; ++j) {
        if (j < 4) {
            p->sc[j] = q[j] & 63; p->m[j] = q[j + 4] & 63;
        } else {
            p->sc[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
            p->m[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        }
    }
}

static void qk_pack(const float * x, float nmax, const qk_params * p, uint8_t * b, int five) {
    const gqt_fp16 hd = gqt_fp32_to_fp16(p->d), hm = gqt_fp32_to_fp16(p->dmin);
    memcpy(b, &hd, 2); memcpy(b + 2, &hm, 2);
    uint8_t * s = b + 4;
    memset(s, 0, 12);
    for (int j = 0; j < 8; ++j) {
        const int ls = p->sc[j], lm = p->m[j];
        if (j < 4) {
            s[j] |= (uint8_t) ls; s[j + 4] |= (uint8_t) lm;
        } else {
            s[j + 4] = (uint8_t) ((ls & 0xF) | ((lm & 0xF) << 4));
            s[j - 4] |= (uint8_t) ((ls >> 4) << 6);
            s[j] |= (uint8_t) ((lm >> 4) << 6);
        }
    }
    uint8_t L[QK];
    for (int j = 0; j < 8; ++j) qk_sub_codes(x + 32 * j, nmax, p->d * (float) p->sc[j], p->dmin * (float) p->m[j], L + 32 * j);
    if (!five) {
        uint8_t * q = b + 16;
        for (int n = 0; n < QK; n += 64, q += 32)
            for (int l = 0; l < 32; ++l) q[l] = (uint8_t) (L[n + l] | (L[n + l + 32] << 4));
    } else {
        uint8_t * qh = b + 16, * ql = b + 48;
        memset(qh, 0, 32);
        uint8_t m1 = 1, m2 = 2;
        for (int n = 0; n < QK; n += 64, ql += 32) {
            for (int j = 0; j < 32; ++j) {
                int l1 = L[n + j], l2 = L[n + j + 32];
                if (l1 > 15) { l1 -= 16; qh[j] |= m1; }
                if (l2 > 15) { l2 -= 16; qh[j] |= m2; }
                ql[j] = (uint8_t) (l1 | (l2 << 4));
            }
            m1 <<= 2; m2 <<= 2;
        }
    }
}

static void qk_decode(const uint8_t * b, float * y, int five) {
    qk_params p;
    qk_unpack(b, &p);
    for (int n = 0; n < QK; n += 64) {
        const int j = n / 32;
        const float d1 = p.d * (float) p.sc[j], m1 = p.dmin * (float) p.m[j];
        const float d2 = p.d * (float) p.sc[j + 1], m2 = p.dmin * (float) p.m[j + 1];
        for (int l = 0; l < 32; ++l) {
            int q1, q2;
            if (!five) {
                const uint8_t q = b[16 + n / 2 + l];
                q1 = q & 0xF; q2 = q >> 4;
            } else {
                const uint8_t q = b[48 + n / 2 + l], h = b[16 + l];
                q1 = (q & 0xF) + ((h >> (n / 32)) & 1 ? 16 : 0);
                q2 = (q >> 4) + ((h >> (n / 32 + 1)) & 1 ? 16 : 0);
            }
            y[n + l] = d1 * (float) q1 - m1;
            y[n + 32 + l] = d2 * (float) q2 - m2;
        }
    }
}

/* ------------------------------------------------------------------ Q6_K: x = (d*sc)*(q - 32) */

typedef struct {
    float d;
    int sc[16];
} q6_params;

static inline float q6_sub_err(const float * x, const float * w, float s) {
    v8f e = GQT_V8(v8f, 0.f);
    if (s == 0.f) {
        for (int k = 0; k < 16; k += 8) { const v8f xv = ld8(x + k); e += ld8(w + k) * (xv * xv); }
        return hsum8(e);
    }
    const v8f S = GQT_V8(v8f, s), I = GQT_V8(v8f, 1.f / s), M = GQT_V8(v8f, MAGIC);
    for (int k = 0; k < 16; k += 8) {
        const v8f xv = ld8(x + k);
        const v8f q = (clamp8(xv * I, -32.f, 31.f) + M) - M;
        const v8f r = xv - S * q;
        e += ld8(w + k) * (r * r);
    }
    return hsum8(e);
}

static inline void q6_sub_codes(const float * x, float s, int8_t * q) {
    if (s == 0.f) { memset(q, 0, 16); return; }
    const float inv = 1.f / s;
    for (int i = 0; i < 16; ++i) q[i] = (int8_t) round_clamp(x[i] * inv, -32.f, 31.f);
}

static double q6_block_err(const float * x, const float * w, const q6_params * p, float * sub) {
    double e = 0;
    for (int j = 0; j < 16; ++j) {
        const float ej = q6_sub_err(x + 16 * j, w + 16 * j, p->d * (float) p->sc[j]);
        if (sub) sub[j] = ej;
        e += ej;
    }
    return e;
}

static float q6_search_sub(const float * x, const float * w, q6_params * p, int j, float cur) {
    const float * xj = x + 16 * j, * wj = w + 16 * j;
    int bs = p->sc[j];
    float best = cur;
    for (int it = 0; it < 2; ++it) {
        int moved = 0;
        int8_t q[16];
        q6_sub_codes(xj, p->d * (float) bs, q);
        double Sqq = 0, Sxq = 0;
        for (int i = 0; i < 16; ++i) { Sqq += (double) wj[i] * q[i] * q[i]; Sxq += (double) wj[i] * xj[i] * q[i]; }
        if (Sqq > 0) {
            const int cs = nearest((float) (Sxq / Sqq / p->d), -128, 127);
            if (cs != bs) {
                const float e = q6_sub_err(xj, wj, p->d * (float) cs);
                if (e < best) { best = e; bs = cs; moved = 1; }
            }
        }
        for (int step = 0; step < PATTERN_MOVES; ++step) {
            int ns = bs;
            float nb = best;
            for (int ds = -1; ds <= 1; ds += 2) {
                const int s = bs + ds;
                if (s < -128 || s > 127) continue;
                const float e = q6_sub_err(xj, wj, p->d * (float) s);
                if (e < nb) { nb = e; ns = s; }
            }
            if (ns == bs) break;
            best = nb; bs = ns; moved = 1;
        }
        if (!moved) break;
    }
    p->sc[j] = bs;
    return best;
}

static int q6_refit(const float * x, const float * w, const q6_params * p, q6_params * out) {
    double Suu = 0, Sxu = 0;
    for (int j = 0; j < 16; ++j) {
        int8_t q[16];
        q6_sub_codes(x + 16 * j, p->d * (float) p->sc[j], q);
        for (int i = 0; i < 16; ++i) {
            const double u = (double) p->sc[j] * q[i], wi = w[16 * j + i];
            Suu += wi * u * u; Sxu += wi * x[16 * j + i] * u;
        }
    }
    *out = *p;
    if (!(Suu > 0)) return 0;
    const double d = Sxu / Suu;
    if (!finite_fp16((float) d)) return 0;
    out->d = fp16_round((float) d);
    return out->d != p->d && out->d != 0.f;
}

/* least-squares scale of one sub-block for the codes of scale s */
static int q6_ls(const float * x, const float * w, float s, float * a) {
    int8_t q[16];
    q6_sub_codes(x, s, q);
    double Sqq = 0, Sxq = 0;
    for (int i = 0; i < 16; ++i) { Sqq += (double) w[i] * q[i] * q[i]; Sxq += (double) w[i] * x[i] * q[i]; }
    if (!(Sqq > 0) || Sxq == 0) return 0;
    *a = (float) (Sxq / Sqq);
    return 1;
}

/* the best continuous scale of one sub-block for the weighted squared error: the largest |x| mapped
 * to -(32 + k/10) or +(31 + k/10), k = -10..10 (ggml's make_qx_quants tries the first side only, and
 * weights its objective by x^2), each refit by least squares, scored with the codes re-chosen */
static float q6_continuous(const float * x, const float * w) {
    float amax = 0, vmax = 0;
    for (int i = 0; i < 16; ++i) { const float ax = fabsf(x[i]); if (ax > amax) { amax = ax; vmax = x[i]; } }
    if (amax == 0.f) return 0.f;
    float ba = -vmax / 32.f, be = q6_sub_err(x, w, ba);
    for (int side = 0; side < 2; ++side) {
        for (int k = -10; k <= 10; ++k) {
            const float s = side == 0 ? -vmax / (32.f + 0.1f * (float) k) : vmax / (31.f + 0.1f * (float) k);
            float a;
            if (!q6_ls(x, w, s, &a)) continue;
            const float e = q6_sub_err(x, w, a);
            if (e < be) { be = e; ba = a; }
        }
    }
    for (int it = 0; it < 2; ++it) {
        float a;
        if (!q6_ls(x, w, ba, &a)) break;
        const float e = q6_sub_err(x, w, a);
        if (!(e < be)) break;
        be = e; ba = a;
    }
    return ba;
}

static void q6_rounds(const float * x, const float * w, q6_params * p, int rounds, float * sub, double * E_io) {
    double E = *E_io;
    for (int r = 0; r < rounds; ++r) {
        double En = 0;
        for (int j = 0; j < 16; ++j) { sub[j] = q6_search_sub(x, w, p, j, sub[j]); En += sub[j]; }
        int changed = En < E;
        E = En < E ? En : E;
        q6_params q;
        if (q6_refit(x, w, p, &q)) {
            float subq[16];
            const double Eq = q6_block_err(x, w, &q, subq);
            if (Eq < E) { *p = q; E = Eq; memcpy(sub, subq, 16 * sizeof *sub); changed = 1; }
        }
        if (!changed) break;
    }
    *E_io = E;
}

/* For the grid scale d, each sub-block's best integer scale among the three nearest a_j / d (the
 * codes re-chosen for each): the exact inner optimum up to those neighbours. Returns the block error. */
static double q6_scales_for_d(const float * x, const float * w, const float * a, float d, int * sc) {
    double e = 0;
    for (int j = 0; j < 16; ++j) {
        const int c = nearest(a[j] / d, -128, 127);
        float be = INFINITY;
        for (int s = c - 1; s <= c + 1; ++s) {
            if (s < -128 || s > 127) continue;
            const float es = q6_sub_err(x + 16 * j, w + 16 * j, d * (float) s);
            if (es < be) { be = es; sc[j] = s; }
        }
        e += be;
    }
    return e;
}

/* The int8 scales of one sub-block for the grid scale d, both signs, 0.8-1.6x the current magnitude, the
 * codes re-chosen for each: the error of a scale is jagged (the sign decides which end gets the 32nd step),
 * so the neighbours of the continuous optimum miss many of the best (Q6_K at the same d: MiniLM 0.893 ->
 * 0.857, Gemma 0.902 -> 0.871 of llama-quantize's error). All 256 scales give the same to 2e-5, at 1.5x the
 * time. Run once, on the winning start (on both: 0.0004 better, 1.15x the time). */
static float q6_scan_scales(const float * x, const float * w, float d, int * sc) {
    float best = INFINITY;
    const int c = abs(*sc), lo = c * 4 / 5 - 1, hi = c * 8 / 5 + 2;
    for (int m = lo < 0 ? 0 : lo; m <= hi && m <= 128; ++m) {
        for (int sg = -1; sg <= 1; sg += 2) {
            const int s = sg * m;
            if (s > 127 || (m == 0 && sg > 0)) continue;
            const float e = q6_sub_err(x, w, d * (float) s);
            if (e < best) { best = e; *sc = s; }
        }
    }
    return best;
}

#define Q6_D_STEPS 24   /* the grid scale over 1 +- Q6_D_STEPS/200: d decides every sub-block's scale steps */

static double q6_refine_block(const float * x, const float * w, q6_params * p, int rounds, double * before) {
    float sub[16];
    double E = q6_block_err(x, w, p, sub);
    *before = E;
    if (p->d == 0.f) return E;
    q6_rounds(x, w, p, rounds, sub, &E);
    /* a second start: each sub-block's continuous optimum on the int8 grid of ggml's rule (d = -max/128) */
    float a[16], amax = 0, smax = 0;
    for (int j = 0; j < 16; ++j) {
        a[j] = q6_continuous(x + 16 * j, w + 16 * j);
        if (fabsf(a[j]) > amax) { amax = fabsf(a[j]); smax = a[j]; }
    }
    q6_params q;
    q.d = fp16_round(-smax / 128.f);
    if (q.d == 0.f || !isfinite(q.d)) return E;
    double best = q6_scales_for_d(x, w, a, q.d, q.sc);
    for (int k = -Q6_D_STEPS; k <= Q6_D_STEPS; ++k) {   /* the grid scale, each with its best sub-block scales */
        q6_params c;
        c.d = fp16_round(-smax / 128.f * (1.f + 0.005f * (float) k));
        if (k == 0 || c.d == 0.f || !isfinite(c.d)) continue;
        const double e = q6_scales_for_d(x, w, a, c.d, c.sc);
        if (e < best) { best = e; q = c; }
    }
    float subq[16];
    double Eq = q6_block_err(x, w, &q, subq);
    q6_rounds(x, w, &q, rounds, subq, &Eq);
    if (Eq < E) { *p = q; E = Eq; }
    q = *p;
    Eq = 0;
    for (int j = 0; j < 16; ++j) Eq += subq[j] = q6_scan_scales(x + 16 * j, w + 16 * j, q.d, &q.sc[j]);
    q6_rounds(x, w, &q, rounds, subq, &Eq);
    if (Eq < E) { *p = q; E = Eq; }
    return E;
}

static void q6_unpack(const uint8_t * b, q6_params * p) {
    uint16_t h;
    memcpy(&h, b + 208, 2);
    p->d = gqt_fp16_to_fp32(h);
    for (int j = 0; j < 16; ++j) p->sc[j] = (int8_t) b[192 + j];
}

static void q6_pack(const float * x, const q6_params * p, uint8_t * b) {
    uint8_t L[QK];
    for (int j = 0; j < 16; ++j) {
        int8_t q[16];
        q6_sub_codes(x + 16 * j, p->d * (float) p->sc[j], q);
        for (int i = 0; i < 16; ++i) L[16 * j + i] = (uint8_t) (q[i] + 32);
    }
    uint8_t * ql = b, * qh = b + 128;
    for (int n = 0; n < QK; n += 128, ql += 64, qh += 32) {
        for (int l = 0; l < 32; ++l) {
            const uint8_t q1 = L[n + l] & 0xF, q2 = L[n + l + 32] & 0xF, q3 = L[n + l + 64] & 0xF, q4 = L[n + l + 96] & 0xF;
            ql[l] = (uint8_t) (q1 | (q3 << 4));
            ql[l + 32] = (uint8_t) (q2 | (q4 << 4));
            qh[l] = (uint8_t) ((L[n + l] >> 4) | ((L[n + l + 32] >> 4) << 2) | ((L[n + l + 64] >> 4) << 4) | ((L[n + l + 96] >> 4) << 6));
        }
    }
    for (int j = 0; j < 16; ++j) b[192 + j] = (uint8_t) (int8_t) p->sc[j];
    const gqt_fp16 hd = gqt_fp32_to_fp16(p->d);
    memcpy(b + 208, &hd, 2);
}

static void q6_decode(const uint8_t * b, float * y) {
    q6_params p;
    q6_unpack(b, &p);
    const uint8_t * ql = b, * qh = b + 128;
    for (int n = 0; n < QK; n += 128, ql += 64, qh += 32) {
        for (int l = 0; l < 32; ++l) {
            const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            const int is = (n + l) / 16;
            y[n + l] = p.d * (float) p.sc[is] * (float) q1;
            y[n + l + 32] = p.d * (float) p.sc[is + 2] * (float) q2;
            y[n + l + 64] = p.d * (float) p.sc[is + 4] * (float) q3;
            y[n + l + 96] = p.d * (float) p.sc[is + 6] * (float) q4;
        }
    }
}

/* ------------------------------------------------------------------ rows */

static int64_t block_bytes(int type) {
    return type == GQT_KQ_Q4_K ? GQT_KQ_Q4_K_BYTES : type == GQT_KQ_Q5_K ? GQT_KQ_Q5_K_BYTES :
           type == GQT_KQ_Q6_K ? GQT_KQ_Q6_K_BYTES : 0;
}

int64_t gqt_kq_row_size(int type, int64_t n_per_row) {
    return n_per_row % QK ? 0 : n_per_row / QK * block_bytes(type);
}

static int check(int type, const float * x, const float * w, int64_t nrows, int64_t n) {
    if (!block_bytes(type)) return GQT_KQ_ERR_TYPE;
    if (n <= 0 || n % QK || nrows < 0) return GQT_KQ_ERR_SHAPE;
    for (int64_t i = 0; i < nrows * n; ++i) if (!isfinite(x[i])) return GQT_KQ_ERR_NONFINITE;
    if (w) for (int64_t i = 0; i < n; ++i) if (!isfinite(w[i]) || w[i] < 0) return GQT_KQ_ERR_NONFINITE;
    return GQT_KQ_OK;
}

GQT_MULTIVERSION
int gqt_kq_refine_rows(int type, const float * x, const float * w, void * blocks, int64_t nrows,
                       int64_t n_per_row, int rounds, double * err_before, double * err_after) {
    const int rc = check(type, x, w, nrows, n_per_row);
    if (rc) return rc;
    if (rounds < 1 || rounds > GQT_KQ_ROUNDS_MAX) return GQT_KQ_ERR_PARAM;
    const int64_t nb = n_per_row / QK, bb = block_bytes(type);
    const float nmax = type == GQT_KQ_Q4_K ? 15.f : 31.f;
    double tb = 0, ta = 0;
    for (int64_t r = 0; r < nrows; ++r) {
        for (int64_t i = 0; i < nb; ++i) {
            const float * xb = x + r * n_per_row + i * QK;
            const float * wb = w ? w + i * QK : ONES;
            uint8_t * b = (uint8_t *) blocks + (r * nb + i) * bb;
            double before, after;
            if (type == GQT_KQ_Q6_K) {
                q6_params p;
                q6_unpack(b, &p);
                after = q6_refine_block(xb, wb, &p, rounds, &before);
                if (after < before) q6_pack(xb, &p, b);
            } else {
                qk_params p;
                qk_unpack(b, &p);
                after = qk_refine_block(xb, wb, nmax, &p, rounds, &before);
                if (after < before) qk_pack(xb, nmax, &p, b, type == GQT_KQ_Q5_K);
            }
            tb += before;
            ta += after < before ? after : before;
        }
    }
    if (err_before) *err_before = tb;
    if (err_after) *err_after = ta;
    return GQT_KQ_OK;
}

int gqt_kq_dequantize_rows(int type, const void * blocks, float * y, int64_t nrows, int64_t n_per_row) {
    if (!block_bytes(type)) return GQT_KQ_ERR_TYPE;
    if (n_per_row <= 0 || n_per_row % QK || nrows < 0) return GQT_KQ_ERR_SHAPE;
    const int64_t nb = nrows * (n_per_row / QK), bb = block_bytes(type);
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t * b = (const uint8_t *) blocks + i * bb;
        if (type == GQT_KQ_Q6_K) q6_decode(b, y + i * QK);
        else qk_decode(b, y + i * QK, type == GQT_KQ_Q5_K);
    }
    return GQT_KQ_OK;
}

int gqt_kq_block_errors(int type, const float * x, const float * w, const void * blocks, int64_t nrows,
                        int64_t n_per_row, double * out) {
    const int rc = check(type, x, w, nrows, n_per_row);
    if (rc) return rc;
    const int64_t nb = n_per_row / QK, bb = block_bytes(type);
    float y[QK];
    for (int64_t r = 0; r < nrows; ++r) {
        for (int64_t i = 0; i < nb; ++i) {
            const uint8_t * b = (const uint8_t *) blocks + (r * nb + i) * bb;
            if (type == GQT_KQ_Q6_K) q6_decode(b, y); else qk_decode(b, y, type == GQT_KQ_Q5_K);
            const float * xb = x + r * n_per_row + i * QK;
            const float * wb = w ? w + i * QK : ONES;
            double e = 0;
            for (int k = 0; k < QK; ++k) { const double d = (double) xb[k] - y[k]; e += wb[k] * d * d; }
            out[r * nb + i] = e;
        }
    }
    return GQT_KQ_OK;
}
