// gguftool KV-cache calibration: metadata -> per-layer tensors -> graph edits. See gqt_kv_calib.h.
#include "gqt_kv_calib.h"
#include "gqt_kv_fused.h"

#include "gguf.h"
#include "ggml-backend.h"
#include "llama-hparams.h"
#include "llama-impl.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct model_calib {
    ggml_context * ctx = nullptr;
    ggml_backend_buffer_t buf = nullptr;
    std::vector<gqt_kv_calib_layer> layers;  // empty entries: layer not calibrated

    ~model_calib() {
        if (buf) ggml_backend_buffer_free(buf);
        if (ctx) ggml_free(ctx);
    }
};

struct binding {
    const llama_model * model;
    int32_t il;
};

std::mutex g_mutex;
std::map<const llama_model *, model_calib *> g_models;
std::map<const ggml_tensor *, binding> g_bindings;

// per-layer cache types (gqt_kv_plan_load)
struct layer_rule { int lo, hi; ggml_type type; };

struct layer_plan {            // one side (K or V) of a file's plan
    ggml_type base = GGML_TYPE_COUNT;   // the requested cache type it is for
    std::string spec;
    std::vector<layer_rule> rules;
    bool logged = false;                // one log line per model and side
};

struct model_plan { layer_plan side[2]; };   // [0] K, [1] V

std::map<const llama_model *, model_plan> g_plans;

// the float32 array `key`, exactly n long and finite (positive if `positive`); empty when absent
std::vector<float> read_array(const gguf_context * meta, const std::string & key, size_t n, bool positive) {
    const int64_t id = gguf_find_key(meta, key.c_str());
    if (id < 0) {
        return {};
    }
    if (gguf_get_kv_type(meta, id) != GGUF_TYPE_ARRAY || gguf_get_arr_type(meta, id) != GGUF_TYPE_FLOAT32 ||
        gguf_get_arr_n(meta, id) != n) {
        throw std::runtime_error("gguftool KV calibration: " + key + " must be a float32 array of " +
                                 std::to_string(n) + " values");
    }
    const float * d = (const float *) gguf_get_arr_data(meta, id);
    std::vector<float> out(d, d + n);
    for (float x : out) {
        if (!std::isfinite(x) || (positive && !(x > 0.0f))) {
            throw std::runtime_error("gguftool KV calibration: " + key + " holds a value that is not finite" +
                                     std::string(positive ? " and positive" : ""));
        }
    }
    return out;
}

}  // namespace

