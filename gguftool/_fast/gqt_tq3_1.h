/* TQ3_1 and TQ3_2: 3-bit Lloyd-Max types without a rotation of their own, for KV caches that llama.cpp already
 * rotates head-wide (its graph multiplies Q, K and V by a Walsh-Hadamard matrix whenever the cache
 * type is quantized). TQ3_0 rotates every 32-value block again, which costs a transform on every
 * read; TQ3_1 decodes by table look-up and its dot with Q8_0 is an integer dot. See docs/kv.md.
 *
 * Block (14 bytes, little-endian):
 *   bytes 0..1   d: fp16 scale
 *   bytes 2..5   qh: bit j of this 32-bit word is bit 2 of value j's index
 *   bytes 6..13  qs: byte j holds bits 0..1 of the indices of values j, j+8, j+16, j+24 (bits 0-1, 2-3, 4-5, 6-7)
 * Decode: x_j = d * L[idx_j], L = {-127, -81, -46, -15, 15, 46, 81, 127}: TQ3_0's 3-bit Lloyd-Max
 *   codebook (a unit-variance coordinate of a rotated 32-vector) times 127/2.0719, rounded (MSE +0.1%).
 * Encode: for each of GQT_TQ3_1_SEARCH starting scales d = c * rms(x) / (127/2.0719), c = 0.7, 0.8 .. 1.3,
 *   indices nearest to x / d, then GQT_TQ3_1_REFINE_PASSES Lloyd passes against the fp16 least-squares
 *   scale; the indices of the smallest least-squares error win (the search costs 7x the encode and cuts
 *   the MSE 9%, the attention KL of a K cache 17% on SmolLM2); stored d is the norm-preserving ||x|| / ||L[idx]||
 *   (TQ3_0's measured choice for the K cache). A zero block is 14 zero bytes; a block holding NaN/Inf
 *   gets a NaN scale.
 *
 * TQ3_2 (26 bytes per 64 values, 3.25 bits): the same codes with one scale per 64 values, a whole
 *   head of SmolLM2 (head dim 64): d, then two 12-byte code groups laid out as a TQ3_1 block's bytes
 *   2..13, for values 0..31 and 32..63. The encoder is TQ3_1's run over the 64 values at once. The
 *   head-wide rotation leaves a head's coordinates near-iid, so a second scale per head buys little
 *   (docs/kv.md measures it); the quarter bit it saves pays for better keys where they matter.
 *
 * Bit-identical to the numpy twin (gguftool/quant/tq3_1.py) on every target: integer dots, one float
 * multiply per value or block, no FMA contraction. C99; AVX2 and arm64 NEON paths give the same bits. */
#pragma once
#include "gqt_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint8_t  qh[4];   /* bit 2 of each index */
    uint8_t  qs[8];   /* bits 0..1 of each index, 4 values per byte */
} gqt_tq3_codes;      /* the indices of 32 values */

typedef struct {
    gqt_fp16 d;       /* scale: x = d * L[idx] */
    gqt_tq3_codes c;
} gqt_block_tq3_1;

typedef struct {
    gqt_fp16 d;       /* one scale for all 64 values */
    gqt_tq3_codes c[2];
} gqt_block_tq3_2;

#define GQT_TQ3_1_REFINE_PASSES 2
#define GQT_TQ3_1_SEARCH 7          /* starting scales c = 0.7 + 0.1 k, k = 0..6 */
#define GQT_TQ3_1_UNIT (127.0 / 2.071926058278797)  /* codebook units per standard deviation (TQ3_0's top centroid) */

GQT_STATIC_ASSERT(tq3_1_block, sizeof(gqt_block_tq3_1) == GQT_TQ3_1_BYTES && GQT_TQ3_1_BLOCK == 32);
GQT_STATIC_ASSERT(tq3_2_block, sizeof(gqt_block_tq3_2) == GQT_TQ3_2_BYTES && GQT_TQ3_2_BLOCK == 64);

/* the codebook, index k -> level (ascending) */
static const int8_t gqt_tq3_1_levels[8] = {-127, -81, -46, -15, 15, 46, 81, 127};

/* ggml type-trait signatures (the native build registers these). k, n_per_row, n: multiples of 32. */
void   gqt_quantize_row_tq3_1_ref(const float * x, void * y, int64_t k);   /* non-finite block -> NaN scale */
void   gqt_dequantize_row_tq3_1(const void * x, float * y, int64_t k);
size_t gqt_quantize_tq3_1(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix); /* imatrix ignored */
/* *s = sum of n products of a TQ3_1 row (vx) and a ggml block_q8_0 row (vy); nrc must be 1. */
void   gqt_vec_dot_tq3_1_q8_0(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void   gqt_vec_dot_tq3_1_q8_0_ref(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);

/* acc[j] = acc[j] + (s * d) * L[idx_j] over a TQ3_1 row of k values: flash attention's V accumulation
 * straight from the blocks (no float row in between). Products and sums in that order, in float32, no
 * FMA: every path gives the numpy twin's bits (quant/tq3_1.py mad_tq3_1_ref). */
void   gqt_mad_tq3_1(int64_t k, float * acc, const void * x, float s);

/* Checked entry point for gguftool: GQT_ERR_SHAPE if n_per_row % 32, GQT_ERR_NONFINITE if any
 * input is NaN/Inf (then nothing is written), GQT_ERR_RANGE if a block's scale is beyond fp16 (each
 * such block is written with a NaN scale, the others as usual), else GQT_OK. */
int    gqt_tq3_1_quantize_rows(const float * src, void * dst, int64_t nrows, int64_t n_per_row);

/* TQ3_2: the same entry points (k, n_per_row, n: multiples of 64) */
void   gqt_quantize_row_tq3_2_ref(const float * x, void * y, int64_t k);
void   gqt_dequantize_row_tq3_2(const void * x, float * y, int64_t k);
size_t gqt_quantize_tq3_2(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix);
void   gqt_vec_dot_tq3_2_q8_0(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void   gqt_vec_dot_tq3_2_q8_0_ref(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void   gqt_mad_tq3_2(int64_t k, float * acc, const void * x, float s);
int    gqt_tq3_2_quantize_rows(const float * src, void * dst, int64_t nrows, int64_t n_per_row);

#ifdef __cplusplus
}
#endif
