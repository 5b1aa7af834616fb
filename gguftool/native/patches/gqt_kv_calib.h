// gguftool KV-cache calibration in llama.cpp (see docs/kv.md).
//
// A file written by `gguftool kv-calibrate` carries, per layer, three float32 arrays measured
// offline on text (post-norm, post-RoPE attention inputs):
//   gguftool.kv_calib.blk.<il>.k_mean    mu   (n_embd_k_gqa)   mean key
//   gguftool.kv_calib.blk.<il>.k_scale   s    (n_embd_k_gqa)   per-channel key divisor, > 0
//   gguftool.kv_calib.blk.<il>.v_mean    nu   (n_embd_v_gqa)   mean value
// Before the cache (and before llama.cpp's Hadamard rotation) the graph stores
//   k' = (k - mu) / s,   q' = q * s (s of the query's KV head),   v' = v - nu,
// and adds nu back to the attention output. Softmax is unchanged by a per-query constant, so
// q'.k' = q.k - q.mu gives the same attention; sum_j p_j (v_j - nu) + nu is the same output. Only
// what is quantized changes: keys and values with the common part removed and key channels
// balanced against the queries that read them. s is equal on channels RoPE rotates together,
// so a K shift stays exact. Applied only when the cache type is quantized; a file without the
// arrays runs unchanged (one log line says so).
#pragma once

#include "ggml.h"

#include <cstdint>

struct gguf_context;
struct llama_hparams;
struct llama_model;

struct gqt_kv_calib_layer {
    ggml_tensor * k_mean    = nullptr;  // [n_embd_head_k, n_head_kv]
    ggml_tensor * k_inv     = nullptr;  // [n_embd_head_k, n_head_kv]   1 / s
    ggml_tensor * q_scale   = nullptr;  // [n_embd_head_k, n_head]      s of each query head's KV head
    ggml_tensor * v_mean    = nullptr;  // [n_embd_head_v, n_head_kv]
    ggml_tensor * out_mean  = nullptr;  // [n_embd_head_v * n_head]     nu of each query head's KV head
};

// Read the arrays of `meta` for `model`. An array that is present but malformed (wrong type or
// length, non-finite, s <= 0) is named in a warning and the model runs without calibration.
void gqt_kv_calib_load(const llama_model * model, const gguf_context * meta, const llama_hparams & hp);
void gqt_kv_calib_forget(const llama_model * model);

// The KV cache registers its per-layer K tensor; build_attn finds the layer's calibration from it.
void gqt_kv_calib_bind(const ggml_tensor * k_cache, const llama_model * model, int32_t il);
const gqt_kv_calib_layer * gqt_kv_calib_find(const ggml_tensor * k_cache);

// The graph edits of build_attn (q, k, v: [head_dim, heads, tokens]; out: [head_dim * n_head, tokens]).
void gqt_kv_calib_apply_in(ggml_context * ctx, const gqt_kv_calib_layer * c, bool k_quantized, bool v_quantized,
                           ggml_tensor ** q, ggml_tensor ** k, ggml_tensor ** v);
ggml_tensor * gqt_kv_calib_apply_out(ggml_context * ctx, const gqt_kv_calib_layer * c, bool v_quantized,
                                     ggml_tensor * out);

// The calibration and llama.cpp's rotation inside SET_ROWS and FLASH_ATTN_EXT (gqt_kv_fused.h), per side:
// where flash attention is on, that side's cache is quantized and either one of gguftool's types (`ours`)
// or calibrated, and GGUFTOOL_KV_FUSED is not 0. A side that is not fused keeps the graph nodes.
struct gqt_kv_fused {
    bool k = false, v = false;
    int32_t nk = 0, nv = 0;                       // rotation sizes (0: none)
    const gqt_kv_calib_layer * calib = nullptr;
    const ggml_tensor * k_cache = nullptr, * v_cache = nullptr;
};
gqt_kv_fused gqt_kv_fuse_plan(const gqt_kv_calib_layer * c, bool flash_attn, const ggml_tensor * k_cache, bool k_ours,
                              const ggml_tensor * v_cache, bool v_ours, const ggml_tensor * k_rot,
                              const ggml_tensor * v_rot);
// After build_attn_mha: mark its FLASH_ATTN_EXT node (found from `out`) and the layer's SET_ROWS nodes in gf.
// Aborts when a fused side's node is missing: the graph would otherwise attend to unrotated data.
void gqt_kv_fuse_mark(ggml_cgraph * gf, const gqt_kv_fused & f, ggml_tensor * out);

// Per-layer cache types (docs/kv.md, "per-layer plans"). A file may plan, for one requested cache type,
// other types on some layers: gguftool.kv_layers.k = "8-19:q4_0" with gguftool.kv_layers.k.for = "tq3_2"
// (and .v / .v.for), written by `gguftool kv-calibrate --k-layers tq3_2=8-19:q4_0`. A malformed plan is
// named in a warning and dropped.
void gqt_kv_plan_load(const llama_model * model, const gguf_context * meta, int n_layer);

// The cache type of layer il's K (is_v false) or V cache when `t` is requested: the file's plan when it
// is for `t`; GGUFTOOL_KV_LAYERS_K / _V ("10-19:q4_0,3:q8_0", first match wins) override it for any
// quantized `t`, and "off" turns both off. Only quantized caches change, so the rotation still applies.
ggml_type gqt_kv_layer_type(const llama_model * model, int32_t il, ggml_type t, bool is_v);