static void load(const llama_model * model, const gguf_context * meta, const llama_hparams & hp) {
    const uint32_t n_layer = hp.n_layer_all;
    struct host_layer { std::vector<float> k_mean, k_inv, q_scale, v_mean, out_mean; uint32_t dk, dv, hq, hkv; };
    std::vector<host_layer> host(n_layer);
    uint32_t n_found = 0;
    for (uint32_t il = 0; il < n_layer; ++il) {
        const uint32_t hkv = hp.n_head_kv(il), hq = hp.n_head(il);
        if (hkv == 0 || hq == 0 || hq % hkv != 0) {
            continue;
        }
        const uint32_t nk = hp.n_embd_k_gqa(il), nv = hp.n_embd_v_gqa(il);
        const std::string pre = "gguftool.kv_calib.blk." + std::to_string(il) + ".";
        std::vector<float> mu = read_array(meta, pre + "k_mean", nk, false);
        std::vector<float> s = read_array(meta, pre + "k_scale", nk, true);
        std::vector<float> nu = read_array(meta, pre + "v_mean", nv, false);
        if (mu.empty() && s.empty() && nu.empty()) {
            continue;
        }
        if (mu.empty() || s.empty() || nu.empty()) {
            throw std::runtime_error("gguftool KV calibration: layer " + std::to_string(il) +
                                     " has only some of k_mean, k_scale, v_mean");
        }
        host_layer & h = host[il];
        h.dk = nk / hkv;
        h.dv = nv / hkv;
        h.hq = hq;
        h.hkv = hkv;
        h.k_mean = mu;
        h.v_mean = nu;
        h.k_inv.resize(nk);
        for (uint32_t i = 0; i < nk; ++i) {
            h.k_inv[i] = 1.0f / s[i];
        }
        const uint32_t g = hq / hkv;
        h.q_scale.resize(size_t(h.dk) * hq);
        h.out_mean.resize(size_t(h.dv) * hq);
        for (uint32_t hh = 0; hh < hq; ++hh) {
            for (uint32_t i = 0; i < h.dk; ++i) h.q_scale[size_t(hh) * h.dk + i] = s[size_t(hh / g) * h.dk + i];
            for (uint32_t i = 0; i < h.dv; ++i) h.out_mean[size_t(hh) * h.dv + i] = nu[size_t(hh / g) * h.dv + i];
        }
        ++n_found;
    }
    if (n_found == 0) {
        LLAMA_LOG_INFO("gguftool: no KV calibration in this file; a quantized cache stores K/V as they are\n");
        return;
    }

    auto * mc = new model_calib();
    mc->layers.resize(n_layer);
    ggml_init_params params = { /*.mem_size =*/ 5 * n_layer * ggml_tensor_overhead(), /*.mem_buffer =*/ nullptr,
                                /*.no_alloc =*/ true };
    mc->ctx = ggml_init(params);
    for (uint32_t il = 0; il < n_layer; ++il) {
        const host_layer & h = host[il];
        if (h.k_mean.empty()) continue;
        gqt_kv_calib_layer & L = mc->layers[il];
        L.k_mean = ggml_new_tensor_2d(mc->ctx, GGML_TYPE_F32, h.dk, h.hkv);
        L.k_inv = ggml_new_tensor_2d(mc->ctx, GGML_TYPE_F32, h.dk, h.hkv);
        L.q_scale = ggml_new_tensor_2d(mc->ctx, GGML_TYPE_F32, h.dk, h.hq);
        L.v_mean = ggml_new_tensor_2d(mc->ctx, GGML_TYPE_F32, h.dv, h.hkv);
        L.out_mean = ggml_new_tensor_1d(mc->ctx, GGML_TYPE_F32, int64_t(h.dv) * h.hq);
        ggml_format_name(L.k_mean, "gqt_k_mean-%u", il);
        ggml_format_name(L.k_inv, "gqt_k_inv-%u", il);
        ggml_format_name(L.q_scale, "gqt_q_scale-%u", il);
        ggml_format_name(L.v_mean, "gqt_v_mean-%u", il);
        ggml_format_name(L.out_mean, "gqt_out_mean-%u", il);
    }
    mc->buf = ggml_backend_alloc_ctx_tensors_from_buft(mc->ctx, ggml_backend_cpu_buffer_type());
    if (!mc->buf) {
        delete mc;
        throw std::runtime_error("gguftool KV calibration: cannot allocate its tensors");
    }
    for (uint32_t il = 0; il < n_layer; ++il) {
        const host_layer & h = host[il];
        if (h.k_mean.empty()) continue;
        const gqt_kv_calib_layer & L = mc->layers[il];
        ggml_backend_tensor_set(L.k_mean, h.k_mean.data(), 0, ggml_nbytes(L.k_mean));
        ggml_backend_tensor_set(L.k_inv, h.k_inv.data(), 0, ggml_nbytes(L.k_inv));
        ggml_backend_tensor_set(L.q_scale, h.q_scale.data(), 0, ggml_nbytes(L.q_scale));
        ggml_backend_tensor_set(L.v_mean, h.v_mean.data(), 0, ggml_nbytes(L.v_mean));
        ggml_backend_tensor_set(L.out_mean, h.out_mean.data(), 0, ggml_nbytes(L.out_mean));
    }
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        g_models[model] = mc;
    }
    LLAMA_LOG_INFO("gguftool: KV calibration for %u of %u layers (applied to quantized K/V caches)\n", n_found, n_layer);
}

