/* fp16 -> fp32 in bulk: F16 checkpoints are the usual input to quantize, and numpy's cast runs at
 * about 3 ns a value here (scalar); the same bit formula as gqt_fp16_to_fp32 on 8 lanes at once. */
#include "gqt_convert.h"

typedef uint16_t vh __attribute__((vector_size(16)));
typedef uint32_t vu __attribute__((vector_size(32)));
typedef float    vf __attribute__((vector_size(32)));
#define SPLAT(T, v) ((T) {(v), (v), (v), (v), (v), (v), (v), (v)})

GQT_MULTIVERSION
void gqt_fp16_to_fp32_n(const uint16_t * x, float * y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        vh h;
        memcpy(&h, x + i, sizeof h);
        const vu w = __builtin_convertvector(h, vu) << 16;
        const vu sign = w & SPLAT(vu, 0x80000000u);
        const vu two_w = w + w;
        const vf normalized = (vf) ((two_w >> 4) + SPLAT(vu, 0xE0u << 23)) * SPLAT(vf, 0x1.0p-112f);
        const vf denormalized = (vf) ((two_w >> 17) | SPLAT(vu, 126u << 23)) - SPLAT(vf, 0.5f);
        const vu small = (vu) (two_w < SPLAT(vu, 1u << 27));
        const vf r = (vf) (sign | (small & (vu) denormalized) | (~small & (vu) normalized));
        memcpy(y + i, &r, sizeof r);
    }
    for (; i < n; i++) y[i] = gqt_fp16_to_fp32(x[i]);
}
