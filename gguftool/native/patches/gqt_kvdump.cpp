// gguftool-kvdump: run text through a model and write the attention inputs (Q, K, V of every layer,
// after norm and RoPE, before llama.cpp's cache rotation) as float32 files, for gguftool's offline
// KV-cache calibration and attention-score error report (gguftool/validate/kvdump.py reads them).
//
//   gguftool-kvdump OUTDIR -m model.gguf -f text.txt -c 512 --chunks 4 [llama.cpp options]
//
// Run it with an f16 cache: a quantized cache turns on llama.cpp's Hadamard rotation, which would
// then sit inside the dumped vectors. For every tensor named Qcur-<il>, Kcur-<il> or Vcur-<il> the
// last node of that name in each graph (the one attention reads) is appended to
// OUTDIR/<name>.f32 as rows of ne0 x ne1 floats, one row per token; OUTDIR/manifest.json gives
// the shapes and the token count.
#include "arg.h"
#include "common.h"
#include "log.h"
#include "llama.h"
#include "ggml-backend.h"

#include <clocale>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace {

struct capture {
    int64_t ne0 = 0, ne1 = 0, tokens = 0;
    std::vector<float> data;   // the latest node of this name in the current graph
};

struct dump_state {
    std::string out;
    std::map<std::string, capture> seen;
    std::map<std::string, capture> total;  // shapes and token counts of what was written
    std::vector<uint8_t> buf;
    bool failed = false;
};

// exactly "Qcur-<il>", "Kcur-<il>" or "Vcur-<il>" (not the views ggml names "Kcur-<il> (view)")
bool wanted(const char * name) {
    if (strncmp(name, "Qcur-", 5) && strncmp(name, "Kcur-", 5) && strncmp(name, "Vcur-", 5)) {
        return false;
    }
    const char * p = name + 5;
    if (!*p) {
        return false;
    }
    for (; *p; ++p) {
        if (*p < '0' || *p > '9') {
            return false;
        }
    }
    return true;
}

bool on_tensor(struct ggml_tensor * t, bool ask, void * user) {
    auto * st = (dump_state *) user;
    if (ask) {
        return wanted(t->name);
    }
    if (!wanted(t->name) || t->type != GGML_TYPE_F32 || t->ne[3] != 1) {
        return true;
    }
    const bool host = t->buffer == nullptr || ggml_backend_buffer_is_host(t->buffer);
    const uint8_t * src = (const uint8_t *) t->data;
    if (!host) {
        st->buf.resize(ggml_nbytes(t));
        ggml_backend_tensor_get(t, st->buf.data(), 0, ggml_nbytes(t));
        src = st->buf.data();
    }
    capture & c = st->seen[t->name];
    c.ne0 = t->ne[0];
    c.ne1 = t->ne[1];
    c.tokens = t->ne[2];
    c.data.resize(size_t(t->ne[0] * t->ne[1] * t->ne[2]));
    float * dst = c.data.data();
    for (int64_t i2 = 0; i2 < t->ne[2]; ++i2) {
        for (int64_t i1 = 0; i1 < t->ne[1]; ++i1) {
            for (int64_t i0 = 0; i0 < t->ne[0]; ++i0) {
                memcpy(dst++, src + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2], sizeof(float));
            }
        }
    }
    return true;
}

bool flush(dump_state & st) {
    for (auto & [name, c] : st.seen) {
        const std::string path = st.out + "/" + name + ".f32";
        FILE * f = fopen(path.c_str(), "ab");
        if (!f || fwrite(c.data.data(), sizeof(float), c.data.size(), f) != c.data.size() || fclose(f) != 0) {
            LOG_ERR("gguftool-kvdump: cannot write %s\n", path.c_str());
            return false;
        }
        capture & tot = st.total[name];
        if (tot.tokens && (tot.ne0 != c.ne0 || tot.ne1 != c.ne1)) {
            LOG_ERR("gguftool-kvdump: %s changed shape between graphs\n", name.c_str());
            return false;
        }
        tot.ne0 = c.ne0;
        tot.ne1 = c.ne1;
        tot.tokens += c.tokens;
    }
    st.seen.clear();
    return true;
}

