/* cudnn_sdpa.h on a GPU: cuDNN's fused SDPA forward and backward graphs
 * through cudnn-frontend (header-only C++; scripts/setup.sh puts its include/
 * in third_party/cudnn_frontend).  libcudnn is loaded at run time
 * (cudnn-frontend's dynamic loading, NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING),
 * so a machine without it still runs the CUDA backend's own kernels.  C++ only
 * because cudnn-frontend is; every exception stops here. */
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#include <cudnn_frontend.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/cudnn_sdpa.h"

extern "C" {
#include "util/error.h"
}

namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr; /* the frontend's shim resolves every cuDNN call through it */
}

namespace fe = cudnn_frontend;

namespace {

enum : int64_t { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV };

typedef std::tuple<int, int, int, int, int, int, float, int, std::vector<int64_t>> graph_key;

struct cached_graph {
    std::shared_ptr<fe::graph::Graph> graph; /* NULL: refused (why) */
    int64_t workspace = 0;
    std::string why;
};

std::vector<int64_t> dims(const olmo_sdpa_shape *s, int heads, int cols) {
    return {s->batch, heads, s->seq, cols};
}
std::vector<int64_t> strides(const int64_t st[3]) { return {st[0], st[1], st[2], 1}; }

graph_key key_of(const olmo_sdpa_shape *s, int backward) {
    std::vector<int64_t> st;
    for (const int64_t *p : {s->q_stride, s->k_stride, s->v_stride, s->o_stride}) st.insert(st.end(), p, p + 3);
    /* window >= seq is full causal: one graph */
    const int window = s->window > 0 && s->window < s->seq ? s->window : 0;
    return graph_key(s->batch, s->seq, s->n_heads, s->n_kv_heads, s->head_dim, window, s->scale, backward, st);
}

} // namespace

struct olmo_sdpa {
    cudnnHandle_t handle = nullptr;
    long version = 0;
    std::string library;
    std::map<graph_key, cached_graph> graphs;
};

static int fe_failed(const char *what, fe::error_t e) {
    return olmo_error("cuDNN SDPA: %s: %s", what, e.get_message().c_str());
}
#define FE_TRY(what, call)                                                                         \
    do {                                                                                           \
        fe::error_t e_ = (call);                                                                   \
        if (e_.is_bad()) return fe_failed(what, e_);                                               \
    } while (0)

static std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph &g, const char *name, int64_t uid,
                                                           std::vector<int64_t> d, std::vector<int64_t> st) {
    return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(d).set_stride(st));
}

