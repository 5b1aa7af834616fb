/* TQ3_0: TurboQuant-style 3.5-bit type (3-bit Lloyd-Max codebook after a fixed randomised
 * Walsh-Hadamard rotation of each 32-value block). See docs/tq3.md.
 *
 * Block (14 bytes, little-endian):
 *   bytes 0..1   d: fp16 scale s
 *   bytes 2..13  qs: 32 indices of 3 bits. Four groups of 8: group g (values 8g..8g+7) is the
 *                24-bit little-endian word qs[3g] | qs[3g+1] << 8 | qs[3g+2] << 16, and value
 *                8g+i sits in bits 3i..3i+2 of it.
 * Decode: index k -> centroid c[k] (ascending, c[0] = -2.0719 .. c[7] = +2.0719, gqt_tq3_codebook.h);
 *   x_hat = D * H * (s * c[idx]), H the orthonormal 32x32 Sylvester-Hadamard matrix (H = H^T,
 *   H*H = I), D = diag(+-1) the committed sign pattern GQT_TQ3_SIGN_WORD. Encode used y = H*D*x.
 * A block whose scale is zero decodes to exact +0.0 (an all-zero input is stored as 14 zero bytes).
 *
 * Results are bit-identical to the numpy reference (gguftool/quant/tq3.py) and independent of
 * -march: sums run in a fixed order, no FMA contraction (the .c file forbids it), sqrt and
 * division are IEEE correctly rounded. C99; optional AVX2 / arm64 NEON paths for dequantize and
 * vec_dot (when __AVX2__ / __ARM_NEON are defined) give the same bits as the scalar code. */
#pragma once
#include "gqt_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    gqt_fp16 d;       /* least-squares scale of the rotated block */
    uint8_t  qs[12];  /* 32 x 3-bit codebook indices */
} gqt_block_tq3_0;

#define GQT_TQ3_REFINE_PASSES 2  /* Lloyd passes after the first pick: -5% then -2.4% MSE (docs/tq3.md) */

GQT_STATIC_ASSERT(tq3_0_block, sizeof(gqt_block_tq3_0) == GQT_TQ3_0_BYTES && GQT_TQ3_0_BLOCK == 32);

/* ggml type-trait signatures (the native build registers these). k, n_per_row, n: multiples of 32. */
void   gqt_quantize_row_tq3_0_ref(const float * x, void * y, int64_t k);   /* non-finite block -> NaN scale */
void   gqt_dequantize_row_tq3_0(const void * x, float * y, int64_t k);
size_t gqt_quantize_tq3_0(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix); /* bytes written; imatrix ignored */
/* *s = sum of n products of a TQ3_0 row (vx) and a ggml block_q8_0 row (vy); nrc must be 1. The
 * registered one takes the AVX2 / NEON path where there is one; _ref is the portable scalar code.
 * Both give the same bits. */
void   gqt_vec_dot_tq3_0_q8_0(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void   gqt_vec_dot_tq3_0_q8_0_ref(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);

/* Checked entry point for gguftool: GQT_ERR_SHAPE if n_per_row % 32, GQT_ERR_NONFINITE if any
 * input is NaN/Inf (then nothing is written), GQT_ERR_RANGE if a block's scale is beyond fp16 (each
 * such block is written with a NaN scale, the others as usual), else GQT_OK. */
int    gqt_tq3_0_quantize_rows(const float * src, void * dst, int64_t nrows, int64_t n_per_row);

#ifdef __cplusplus
}
#endif
