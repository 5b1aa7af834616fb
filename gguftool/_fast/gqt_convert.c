/* fp16 -> fp32 in bulk: F16 checkpoints are the usual input to quantize, and numpy's cast runs at
 * about 3 ns a value here (scalar); gqt_common.h's 8-lane twin of gqt_fp16_to_fp32 does 8 at once. */
#include "gqt_convert.h"

typedef uint16_t vh __attribute__((vector_size(16)));

GQT_MULTIVERSION
void gqt_fp16_to_fp32_n(const uint16_t * x, float * y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        vh h;
        gqt_v8f r;
        memcpy(&h, x + i, sizeof h);
        GQT_V8_FP16_TO_FP32(r, __builtin_convertvector(h, gqt_v8u));
        memcpy(y + i, &r, sizeof r);
    }
    for (; i < n; i++) y[i] = gqt_fp16_to_fp32(x[i]);
}
