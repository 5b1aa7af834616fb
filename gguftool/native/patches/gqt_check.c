/* gguftool-check: drives the patched ggml from the outside, through its public API, so that
 * tests can compare what llama.cpp computes with what the Python package computes.
 *
 *   gguftool-check types
 *       one line per gguftool type: name id blck_size type_size is_quantized vec_dot_type
 *   gguftool-check quant TYPE N_PER_ROW IN.f32 OUT.q OUT.f32
 *       ggml_quantize_chunk(TYPE) over IN (rows of N_PER_ROW floats) -> OUT.q,
 *       then type_traits[TYPE].to_float(OUT.q) -> OUT.f32; also runs ggml_validate_row_data
 *   gguftool-check dot TYPE N X.f32 Y.f32 [OUT_X.q OUT_Y.q]
 *       quantizes X to TYPE (ggml_quantize_chunk) and Y to the vec_dot type (ggml-cpu's
 *       from_float), then prints three numbers: the registered (SIMD) vec_dot, the scalar
 *       reference vec_dot (gqt_vec_dot_*_ref), and the dot of the
 *       dequantized vectors in double precision; optionally writes both quantized rows
 *   gguftool-check validate TYPE FILE.q
 *       prints ggml_validate_row_data's verdict ("valid"/"invalid"), exit 0/3
 *   gguftool-check speed N ROWS REPS TYPE...
 *       thread CPU time of the registered vec_dot over a ROWS x N matrix (one activation row,
 *       as in token generation), ns per row; CPU time, so other load on the machine does not
 *       count (cache effects still do)
 *   gguftool-check fa KTYPE VTYPE D N_KV N_HEAD N_HEAD_KV THREADS REPS [WINDOW]
 *       one decode step of flash attention (one query per head, N_KV cached keys and values of
 *       KTYPE / VTYPE, random N(0,1) data): the build's kernels against ggml's reference path
 *       (use_ref: per-head rows, to_float + mad) and against attention in double on the decoded
 *       cache; prints the largest relative errors and the wall ns per call of both paths.
 *       WINDOW: a mask leaves only WINDOW keys, a run of them that wraps around the cells from
 *       N_KV/3 on (a sliding-window layer's ring of cells)
 */
#define _POSIX_C_SOURCE 199309L
#include "ggml.h"
#include "ggml-cpu.h"
#include "gqt_hqq.h"
#include "gqt_tq3.h"
#include "gqt_tq3_1.h"
#include "gqt_tcq3.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static float normal(void) {   /* N(0, 1): Box-Muller over a 64-bit LCG, fixed seed */
    static uint64_t st = 0x9E3779B97F4A7C15ull;
    double u[2];
    for (int i = 0; i < 2; ++i) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        u[i] = ((double) (st >> 11) + 0.5) / 9007199254740992.0;
    }
    return (float) (sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]));
}

static enum ggml_type type_by_name(const char * name) {
    for (int i = 0; i < GGML_TYPE_COUNT; ++i) {
        const char * n = ggml_type_name((enum ggml_type) i);
        if (n && ggml_type_size((enum ggml_type) i) > 0 && strcmp(n, name) == 0) {
            return (enum ggml_type) i;
        }
    }
    fprintf(stderr, "gguftool-check: unknown type %s\n", name);
    exit(2);
}

static void * read_file(const char * path, size_t * size) {
    FILE * f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void * buf = malloc(n > 0 ? (size_t) n : 1);
    if (fread(buf, 1, (size_t) n, f) != (size_t) n) { perror(path); exit(2); }
    fclose(f);
    *size = (size_t) n;
    return buf;
}

static void write_file(const char * path, const void * data, size_t size) {
    FILE * f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size) { perror(path); exit(2); }
    fclose(f);
}

