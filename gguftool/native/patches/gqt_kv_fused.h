// gguftool: a quantized cache's calibration and head-wide rotation done inside the kernels (docs/kv.md, Speed).
//
// Upstream llama.cpp rotates Q, K, V and the attention output of every layer with a quantized cache
// (llama_mul_mat_hadamard: one graph node each), and gguftool's calibration adds five more nodes
// ((k - mu) / s, q * s, v - nu, out + nu). Each node is a barrier for all threads, and a decode step
// is short: on Gemma 3 270M those 9 nodes a layer cost more than the attention they serve. Where the
// cache is one of gguftool's types or the file is calibrated, the graph (gqt_kv_calib.cpp) instead
// marks the two nodes that already touch the data:
//
//   SET_ROWS         op_params[0] = GQT_KV_FUSED_MAGIC, [1] = rotation size n (0: none)
//                    src[3] = mean subtracted from every row (or NULL), src[4] = multiplier (or NULL)
//                    row' = rotate_n((row - src[3]) * src[4]), then quantized as before
//   FLASH_ATTN_EXT   op_params[12] = GQT_KV_FUSED_MAGIC, [13] = K rotation size, [14] = V rotation size
//                    (upstream uses 0-4)
//                    src[5] = per-head query multiplier [DK, n_head] (or NULL), src[6] = mean added to
//                    the output [DV * n_head] (or NULL)
//                    q' = rotate_nk(q * src[5]),  out = rotate_nv(out') + src[6]
//
// rotate_n is the orthonormal Walsh-Hadamard transform on each group of n values, with the operations in
// the order of ggml_compute_forward_fwht (scale first, then the butterflies), and the calibration's
// arithmetic is that of the ggml_sub / ggml_mul / ggml_add nodes it replaces: the fused graph computes
// the same floats as the unfused one (tests/test_kv_fused.py compares them). The K-shift still rotates
// with upstream's matrices, which are the same transform. GGUFTOOL_KV_FUSED=0 keeps the graph nodes.
#pragma once

#include <math.h>
#include <stdint.h>

#define GQT_KV_FUSED_MAGIC 0x46545147   // "GQTF"
#define GQT_FA_FUSED_PARAM 12           // FLASH_ATTN_EXT op_params[12..14]

// x[0..len) in place, each group of n (a power of two dividing len) rotated
static inline void gqt_fwht_groups(float * x, int64_t len, int64_t n) {
    const float scale = 1.0f / sqrtf((float) n);
    for (int64_t j = 0; j < len; ++j) {
        x[j] = x[j] * scale;
    }
    for (int64_t g = 0; g < len; g += n) {
        float * r = x + g;
        for (int64_t h = 1; h < n; h <<= 1) {
            for (int64_t i = 0; i < n; i += 2 * h) {
                for (int64_t j = i; j < i + h; ++j) {
                    const float u = r[j], v = r[j + h];
                    r[j] = u + v;
                    r[j + h] = u - v;
                }
            }
        }
    }
}
