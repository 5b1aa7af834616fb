// gguftool: ggml's own quantizers as a shared library for Python (gguftool/native/ggml_lib.py loads it
// with ctypes), so every stock type gguftool writes is the pinned ggml's code, not a port.
// A GGML_ASSERT inside ggml would abort the Python process: these entry points refuse bad calls first.
#include "ggml.h"

#include <stdint.h>

int gqt_ggml_type_count(void) { return GGML_TYPE_COUNT; }

const char * gqt_ggml_type_name(int type) {
    return type >= 0 && type < GGML_TYPE_COUNT ? ggml_type_name((enum ggml_type) type) : "";
}

int gqt_ggml_requires_imatrix(int type) {
    return type >= 0 && type < GGML_TYPE_COUNT && ggml_quantize_requires_imatrix((enum ggml_type) type);
}

// The types ggml_quantize_chunk has a case for (others fall through to an abort there).
static int quantizable(int type) {
    switch (type) {
        case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16:
        case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1: case GGML_TYPE_Q8_0:
        case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K:
        case GGML_TYPE_TQ1_0: case GGML_TYPE_TQ2_0: case GGML_TYPE_MXFP4: case GGML_TYPE_NVFP4:
        case GGML_TYPE_Q1_0: case GGML_TYPE_Q2_0:
        case GGML_TYPE_IQ2_XXS: case GGML_TYPE_IQ2_XS: case GGML_TYPE_IQ2_S: case GGML_TYPE_IQ3_XXS:
        case GGML_TYPE_IQ3_S: case GGML_TYPE_IQ1_S: case GGML_TYPE_IQ1_M: case GGML_TYPE_IQ4_NL: case GGML_TYPE_IQ4_XS:
            return 1;
        default:
            return 0;
    }
}

// Bytes written to dst (nrows rows of n_per_row values), or < 0: -1 not a type ggml quantizes,
// -2 n_per_row does not divide the block, -3 the type needs an importance matrix.
int64_t gqt_ggml_quantize(int type, const float * src, void * dst, int64_t nrows, int64_t n_per_row,
                          const float * imatrix) {
    if (!quantizable(type)) return -1;
    const struct ggml_type_traits * tr = ggml_get_type_traits((enum ggml_type) type);
    if (n_per_row % tr->blck_size) return -2;
    if (ggml_quantize_requires_imatrix((enum ggml_type) type) && imatrix == NULL) return -3;
    return (int64_t) ggml_quantize_chunk((enum ggml_type) type, src, dst, 0, nrows, n_per_row, imatrix);
}

// 1 when the rows hold valid blocks (finite scales, in-range values), as llama.cpp checks on load.
int gqt_ggml_validate(int type, const void * data, int64_t nbytes) {
    if (type < 0 || type >= GGML_TYPE_COUNT) return 0;
    return ggml_validate_row_data((enum ggml_type) type, data, (size_t) nbytes);
}

// ggml's to_float for nrows rows of n_per_row values; 0 when the type has none.
int gqt_ggml_dequantize(int type, const void * src, float * dst, int64_t nrows, int64_t n_per_row) {
    if (type < 0 || type >= GGML_TYPE_COUNT) return 0;
    const struct ggml_type_traits * tr = ggml_get_type_traits((enum ggml_type) type);
    if (tr->blck_size <= 0 || tr->to_float == NULL || n_per_row % tr->blck_size) return 0;
    tr->to_float(src, dst, nrows * n_per_row);
    return 1;
}
