/* TQ3_3: a trellis-coded 3-bit type for KV caches that llama.cpp rotates head-wide (see gqt_tq3_1.h).
 *
 * Scalar Lloyd-Max codes quantize each value alone. A trellis code (TCQ, Marcellin & Fischer 1990) lets
 * each value choose among 4 of 16 levels, the 4 depending on the codes of the 3 values before it, and
 * picks the whole row's codes at once by a Viterbi search: at the same 3 bits per value the squared error
 * of a Gaussian row falls 28% below TQ3_2's (0.021 vs 0.029 of the variance; SmolLM2's calibrated keys
 * measured the same). Decoding stays free of state: each value's level is a table look-up of its own 2
 * index bits and a 4-bit window of branch bits, so rows decode in any order and in SIMD.
 *
 * Block (26 bytes per 64 values, 3.25 bits, little-endian):
 *   bytes 0..1   d: fp16 scale
 *   bytes 2..9   qb: bit i of this 64-bit word is b_i, value i's branch bit
 *   bytes 10..25 qs: byte j holds the 2-bit indices of values j, j+16, j+32, j+48 (bits 0-1, 2-3, 4-5, 6-7)
 * Decode: x_i = d * L[s_i + 4 idx_i], L the 16 levels below, s_i = subset(w_i) with the window
 *   w_i = b_i << 3 | b_{i-1} << 2 | b_{i-2} << 1 | b_{i-3} (b_{-1} = b_{-2} = b_{-3} = 0) and
 *   subset(w) = b_{i-1} | (b_i ^ b_{i-2} ^ b_{i-3}) << 1: 8 states, Ungerboeck's set partition (the levels
 *   of subset s are L[s], L[s+4], L[s+8], L[s+12]; both branches from a state keep one parity of s).
 *   L: the union codebook trained by Lloyd iterations over the Viterbi encoder on unit Gaussian rows,
 *   times 127 / 2.5451, rounded (MSE +0.1%).
 * Encode: for each of GQT_TQ3_3_SEARCH scales d = c * rms(x) / GQT_TQ3_3_UNIT, c = 0.85, 0.95 ..,
 *   the Viterbi search for the codes of least squared error against d * L; the codes of the smallest
 *   least-squares error win, stored with their least-squares scale <x, l> / <l, l>. All in double, no FMA,
 *   ties to the lower state: the numpy twin (gguftool/quant/tcq3.py) gives the same bytes. A zero block is
 *   26 zero bytes; a block holding NaN/Inf gets a NaN scale. */
#pragma once
#include "gqt_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    gqt_fp16 d;       /* x = d * L[...] */
    uint8_t  qb[8];   /* branch bits */
    uint8_t  qs[16];  /* 2-bit indices within the subset */
} gqt_block_tq3_3;

#define GQT_TQ3_3_SEARCH 4          /* starting scales c = 0.85 + 0.1 k, k = 0..3 */
#define GQT_TQ3_3_UNIT (127.0 / 2.5451)   /* codebook units per standard deviation (the top level) */

GQT_STATIC_ASSERT(tq3_3_block, sizeof(gqt_block_tq3_3) == GQT_TQ3_3_BYTES && GQT_TQ3_3_BLOCK == 64);

/* the union codebook, ascending */
static const int8_t gqt_tq3_3_levels[16] = {-127, -92, -70, -54, -40, -28, -17, -6, 6, 17, 28, 40, 54, 70, 92, 127};

/* ggml type-trait signatures (the native build registers these). k, n_per_row, n: multiples of 64. */
void   gqt_quantize_row_tq3_3_ref(const float * x, void * y, int64_t k);   /* non-finite block -> NaN scale */
void   gqt_dequantize_row_tq3_3(const void * x, float * y, int64_t k);
size_t gqt_quantize_tq3_3(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix); /* imatrix ignored */
void   gqt_vec_dot_tq3_3_q8_0(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void   gqt_vec_dot_tq3_3_q8_0_ref(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
/* acc[j] = acc[j] + (s * d) * level_j: flash attention's V accumulation, float32 in that order, no FMA */
void   gqt_mad_tq3_3(int64_t k, float * acc, const void * x, float s);
/* the 64 int8 levels of one block, value i in lv[i] (what every decode path reads) */
void   gqt_tq3_3_levels_of(const void * block, int8_t * lv);
/* the k levels of a row and its scales per 32 values (each block's for both halves): decode's grouped K dot */
void   gqt_tq3_3_row_levels(const void * row, int64_t k, int8_t * lv, float * d);

/* Checked entry point for gguftool: GQT_ERR_SHAPE if n_per_row % 64, GQT_ERR_NONFINITE if any input is
 * NaN/Inf (nothing written), GQT_ERR_RANGE if a block's scale is beyond fp16 (that block gets a NaN scale). */
int    gqt_tq3_3_quantize_rows(const float * src, void * dst, int64_t nrows, int64_t n_per_row);

#ifdef __cplusplus
}
#endif
