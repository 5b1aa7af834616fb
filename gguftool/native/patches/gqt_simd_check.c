/* Standalone check of gguftool/_fast/gqt_hqq_simd.c against the scalar reference in gqt_hqq.c,
 * without llama.cpp: build it for the host (AVX2) or cross-build it for aarch64 (NEON, run under
 * qemu) and it prints one line per case and exits 1 if any SIMD dot strays from the reference.
 *
 *   cc -O2 -std=c99 -ffp-contract=off -march=native -I gguftool/_fast gqt_simd_check.c \
 *      gguftool/_fast/gqt_hqq.c gguftool/_fast/gqt_hqq_simd.c -lm && ./a.out
 *
 * Activations are quantized to ggml's block_q8_1 with a port of quantize_row_q8_1_ref. */
#include "gqt_common.h"
#include "gqt_hqq.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double uniform(void) {            /* xorshift64*, (0,1) */
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return ((rng_state * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0) + 1e-300;
}
static float normal(void) { return (float) (sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform())); }

/* ggml's quantize_row_q8_1_ref */
static void quantize_q8_1(const float * x, gqt_block_q8_1 * y, int n) {
    for (int i = 0; i < n / 32; i++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[32*i + j]));
        const float d = amax / 127.0f;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = gqt_fp32_to_fp16(d);
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            y[i].qs[j] = (int8_t) roundf(x[32*i + j] * id);
            sum += y[i].qs[j];
        }
        y[i].s = gqt_fp32_to_fp16((float) sum * d);
    }
}

int main(void) {
    const int sizes[] = { 128, 256, 384, 640, 2048, 4096 };   /* odd block counts hit the NEON tail loop */
    int failures = 0, cases = 0;
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        const int n = sizes[si];
        float * x = malloc(n * sizeof(float)), * y = malloc(n * sizeof(float));
        unsigned char * qx = malloc((size_t) n / 32 * GQT_Q4_HQQ_BYTES + 64);
        unsigned char * qx128 = malloc((size_t) n / 128 * GQT_Q4_HQQ_128_BYTES + 64);
        gqt_block_q8_1 * qy = malloc((size_t) n / 32 * sizeof(gqt_block_q8_1));
        for (int trial = 0; trial < 20; trial++) {
            const float shift = (trial % 4 == 1) ? 0.02f : 0.0f;          /* one-signed rows: large zero terms */
            for (int i = 0; i < n; i++) { x[i] = 0.05f * normal() + shift; y[i] = 3.0f * normal(); }
            quantize_q8_1(y, qy, n);
            gqt_quantize_row_q4_hqq_ref(x, qx, n);
            gqt_quantize_row_q4_hqq_128_ref(x, qx128, n);
            for (int t = 0; t < 2; t++) {
                float simd = 0.0f, ref = 0.0f;
                double mag = 0.0;
                if (t == 0) {
                    gqt_vec_dot_q4_hqq_q8_1(n, &simd, 0, qx, 0, qy, 0, 1);
                    gqt_vec_dot_q4_hqq_q8_1_ref(n, &ref, 0, qx, 0, qy, 0, 1);
                } else {
                    gqt_vec_dot_q4_hqq_128_q8_1(n, &simd, 0, qx128, 0, qy, 0, 1);
                    gqt_vec_dot_q4_hqq_128_q8_1_ref(n, &ref, 0, qx128, 0, qy, 0, 1);
                }
                for (int i = 0; i < n; i++) mag += fabs((double) x[i] * y[i]);
                const double err = fabs((double) simd - ref);
                cases++;
                if (!(err <= 1e-5 * mag + 1e-6)) {
                    failures++;
                    printf("FAIL %s n=%d trial=%d simd=%.9g ref=%.9g mag=%.4g\n",
                           t ? "q4_hqq_128" : "q4_hqq", n, trial, simd, ref, mag);
                }
            }
        }
        free(x); free(y); free(qx); free(qx128); free(qy);
    }
#if defined(__AVX2__)
    const char * path = "avx2";
#elif defined(__ARM_NEON) && defined(__aarch64__)
#if defined(__ARM_FEATURE_DOTPROD)
    const char * path = "neon+dotprod";
#else
    const char * path = "neon";
#endif
#else
    const char * path = "scalar";
#endif
    printf("path=%s cases=%d failures=%d\n", path, cases, failures);
    return failures ? 1 : 0;
}