/* Builds the graph of this shape and direction into c; 0 or -1 with the error set. */
static int build_graph(olmo_sdpa *sd, const olmo_sdpa_shape *s, int backward, int window, cached_graph *c) {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto Q = input(*g, "Q", UID_Q, dims(s, s->n_heads, s->head_dim), strides(s->q_stride));
    auto K = input(*g, "K", UID_K, dims(s, s->n_kv_heads, s->head_dim), strides(s->k_stride));
    auto V = input(*g, "V", UID_V, dims(s, s->n_kv_heads, s->head_dim), strides(s->v_stride));
    const std::vector<int64_t> stats_dims = {s->batch, s->n_heads, s->seq, 1};
    const std::vector<int64_t> stats_strides = {(int64_t)s->n_heads * s->seq, s->seq, 1, 1};
    if (!backward) {
        auto opt = fe::graph::SDPA_attributes().set_name("olmoc_sdpa").set_generate_stats(true).set_causal_mask(true)
                       .set_attn_scale(s->scale);
        if (window > 0) opt.set_diagonal_band_left_bound(window);
        auto [O, stats] = g->sdpa(Q, K, V, opt);
        O->set_output(true).set_uid(UID_O).set_dim(dims(s, s->n_heads, s->head_dim)).set_stride(strides(s->o_stride));
        stats->set_output(true).set_uid(UID_STATS).set_data_type(fe::DataType_t::FLOAT).set_dim(stats_dims)
            .set_stride(stats_strides);
    } else {
        auto O = input(*g, "O", UID_O, dims(s, s->n_heads, s->head_dim), strides(s->o_stride));
        auto dO = input(*g, "dO", UID_DO, dims(s, s->n_heads, s->head_dim), strides(s->o_stride));
        auto stats = g->tensor(fe::graph::Tensor_attributes().set_name("stats").set_uid(UID_STATS).set_dim(stats_dims)
                                   .set_stride(stats_strides).set_data_type(fe::DataType_t::FLOAT));
        auto opt = fe::graph::SDPA_backward_attributes().set_name("olmoc_sdpa_backward").set_causal_mask(true)
                       .set_attn_scale(s->scale).set_deterministic_algorithm(true);
        if (window > 0) opt.set_diagonal_band_left_bound(window);
        auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, stats, opt);
        dQ->set_output(true).set_uid(UID_DQ).set_dim(dims(s, s->n_heads, s->head_dim)).set_stride(strides(s->q_stride));
        dK->set_output(true).set_uid(UID_DK).set_dim(dims(s, s->n_kv_heads, s->head_dim)).set_stride(strides(s->k_stride));
        dV->set_output(true).set_uid(UID_DV).set_dim(dims(s, s->n_kv_heads, s->head_dim)).set_stride(strides(s->v_stride));
    }
    FE_TRY("validate", g->validate());
    FE_TRY("build_operation_graph", g->build_operation_graph(sd->handle));
    FE_TRY("create_execution_plans", g->create_execution_plans({fe::HeurMode_t::A}));
    FE_TRY("check_support", g->check_support(sd->handle));
    FE_TRY("build_plans", g->build_plans(sd->handle));
    FE_TRY("get_workspace_size", g->get_workspace_size(c->workspace));
    c->graph = g;
    return 0;
}

/* The graph of this shape and direction, built once and cached, a refusal too; 0 or -1 with the error set. */
static int graph_for(olmo_sdpa *sd, const olmo_sdpa_shape *s, int backward, cached_graph **out) {
    const graph_key key = key_of(s, backward);
    auto it = sd->graphs.find(key);
    if (it == sd->graphs.end()) {
        cached_graph c;
        if (build_graph(sd, s, backward, std::get<5>(key), &c)) c.why = olmo_last_error();
        it = sd->graphs.emplace(key, c).first;
    }
    if (!it->second.graph) return olmo_error("%s", it->second.why.c_str());
    *out = &it->second;
    return 0;
}

static int check_shape(const olmo_sdpa_shape *s) {
    if (s->batch <= 0 || s->seq <= 0 || s->n_heads <= 0 || s->n_kv_heads <= 0 || s->head_dim <= 0 ||
        s->n_heads % s->n_kv_heads || s->window < 0)
        return olmo_error("cuDNN SDPA: invalid shape (batch %d, seq %d, heads %d/%d, head_dim %d, window %d)",
                          s->batch, s->seq, s->n_heads, s->n_kv_heads, s->head_dim, s->window);
    return 0;
}

extern "C" struct olmo_sdpa *olmo_sdpa_create(void) {
    const char *path = getenv("OLMOC_CUDNN_LIB");
    const char *name = path && *path ? path : "libcudnn.so.9";
    /* the frontend's shim opens libcudart by its soname: the one this program is linked with */
    char cudart[32];
    snprintf(cudart, sizeof cudart, "libcudart.so.%d", CUDART_VERSION / 1000);
    setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", cudart, 0);
    if (!fe::cudnn_dlhandle) {
        void *h = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
        if (!h) {
            const char *err = dlerror();
            olmo_error("cuDNN not loaded: %s", err ? err : name);
            return NULL;
        }
        fe::cudnn_dlhandle = h;
    }
    olmo_sdpa *sd = nullptr;
    try {
        sd = new olmo_sdpa();
        sd->version = (long)fe::detail::get_backend_version();
        Dl_info info;
        void *sym = dlsym(fe::cudnn_dlhandle, "cudnnGetVersion");
        sd->library = sym && dladdr(sym, &info) && info.dli_fname ? info.dli_fname : name;
        if (sd->version < 90000) {
            olmo_error("cuDNN %ld from %s: the fused SDPA graphs need cuDNN 9", sd->version, sd->library.c_str());
            delete sd;
            return NULL;
        }
        cudnnStatus_t st = fe::detail::create_handle(&sd->handle);
        if (st != CUDNN_STATUS_SUCCESS) {
            olmo_error("cuDNN %ld: cudnnCreate failed (%s)", sd->version, fe::detail::get_error_string(st));
            sd->handle = nullptr;
            olmo_sdpa_destroy(sd);
            return NULL;
        }
    } catch (const std::exception &e) {
        olmo_error("cuDNN not usable: %s", e.what());
        olmo_sdpa_destroy(sd);
        return NULL;
    }
    return sd;
}