static int cmd_types(void) {
#define OUR_TYPE(NAME, name, vdt) GGML_TYPE_##NAME,
    const enum ggml_type ours[] = { GQT_FOR_EACH_TYPE(OUR_TYPE) };
#undef OUR_TYPE
    for (size_t i = 0; i < sizeof(ours)/sizeof(ours[0]); ++i) {
        const enum ggml_type t = ours[i];
        printf("%s %d %lld %zu %d %s\n", ggml_type_name(t), (int) t, (long long) ggml_blck_size(t),
               ggml_type_size(t), (int) ggml_is_quantized(t),
               ggml_type_name(ggml_get_type_traits_cpu(t)->vec_dot_type));
    }
    printf("COUNT %d\n", (int) GGML_TYPE_COUNT);
    return 0;
}

static int cmd_quant(const char * tname, long long npr, const char * in, const char * outq, const char * outf) {
    const enum ggml_type t = type_by_name(tname);
    size_t nbytes;
    float * src = read_file(in, &nbytes);
    const int64_t n = (int64_t) (nbytes / sizeof(float));
    if (npr <= 0 || n % npr != 0 || npr % ggml_blck_size(t) != 0) {
        fprintf(stderr, "gguftool-check: bad shape\n");
        return 2;
    }
    const int64_t nrows = n / npr;
    const size_t qsize = ggml_row_size(t, npr) * (size_t) nrows;
    void * q = malloc(qsize);
    const size_t got = ggml_quantize_chunk(t, src, q, 0, nrows, npr, NULL);
    if (got != qsize) {
        fprintf(stderr, "gguftool-check: quantize_chunk returned %zu, expected %zu\n", got, qsize);
        return 1;
    }
    if (!ggml_validate_row_data(t, q, qsize)) {
        fprintf(stderr, "gguftool-check: ggml_validate_row_data rejected the quantized data\n");
        return 1;
    }
    float * deq = malloc((size_t) n * sizeof(float));
    ggml_get_type_traits(t)->to_float(q, deq, n);
    write_file(outq, q, qsize);
    write_file(outf, deq, (size_t) n * sizeof(float));
    return 0;
}

static int cmd_dot(const char * tname, long long n, const char * xs, const char * ys,
                   const char * outx, const char * outy) {
    const enum ggml_type t = type_by_name(tname);
    size_t nx, ny;
    float * x = read_file(xs, &nx);
    float * y = read_file(ys, &ny);
    if (n <= 0 || nx != (size_t) n * sizeof(float) || ny != nx || n % ggml_blck_size(t) != 0) {
        fprintf(stderr, "gguftool-check: bad shape\n");
        return 2;
    }
    const struct ggml_type_traits_cpu * cpu = ggml_get_type_traits_cpu(t);
    const enum ggml_type vt = cpu->vec_dot_type;
    void * qx = malloc(ggml_row_size(t, n));
    void * qy = malloc(ggml_row_size(vt, n));
    ggml_quantize_chunk(t, x, qx, 0, 1, n, NULL);
    ggml_get_type_traits_cpu(vt)->from_float(y, qy, n);

    float simd = 0.0f, ref = 0.0f;
    cpu->vec_dot((int) n, &simd, 0, qx, 0, qy, 0, 1);
#define REF_DOT(NAME, name, vdt) if (t == GGML_TYPE_##NAME) gqt_vec_dot_##name##_##vdt##_ref((int) n, &ref, 0, qx, 0, qy, 0, 1);
    GQT_FOR_EACH_TYPE(REF_DOT)
#undef REF_DOT
    float * dx = malloc((size_t) n * sizeof(float));
    float * dy = malloc((size_t) n * sizeof(float));
    ggml_get_type_traits(t)->to_float(qx, dx, n);
    {   /* Q8_1 has no to_float in ggml: decode d * q from either block (d first, qs last) */
        const size_t bsz = ggml_type_size(vt);
        for (long long b = 0; b < n / 32; ++b) {
            const unsigned char * blk = (const unsigned char *) qy + b * bsz;
            ggml_fp16_t d;
            memcpy(&d, blk, sizeof(d));
            const int8_t * q8 = (const int8_t *) (blk + bsz - 32);
            for (int j = 0; j < 32; ++j) {
                dy[32 * b + j] = ggml_fp16_to_fp32(d) * (float) q8[j];
            }
        }
    }
    double exact = 0.0;
    for (long long i = 0; i < n; ++i) {
        exact += (double) dx[i] * (double) dy[i];
    }
    if (outx && outy) {
        write_file(outx, qx, ggml_row_size(t, n));
        write_file(outy, qy, ggml_row_size(vt, n));
    }
    printf("%.9g %.9g %.9g\n", simd, ref, exact);
    return 0;
}

