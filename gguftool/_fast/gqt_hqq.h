/* HQQ quantizer: Q4_HQQ (32 values, 20 B), Q4_HQQ_128 (128 values, 68 B), and the same solver
 * writing ggml's stock Q4_1 / Q5_1 blocks. C99 with GCC/clang vector extensions (SIMD across
 * blocks: 8 blocks per vector, each lane doing the scalar operations of the numpy reference,
 * gguftool/quant/hqq.py: quantize_hqq_ref, which it matches byte for byte).
 *
 * Block layouts (little-endian):
 *   Q4_HQQ      fp16 scale, fp16 zero, 16 B: byte j = code j | code j+16 << 4   (Q4_1's packing)
 *   Q4_HQQ_128  fp16 scale, fp16 zero, 64 B: four 32-value sub-blocks packed like Q4_HQQ
 *               (byte 16*b + j = code 32b+j | code 32b+j+16 << 4)
 *   decode      x = (q - zero) * scale, q in 0..15, zero a real fp16 (not an integer)
 *
 * Build with IEEE float semantics and no contraction (-ffp-contract=off, never -ffast-math):
 * numpy and the llama.cpp build must reproduce every float operation in the same order.
 * On error (GQT_ERR_*) the contents of dst are unspecified. */
#pragma once
#include "gqt_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The blocks (gqt_types.h has their sizes): Q4_1's layout, x = (q - zero) * scale. */
typedef struct {
    gqt_fp16 scale;
    gqt_fp16 zero;                       /* in code units, a real fp16 (not an integer) */
    uint8_t  qs[GQT_Q4_HQQ_BLOCK / 2];   /* byte j = code j | code j+16 << 4 */
} gqt_block_q4_hqq;
typedef struct {
    gqt_fp16 scale;
    gqt_fp16 zero;
    uint8_t  qs[GQT_Q4_HQQ_128_BLOCK / 2];   /* four 32-value sub-blocks packed like Q4_HQQ */
} gqt_block_q4_hqq_128;
GQT_STATIC_ASSERT(q4_hqq_block, sizeof(gqt_block_q4_hqq) == GQT_Q4_HQQ_BYTES);
GQT_STATIC_ASSERT(q4_hqq_128_block, sizeof(gqt_block_q4_hqq_128) == GQT_Q4_HQQ_128_BYTES);

#define GQT_HQQ_SCALE_SEARCH_MAX 6
/* scale_search in effect with importance weights when none is asked for (llama-quantize's entry,
 * quantize_hqq(imatrix=)): it closes weighted Q4_HQQ's gap to ggml's own 37-scale imatrix search */
#define GQT_HQQ_WEIGHTED_SCALE_SEARCH 1
#define GQT_HQQ_REFIT_MAX 8
#define GQT_HQQ_ITERS_MAX 1000
#define GQT_HQQ_S_INV_CAP 16777216.0f  /* cap of the inverse scale, 2^24: 1/2^24 is fp16's smallest step */
#define GQT_HQQ_ZERO_CAP 60000.0f      /* |zero| stays below fp16's max (65504) */

typedef struct {
    float lp_norm;     /* p of the shrink, 0 < p <= 1 (hqq: 0.7) */
    float beta;        /* initial beta (10) */
    float kappa;       /* beta *= kappa each step (1.01; 1.0 = hqq 0.2.8 legacy loop) */
    int iters;         /* proximal steps at most (20; 0 = plain min-max) */
    int early_stop;    /* 1: stop when the block's mean |error| stops falling (hqq's rule) */
    int scale_search;  /* 0: min-max scale only (default); n in 1..GQT_HQQ_SCALE_SEARCH_MAX: also try
                          2n other scales, each with its own zero loop */
    int refit;         /* rounds of least-squares refit of scale/zero to the codes, 0..GQT_HQQ_REFIT_MAX
                          (default 2; 0 with scale_search 0 = plain HQQ) */
} gqt_hqq_params;

void gqt_hqq_default_params(gqt_hqq_params * p);

/* Offset i (0 <= i < 2 * GQT_HQQ_SCALE_SEARCH_MAX) of the scale search, in search order: it tries the
 * inverse scale (qmax + offset) / (max - min). */
float gqt_hqq_scale_step(int i);

/* target: GQT_TYPE_Q4_HQQ, GQT_TYPE_Q4_HQQ_128, GQT_HQQ_TARGET_Q4_1 or GQT_HQQ_TARGET_Q5_1 (gqt_types.h).
 * src: nrows x n_per_row floats; dst: nrows x row size bytes. Returns GQT_OK or GQT_ERR_*
 * (GQT_ERR_NONFINITE first when any block holds NaN/Inf). p == NULL: defaults. */
int gqt_hqq_quantize_rows(int target, const float * src, void * dst, int64_t nrows, int64_t n_per_row,
                          const gqt_hqq_params * p);
/* The same with importance weights (weights == NULL: exactly gqt_hqq_quantize_rows). Value j of row r
 * weighs weights[r * weights_stride + j] (weights_stride 0: one row of per-column weights for every row,
 * an imatrix); finite and >= 0, else GQT_ERR_PARAM. Per block the weights are divided by their maximum
 * (a block whose weights are all 0 is solved unweighted) and enter every mean and squared error of the
 * solver: the zero update and the early-stop error become weighted means, the refit weighted least
 * squares, the scale search and refit acceptance compare weighted squared errors. Weights that are
 * equal within a block give the unweighted bytes. */
int gqt_hqq_quantize_rows_weighted(int target, const float * src, void * dst, int64_t nrows, int64_t n_per_row,
                                   const gqt_hqq_params * p, const float * weights, int64_t weights_stride);
/* Decode any of the four targets (Q4_1/Q5_1 as ggml does: x = d*q + m). */
int gqt_hqq_dequantize_rows(int target, const void * src, float * dst, int64_t nrows, int64_t n_per_row);
/* Bytes per row, or 0 for an unknown target / n_per_row not a multiple of the block. */
size_t gqt_hqq_row_size(int target, int64_t n_per_row);

/* ggml type-trait signatures (default parameters; the _ref row quantizers are also the CPU backend's
 * from_float, which quantizes every new KV-cache row). A block holding NaN/Inf, or values too large
 * for fp16, is written with NaN scale and zero so ggml_validate_row_data-style checks catch it. */
void   gqt_quantize_row_q4_hqq_ref(const float * x, void * y, int64_t k);
void   gqt_dequantize_row_q4_hqq(const void * x, float * y, int64_t k);
size_t gqt_quantize_q4_hqq(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix);
void   gqt_vec_dot_q4_hqq_q8_1_ref(int n, float * s, size_t bs, const void * vx, size_t bx,
                                   const void * vy, size_t by, int nrc);

void   gqt_quantize_row_q4_hqq_128_ref(const float * x, void * y, int64_t k);

void   gqt_dequantize_row_q4_hqq_128(const void * x, float * y, int64_t k);
size_t gqt_quantize_q4_hqq_128(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix);
void   gqt_vec_dot_q4_hqq_128_q8_1_ref(int n, float * s, size_t bs, const void * vx, size_t bx,
                                       const void * vy, size_t by, int nrc);

/* The vec_dot that ggml-cpu registers (gqt_hqq_simd.c: AVX2 / NEON where the build targets them,
 * else the _ref above). */
void   gqt_vec_dot_q4_hqq_q8_1(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void   gqt_vec_dot_q4_hqq_128_q8_1(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);

#ifdef __cplusplus
}
#endif