void gqt_kv_calib_load(const llama_model * model, const gguf_context * meta, const llama_hparams & hp) {
    gqt_kv_calib_forget(model);
    try {
        load(model, meta, hp);
    } catch (const std::exception & e) {
        LLAMA_LOG_WARN("%s: %s; running without it\n", __func__, e.what());
    }
}

void gqt_kv_calib_forget(const llama_model * model) {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_models.find(model);
    if (it != g_models.end()) {
        delete it->second;
        g_models.erase(it);
    }
    g_plans.erase(model);
}

void gqt_kv_calib_bind(const ggml_tensor * k_cache, const llama_model * model, int32_t il) {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_bindings[k_cache] = { model, il };
}

const gqt_kv_calib_layer * gqt_kv_calib_find(const ggml_tensor * k_cache) {
    while (k_cache && k_cache->view_src) {
        k_cache = k_cache->view_src;
    }
    std::lock_guard<std::mutex> lock(g_mutex);
    auto b = g_bindings.find(k_cache);
    if (b == g_bindings.end()) return nullptr;
    auto m = g_models.find(b->second.model);
    if (m == g_models.end() || b->second.il < 0 || size_t(b->second.il) >= m->second->layers.size()) return nullptr;
    const gqt_kv_calib_layer * L = &m->second->layers[b->second.il];
    return L->k_mean ? L : nullptr;
}

void gqt_kv_calib_apply_in(ggml_context * ctx, const gqt_kv_calib_layer * c, bool k_quantized, bool v_quantized,
                           ggml_tensor ** q, ggml_tensor ** k, ggml_tensor ** v) {
    if (!c) return;
    if (k_quantized && *k) {
        *q = ggml_mul(ctx, *q, c->q_scale);
        *k = ggml_mul(ctx, ggml_sub(ctx, *k, c->k_mean), c->k_inv);
    }
    if (v_quantized && *v) {
        *v = ggml_sub(ctx, *v, c->v_mean);
    }
}

ggml_tensor * gqt_kv_calib_apply_out(ggml_context * ctx, const gqt_kv_calib_layer * c, bool v_quantized,
                                     ggml_tensor * out) {
    if (!c || !v_quantized) return out;
    return ggml_add(ctx, out, c->out_mean);
}

// ---- the calibration and rotation inside the kernels (gqt_kv_fused.h) ------------------------

static const ggml_tensor * base_of(const ggml_tensor * t) {
    while (t && t->view_src) {
        t = t->view_src;
    }
    return t;
}

gqt_kv_fused gqt_kv_fuse_plan(const gqt_kv_calib_layer * c, bool flash_attn, const ggml_tensor * k_cache, bool k_ours,
                              const ggml_tensor * v_cache, bool v_ours, const ggml_tensor * k_rot,
                              const ggml_tensor * v_rot) {
    static const bool off = getenv("GGUFTOOL_KV_FUSED") && atoi(getenv("GGUFTOOL_KV_FUSED")) == 0;
    gqt_kv_fused f;
    if (off || !flash_attn) {
        return f;
    }
    f.calib = c;
    f.k = k_cache && ggml_is_quantized(k_cache->type) && (k_ours || c) && (k_rot || c);
    f.v = v_cache && ggml_is_quantized(v_cache->type) && (v_ours || c) && (v_rot || c);
    if (f.k) {
        f.nk = k_rot ? (int32_t) k_rot->ne[0] : 0;
        f.k_cache = base_of(k_cache);
    }
    if (f.v) {
        f.nv = v_rot ? (int32_t) v_rot->ne[0] : 0;
        f.v_cache = base_of(v_cache);
    }
    return f;
}

