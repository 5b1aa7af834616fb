/* A better search for ggml's stock K-quant blocks (Q4_K, Q5_K, Q6_K): the same bytes layout, so any
 * stock llama.cpp reads the result; lower (weighted) squared error than ggml's own search.
 *
 * The kernel refines blocks that ggml's quantizer already wrote (its solution is the starting point):
 * per super-block of 256 it alternates
 *   (a) a search of each sub-block's integer scale (and min) codes, the value codes re-chosen optimally
 *       for every candidate: the least-squares pair given the current codes, rounded, then a pattern
 *       search over the +-1 neighbours on the integer grid while the error falls;
 *   (b) a least-squares refit of the fp16 super-block scale(s) given all integer codes, kept only if
 *       the super-block's error falls after rounding to fp16 and re-choosing the value codes.
 * Every change is kept only when the block's error sum_i w_i (x_i - xhat_i)^2 falls, so a block is
 * never worse than where it started. xhat is computed with the float operations of ggml's dequantize.
 *
 * Python-only (not compiled into llama.cpp): named kq_* so the native build's kernel set is unchanged. */
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ggml type ids (ggml.h) */
#define GQT_KQ_Q4_K 12
#define GQT_KQ_Q5_K 13
#define GQT_KQ_Q6_K 14

#define GQT_KQ_QK 256
#define GQT_KQ_Q4_K_BYTES 144
#define GQT_KQ_Q5_K_BYTES 176
#define GQT_KQ_Q6_K_BYTES 210
#define GQT_KQ_ROUNDS_MAX 8

#define GQT_KQ_OK 0
#define GQT_KQ_ERR_TYPE 1
#define GQT_KQ_ERR_SHAPE 2
#define GQT_KQ_ERR_NONFINITE 3
#define GQT_KQ_ERR_PARAM 4

/* Bytes of one row of n_per_row values (0: not a K type handled here). */
int64_t gqt_kq_row_size(int type, int64_t n_per_row);

/* Refines `blocks` (nrows rows of ggml blocks of `type`, as ggml wrote them for the float rows x) in
 * place. w: n_per_row importance weights per column (NULL: all 1). rounds: 1..GQT_KQ_ROUNDS_MAX.
 * err_before / err_after (may be NULL): the summed weighted squared error of the blocks as given and as
 * returned. Returns GQT_KQ_OK or an error code (nothing is changed then). */
int gqt_kq_refine_rows(int type, const float * x, const float * w, void * blocks, int64_t nrows,
                       int64_t n_per_row, int rounds, double * err_before, double * err_after);

/* The weighted squared error of `blocks` against x, per super-block (out: nrows * n_per_row/256),
 * decoded with the float operations of ggml's dequantize. */
int gqt_kq_block_errors(int type, const float * x, const float * w, const void * blocks, int64_t nrows,
                        int64_t n_per_row, double * out);

/* The reconstruction of `blocks` (ggml's dequantize, reimplemented: a test holds it to ggml's). */
int gqt_kq_dequantize_rows(int type, const void * blocks, float * y, int64_t nrows, int64_t n_per_row);

#ifdef __cplusplus
}
#endif
