/* Decode's grouped K dots for the cache types whose blocks are an integer per value times one scale per 32
 * or 64 (Q4_0, Q5_0, Q8_0, IQ4_NL, gguftool's TQ3_3): flash attention's decode (integrate.py, gqt_fa_grouped) turns a K row into
 * int8 levels once, then dots them with every query head of its KV head in Q8_0, four heads per accumulator,
 * where ggml's vec_dot reads and unpacks the row once per head. The integer sums are exact; each head's float
 * arithmetic is sum over blocks j of (d_j * yd_j) * isum_j, in block order (ggml's vec_dot sums the same
 * terms in another order; TQ3_3's the same ones in the same order). Block layouts: ggml-common.h (block_q4_0,
 * block_q5_0, block_q8_0, block_iq4_nl), gqt_tcq3.h. */
#pragma once
#include "gqt_common.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { GQT_KV_DOT_Q4_0, GQT_KV_DOT_Q5_0, GQT_KV_DOT_Q8_0, GQT_KV_DOT_IQ4_NL, GQT_KV_DOT_TQ3_3 };

/* the n (a multiple of 32; of 64 for TQ3_3) int8 levels of one row of type `kind`, and a scale per 32 as
 * floats (TQ3_3's per 64 given for both halves) */
void gqt_kv_levels(int kind, const void * row, int64_t n, int8_t * lv, float * d);

/* s[g * s_stride] = sum_j (d[j] * yd[j * G4 + g]) * <lv[32 j ..], y_g's block j>, g < G: y_g = the Q8_0 row at
 * vy + g * y_stride, yd its block scales as floats laid out by block (G4 = G rounded up to a multiple of 4, the
 * rest 0). Levels and queries within [-127, 127]. */
void gqt_kv_dot_heads(int64_t n, const int8_t * lv, const float * d, const void * vy, size_t y_stride,
                      const float * yd, int G, float * s, int s_stride);

#ifdef __cplusplus
}
#endif