static int cmd_validate(const char * tname, const char * path) {
    const enum ggml_type t = type_by_name(tname);
    size_t n;
    void * q = read_file(path, &n);
    const int ok = ggml_validate_row_data(t, q, n);
    printf("%s\n", ok ? "valid" : "invalid");
    return ok ? 0 : 3;
}

static double thread_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

static int cmd_speed(long long n, long long rows, long long reps, int ntypes, char ** tnames) {
    float * w = malloc((size_t) (n * rows) * sizeof(float));
    float * a = malloc((size_t) n * sizeof(float));
    uint64_t st = 0x853c49e6748fea9bull;
    for (long long i = 0; i < n * rows; ++i) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        w[i] = (float) ((double) (st >> 11) / 9007199254740992.0 - 0.5) * 0.1f;
    }
    for (long long i = 0; i < n; ++i) {
        a[i] = (float) ((i * 7919) % 1000) / 500.0f - 1.0f;
    }
    for (int k = 0; k < ntypes; ++k) {
        const enum ggml_type t = type_by_name(tnames[k]);
        const struct ggml_type_traits_cpu * cpu = ggml_get_type_traits_cpu(t);
        const size_t rs = ggml_row_size(t, n);
        char * q = malloc(rs * (size_t) rows);
        ggml_quantize_chunk(t, w, q, 0, rows, n, NULL);
        void * qa = malloc(ggml_row_size(cpu->vec_dot_type, n));
        ggml_get_type_traits_cpu(cpu->vec_dot_type)->from_float(a, qa, n);
        volatile float sink = 0.0f;
        double best = 1e30;
        for (long long r = 0; r < reps; ++r) {
            const double t0 = thread_seconds();
            for (long long i = 0; i < rows; ++i) {
                float s;
                cpu->vec_dot((int) n, &s, 0, q + (size_t) i * rs, 0, qa, 0, 1);
                sink += s;
            }
            const double dt = thread_seconds() - t0;
            if (dt < best) best = dt;
        }
        printf("%s %.2f\n", ggml_type_name(t), 1e9 * best / (double) rows);
        free(q);
        free(qa);
    }
    free(w);
    free(a);
    return 0;
}

static double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

static void decode_rows(enum ggml_type t, const void * q, float * out, long long nrows, long long n) {
    for (long long r = 0; r < nrows; ++r) {
        const char * row = (const char *) q + (size_t) r * ggml_row_size(t, n);
        if (t == GGML_TYPE_F16) ggml_fp16_to_fp32_row((const ggml_fp16_t *) row, out + r * n, n);
        else ggml_get_type_traits(t)->to_float(row, out + r * n, n);
    }
}

static double max_rel(const float * a, const float * b, long long n) {   /* max |a - b| / max |b| */
    double m = 0.0, e = 0.0;
    for (long long i = 0; i < n; ++i) {
        const double d = fabs((double) a[i] - (double) b[i]);
        if (d > e || d != d) e = d != d ? INFINITY : d;
        if (fabs((double) b[i]) > m) m = fabs((double) b[i]);
    }
    return m > 0.0 ? e / m : e;
}