void gqt_kv_fuse_mark(ggml_cgraph * gf, const gqt_kv_fused & f, ggml_tensor * out) {
    if (!f.k && !f.v) {
        return;
    }
    ggml_tensor * fa = out;
    while (fa && (fa->op == GGML_OP_RESHAPE || fa->op == GGML_OP_VIEW || fa->op == GGML_OP_PERMUTE)) {
        fa = fa->src[0];
    }
    GGML_ASSERT(fa && fa->op == GGML_OP_FLASH_ATTN_EXT && "gguftool: fused KV transforms need the flash-attention node");
    int32_t * p = fa->op_params;
    p[GQT_FA_FUSED_PARAM] = GQT_KV_FUSED_MAGIC;
    p[GQT_FA_FUSED_PARAM + 1] = f.k ? f.nk : 0;
    p[GQT_FA_FUSED_PARAM + 2] = f.v ? f.nv : 0;
    // tensors the graph did not reach yet are added as leafs, as the scheduler wants every input assigned
    auto use = [gf](ggml_tensor * t) {
        if (t) ggml_build_forward_expand(gf, t);
        return t;
    };
    if (f.calib) {
        fa->src[5] = f.k ? use(f.calib->q_scale) : nullptr;
        fa->src[6] = f.v ? use(f.calib->out_mean) : nullptr;
    }
    int found = 0;
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
        ggml_tensor * n = ggml_graph_node(gf, i);
        if (n->op != GGML_OP_SET_ROWS) {
            continue;
        }
        const ggml_tensor * dst = base_of(n->src[2]);
        const bool is_k = f.k && dst == f.k_cache, is_v = f.v && dst == f.v_cache;
        if (!is_k && !is_v) {
            continue;
        }
        GGML_ASSERT(n->src[0]->type == GGML_TYPE_F32 && ggml_is_contiguous_rows(n->src[0]));
        n->op_params[0] = GQT_KV_FUSED_MAGIC;
        n->op_params[1] = is_k ? f.nk : f.nv;
        if (f.calib) {
            n->src[3] = use(is_k ? f.calib->k_mean : f.calib->v_mean);
            n->src[4] = is_k ? use(f.calib->k_inv) : nullptr;
        }
        found |= is_k ? 1 : 2;
    }
    GGML_ASSERT(found == ((f.k ? 1 : 0) | (f.v ? 2 : 0)) && "gguftool: a fused side's cache write is not in the graph");
}

// ---- per-layer cache types -------------------------------------------------------------------

namespace {


ggml_type type_by_name(const std::string & name) {
    for (int i = 0; i < GGML_TYPE_COUNT; ++i) {
        const char * n = ggml_type_name((ggml_type) i);
        if (n && ggml_type_size((ggml_type) i) > 0 && name == n) return (ggml_type) i;
    }
    return GGML_TYPE_COUNT;
}

// "10-19:q4_0,3:q8_0" -> rules; a malformed item throws (its text in the message)
std::vector<layer_rule> parse_rules(const std::string & s, int n_layer) {
    std::vector<layer_rule> out;
    for (size_t pos = 0; pos < s.size();) {
        size_t end = s.find(',', pos);
        if (end == std::string::npos) end = s.size();
        const std::string item = s.substr(pos, end - pos);
        pos = end + 1;
        const size_t colon = item.find(':');
        int lo = -1, hi = -1, used = 0;
        const int got = colon == std::string::npos ? 0 : sscanf(item.c_str(), "%d%n-%d%n", &lo, &used, &hi, &used);
        const ggml_type t = colon == std::string::npos ? GGML_TYPE_COUNT : type_by_name(item.substr(colon + 1));
        if (got == 1) hi = lo;
        if (got <= 0 || (size_t) used != colon || t == GGML_TYPE_COUNT || !ggml_is_quantized(t) || lo < 0 || hi < lo ||
            (n_layer > 0 && hi >= n_layer)) {
            throw std::runtime_error("'" + item + "' (expected FIRST[-LAST]:TYPE, a quantized type, layers below " +
                                     std::to_string(n_layer) + ")");
        }
        out.push_back({ lo, hi, t });
    }
    return out;
}

ggml_type apply(const std::vector<layer_rule> & rules, int32_t il, ggml_type t) {
    for (const layer_rule & r : rules) {
        if (il >= r.lo && il <= r.hi) return r.type;
    }
    return t;
}

std::string read_string(const gguf_context * meta, const std::string & key) {
    const int64_t id = gguf_find_key(meta, key.c_str());
    if (id < 0) return {};
    if (gguf_get_kv_type(meta, id) != GGUF_TYPE_STRING) throw std::runtime_error(key + " must be a string");
    return gguf_get_val_str(meta, id);
}

}  // namespace

