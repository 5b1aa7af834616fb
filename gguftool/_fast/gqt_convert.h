/* Bulk conversions for the Python pipeline's inputs (not used by the llama.cpp build). */
#pragma once
#include "gqt_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[i] = fp32(x[i]) for i < n: exactly gqt_fp16_to_fp32 (ggml's formula), 8 values per vector. */
void gqt_fp16_to_fp32_n(const uint16_t * x, float * y, int64_t n);

#ifdef __cplusplus
}
#endif
