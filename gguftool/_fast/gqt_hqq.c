/* HQQ solver and Q4_HQQ / Q4_HQQ_128 kernels. The math, and why it differs from
 * hqq's torch code, is documented in gguftool/quant/hqq.py, whose numpy reference this file
 * matches byte for byte: same float32 operations in the same order, sequential sums, rounding
 * half-to-even of the clamped value, the shrink's pow in double through libm. */
#include "gqt_hqq.h"

#include <math.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* Scale-search offsets r, in search order: inverse scale (qmax + r) / (max - min). The Python
 * reference reads them through gqt_hqq_scale_step. */
static const float GQT_HQQ_SCALE_STEPS[2 * GQT_HQQ_SCALE_SEARCH_MAX] = {
    0.5f, -0.5f, 1.0f, -1.0f, 0.25f, -0.25f, 0.75f, -0.75f, 1.5f, -1.5f, 2.0f, -2.0f,
};

#define FP16_NAN 0x7E00

typedef struct {
    int group;      /* values per solver group (= block) */
    int qmax;       /* 15 or 31 */
    int stock;      /* 1: ggml Q4_1/Q5_1 (d, m), 0: ours (scale, zero) */
    size_t bytes;   /* bytes per block */
} hqq_target;

static int target_info(int target, hqq_target * t) {
    switch (target) {
#define TARGET(T, STOCK) \
        t->group = GQT_##T##_BLOCK; t->bytes = GQT_##T##_BYTES; t->qmax = (1 << GQT_##T##_BITS) - 1; t->stock = STOCK; return 1
    case GQT_TYPE_Q4_HQQ:     TARGET(Q4_HQQ, 0);
    case GQT_TYPE_Q4_HQQ_128: TARGET(Q4_HQQ_128, 0);
    case GQT_HQQ_TARGET_Q4_1: TARGET(Q4_1, 1);
    case GQT_HQQ_TARGET_Q5_1: TARGET(Q5_1, 1);
#undef TARGET
    default: return 0;
    }
}

float gqt_hqq_scale_step(int i) {
    return i >= 0 && i < 2 * GQT_HQQ_SCALE_SEARCH_MAX ? GQT_HQQ_SCALE_STEPS[i] : 0.0f;
}

void gqt_hqq_default_params(gqt_hqq_params * p) {
    p->lp_norm = 0.7f;
    p->beta = 10.0f;
    p->kappa = 1.01f;
    p->iters = 20;
    p->early_stop = 1;
    p->scale_search = 0;
    p->refit = 2;          /* see HQQParams in hqq.py */
}

static int params_ok(const gqt_hqq_params * p) {
    return p->lp_norm > 0.0f && p->lp_norm <= 1.0f && p->beta > 0.0f && isfinite(p->beta) &&
           p->kappa >= 1.0f && isfinite(p->kappa) && p->iters >= 0 && p->iters <= GQT_HQQ_ITERS_MAX &&
           (p->early_stop == 0 || p->early_stop == 1) &&
           p->scale_search >= 0 && p->scale_search <= GQT_HQQ_SCALE_SEARCH_MAX &&
           p->refit >= 0 && p->refit <= GQT_HQQ_REFIT_MAX;
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

/* ------------------------------------------------------------------ lane engine
 * Blocks are independent, and every block's sums run left to right (the order numpy's reference
 * uses), so SIMD goes across blocks, never inside one: lane l of an 8-wide vector works on its own
 * block, element j of that block at X[8*j + l]. Each lane performs exactly the scalar operations
 * of the reference in the same order, so the bytes do not depend on the vector width. Written with
 * GCC/clang vector extensions: AVX (via target_clones) or SSE2 on x86, NEON on arm64. */
#define LANES 8
#define GMAX 128
typedef float   vf __attribute__((vector_size(4 * LANES)));
typedef int32_t vi __attribute__((vector_size(4 * LANES)));

/* Macros rather than functions: vectors never cross a call (no ABI questions without AVX). */
#define VSPLAT(v) ((vf) {(v), (v), (v), (v), (v), (v), (v), (v)})
#define VSEL(m, a, b) ((vf) (((m) & (vi) (a)) | (~(m) & (vi) (b))))
#define VABS(v) ((vf) ((vi) (v) & (vi) {0x7FFFFFFF, 0x7FFFFFFF, 0x7FFFFFFF, 0x7FFFFFFF, \
                                        0x7FFFFFFF, 0x7FFFFFFF, 0x7FFFFFFF, 0x7FFFFFFF}))
#define VLOAD(dst, p) memcpy(&(dst), (p), sizeof(vf))
#define VSTORE(p, v) memcpy((p), &(v), sizeof(vf))
/* round_clamped, lane by lane, in place */
#define VROUND_CLAMPED(v, qmax) do { \
        (v) = VSEL((v) < VSPLAT(0.0f), VSPLAT(0.0f), (v)); \
        (v) = VSEL((v) > VSPLAT(qmax), VSPLAT(qmax), (v)); \
        (v) = ((v) + VSPLAT(12582912.0f)) - VSPLAT(12582912.0f); \
    } while (0)

/* Lane l of X takes src[0..G) (src NULL: zeros, an idle lane). */
static void load_lane(float * X, int l, const float * src, int G) {
    for (int j = 0; j < G; j++) X[LANES * j + l] = src ? src[j] : 0.0f;
}