static int cmd_fa(const char * kname, const char * vname, long long D, long long nkv, long long nh, long long nhkv,
                  int threads, int reps, long long window) {
    const enum ggml_type kt = type_by_name(kname), vt = type_by_name(vname);
    if (D <= 0 || nkv <= 0 || nh <= 0 || nhkv <= 0 || nh % nhkv || D % ggml_blck_size(kt) || D % ggml_blck_size(vt)
        || threads <= 0 || reps <= 0 || window < 0 || window > nkv) {
        fprintf(stderr, "gguftool-check: bad fa shape\n");
        return 2;
    }
    struct ggml_init_params ip = { (size_t) (2 * nkv * nhkv * D * 4 + nh * D * 8) + (64u << 20), NULL, false };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, 1, nh, 1);
    struct ggml_tensor * k = ggml_new_tensor_4d(ctx, kt, D, nkv, nhkv, 1);
    struct ggml_tensor * v = ggml_new_tensor_4d(ctx, vt, D, nkv, nhkv, 1);
    const long long nrows = nkv * nhkv;
    float * kf = malloc(sizeof(float) * (size_t) (nrows * D)), * vf = malloc(sizeof(float) * (size_t) (nrows * D));
    for (long long i = 0; i < nh * D; ++i) ((float *) q->data)[i] = normal();
    for (long long i = 0; i < nrows * D; ++i) { kf[i] = normal(); vf[i] = normal(); }
    ggml_quantize_chunk(kt, kf, k->data, 0, nrows, D, NULL);
    ggml_quantize_chunk(vt, vf, v->data, 0, nrows, D, NULL);
    decode_rows(kt, k->data, kf, nrows, D);   /* the cache as stored, for the double reference */
    decode_rows(vt, v->data, vf, nrows, D);
    const float scale = 1.0f / sqrtf((float) D);
    struct ggml_tensor * mask = NULL;
    char * seen = malloc((size_t) nkv);
    for (long long j = 0; j < nkv; ++j) seen[j] = !window || (j - nkv / 3 + nkv) % nkv < window;
    if (window) {
        mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, nkv, 1, 1, 1);
        for (long long j = 0; j < nkv; ++j) ((ggml_fp16_t *) mask->data)[j] = ggml_fp32_to_fp16(seen[j] ? 0.0f : -INFINITY);
    }
    struct ggml_tensor * out = ggml_flash_attn_ext(ctx, q, k, v, mask, scale, 0.0f, 0.0f);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    const long long nout = nh * D;
    float * res[2];
    double ns[2];
    for (int ref = 0; ref < 2; ++ref) {
        struct ggml_cplan plan = ggml_graph_plan(gf, threads, NULL);
        plan.work_data = malloc(plan.work_size + 64);
        plan.use_ref = ref;
        double best = 1e30;
        for (int r = 0; r < reps; ++r) {
            const double t0 = wall_seconds();
            if (ggml_graph_compute(gf, &plan) != GGML_STATUS_SUCCESS) { fprintf(stderr, "compute failed\n"); return 2; }
            const double dt = wall_seconds() - t0;
            if (dt < best) best = dt;
        }
        ns[ref] = 1e9 * best;
        res[ref] = malloc(sizeof(float) * (size_t) nout);
        memcpy(res[ref], out->data, sizeof(float) * (size_t) nout);
        free(plan.work_data);
    }
    float * exact = malloc(sizeof(float) * (size_t) nout);
    double * w = malloc(sizeof(double) * (size_t) nkv);
    for (long long h = 0; h < nh; ++h) {
        const long long hk = h / (nh / nhkv);
        const float * qh = (const float *) q->data + h * D;
        double mx = -INFINITY, sum = 0.0;
        for (long long j = 0; j < nkv; ++j) {
            double s = 0.0;
            for (long long d = 0; d < D; ++d) s += (double) qh[d] * kf[(hk * nkv + j) * D + d];
            w[j] = seen[j] ? s * scale : -INFINITY;
            if (w[j] > mx) mx = w[j];
        }
        for (long long j = 0; j < nkv; ++j) { w[j] = exp(w[j] - mx); sum += w[j]; }
        for (long long d = 0; d < D; ++d) {
            double acc = 0.0;
            for (long long j = 0; j < nkv; ++j) acc += w[j] * vf[(hk * nkv + j) * D + d];
            exact[h * D + d] = (float) (acc / sum);
        }
    }
    printf("fast_vs_ref=%.3g fast_vs_exact=%.3g ref_vs_exact=%.3g ns_fast=%.0f ns_ref=%.0f\n",
           max_rel(res[0], res[1], nout), max_rel(res[0], exact, nout), max_rel(res[1], exact, nout), ns[0], ns[1]);
    free(seen);
    ggml_free(ctx);
    return 0;
}