void gqt_kv_plan_load(const llama_model * model, const gguf_context * meta, int n_layer) {
    model_plan mp;
    for (int side = 0; side < 2; ++side) {
        const std::string key = std::string("gguftool.kv_layers.") + (side ? "v" : "k");
        try {
            layer_plan & p = mp.side[side];
            p.spec = read_string(meta, key);
            const std::string base = read_string(meta, key + ".for");
            if (p.spec.empty() && base.empty()) continue;
            p.base = type_by_name(base);
            if (p.base == GGML_TYPE_COUNT || !ggml_is_quantized(p.base)) {
                throw std::runtime_error(key + ".for = '" + base + "' is not a quantized cache type");
            }
            p.rules = parse_rules(p.spec, n_layer);
            LLAMA_LOG_INFO("gguftool: the file plans %s cache types for -ct%c %s: %s\n", side ? "V" : "K",
                           side ? 'v' : 'k', base.c_str(), p.spec.c_str());
        } catch (const std::exception & e) {
            LLAMA_LOG_WARN("gguftool: %s: %s; every layer uses the requested cache type\n", key.c_str(), e.what());
            mp.side[side] = layer_plan();
        }
    }
    std::lock_guard<std::mutex> lock(g_mutex);
    g_plans[model] = mp;
}

ggml_type gqt_kv_layer_type(const llama_model * model, int32_t il, ggml_type t, bool is_v) {
    const char * var = is_v ? "GGUFTOOL_KV_LAYERS_V" : "GGUFTOOL_KV_LAYERS_K";
    const char * env = getenv(var);
    if (!ggml_is_quantized(t)) return t;   // the graph's rotation follows the cache's own type
    if (env && std::string(env) == "off") {
        if (il == 0) LLAMA_LOG_INFO("gguftool: %s=off: every layer's %s cache is %s\n", var, is_v ? "V" : "K", ggml_type_name(t));
        return t;
    }
    if (env && *env) {
        try {
            const ggml_type r = apply(parse_rules(env, 0), il, t);
            if (r != t) LLAMA_LOG_INFO("gguftool: layer %d %s cache: %s (%s)\n", il, is_v ? "V" : "K", ggml_type_name(r), var);
            return r;
        } catch (const std::exception & e) {
            if (il == 0) LLAMA_LOG_WARN("gguftool: %s: ignoring %s\n", var, e.what());
            return t;
        }
    }
    layer_plan p;
    bool first = false;
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        auto it = g_plans.find(model);
        if (it == g_plans.end()) return t;
        layer_plan & stored = it->second.side[is_v ? 1 : 0];
        first = !stored.logged;
        stored.logged = true;
        p = stored;
    }
    if (p.rules.empty()) return t;
    if (t != p.base) {
        if (first) {
            LLAMA_LOG_INFO("gguftool: the file's %s cache plan is for %s; %s runs on every layer\n", is_v ? "V" : "K",
                           ggml_type_name(p.base), ggml_type_name(t));
        }
        return t;
    }
    const ggml_type r = apply(p.rules, il, t);
    if (first) {
        LLAMA_LOG_INFO("gguftool: %s cache: %s, layers %s from the file's plan (%s=off runs %s everywhere)\n",
                       is_v ? "V" : "K", ggml_type_name(t), p.spec.c_str(), var, ggml_type_name(t));
    }
    return r;
}