/* The n <= LANES consecutive blocks at x into the lanes of X (the rest idle, zeros): an 8 x 8
 * transpose in registers per 8 values of each block (_MM256_TRANSPOSE8_PS's shuffles). */
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define SHUF __builtin_shufflevector
GQT_MULTIVERSION
static void load_group(float * X, const float * x, int n, int G) {
    if (n < LANES) {
        for (int l = 0; l < LANES; l++) load_lane(X, l, l < n ? x + (int64_t) l * G : NULL, G);
        return;
    }
    for (int j = 0; j < G; j += LANES) {
        vf r[LANES], t[LANES], u[LANES];
        for (int l = 0; l < LANES; l++) VLOAD(r[l], x + (int64_t) l * G + j);
        for (int i = 0; i < LANES; i += 2) {
            t[i] = SHUF(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
            t[i + 1] = SHUF(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
        }
        for (int i = 0; i < LANES; i += 4)
            for (int h = 0; h < 2; h++) {
                u[i + 2 * h] = SHUF(t[i + h], t[i + 2 + h], 0, 1, 8, 9, 4, 5, 12, 13);
                u[i + 2 * h + 1] = SHUF(t[i + h], t[i + 2 + h], 2, 3, 10, 11, 6, 7, 14, 15);
            }
        for (int c = 0; c < 4; c++) {   /* u[c] holds elements c and c+4 of blocks 0-3, u[c+4] of 4-7 */
            const vf lo = SHUF(u[c], u[c + 4], 0, 1, 2, 3, 8, 9, 10, 11);
            const vf hi = SHUF(u[c], u[c + 4], 4, 5, 6, 7, 12, 13, 14, 15);
            VSTORE(X + LANES * (j + c), lo);
            VSTORE(X + LANES * (j + c + 4), hi);
        }
    }
}
#undef SHUF
#else
static void load_group(float * X, const float * x, int n, int G) {
    for (int l = 0; l < LANES; l++) load_lane(X, l, l < n ? x + (int64_t) l * G : NULL, G);
}
#endif

/* beta and the shrink's threshold at each step, filled lazily: most blocks stop within a few steps. */
typedef struct {
    double beta[GQT_HQQ_ITERS_MAX], live_min[GQT_HQQ_ITERS_MAX];
    float thr[GQT_HQQ_ITERS_MAX];   /* largest float <= live_min: for float x, x > thr <=> x > live_min */
    double kappa, pm1;
    int n;
} step_table;

static void step_table_init(step_table * T, const gqt_hqq_params * p) {
    T->beta[0] = (double) p->beta;
    T->kappa = (double) p->kappa;
    T->pm1 = (double) p->lp_norm - 1.0;
    T->n = 0;
}

static void step_table_fill(step_table * T, int it) {
    for (; T->n <= it; T->n++) {
        const int k = T->n;
        if (k > 0) T->beta[k] = T->beta[k - 1] * T->kappa;
        T->live_min[k] = pow(1.0 / T->beta[k], 1.0 / (1.0 - T->pm1)) * (1.0 - 1e-4);
        float f = (float) T->live_min[k];
        if ((double) f > T->live_min[k]) f = nextafterf(f, 0.0f);
        T->thr[k] = f;
    }
}

/* One proximal step of one lane in plain scalar code, the shrink included: for the rare steps
 * where some residual is large enough to survive the shrink. */
static void step_scalar(const float * X, const float * WX, int l, int G, float s, float z, float qmax,
                        const step_table * T, int it, float * zsum, float * esum) {
    float zs = 0.0f, es = 0.0f;
    for (int j = 0; j < G; j++) {
        const float W_f = X[LANES * j + l];
        const float W_q = round_clamped(W_f * s + z, qmax);
        const float W_r = (W_q - z) / s;
        const float r = W_f - W_r;
        const float W_e = shrink_lp(r, T->beta[it], T->pm1, T->live_min[it]);
        if (WX) {   /* weighted: w * term (w = 1 gives the unweighted sums exactly) */
            const float wj = WX[LANES * j + l];
            zs += wj * (W_q - (W_f - W_e) * s);
            es += wj * fabsf(r);
        } else {
            zs += W_q - (W_f - W_e) * s;
            es += fabsf(r);
        }
    }
    *zsum = zs;
    *esum = es;
}

/* z: start value in, result out; w: the block's normalized importance weights (NULL: unweighted), sw their sum */
typedef struct { const float * x; const float * w; float sw; float s; float z; } zero_job;

/* hqq's proximal loop for the zero of every job (a block and an inverse scale s):
 *   W_q = rint(clamp(W_f*s + z)), W_r = (W_q - z)/s, W_e = shrink(W_f - W_r),
 *   z = mean(W_q - (W_f - W_e)*s), beta *= kappa, stop when mean|W_f - W_r| stops falling
 * (keeping that step's zero, as hqq does); `weighted`: both means weighted by the job's w (sum w*t / sw).
 * A lane whose job stops takes the next job at once, so lanes never idle behind a slow block. */
GQT_MULTIVERSION
static void solve_zero_jobs(zero_job * jobs, int njobs, int G, float qmax, const gqt_hqq_params * p,
                            step_table * T, int weighted) {
    float X[LANES * GMAX], WX[LANES * GMAX], s[LANES], z[LANES], best[LANES], thr[LANES], zs_a[LANES], es_a[LANES];
    float den[LANES];   /* the means' denominators: G, or the job's sum of weights */
    int it[LANES], job[LANES];
    const float Gf = (float) G;
    int next = 0, active = 0;
    if (p->iters <= 0) return;
    for (int l = 0; l < LANES; l++) {
        job[l] = next < njobs ? next++ : -1;
        load_lane(X, l, job[l] >= 0 ? jobs[job[l]].x : NULL, G);
        if (weighted) load_lane(WX, l, job[l] >= 0 ? jobs[job[l]].w : NULL, G);
        den[l] = weighted && job[l] >= 0 ? jobs[job[l]].sw : Gf;
        s[l] = job[l] >= 0 ? jobs[job[l]].s : 1.0f;
        z[l] = job[l] >= 0 ? jobs[job[l]].z : 0.0f;
        best[l] = INFINITY;
        it[l] = 0;
        active += job[l] >= 0;
    }
    step_table_fill(T, 0);
    while (active > 0) {
        for (int l = 0; l < LANES; l++) thr[l] = job[l] >= 0 ? T->thr[it[l]] : INFINITY;
        vf S, Z, TH, W_f, W_q, ar;
        VLOAD(S, s);
        VLOAD(Z, z);
        VLOAD(TH, thr);
        vf zs = VSPLAT(0.0f), es = VSPLAT(0.0f), WV;
        vi live = (vi) VSPLAT(0.0f);
        if (weighted)
            for (int j = 0; j < G; j++) {
                VLOAD(W_f, X + LANES * j);
                VLOAD(WV, WX + LANES * j);
                W_q = W_f * S + Z;
                VROUND_CLAMPED(W_q, qmax);
                ar = VABS(W_f - (W_q - Z) / S);
                live |= ar > TH;
                zs += WV * (W_q - W_f * S);
                es += WV * ar;
            }
        else
            for (int j = 0; j < G; j++) {
                VLOAD(W_f, X + LANES * j);
                W_q = W_f * S + Z;
                VROUND_CLAMPED(W_q, qmax);
                ar = VABS(W_f - (W_q - Z) / S);
                live |= ar > TH;
                zs += W_q - W_f * S;   /* W_e = 0 below the threshold: W_f - 0 is W_f */
                es += ar;
            }
        VSTORE(zs_a, zs);
        VSTORE(es_a, es);
        for (int l = 0; l < LANES; l++) {
            if (job[l] < 0) continue;
            if (live[l]) step_scalar(X, weighted ? WX : NULL, l, G, s[l], z[l], qmax, T, it[l], &zs_a[l], &es_a[l]);
            const float err = es_a[l] / den[l];
            z[l] = zs_a[l] / den[l];
            int done = 0;
            if (p->early_stop) {
                if (err < best[l]) best[l] = err;
                else done = 1;
            }
            if (++it[l] >= p->iters) done = 1;
            if (!done) {
                step_table_fill(T, it[l]);
                continue;
            }
            jobs[job[l]].z = z[l];
            job[l] = next < njobs ? next++ : -1;
            active -= job[l] < 0;
            load_lane(X, l, job[l] >= 0 ? jobs[job[l]].x : NULL, G);
            if (weighted) load_lane(WX, l, job[l] >= 0 ? jobs[job[l]].w : NULL, G);
            den[l] = weighted && job[l] >= 0 ? jobs[job[l]].sw : Gf;
            s[l] = job[l] >= 0 ? jobs[job[l]].s : 1.0f;
            z[l] = job[l] >= 0 ? jobs[job[l]].z : 0.0f;
            best[l] = INFINITY;
            it[l] = 0;
        }
    }
}

/* Lane by lane over one group of 8 blocks (XT: element j of lane l at XT[8*j + l]): the codes of
 * each block on the grid of its stored fp16 pair, sc/bb = (scale, zero), or (d, m) for Q4_1/Q5_1
 * (sc = 0: codes 0), the block's squared error (sq) and, for the least-squares refit (sums not
 * NULL), the sums of q, q^2 and q*x of the same codes (sums[0..2]), all left to right. WT not NULL:
 * the same group's importance weights (lane-major like XT), and every sum is of w * term. */
#define GRID_CODES(W_q, W_f) do { \
        W_q = stock ? (W_f - BB) / SC : W_f / SC + BB; \
        VROUND_CLAMPED(W_q, qmax); \
        W_q = VSEL(nz, W_q, VSPLAT(0.0f)); \
    } while (0)

GQT_MULTIVERSION
static void grid_group(const float * XT, const float * WT, int G, float qmax, int stock, const float * sc,
                       const float * bb, float * sq, float (*sums)[LANES]) {
    vf SC, BB, W_f, W_q, WV;
    VLOAD(SC, sc);
    VLOAD(BB, bb);
    const vi nz = SC != VSPLAT(0.0f);
    vf acc = VSPLAT(0.0f), d;
    if (WT) {
        vf s_q = VSPLAT(0.0f), s_qq = s_q, s_qx = s_q;
        for (int j = 0; j < G; j++) {
            VLOAD(W_f, XT + LANES * j);
            VLOAD(WV, WT + LANES * j);
            GRID_CODES(W_q, W_f);
            d = W_f - (stock ? SC * W_q + BB : (W_q - BB) * SC);
            acc += WV * (d * d);
            if (sums) {
                s_q += WV * W_q;
                s_qq += WV * (W_q * W_q);
                s_qx += WV * (W_q * W_f);
            }
        }
        VSTORE(sq, acc);
        if (sums) {
            VSTORE(sums[0], s_q);
            VSTORE(sums[1], s_qq);
            VSTORE(sums[2], s_qx);
        }
        return;
    }
    if (sums == NULL) {
        for (int j = 0; j < G; j++) {
            VLOAD(W_f, XT + LANES * j);
            GRID_CODES(W_q, W_f);
            d = W_f - (stock ? SC * W_q + BB : (W_q - BB) * SC);
            acc += d * d;
        }
        VSTORE(sq, acc);
        return;
    }
    vf s_q = VSPLAT(0.0f), s_qq = s_q, s_qx = s_q;
    for (int j = 0; j < G; j++) {
        VLOAD(W_f, XT + LANES * j);
        GRID_CODES(W_q, W_f);
        d = W_f - (stock ? SC * W_q + BB : (W_q - BB) * SC);
        acc += d * d;
        s_q += W_q;
        s_qq += W_q * W_q;
        s_qx += W_q * W_f;
    }
    VSTORE(sq, acc);
    VSTORE(sums[0], s_q);
    VSTORE(sums[1], s_qq);
    VSTORE(sums[2], s_qx);
}

/* Per block, the sum of its values left to right (lane by lane over a group); WT not NULL: of w * x. */
GQT_MULTIVERSION
static void group_sum(const float * XT, const float * WT, int G, float * out) {
    vf acc = VSPLAT(0.0f), W_f, WV;
    for (int j = 0; j < G; j++) {
        VLOAD(W_f, XT + LANES * j);
        if (WT) {
            VLOAD(WV, WT + LANES * j);
            acc += WV * W_f;
        } else {
            acc += W_f;
        }
    }
    VSTORE(out, acc);
}

/* The codes of one block (contiguous x) on the grid of its final pair: the same operations as
 * grid_group, here across the block's elements (no sums involved). For Q5_1; the 4-bit targets
 * use block_nibbles. */
GQT_MULTIVERSION
static void block_codes(const float * x, int G, float qmax, int stock, float sc_f, float bb_f, uint8_t * q) {
    const vf SC = VSPLAT(sc_f), BB = VSPLAT(bb_f);
    const vi nz = SC != VSPLAT(0.0f);
    vf W_f, W_q;
    float c[LANES];
    for (int j0 = 0; j0 < G; j0 += LANES) {
        VLOAD(W_f, x + j0);
        GRID_CODES(W_q, W_f);
        VSTORE(c, W_q);
        for (int l = 0; l < LANES; l++) q[j0 + l] = (uint8_t) c[l];
    }
}

typedef uint8_t vbyte __attribute__((vector_size(LANES)));

/* block_codes for qmax 15, packed as it goes: per 32-value sub-block, byte j = code j | code j+16 << 4. */
GQT_MULTIVERSION
static void block_nibbles(const float * x, int G, int stock, float sc_f, float bb_f, uint8_t * qs) {
    const vf SC = VSPLAT(sc_f), BB = VSPLAT(bb_f);
    const vi nz = SC != VSPLAT(0.0f);
    const float qmax = 15.0f;
    vf W_f, lo, hi;
    for (int k = 0; k < G; k += 32)
        for (int h = 0; h < 16; h += LANES) {
            VLOAD(W_f, x + k + h);
            GRID_CODES(lo, W_f);
            VLOAD(W_f, x + k + 16 + h);
            GRID_CODES(hi, W_f);
            const vbyte b = __builtin_convertvector(__builtin_convertvector(lo, vi) | (__builtin_convertvector(hi, vi) << 4), vbyte);
            memcpy(qs + k / 2 + h, &b, LANES);
        }
}

/* Per block: finite?, min and max, lane by lane over a group. */
GQT_MULTIVERSION
static void group_range(const float * XT, int G, float * mn, float * mx, int * finite) {
    vf lo, hi, W_f;
    vi fin = (vi) VSPLAT(0.0f) == (vi) VSPLAT(0.0f);
    VLOAD(lo, XT);
    hi = lo;
    for (int j = 0; j < G; j++) {
        VLOAD(W_f, XT + LANES * j);
        fin &= (W_f - W_f) == VSPLAT(0.0f);   /* false for NaN and +-Inf */
        lo = VSEL(W_f < lo, W_f, lo);
        hi = VSEL(W_f > hi, W_f, hi);
    }
    VSTORE(mn, lo);
    VSTORE(mx, hi);
    for (int l = 0; l < LANES; l++) finite[l] = fin[l] != 0;
}

#define BATCH_VALUES 4096   /* values per batch: blocks of a batch are transposed once */
#define BATCH_MAX (BATCH_VALUES / 32)
#define CAND_MAX (1 + 2 * GQT_HQQ_SCALE_SEARCH_MAX)

/* Per-block state, lane-major: the 8 blocks of group g sit at [8g .. 8g+8), one vector. */
typedef struct {
    float XT[BATCH_VALUES];                 /* the batch, in groups of 8 blocks (see grid_group) */
    zero_job zj[CAND_MAX * BATCH_MAX];
    int zj_index[CAND_MAX * BATCH_MAX];     /* candidate * BATCH_MAX + block of each zero job */
    int32_t cand_a[CAND_MAX * BATCH_MAX];   /* a candidate's fp16 scale (d), its value, its zero */
    float cand_af[CAND_MAX * BATCH_MAX], cand_z[CAND_MAX * BATCH_MAX];
    float mn[BATCH_MAX], mx[BATCH_MAX];
    int32_t a[BATCH_MAX], b[BATCH_MAX];     /* the chosen fp16 pair (bits), and its values */
    float af[BATCH_MAX], bf[BATCH_MAX];
    int32_t status[BATCH_MAX];
    int weighted;                           /* importance weights given: WB, WT, sw hold them */
    float WB[BATCH_VALUES], WT[BATCH_VALUES];   /* per block, w / max(w) (all 1 where max(w) is 0), as the */
    float sw[BATCH_MAX];                        /* batch (WB) and lane-major like XT (WT); sw: their sums */
    step_table steps;
} workspace;

enum { B_SOLVE = 1, B_CONST = 2 };   /* status: GQT_ERR_* (< 0), or what the block needs */
static const uint8_t ZERO_CODES[GMAX];

/* gqt_fp32_to_fp16 and gqt_fp16_to_fp32 lane by lane (gqt_common.h's GQT_V8_*), fp16 values in
 * int32 lanes. */
typedef uint32_t vu __attribute__((vector_size(4 * LANES)));
#define VUSPLAT(v) ((vu) {(v), (v), (v), (v), (v), (v), (v), (v)})
#define VUSEL(m, a, b) ((vu) (((m) & (vi) (a)) | (~(m) & (vi) (b))))
#define VFINITE(v) ((v) - (v) == VSPLAT(0.0f))   /* false for NaN and +-Inf */
#define VTO_FP16(out, f) do { gqt_v8u h_; GQT_V8_FP32_TO_FP16(h_, (f)); (out) = (vi) h_; } while (0)
#define VFROM_FP16(out, h) GQT_V8_FP16_TO_FP32(out, (gqt_v8u) (h))
GQT_STATIC_ASSERT(lanes, LANES == 8);   /* gqt_common.h's lane-wise fp16 conversions are 8 wide */
#define VSTORE_IF(p, m, v) do { vf old_; VLOAD(old_, (p)); old_ = VSEL((m), (v), old_); VSTORE((p), old_); } while (0)

/* Candidate k of the 8 blocks of group g (inverse scale (qmax + r)/(max - min), capped): its fp16
 * scale, and a zero job for every block still to solve. */
GQT_MULTIVERSION
static void candidate_group(workspace * w, int g, int k, float r, const float * x, const hqq_target * t, int * nj) {
    const int o = g * LANES, G = t->group;
    vf MN, MX, SIN, S, Z0, SHF;
    vi SH, on;
    VLOAD(MN, w->mn + o);
    VLOAD(MX, w->mx + o);
    VLOAD(on, w->status + o);
    on = on == (vi) VUSPLAT(B_SOLVE);
    const vf AMN = VABS(MN), AMX = VABS(MX);
    const vf zcap = VSPLAT(GQT_HQQ_ZERO_CAP) / VSEL(AMN > AMX, AMN, AMX);
    const vf cap = VSEL(VSPLAT(GQT_HQQ_S_INV_CAP) < zcap, VSPLAT(GQT_HQQ_S_INV_CAP), zcap);
    SIN = VSPLAT((float) t->qmax + r) / (MX - MN);
    SIN = VSEL(SIN < cap, SIN, cap);   /* also catches +inf */
    const vf inv = VSPLAT(1.0f) / SIN;
    VTO_FP16(SH, inv);
    VFROM_FP16(SHF, SH);
    S = VSPLAT(1.0f) / SHF;
    Z0 = -MN * S;
    const vi bad = on & ~VFINITE(SHF);
    float s[LANES], z0[LANES];
    VSTORE(s, S);
    VSTORE(z0, Z0);
    memcpy(w->cand_a + k * BATCH_MAX + o, &SH, sizeof SH);
    VSTORE(w->cand_af + k * BATCH_MAX + o, SHF);
    for (int l = 0; l < LANES; l++) {
        if (!on[l]) continue;
        if (bad[l]) { w->status[o + l] = GQT_ERR_RANGE; continue; }
        w->zj[*nj] = (zero_job) {x + (int64_t) (o + l) * G, w->weighted ? w->WB + (int64_t) (o + l) * G : NULL,
                                 w->sw[o + l], s[l], z0[l]};
        w->zj_index[(*nj)++] = k * BATCH_MAX + o + l;
    }
}

/* Group g: of candidates 0..ncand-1, each block keeps the one with the lowest squared error (ties:
 * the earlier); then `rounds` of least-squares refit of its pair to its codes (x ~ A*q + C, like the
 * inner step of llama.cpp's make_qkx2_quants), the codes chosen again, each round kept only while it
 * lowers the block's squared error. The pass that scores a pair also sums its codes for the next round.
 * With importance weights every error and sum is weighted, and n (the count) is the sum of the weights. */
GQT_MULTIVERSION
static void choose_group(workspace * w, int g, int ncand, int rounds, const hqq_target * t) {
    const int o = g * LANES, G = t->group;
    const float * XT = w->XT + (int64_t) o * G;
    const float * WT = w->weighted ? w->WT + (int64_t) o * G : NULL;
    const float qmax = (float) t->qmax;
    float sq_a[LANES], sums[3][LANES], sc[LANES], bb[LANES];
    vf BEST = VSPLAT(INFINITY), AF = VSPLAT(0.0f), BF = AF, SQ, SUM[3] = {AF, AF, AF}, S_X, N = VSPLAT((float) G);
    if (WT) VLOAD(N, w->sw + o);
    vi A = (vi) VUSPLAT(0), B = A, on;
    VLOAD(on, w->status + o);
    on = on == (vi) VUSPLAT(B_SOLVE);
    for (int k = 0; k < ncand; k++) {
        vf SC, Z, BBF;
        vi BBITS;
        VLOAD(SC, w->cand_af + k * BATCH_MAX + o);
        VLOAD(Z, w->cand_z + k * BATCH_MAX + o);
        const vf zb = t->stock ? -(SC * Z) : Z;   /* Q4_1/Q5_1: m = -scale * zero */
        VTO_FP16(BBITS, zb);
        VFROM_FP16(BBF, BBITS);
        SC = VSEL(on, SC, VSPLAT(0.0f));
        BBF = VSEL(on, BBF, VSPLAT(0.0f));
        VSTORE(sc, SC);
        VSTORE(bb, BBF);
        grid_group(XT, WT, G, qmax, t->stock, sc, bb, sq_a, rounds ? sums : NULL);
        VLOAD(SQ, sq_a);
        const vi take = on & (SQ < BEST);
        vi CA;
        memcpy(&CA, w->cand_a + k * BATCH_MAX + o, sizeof CA);
        BEST = VSEL(take, SQ, BEST);
        A = (vi) VUSEL(take, CA, A);
        B = (vi) VUSEL(take, BBITS, B);
        AF = VSEL(take, SC, AF);
        BF = VSEL(take, BBF, BF);
        if (rounds)
            for (int i = 0; i < 3; i++) {
                vf v;
                VLOAD(v, sums[i]);
                SUM[i] = VSEL(take, v, SUM[i]);
            }
    }
    /* No candidate with a finite error: for Q4_1/Q5_1, m = -scale * zero overflows fp16 (the block's
     * minimum is beyond +-65504). The block has no encoding: refused, never stored as a zero block. */
    const vi none = on & ~(BEST < VSPLAT(INFINITY));
    for (int l = 0; l < LANES; l++)
        if (none[l]) w->status[o + l] = GQT_ERR_RANGE;
    on &= ~none;
    if (rounds) group_sum(XT, WT, G, sc), VLOAD(S_X, sc);
    vi live = on;
    for (int round = 0; round < rounds; round++) {
        const vf D = N * SUM[1] - SUM[0] * SUM[0];
        const vf NA = (N * SUM[2] - SUM[0] * S_X) / D;
        const vf C = (S_X - NA * SUM[0]) / N;
        vi na, nbz;
        vf naf, nbf;
        VTO_FP16(na, NA);
        VFROM_FP16(naf, na);
        const vf cb = t->stock ? C : -C / naf;
        VTO_FP16(nbz, cb);
        VFROM_FP16(nbf, nbz);
        live &= (D > VSPLAT(0.0f)) & (naf > VSPLAT(0.0f)) & VFINITE(naf) & VFINITE(nbf);
        int any = 0;
        for (int l = 0; l < LANES; l++) any |= live[l] != 0;
        if (!any) break;
        const vf SC = VSEL(live, naf, VSPLAT(0.0f)), BBF = VSEL(live, nbf, VSPLAT(0.0f));
        VSTORE(sc, SC);
        VSTORE(bb, BBF);
        grid_group(XT, WT, G, qmax, t->stock, sc, bb, sq_a, round + 1 < rounds ? sums : NULL);
        VLOAD(SQ, sq_a);
        live &= SQ < BEST;
        BEST = VSEL(live, SQ, BEST);
        A = (vi) VUSEL(live, na, A);
        B = (vi) VUSEL(live, nbz, B);
        AF = VSEL(live, naf, AF);
        BF = VSEL(live, nbf, BF);
        if (round + 1 < rounds)
            for (int i = 0; i < 3; i++) {
                vf v;
                VLOAD(v, sums[i]);
                SUM[i] = VSEL(live, v, SUM[i]);
            }
    }
    /* blocks not solved here (constant, failed) keep what solve_batch gave them */
    VSTORE_IF(w->af + o, on, AF);
    VSTORE_IF(w->bf + o, on, BF);
    VSTORE_IF((float *) w->a + o, on, (vf) A);
    VSTORE_IF((float *) w->b + o, on, (vf) B);
}

/* nb blocks (x: contiguous) -> w->status, w->a/af, w->b/bf. The candidates are the min-max inverse
 * scale qmax/(max - min), then (qmax + r)/(max - min) for r in the scale-search steps; each gets hqq's
 * zero loop (all candidates of all blocks share the lanes), then choose_group picks and refits. */
static void solve_batch(workspace * w, const float * x, int nb, const hqq_target * t, const gqt_hqq_params * p) {
    const int G = t->group;
    const int ngroups = (nb + LANES - 1) / LANES;
    int finite[LANES];
    for (int g = 0; g < ngroups; g++) {
        float * XT = w->XT + (int64_t) g * LANES * G;
        load_group(XT, x + (int64_t) g * LANES * G, nb - g * LANES < LANES ? nb - g * LANES : LANES, G);
        if (w->weighted)
            load_group(w->WT + (int64_t) g * LANES * G, w->WB + (int64_t) g * LANES * G,
                       nb - g * LANES < LANES ? nb - g * LANES : LANES, G);
        group_range(XT, G, w->mn + g * LANES, w->mx + g * LANES, finite);
        for (int l = 0; l < LANES; l++) {
            const int b = g * LANES + l;
            if (b >= nb) { w->status[b] = 0; continue; }   /* an idle lane */
            if (!finite[l]) { w->status[b] = GQT_ERR_NONFINITE; continue; }
            w->mn[b] = w->mn[b] + 0.0f;   /* -0 -> +0: numpy's min/max may return either zero */
            w->mx[b] = w->mx[b] + 0.0f;
            w->status[b] = B_SOLVE;
            if (w->mn[b] == w->mx[b]) {   /* constant: scale = c, zero = -1, codes 0 (stock: d = m = c) */
                const uint16_t c = gqt_fp32_to_fp16(w->mn[b]);
                w->status[b] = isfinite(gqt_fp16_to_fp32(c)) ? B_CONST : GQT_ERR_RANGE;
                w->a[b] = c;
                w->b[b] = t->stock ? c : gqt_fp32_to_fp16(-1.0f);
            }
        }
    }
    const int ncand = 1 + 2 * p->scale_search;
    int nj = 0;
    for (int k = 0; k < ncand; k++)
        for (int g = 0; g < ngroups; g++)
            candidate_group(w, g, k, k == 0 ? 0.0f : GQT_HQQ_SCALE_STEPS[k - 1], x, t, &nj);
    solve_zero_jobs(w->zj, nj, G, (float) t->qmax, p, &w->steps, w->weighted);
    for (int i = 0; i < nj; i++) w->cand_z[w->zj_index[i]] = w->zj[i].z;
    for (int g = 0; g < ngroups; g++) choose_group(w, g, ncand, p->refit, t);
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

/* One workspace per thread (~95 KiB), reused by every call: llama.cpp quantizes each new KV-cache
 * row through from_float, where an allocation per row would cost time and could fail with no way
 * to say so. */
static GQT_THREAD_LOCAL workspace thread_workspace;

/* The importance weights of blocks b0 .. b0+nb-1 into w->WB (per block w / max(w); all 1 where the
 * block's weights are all 0: unweighted) and their sums into w->sw. Block b of the tensor (bpr blocks a
 * row) takes its weights from wsrc + (b / bpr) * wstride + (b % bpr) * G. */
static void load_weights(workspace * w, const float * wsrc, int64_t wstride, int64_t bpr, int64_t b0, int nb, int G) {
    for (int b = 0; b < nb; b++) {
        const int64_t gb = b0 + b;
        const float * ws = wsrc + (gb / bpr) * wstride + (gb % bpr) * G;
        float * wb = w->WB + (int64_t) b * G;
        float mx = 0.0f, sum = 0.0f;
        for (int j = 0; j < G; j++) mx = ws[j] > mx ? ws[j] : mx;
        for (int j = 0; j < G; j++) {
            wb[j] = mx > 0.0f ? ws[j] / mx : 1.0f;
            sum += wb[j];
        }
        w->sw[b] = sum;
    }
}

/* Quantize nblocks consecutive blocks (wsrc: their importance weights, see load_weights, or NULL).
 * A failing block is written with NaN scale and zero and codes 0 - the error travels in the data,
 * where ggml_validate_row_data finds it; the return value repeats it for callers that can return
 * one: GQT_ERR_NONFINITE if any block held NaN/Inf, else the first error code. */
static int quantize_blocks(const hqq_target * t, const float * x, uint8_t * y, int64_t nblocks,
                           const gqt_hqq_params * p, const float * wsrc, int64_t wstride, int64_t bpr) {
    workspace * w = &thread_workspace;
    step_table_init(&w->steps, p);
    w->weighted = wsrc != NULL;
    const int per_batch = BATCH_VALUES / t->group;
    uint8_t q[GMAX];
    int rc = GQT_OK;
    for (int64_t b0 = 0; b0 < nblocks; b0 += per_batch) {
        const int nb = nblocks - b0 < per_batch ? (int) (nblocks - b0) : per_batch;
        const float * xb = x + b0 * t->group;
        if (wsrc) load_weights(w, wsrc, wstride, bpr, b0, nb, t->group);
        solve_batch(w, xb, nb, t, p);
        for (int b = 0; b < nb; b++) {
            uint8_t * out = y + (b0 + b) * (int64_t) t->bytes;
            if (w->status[b] < 0) {
                pack_block(t, FP16_NAN, FP16_NAN, ZERO_CODES, out);
                if (rc == GQT_OK || w->status[b] == GQT_ERR_NONFINITE) rc = w->status[b];
            } else if (w->status[b] == B_CONST) {
                pack_block(t, (uint16_t) w->a[b], (uint16_t) w->b[b], ZERO_CODES, out);
            } else if (t->qmax == 15) {
                put16(out, (uint16_t) w->a[b]);
                put16(out + 2, (uint16_t) w->b[b]);
                block_nibbles(xb + (int64_t) b * t->group, t->group, t->stock, w->af[b], w->bf[b], out + 4);
            } else {
                block_codes(xb + (int64_t) b * t->group, t->group, (float) t->qmax, t->stock, w->af[b], w->bf[b], q);
                pack_block(t, (uint16_t) w->a[b], (uint16_t) w->b[b], q, out);
            }
        }
    }
    return rc;
}

size_t gqt_hqq_row_size(int target, int64_t n_per_row) {
    hqq_target t;
    if (!target_info(target, &t) || n_per_row < 0 || n_per_row % t.group) return 0;
    return (size_t) (n_per_row / t.group) * t.bytes;
}

int gqt_hqq_quantize_rows_weighted(int target, const float * src, void * dst, int64_t nrows, int64_t n_per_row,
                                   const gqt_hqq_params * p, const float * weights, int64_t weights_stride) {
    hqq_target t;
    gqt_hqq_params def;
    if (!target_info(target, &t)) return GQT_ERR_PARAM;
    if (p == NULL) { gqt_hqq_default_params(&def); p = &def; }
    if (!params_ok(p)) return GQT_ERR_PARAM;
    if (n_per_row <= 0 || n_per_row % t.group || nrows < 0 || weights_stride < 0) return GQT_ERR_SHAPE;
    if (weights)   /* finite and >= 0 (NaN fails the test too) */
        for (int64_t r = 0; r < (weights_stride ? nrows : 1); r++)
            for (int64_t j = 0; j < n_per_row; j++) {
                const float v = weights[r * weights_stride + j];
                if (!(v >= 0.0f) || !isfinite(v)) return GQT_ERR_PARAM;
            }
    return quantize_blocks(&t, src, (uint8_t *) dst, nrows * (n_per_row / t.group), p, weights, weights_stride,
                           n_per_row / t.group);
}

int gqt_hqq_quantize_rows(int target, const float * src, void * dst, int64_t nrows, int64_t n_per_row,
                          const gqt_hqq_params * p) {
    return gqt_hqq_quantize_rows_weighted(target, src, dst, nrows, n_per_row, p, NULL, 0);
}

/* nb blocks -> floats; nothing can fail once the target and the shape are known. */
static void dequantize_blocks(const hqq_target * t, const uint8_t * in, float * y, int64_t nb) {
    uint8_t q[GMAX];
    for (int64_t i = 0; i < nb; i++, in += t->bytes, y += t->group) {
        const float a = gqt_fp16_to_fp32(get16(in)), b = gqt_fp16_to_fp32(get16(in + 2));
        unpack_block(t, in, q);
        for (int j = 0; j < t->group; j++)
            y[j] = t->stock ? a * (float) q[j] + b : ((float) q[j] - b) * a;
    }
}

int gqt_hqq_dequantize_rows(int target, const void * src, float * dst, int64_t nrows, int64_t n_per_row) {
    hqq_target t;
    if (!target_info(target, &t)) return GQT_ERR_PARAM;
    if (n_per_row <= 0 || n_per_row % t.group || nrows < 0) return GQT_ERR_SHAPE;
    dequantize_blocks(&t, (const uint8_t *) src, dst, nrows * (n_per_row / t.group));
    return GQT_OK;
}

/* ------------------------------------------------------------------ ggml type-trait entry points
 * Default parameters everywhere: weights (quantize_*, from_float_ref) and, through from_float, every
 * new KV-cache row (the refit costs ~1.25x plain HQQ's time there, and took SmolLM2's q4_hqq/q4_hqq
 * cache from 23.65 to 23.36 perplexity, docs/native.md). ggml passes whole blocks (k a multiple of
 * the block) and has no error channel: a block that cannot be quantized is marked NaN in the data. */

static void quantize_row_default(int target, const float * x, void * y, int64_t k) {
    hqq_target t;
    gqt_hqq_params p;
    target_info(target, &t);
    gqt_hqq_default_params(&p);
    (void) quantize_blocks(&t, x, (uint8_t *) y, k / t.group, &p, NULL, 0, 1);   /* errors are in the blocks (NaN) */
}

static void dequantize_row(int target, const void * x, float * y, int64_t k) {
    hqq_target t;
    target_info(target, &t);
    dequantize_blocks(&t, (const uint8_t *) x, y, k / t.group);
}

void gqt_quantize_row_q4_hqq_ref(const float * x, void * y, int64_t k) {
    quantize_row_default(GQT_TYPE_Q4_HQQ, x, y, k);
}

void gqt_quantize_row_q4_hqq_128_ref(const float * x, void * y, int64_t k) {
    quantize_row_default(GQT_TYPE_Q4_HQQ_128, x, y, k);
}

/* llama-quantize's entry: with an importance matrix (one weight per column) the weighted solver, as
 * quantize_hqq(imatrix=) runs it (and with its scale search); an imatrix holding a negative or non-finite value is not a weighting
 * (and ggml has no error channel here), so that tensor is solved unweighted */
static size_t quantize_chunk(int target, const float * src, void * dst, int64_t nrows, int64_t n_per_row,
                             const float * imatrix) {
    hqq_target t;
    gqt_hqq_params p;
    target_info(target, &t);
    gqt_hqq_default_params(&p);
    for (int64_t j = 0; imatrix && j < n_per_row; j++)
        if (!(imatrix[j] >= 0.0f) || !isfinite(imatrix[j])) imatrix = NULL;
    if (imatrix) p.scale_search = GQT_HQQ_WEIGHTED_SCALE_SEARCH;
    (void) quantize_blocks(&t, src, (uint8_t *) dst, nrows * (n_per_row / t.group), &p, imatrix, 0, n_per_row / t.group);
    return (size_t) nrows * gqt_hqq_row_size(target, n_per_row);
}

size_t gqt_quantize_q4_hqq(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix) {
    return quantize_chunk(GQT_TYPE_Q4_HQQ, src, dst, nrows, n_per_row, imatrix);
}

size_t gqt_quantize_q4_hqq_128(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix) {
    return quantize_chunk(GQT_TYPE_Q4_HQQ_128, src, dst, nrows, n_per_row, imatrix);
}

void gqt_dequantize_row_q4_hqq(const void * x, float * y, int64_t k) {
    dequantize_row(GQT_TYPE_Q4_HQQ, x, y, k);
}

void gqt_dequantize_row_q4_hqq_128(const void * x, float * y, int64_t k) {
    dequantize_row(GQT_TYPE_Q4_HQQ_128, x, y, k);
}

/* One 32-value sub-block (codes qs, under scale and m = -(scale*zero)) against one ggml block_q8_1:
 * (q - zero)*scale . d8*q8 = (scale*d8)*sum(q*q8) + m*s8, with s8 = d8*sum(q8) as ggml stores it.
 * Callers accumulate in block order (ggml's q4_1 generic form). */
static inline float sub_dot_q8_1(float sumf, float scale, float m, const uint8_t * qs, const gqt_block_q8_1 * y) {
    int sumi = 0;
    for (int j = 0; j < 16; j++)
        sumi += (qs[j] & 0x0F) * y->qs[j] + (qs[j] >> 4) * y->qs[j + 16];
    const float d8 = gqt_fp16_to_fp32(y->d), s8 = gqt_fp16_to_fp32(y->s);
    return sumf + ((scale * d8) * (float) sumi + m * s8);
}

void gqt_vec_dot_q4_hqq_q8_1_ref(int n, float * s, size_t bs, const void * vx, size_t bx,
                                 const void * vy, size_t by, int nrc) {
    (void) bs; (void) bx; (void) by; (void) nrc;   /* nrc == 1: one row pair, as ggml calls it */
    const gqt_block_q4_hqq * x = (const gqt_block_q4_hqq *) vx;
    const gqt_block_q8_1 * y = (const gqt_block_q8_1 *) vy;
    float sumf = 0.0f;
    for (int ib = 0; ib < n / GQT_Q4_HQQ_BLOCK; ib++) {
        const float scale = gqt_fp16_to_fp32(x[ib].scale), zero = gqt_fp16_to_fp32(x[ib].zero);
        sumf = sub_dot_q8_1(sumf, scale, -(scale * zero), x[ib].qs, y + ib);
    }
    *s = sumf;
}

void gqt_vec_dot_q4_hqq_128_q8_1_ref(int n, float * s, size_t bs, const void * vx, size_t bx,
                                     const void * vy, size_t by, int nrc) {
    (void) bs; (void) bx; (void) by; (void) nrc;
    const gqt_block_q4_hqq_128 * x = (const gqt_block_q4_hqq_128 *) vx;
    const gqt_block_q8_1 * y = (const gqt_block_q8_1 *) vy;
    float sumf = 0.0f;
    for (int ib = 0; ib < n / GQT_Q4_HQQ_128_BLOCK; ib++) {
        const float scale = gqt_fp16_to_fp32(x[ib].scale), zero = gqt_fp16_to_fp32(x[ib].zero);
        for (int b = 0; b < GQT_Q4_HQQ_128_BLOCK / 32; b++)
            sumf = sub_dot_q8_1(sumf, scale, -(scale * zero), x[ib].qs + 16 * b, y + 4 * ib + b);
    }
    *s = sumf;
}