extern "C" void olmo_sdpa_destroy(struct olmo_sdpa *sd) {
    if (!sd) return;
    try {
        sd->graphs.clear();
        if (sd->handle) fe::detail::destroy_handle(sd->handle);
    } catch (...) {
    }
    delete sd;
}

extern "C" long olmo_sdpa_version(const struct olmo_sdpa *sd) { return sd ? sd->version : 0; }
extern "C" const char *olmo_sdpa_library(const struct olmo_sdpa *sd) { return sd ? sd->library.c_str() : ""; }

extern "C" int olmo_sdpa_prepare(struct olmo_sdpa *sd, const struct olmo_sdpa_shape *s, int backward,
                                 size_t *workspace) {
    if (check_shape(s)) return -1;
    try {
        cached_graph *c;
        if (graph_for(sd, s, backward, &c)) return -1;
        *workspace = (size_t)c->workspace;
        return 0;
    } catch (const std::exception &e) {
        return olmo_error("cuDNN SDPA: %s", e.what());
    }
}

static int run(olmo_sdpa *sd, const olmo_sdpa_shape *s, int backward, std::unordered_map<int64_t, void *> &pack,
               void *workspace, void *stream) {
    if (check_shape(s)) return -1;
    try {
        cached_graph *c;
        if (graph_for(sd, s, backward, &c)) return -1;
        cudnnStatus_t st = fe::detail::set_stream(sd->handle, (cudaStream_t)stream);
        if (st != CUDNN_STATUS_SUCCESS)
            return olmo_error("cuDNN SDPA: cudnnSetStream failed (%s)", fe::detail::get_error_string(st));
        FE_TRY(backward ? "execute (backward)" : "execute (forward)", c->graph->execute(sd->handle, pack, workspace));
        return 0;
    } catch (const std::exception &e) {
        return olmo_error("cuDNN SDPA: %s", e.what());
    }
}

extern "C" int olmo_sdpa_fwd(struct olmo_sdpa *sd, const struct olmo_sdpa_shape *s, void *o, float *stats,
                             const void *q, const void *k, const void *v, void *workspace, void *stream) {
    std::unordered_map<int64_t, void *> pack = {
        {UID_Q, (void *)q}, {UID_K, (void *)k}, {UID_V, (void *)v}, {UID_O, o}, {UID_STATS, stats}};
    return run(sd, s, 0, pack, workspace, stream);
}

extern "C" int olmo_sdpa_bwd(struct olmo_sdpa *sd, const struct olmo_sdpa_shape *s, void *dq, void *dk, void *dv,
                             const void *dout, const void *o, const float *stats, const void *q, const void *k,
                             const void *v, void *workspace, void *stream) {
    std::unordered_map<int64_t, void *> pack = {
        {UID_Q, (void *)q},   {UID_K, (void *)k},   {UID_V, (void *)v},  {UID_O, (void *)o},
        {UID_STATS, (void *)stats}, {UID_DO, (void *)dout}, {UID_DQ, dq}, {UID_DK, dk}, {UID_DV, dv}};
    return run(sd, s, 1, pack, workspace, stream);
}