bool write_manifest(const dump_state & st, int n_ctx, int n_chunks) {
    const std::string path = st.out + "/manifest.json";
    FILE * f = fopen(path.c_str(), "w");
    if (!f) {
        return false;
    }
    fprintf(f, "{\n \"n_ctx\": %d,\n \"chunks\": %d,\n \"tensors\": {", n_ctx, n_chunks);
    const char * sep = "\n";
    for (const auto & [name, c] : st.total) {
        fprintf(f, "%s  \"%s\": [%lld, %lld, %lld]", sep, name.c_str(), (long long) c.tokens, (long long) c.ne1,
                (long long) c.ne0);
        sep = ",\n";
    }
    fprintf(f, "\n }\n}\n");
    return fclose(f) == 0;
}

}  // namespace

int main(int argc, char ** argv) {
    std::setlocale(LC_NUMERIC, "C");
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: %s OUTDIR -m model.gguf -f text.txt [-c 512] [--chunks N] [llama.cpp options]\n", argv[0]);
        return 2;
    }
    dump_state st;
    st.out = argv[1];
    std::error_code ec;
    std::filesystem::create_directories(st.out, ec);
    if (ec) {
        fprintf(stderr, "gguftool-kvdump: cannot create %s: %s\n", st.out.c_str(), ec.message().c_str());
        return 1;
    }
    argv[1] = argv[0];

    common_params params;
    params.n_ctx = 512;
    common_init();
    if (!common_params_parse(argc - 1, argv + 1, params, LLAMA_EXAMPLE_PERPLEXITY)) {
        return 2;
    }
    params.n_batch = params.n_ctx;
    params.n_ubatch = params.n_ctx;
    params.cb_eval = on_tensor;
    params.cb_eval_user_data = &st;
    params.warmup = false;

    llama_backend_init();
    common_init_result init(params);
    llama_model * model = init.model();
    llama_context * ctx = init.context();
    if (!model || !ctx) {
        LOG_ERR("gguftool-kvdump: cannot load %s\n", params.model.path.c_str());
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const bool add_bos = llama_vocab_get_add_bos(vocab);
    std::vector<llama_token> tokens = common_tokenize(ctx, params.prompt, add_bos, true);
    const int n_ctx = params.n_ctx;   // the chunk asked for (llama.cpp pads its context to 256 cells)
    const int n_avail = (int) tokens.size() / n_ctx;
    const int n_chunks = params.n_chunks < 0 ? n_avail : std::min(params.n_chunks, n_avail);
    if (n_chunks < 1) {
        LOG_ERR("gguftool-kvdump: %zu tokens are fewer than one chunk of %d\n", tokens.size(), n_ctx);
        return 1;
    }
    for (int i = 0; i < n_chunks; ++i) {
        llama_memory_clear(llama_get_memory(ctx), true);
        common_batch batch(ctx);
        for (int j = 0; j < n_ctx; ++j) {
            const llama_token tok = (j == 0 && add_bos) ? llama_vocab_bos(vocab) : tokens[size_t(i) * n_ctx + j];
            batch.add(tok, j, 0, j == n_ctx - 1);
        }
        if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch.get()) || !flush(st)) {
            LOG_ERR("gguftool-kvdump: chunk %d failed\n", i);
            return 1;
        }
        LOG_INF("gguftool-kvdump: chunk %d/%d\n", i + 1, n_chunks);
    }
    if (!write_manifest(st, n_ctx, n_chunks)) {
        LOG_ERR("gguftool-kvdump: cannot write %s/manifest.json\n", st.out.c_str());
        return 1;
    }
    llama_backend_free();
    return 0;
}