/* SET_ROWS of ROWS rows of N normal values into cells 3.. of a TYPE cache of ROWS + 5 cells, on THREADS
 * threads: 0 when the cells hold ggml_quantize_chunk's bytes of the same rows and the others stay untouched
 * (our build splits a row by blocks when there are fewer rows than threads) */
static int cmd_setrows(const char * tname, long long n, long long rows, int threads) {
    const enum ggml_type t = type_by_name(tname);
    if (n <= 0 || rows <= 0 || threads <= 0 || n % ggml_blck_size(t)) {
        fprintf(stderr, "gguftool-check: bad setrows shape\n");
        return 2;
    }
    const long long cells = rows + 5;
    struct ggml_init_params ip = { (size_t) (n * (rows + cells) * 8 + rows * 8) + (16u << 20), NULL, false };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * src = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, rows);
    struct ggml_tensor * idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, rows);
    struct ggml_tensor * cache = ggml_new_tensor_2d(ctx, t, n, cells);
    for (long long i = 0; i < n * rows; ++i) ((float *) src->data)[i] = normal();
    for (long long r = 0; r < rows; ++r) ((int64_t *) idx->data)[r] = 3 + r;
    memset(cache->data, 0xA5, ggml_nbytes(cache));
    struct ggml_tensor * out = ggml_set_rows(ctx, cache, src, idx);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    struct ggml_cplan plan = ggml_graph_plan(gf, threads, NULL);
    plan.work_data = malloc(plan.work_size + 64);
    if (ggml_graph_compute(gf, &plan) != GGML_STATUS_SUCCESS) { fprintf(stderr, "compute failed\n"); return 2; }
    const size_t rs = ggml_row_size(t, n);
    char * want = malloc(rs * (size_t) cells);
    memset(want, 0xA5, rs * (size_t) cells);
    ggml_quantize_chunk(t, (const float *) src->data, want + 3 * rs, 0, rows, n, NULL);
    const int same = memcmp(want, cache->data, rs * (size_t) cells) == 0;
    printf("same=%d\n", same);
    free(want);
    free(plan.work_data);
    ggml_free(ctx);
    return same ? 0 : 1;
}

int main(int argc, char ** argv) {
    ggml_cpu_init();
    if (argc == 2 && strcmp(argv[1], "types") == 0) return cmd_types();
    if (argc == 7 && strcmp(argv[1], "quant") == 0) return cmd_quant(argv[2], atoll(argv[3]), argv[4], argv[5], argv[6]);
    if (argc == 6 && strcmp(argv[1], "dot") == 0) return cmd_dot(argv[2], atoll(argv[3]), argv[4], argv[5], NULL, NULL);
    if (argc == 8 && strcmp(argv[1], "dot") == 0) return cmd_dot(argv[2], atoll(argv[3]), argv[4], argv[5], argv[6], argv[7]);
    if (argc == 4 && strcmp(argv[1], "validate") == 0) return cmd_validate(argv[2], argv[3]);
    if ((argc == 10 || argc == 11) && strcmp(argv[1], "fa") == 0)
        return cmd_fa(argv[2], argv[3], atoll(argv[4]), atoll(argv[5]), atoll(argv[6]), atoll(argv[7]), atoi(argv[8]), atoi(argv[9]),
                      argc == 11 ? atoll(argv[10]) : 0);
    if (argc == 6 && strcmp(argv[1], "setrows") == 0) return cmd_setrows(argv[2], atoll(argv[3]), atoll(argv[4]), atoi(argv[5]));
    if (argc >= 6 && strcmp(argv[1], "speed") == 0) return cmd_speed(atoll(argv[2]), atoll(argv[3]), atoll(argv[4]), argc - 5, argv + 5);
    fprintf(stderr, "usage: gguftool-check types | quant TYPE N_PER_ROW IN.f32 OUT.q OUT.f32 | "
                    "dot TYPE N X.f32 Y.f32 [OUT_X.q OUT_Y.q] | validate TYPE FILE.q | setrows TYPE N ROWS THREADS | speed N ROWS REPS TYPE...\n");
    return 2;
}
