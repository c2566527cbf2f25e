#include "model/hf.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/weights.h"
#include "util/error.h"
#include "util/fs.h"

/* ---- config.json ---- */

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

/* An integer field; `def` when absent (required: absent is an error). */
static int get_int(const cJSON *o, const char *k, int def, bool required, int *out, const char *path) {
    const cJSON *v = get(o, k);
    if (!v || cJSON_IsNull(v)) {
        if (required) return olmo_error("%s: '%s' is missing", path, k);
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return olmo_error("%s: '%s' must be an integer", path, k);
    if (fabs(v->valuedouble) > 2147483647.0)
        return olmo_error("%s: '%s' is %.17g, beyond olmoc's integers (at most 2147483647 in size)", path, k,
                          v->valuedouble);
    *out = (int)v->valuedouble;
    return 0;
}

static int get_double(const cJSON *o, const char *k, double def, double *out, const char *path) {
    const cJSON *v = get(o, k);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v)) return olmo_error("%s: '%s' must be a number", path, k);
    *out = v->valuedouble;
    return 0;
}

/* A token id of the vocabulary [0, vocab) */
static int check_token_id(const cJSON *v, const char *k, int vocab, const char *path) {
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return olmo_error("%s: '%s' must be a token id (an integer)", path, k);
    if (v->valuedouble < 0 || v->valuedouble >= vocab)
        return olmo_error("%s: '%s' is %.17g, outside the vocabulary [0, %d) (vocab_size)", path, k, v->valuedouble,
                          vocab);
    return 0;
}

/* A token id that may be null or a list (the first entry is taken; every one must be a token). */
static int get_token_id(const cJSON *o, const char *k, int def, int vocab, int *out, const char *path) {
    const cJSON *v = get(o, k);
    if (cJSON_IsArray(v)) {
        for (const cJSON *e = v->child; e; e = e->next)
            if (check_token_id(e, k, vocab, path)) return -1;
        v = cJSON_GetArrayItem(v, 0);
    }
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return 0;
    }
    if (check_token_id(v, k, vocab, path)) return -1;
    *out = (int)v->valuedouble;
    return 0;
}

/* Every object of the document has each key once: Python's json (transformers) keeps the last of
 * duplicates, cJSON's lookups the first, so a duplicate would be read differently. */
static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }
static int check_unique_keys(const cJSON *node, const char *path) {
    if (cJSON_IsObject(node)) {
        size_t n = 0;
        for (const cJSON *c = node->child; c; c = c->next) n++;
        const char **names = olmo_malloc(sizeof(char *) * (n ? n : 1), "JSON keys");
        if (!names) return -1;
        n = 0;
        for (const cJSON *c = node->child; c; c = c->next) names[n++] = c->string ? c->string : "";
        qsort(names, n, sizeof *names, cmp_str);
        for (size_t i = 1; i < n; i++)
            if (!strcmp(names[i - 1], names[i])) {
                olmo_error("%s: key '%s' appears twice in one object (Python's json would take the last, cJSON "
                           "the first)",
                           path, names[i]);
                free(names);
                return -1;
            }
        free(names);
    }
    for (const cJSON *c = node ? node->child : NULL; c; c = c->next)
        if ((cJSON_IsObject(c) || cJSON_IsArray(c)) && check_unique_keys(c, path)) return -1;
    return 0;
}

/* text (len bytes) as one JSON document with unique keys; NULL with the error set, naming the byte offset of
 * a syntax error. */
static cJSON *parse_json(const char *text, size_t len, const char *path) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (root && end) /* after the value: only blanks (Python's json refuses anything else) */
        while (end < text + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
    if (!root || (end && end < text + len)) {
        const size_t at = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
        cJSON_Delete(root);
        olmo_error("%s: not valid JSON (%s at byte offset %zu)", path, root ? "text after the document" : "syntax error",
                   at);
        return NULL;
    }
    if (check_unique_keys(root, path)) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* A RoPE parameter set's type ("rope_type", or the older "type"; "default" when absent). */
static const char *rope_type(const cJSON *r) {
    const cJSON *type = get(r, "rope_type");
    if (!type) type = get(r, "type");
    if (!type) return "default";
    return cJSON_IsString(type) ? type->valuestring : "?";
}

/* A number of a YaRN entry that may be absent or null (*out keeps its value then). */
static int yarn_number(const cJSON *r, const char *where, const char *k, double lo, double *out, const char *path) {
    const cJSON *v = get(r, k);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo))
        return olmo_error("%s: %s.%s must be a number >= %g", path, where, k, lo);
    *out = v->valuedouble;
    return 0;
}

/* YaRN's settings as transformers reads them (modeling_rope_utils._compute_yarn_parameters): factor
 * (null: max_position_embeddings / original_max_position_embeddings), original_max_position_embeddings
 * (default max_position_embeddings), beta_fast / beta_slow (absent or 0: 32 / 1), attention_factor
 * (absent: from factor, or mscale / mscale_all_dim when both are set); the correction range truncated. */
static int read_yarn(const cJSON *r, const char *where, int max_pos, struct olmo_model_config *m, const char *path) {
    static const char *const known[] = {"rope_type", "type", "rope_theta", "factor", "original_max_position_embeddings",
                                        "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                                        "truncate"};
    for (const cJSON *c = r->child; c; c = c->next) {
        size_t i = 0;
        while (i < sizeof known / sizeof known[0] && strcmp(c->string, known[i])) i++;
        if (i == sizeof known / sizeof known[0])
            return olmo_error("%s: %s has '%s', which olmoc's YaRN does not implement", path, where, c->string);
    }
    const cJSON *truncate = get(r, "truncate");
    if (truncate && !cJSON_IsTrue(truncate) && !cJSON_IsNull(truncate))
        return olmo_error("%s: %s.truncate is not true; olmoc's YaRN truncates the correction range, as "
                          "transformers' Olmo3 and OLMo-core do",
                          path, where);
    m->rope_scaling = OLMO_ROPE_YARN;
    double orig = max_pos, factor = 0, beta_fast = 0, beta_slow = 0, attention = 0, mscale = 0, mscale_all = 0;
    if (get(r, "original_max_position_embeddings") && !cJSON_IsNull(get(r, "original_max_position_embeddings"))) {
        const cJSON *o = get(r, "original_max_position_embeddings");
        if (!cJSON_IsNumber(o) || o->valuedouble != floor(o->valuedouble) || o->valuedouble < 1 ||
            o->valuedouble > 2147483647.0)
            return olmo_error("%s: %s.original_max_position_embeddings must be a positive integer", path, where);
        orig = o->valuedouble;
    }
    if (!(orig >= 1)) return olmo_error("%s: %s needs original_max_position_embeddings", path, where);
    const cJSON *f = get(r, "factor");
    if (!f) return olmo_error("%s: %s has no factor", path, where);
    if (yarn_number(r, where, "factor", 1, &factor, path) || yarn_number(r, where, "beta_fast", 0, &beta_fast, path) ||
        yarn_number(r, where, "beta_slow", 0, &beta_slow, path) ||
        yarn_number(r, where, "attention_factor", 0, &attention, path) ||
        yarn_number(r, where, "mscale", -1e300, &mscale, path) ||
        yarn_number(r, where, "mscale_all_dim", -1e300, &mscale_all, path))
        return -1;
    if (cJSON_IsNull(f)) factor = max_pos / orig;
    if (get(r, "attention_factor") && !cJSON_IsNull(get(r, "attention_factor")) && !(attention > 0))
        return olmo_error("%s: %s.attention_factor must be positive", path, where);
    if (!(factor >= 1))
        return olmo_error("%s: %s.factor is %g (max_position_embeddings / original_max_position_embeddings); it "
                          "must be >= 1",
                          path, where, factor);
    /* absent: get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when both are set, else 0,
     * model.rope_attention_factor's "from rope_factor" (get_mscale(factor)) */
    if ((!get(r, "attention_factor") || cJSON_IsNull(get(r, "attention_factor"))) && mscale != 0 && mscale_all != 0) {
        attention = factor == 1 ? 1.0 : (0.1 * mscale * log(factor) + 1.0) / (0.1 * mscale_all * log(factor) + 1.0);
        if (!(attention > 0)) return olmo_error("%s: %s gives attention factor %g; it must be positive", path, where,
                                                attention);
    }
    m->rope_factor = factor;
    m->rope_attention_factor = 0;
    m->rope_original_max_position_embeddings = (int)orig;
    m->rope_beta_fast = beta_fast != 0 ? beta_fast : 32; /* transformers: `or 32`, `or 1` */
    m->rope_beta_slow = beta_slow != 0 ? beta_slow : 1;
    /* 0 (model.rope_attention_factor's "from rope_factor") when it is that value */
    m->rope_attention_factor = attention == olmo_rope_attention_factor(m) ? 0 : attention;
    return 0;
}

/* One RoPE parameter set: its theta, and for the full-attention layers' set (full) YaRN's settings.
 * Other scalings (linear, dynamic, llama3, longrope, ...) are refused by name. */
static int read_rope_entry(const cJSON *r, const char *where, bool full, int max_pos, struct olmo_model_config *m,
                           const char *path) {
    if (!r || cJSON_IsNull(r)) return 0;
    if (!cJSON_IsObject(r)) return olmo_error("%s: '%s' must be an object", path, where);
    const char *type = rope_type(r);
    if (strcmp(type, "default") && strcmp(type, "yarn"))
        return olmo_error("%s: %s has rope_type '%s', a RoPE scaling olmoc does not implement (it implements "
                          "default and yarn)",
                          path, where, type);
    if (!strcmp(type, "yarn")) {
        if (!full)
            return olmo_error("%s: %s has rope_type 'yarn'; olmoc scales RoPE on the full-attention layers only, "
                              "as Olmo 3 does",
                              path, where);
        if (read_yarn(r, where, max_pos, m, path)) return -1;
    }
    const cJSON *t = get(r, "rope_theta");
    if (t && !cJSON_IsNull(t)) {
        if (!cJSON_IsNumber(t) || t->valuedouble <= 0) return olmo_error("%s: %s.rope_theta must be positive", path, where);
        if (m->rope_theta > 0 && m->rope_theta != t->valuedouble)
            return olmo_error("%s: different RoPE theta for sliding and full attention layers is not supported", path);
        m->rope_theta = t->valuedouble;
    }
    return 0;
}

/* transformers' Olmo3Config: rope_scaling (4.x) updates the full-attention layers' entry of
 * rope_parameters (5.x: one entry per layer type), its keys replacing that entry's. */
static int read_rope(const cJSON *root, int max_pos, struct olmo_model_config *m, const char *path) {
    m->rope_theta = 0;
    m->rope_scaling = OLMO_ROPE_NONE;
    const cJSON *scaling = get(root, "rope_scaling"), *params = get(root, "rope_parameters");
    if (scaling && !cJSON_IsNull(scaling) && !cJSON_IsObject(scaling))
        return olmo_error("%s: 'rope_scaling' must be an object", path);
    const cJSON *full = NULL, *sliding = NULL;
    if (params && !cJSON_IsNull(params)) {
        if (!cJSON_IsObject(params)) return olmo_error("%s: 'rope_parameters' must be an object", path);
        full = get(params, "full_attention"), sliding = get(params, "sliding_attention");
        if (!full && !sliding) { /* one set for every layer: unscaled only (transformers 5 ignores it for Olmo3) */
            if (strcmp(rope_type(params), "default"))
                return olmo_error("%s: rope_parameters has rope_type '%s' without per-layer-type entries; give it "
                                  "as rope_scaling or rope_parameters.full_attention",
                                  path, rope_type(params));
            if (read_rope_entry(params, "rope_parameters", false, max_pos, m, path)) return -1;
        }
    }
    if (full && !cJSON_IsNull(full) && !cJSON_IsObject(full))
        return olmo_error("%s: 'rope_parameters.full_attention' must be an object", path);
    cJSON *merged = full && cJSON_IsObject(full) ? cJSON_Duplicate(full, true) : NULL;
    if (scaling && !cJSON_IsNull(scaling)) {
        if (!merged && !(merged = cJSON_CreateObject())) return olmo_error("out of memory");
        for (const cJSON *c = scaling->child; c; c = c->next) {
            cJSON *copy = cJSON_Duplicate(c, true);
            if (!copy) {
                cJSON_Delete(merged);
                return olmo_error("out of memory");
            }
            if (get(merged, c->string)) cJSON_ReplaceItemInObjectCaseSensitive(merged, c->string, copy);
            else cJSON_AddItemToObject(merged, c->string, copy);
        }
    }
    const char *where = scaling && !cJSON_IsNull(scaling) ? "rope_scaling" : "rope_parameters.full_attention";
    int rc = read_rope_entry(merged ? merged : full, where, true, max_pos, m, path) ||
             read_rope_entry(sliding, "rope_parameters.sliding_attention", false, max_pos, m, path);
    cJSON_Delete(merged);
    if (rc) return -1;
    const cJSON *legacy = get(root, "rope_theta");
    if (m->rope_theta <= 0 && legacy) {
        if (!cJSON_IsNumber(legacy) || legacy->valuedouble <= 0) return olmo_error("%s: rope_theta must be positive", path);
        m->rope_theta = legacy->valuedouble;
    }
    if (m->rope_theta <= 0) m->rope_theta = 500000.0; /* Olmo3Config.default_theta */
    return 0;
}

/* Finds (full_attention_every, full_attention_last) reproducing layer_types. */
static int read_layer_types(const cJSON *root, struct olmo_model_config *m, const char *path) {
    const cJSON *lt = get(root, "layer_types");
    int n = m->n_layers;
    bool *full = calloc((size_t)n, sizeof(bool));
    if (!full) return olmo_error("out of memory");
    if (!lt || cJSON_IsNull(lt)) {
        for (int i = 0; i < n; i++) full[i] = (i + 1) % 4 == 0; /* Olmo3Config's default */
    } else {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != n) {
            free(full);
            return olmo_error("%s: layer_types must list one entry per layer (%d)", path, n);
        }
        for (int i = 0; i < n; i++) {
            const cJSON *v = cJSON_GetArrayItem(lt, i);
            if (cJSON_IsString(v) && !strcmp(v->valuestring, "full_attention")) full[i] = true;
            else if (cJSON_IsString(v) && !strcmp(v->valuestring, "sliding_attention")) full[i] = false;
            else {
                free(full);
                return olmo_error("%s: layer_types[%d] must be \"full_attention\" or \"sliding_attention\"", path, i);
            }
        }
    }
    int rc = -1;
    for (int every = 0; every <= n && rc; every++)
        for (int last = 0; last < 2 && rc; last++) {
            struct olmo_model_config c = *m;
            c.full_attention_every = every;
            c.full_attention_last = last;
            bool ok = true;
            for (int i = 0; i < n && ok; i++) ok = olmo_layer_is_full_attention(&c, i) == full[i];
            if (ok) {
                m->full_attention_every = every;
                m->full_attention_last = last;
                rc = 0;
            }
        }
    free(full);
    if (rc)
        return olmo_error("%s: layer_types is not 'full attention on every k-th layer (and optionally the last)', "
                          "the only layouts olmoc expresses",
                          path);
    return 0;
}

/* The sizes are positive (vocab_size 0 was refused later as model.vocab_size). */
static int check_sizes(const struct olmo_model_config *m, const char *path) {
    const struct {
        const char *key;
        int value;
    } sizes[] = {
        {"vocab_size", m->vocab_size},   {"hidden_size", m->d_model},           {"num_hidden_layers", m->n_layers},
        {"num_attention_heads", m->n_heads}, {"num_key_value_heads", m->n_kv_heads}, {"intermediate_size", m->mlp_hidden},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].value <= 0) return olmo_error("%s: '%s' is %d; it must be positive", path, sizes[i].key, sizes[i].value);
    return 0;
}

/* olmoc's shape limits (config.h), checked before anything is sized by them
 * (2^31-1 layers took 72 s and 2 GB before failing). */
static int check_limits(const struct olmo_model_config *m, const char *path) {
    const struct {
        const char *key;
        int value;
        long long max;
    } limits[] = {
        {"vocab_size", m->vocab_size, OLMO_MAX_VOCAB_SIZE},   {"hidden_size", m->d_model, OLMO_MAX_D_MODEL},
        {"num_hidden_layers", m->n_layers, OLMO_MAX_N_LAYERS}, {"num_attention_heads", m->n_heads, OLMO_MAX_N_HEADS},
        {"num_key_value_heads", m->n_kv_heads, OLMO_MAX_N_HEADS}, {"intermediate_size", m->mlp_hidden, OLMO_MAX_MLP_HIDDEN},
    };
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++)
        if (limits[i].value > limits[i].max)
            return olmo_error("%s: '%s' is %d, above olmoc's limit of %lld", path, limits[i].key, limits[i].value,
                              limits[i].max);
    return 0;
}

/* What the last olmo_hf_read_config assumed (olmo_hf_config_assumed). */
static _Thread_local char assumed[512];

static void assume(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void assume(const char *fmt, ...) {
    size_t len = strlen(assumed);
    if (len && len + 2 < sizeof assumed) {
        strcpy(assumed + len, "; ");
        len += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(assumed + len, sizeof assumed - len, fmt, ap);
    va_end(ap);
}

const char *olmo_hf_config_assumed(void) { return assumed; }

/* OLMo-core's Hugging Face exporter (olmo_core/nn/hf/config.py, get_hf_config) writes
 * "max_position_embeddings": -1 and null pad/bos/eos token ids (save_hf_model fills the ids in only
 * when given a tokenizer).  Those are read as unknown: the Olmo 3 values are assumed -- the dolma2
 * tokenizer's EOS 100257 and PAD 100277 (OLMo-core TokenizerConfig.dolma2) and Olmo 3's 8192-token
 * sequence length -- and said so. */
#define DOLMA2_EOS 100257
#define DOLMA2_PAD 100277
#define OLMO3_SEQ_LEN 8192

static int read_token_id(const cJSON *root, const char *k, int absent, int null_id, int vocab, int *out,
                         const char *path) {
    const cJSON *v = get(root, k);
    if (v && cJSON_IsNull(v)) {
        *out = null_id;
        assume("%s is null: %d assumed (the dolma2 tokenizer's; --set model.%s=ID to change)", k, null_id,
               strcmp(k, "eos_token_id") ? "pad_token_id" : "eos_token_id");
        return 0;
    }
    return get_token_id(root, k, absent, vocab, out, path);
}

int olmo_hf_read_config(const char *path, struct olmo_config *cfg) {
    assumed[0] = '\0';
    char *text;
    size_t len;
    if (olmo_read_file(path, 1u << 20, &text, &len)) return -1;
    cJSON *root = parse_json(text, len, path);
    free(text);
    if (!root) return -1;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return olmo_error("%s: not a JSON object", path);
    }
    int rc = -1;
    struct olmo_model_config *m = &cfg->model;
    const cJSON *mt = get(root, "model_type");
    if (!cJSON_IsString(mt) || strcmp(mt->valuestring, "olmo3")) {
        olmo_error("%s: model_type is '%s'; olmoc reads Olmo 3 (model_type \"olmo3\") checkpoints", path,
                   cJSON_IsString(mt) ? mt->valuestring : "missing");
        goto done;
    }
    const cJSON *tied = get(root, "tie_word_embeddings");
    if (cJSON_IsTrue(tied)) {
        olmo_error("%s: tie_word_embeddings is true; olmoc's Olmo 3 has an untied LM head", path);
        goto done;
    }
    if (cJSON_IsTrue(get(root, "attention_bias")) || cJSON_IsTrue(get(root, "mlp_bias"))) {
        olmo_error("%s: attention_bias / mlp_bias are not supported (Olmo 3 has no biases)", path);
        goto done;
    }
    const cJSON *act = get(root, "hidden_act");
    if (act && !(cJSON_IsString(act) && !strcmp(act->valuestring, "silu"))) {
        olmo_error("%s: hidden_act '%s' is not supported (only silu / SwiGLU)", path,
                   cJSON_IsString(act) ? act->valuestring : "?");
        goto done;
    }
    double dropout = 0.0;
    if (get_double(root, "attention_dropout", 0.0, &dropout, path)) goto done;
    if (dropout != 0.0) {
        olmo_error("%s: attention_dropout %g is not supported (olmoc has no dropout)", path, dropout);
        goto done;
    }
    int max_pos = 2048;
    if (get_int(root, "vocab_size", 0, true, &m->vocab_size, path) ||
        get_int(root, "hidden_size", 0, true, &m->d_model, path) ||
        get_int(root, "num_hidden_layers", 0, true, &m->n_layers, path) ||
        get_int(root, "num_attention_heads", 0, true, &m->n_heads, path) ||
        get_int(root, "num_key_value_heads", m->n_heads, false, &m->n_kv_heads, path) ||
        get_int(root, "intermediate_size", 0, true, &m->mlp_hidden, path) ||
        get_int(root, "max_position_embeddings", 2048, false, &max_pos, path) ||
        get_double(root, "rms_norm_eps", 1e-5, &m->rms_norm_eps, path) ||
        get_double(root, "initializer_range", 0.02, &m->init_std, path) || read_rope(root, max_pos, m, path))
        goto done;
    if (check_sizes(m, path) || check_limits(m, path)) goto done;
    /* the ranges olmoc's config keys have (config.c), named by config.json's keys */
    const struct {
        const char *hf, *key;
        double value;
    } ranged[] = {
        {"rms_norm_eps", "model.rms_norm_eps", m->rms_norm_eps},
        {"initializer_range", "model.init_std", m->init_std},
        {"rope_theta", "model.rope_theta", m->rope_theta},
        {"rope_scaling.factor", "model.rope_factor", m->rope_factor},
        {"rope_scaling.original_max_position_embeddings", "model.rope_original_max_position_embeddings",
         m->rope_original_max_position_embeddings},
        {"rope_scaling.beta_fast", "model.rope_beta_fast", m->rope_beta_fast},
        {"rope_scaling.beta_slow", "model.rope_beta_slow", m->rope_beta_slow},
        {"rope_scaling.attention_factor", "model.rope_attention_factor", m->rope_attention_factor},
    };
    for (size_t i = 0; i < sizeof ranged / sizeof ranged[0]; i++)
        if (olmo_config_check_range(ranged[i].key, ranged[i].value)) {
            olmo_error_context("%s: '%s'", path, ranged[i].hf);
            goto done;
        }
    int bos = -1;
    if (read_token_id(root, "eos_token_id", 50279, DOLMA2_EOS, m->vocab_size, &m->eos_token_id, path) ||
        read_token_id(root, "pad_token_id", 1, DOLMA2_PAD, m->vocab_size, &m->pad_token_id, path) ||
        get_token_id(root, "bos_token_id", -1, m->vocab_size, &bos, path))
        goto done;
    int head_dim = 0;
    if (get_int(root, "head_dim", m->d_model / m->n_heads, false, &head_dim, path)) goto done;
    if (head_dim * m->n_heads != m->d_model) {
        olmo_error("%s: head_dim %d x %d heads != hidden_size %d is not supported", path, head_dim, m->n_heads,
                   m->d_model);
        goto done;
    }
    const cJSON *sw = get(root, "sliding_window");
    if (!sw) m->sliding_window = 4096;
    else if (cJSON_IsNull(sw)) m->sliding_window = 0; /* sliding layers attend to everything */
    else if (get_int(root, "sliding_window", 0, true, &m->sliding_window, path)) goto done;
    else if (m->sliding_window <= 0) {
        olmo_error("%s: 'sliding_window' is %d; it must be positive (or null: no window)", path, m->sliding_window);
        goto done;
    }
    if (read_layer_types(root, m, path)) goto done;
    if (max_pos <= 0) {
        assume("max_position_embeddings is %d (no limit recorded, as OLMo-core's exporter writes): Olmo 3's %d "
               "assumed, train.seq_len %d",
               max_pos, OLMO3_SEQ_LEN, OLMO3_SEQ_LEN < 4096 ? OLMO3_SEQ_LEN : 4096);
        max_pos = OLMO3_SEQ_LEN;
    }
    cfg->train.seq_len = max_pos < 4096 ? max_pos : 4096;
    rc = 0;
done:
    cJSON_Delete(root);
    return rc;
}

/* YaRN's settings as transformers' rope_parameters and OLMo-core's YaRNRoPEScalingConfig.to_hf_config
 * name them (the attention factor written out, so the file needs no default of either). */
static void add_yarn(cJSON *e, const struct olmo_model_config *m) {
    cJSON_AddStringToObject(e, "rope_type", "yarn");
    cJSON_AddNumberToObject(e, "factor", m->rope_factor);
    cJSON_AddNumberToObject(e, "original_max_position_embeddings", m->rope_original_max_position_embeddings);
    cJSON_AddNumberToObject(e, "beta_fast", m->rope_beta_fast);
    cJSON_AddNumberToObject(e, "beta_slow", m->rope_beta_slow);
    cJSON_AddNumberToObject(e, "attention_factor", olmo_rope_attention_factor(m));
}

int olmo_hf_write_config(const struct olmo_config *cfg, const char *path, const char *dtype_name) {
    const struct olmo_model_config *m = &cfg->model;
    cJSON *root = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(root, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("Olmo3ForCausalLM"));
    cJSON_AddStringToObject(root, "model_type", "olmo3");
    cJSON_AddNumberToObject(root, "vocab_size", m->vocab_size);
    cJSON_AddNumberToObject(root, "hidden_size", m->d_model);
    cJSON_AddNumberToObject(root, "intermediate_size", m->mlp_hidden);
    cJSON_AddNumberToObject(root, "num_hidden_layers", m->n_layers);
    cJSON_AddNumberToObject(root, "num_attention_heads", m->n_heads);
    cJSON_AddNumberToObject(root, "num_key_value_heads", m->n_kv_heads);
    cJSON_AddStringToObject(root, "hidden_act", "silu");
    cJSON_AddNumberToObject(root, "max_position_embeddings", cfg->train.seq_len);
    cJSON_AddNumberToObject(root, "initializer_range", m->init_std);
    cJSON_AddNumberToObject(root, "rms_norm_eps", m->rms_norm_eps);
    cJSON_AddBoolToObject(root, "use_cache", true);
    cJSON_AddNumberToObject(root, "pad_token_id", m->pad_token_id);
    cJSON_AddNullToObject(root, "bos_token_id");
    cJSON_AddNumberToObject(root, "eos_token_id", m->eos_token_id);
    cJSON_AddBoolToObject(root, "tie_word_embeddings", false);
    cJSON_AddBoolToObject(root, "attention_bias", false);
    cJSON_AddNumberToObject(root, "attention_dropout", 0.0);
    /* Both spellings of the RoPE settings: rope_theta (transformers 4.x, the
     * published Olmo 3 configs) and per-layer-type rope_parameters (5.x). */
    cJSON_AddNumberToObject(root, "rope_theta", m->rope_theta);
    if (m->rope_scaling == OLMO_ROPE_YARN) add_yarn(cJSON_AddObjectToObject(root, "rope_scaling"), m);
    else cJSON_AddNullToObject(root, "rope_scaling");
    cJSON *rp = cJSON_AddObjectToObject(root, "rope_parameters");
    const char *types[2] = {"full_attention", "sliding_attention"};
    for (int i = 0; i < 2; i++) {
        cJSON *e = cJSON_AddObjectToObject(rp, types[i]);
        if (i == 0 && m->rope_scaling == OLMO_ROPE_YARN) add_yarn(e, m);
        else cJSON_AddStringToObject(e, "rope_type", "default");
        cJSON_AddNumberToObject(e, "rope_theta", m->rope_theta);
    }
    if (m->sliding_window > 0) cJSON_AddNumberToObject(root, "sliding_window", m->sliding_window);
    else cJSON_AddNullToObject(root, "sliding_window");
    cJSON *lt = cJSON_AddArrayToObject(root, "layer_types");
    for (int l = 0; l < m->n_layers; l++)
        cJSON_AddItemToArray(lt, cJSON_CreateString(olmo_layer_is_full_attention(m, l) ? "full_attention"
                                                                                          : "sliding_attention"));
    cJSON_AddStringToObject(root, "dtype", dtype_name);
    cJSON_AddStringToObject(root, "torch_dtype", dtype_name);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return olmo_error("out of memory writing '%s'", path);
    int rc = olmo_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

/* ---- weights ---- */

struct shard_set {
    int n;
    char names[64][256];
    struct olmo_st_file files[64];
};

static int shard_index(struct shard_set *s, const char *dir, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) return i;
    if (s->n == 64) return olmo_error("more than 64 shards are not supported");
    if (strlen(name) >= sizeof s->names[0] || strchr(name, '/') || !strcmp(name, "..") || !name[0])
        return olmo_error("shard name '%s' is not a plain file name in '%s'", name, dir);
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (olmo_st_open(&s->files[s->n], path)) return -1;
    snprintf(s->names[s->n], sizeof s->names[0], "%s", name);
    return s->n++;
}

static bool ignorable(const char *name) {
    size_t n = strlen(name), k = strlen("rotary_emb.inv_freq");
    return n >= k && !strcmp(name + n - k, "rotary_emb.inv_freq"); /* a buffer some exporters keep */
}

int olmo_hf_load_weights(struct olmo_model *m, const char *dir) {
    char index_path[4400], single[4400];
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir);
    snprintf(single, sizeof single, "%s/model.safetensors", dir);
    if (!m->weights)
        return olmo_error("'%s': the model holds no full-size weights to load into (a sharded model: its trainer "
                          "loads weights by pieces)",
                          dir);
    struct shard_set *s = calloc(1, sizeof *s);
    float *host = malloc(m->n_floats * sizeof(float));
    cJSON *root = NULL;
    int rc = 0;
    if (!s || !host) {
        rc = olmo_error("out of memory loading '%s'", dir);
        goto done;
    }
    const cJSON *map = NULL;
    if (olmo_is_file(index_path)) {
        char *text;
        size_t len;
        if ((rc = olmo_read_file(index_path, 64u << 20, &text, &len))) goto done;
        root = parse_json(text, len, index_path);
        free(text);
        if (!root) {
            rc = -1;
            goto done;
        }
        map = get(root, "weight_map");
        if (!cJSON_IsObject(map)) {
            rc = olmo_error("'%s' has no weight_map object", index_path);
            goto done;
        }
    } else if (!olmo_is_file(single)) {
        rc = olmo_error("'%s' has neither model.safetensors nor model.safetensors.index.json", dir);
        goto done;
    } else if ((rc = shard_index(s, dir, "model.safetensors") < 0 ? -1 : 0)) {
        goto done;
    }
    for (int i = 0; i < m->n_tensors && !rc; i++) {
        const struct olmo_param *p = &m->params[i];
        int k = 0;
        if (map) {
            const cJSON *file = get(map, p->name);
            if (!cJSON_IsString(file)) {
                rc = olmo_error("'%s' maps no file for tensor '%s'", index_path, p->name);
                break;
            }
            if ((k = shard_index(s, dir, file->valuestring)) < 0) {
                rc = -1;
                break;
            }
        }
        const struct olmo_st_tensor *t = olmo_st_find(&s->files[k], p->name);
        if (!t) {
            rc = olmo_error("'%s' has no tensor '%s'", s->files[k].path, p->name);
            break;
        }
        int64_t rows = t->ndim >= 1 ? t->shape[0] : 0, cols = t->ndim == 2 ? t->shape[1] : 1;
        if (t->ndim < 1 || t->ndim > 2 || rows != p->rows || cols != p->cols) {
            rc = olmo_error("'%s': tensor '%s' has %d dims [%lld, ...] but the config needs [%d, %d]", s->files[k].path,
                            p->name, t->ndim, (long long)rows, p->rows, p->cols);
            break;
        }
        if (olmo_st_read_f32(&s->files[k], t, host + p->offset) ||
            olmo_check_finite(s->files[k].path, p->name, host + p->offset, p->numel))
            rc = -1;
    }
    /* Nothing unexpected may be left over (a sign of a config that does not match). */
    for (int k = 0; k < s->n && !rc; k++)
        for (int i = 0; i < s->files[k].n_tensors && !rc; i++) {
            const char *name = s->files[k].tensors[i].name;
            if (!olmo_model_find_param(m, name) && !ignorable(name))
                rc = olmo_error("'%s' has unexpected tensor '%s' (config mismatch?)", s->files[k].path, name);
        }
    if (!rc) rc = m->be->to_device(m->be, m->weights, host, m->n_floats * sizeof(float));
    if (!rc) rc = olmo_model_sync_weights(m);
done:
    if (s)
        for (int k = 0; k < s->n; k++) olmo_st_close(&s->files[k]);
    free(s);
    free(host);
    cJSON_Delete(root);
    if (rc) olmo_error_context("loading Hugging Face weights from '%s'", dir);
    return rc;
}

static uint16_t float_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40); /* quiet NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);                                        /* round to nearest even */
    return (uint16_t)(bits >> 16);
}

int olmo_hf_save_weights(const struct olmo_model *m, const char *path, enum olmo_st_dtype dtype) {
    if (dtype != OLMO_ST_F32 && dtype != OLMO_ST_BF16) return olmo_error("weights can be written as F32 or BF16 only");
    if (!m->weights)
        return olmo_error("'%s': the model holds no full-size weights to save (a sharded model: "
                          "olmo_ckpt_export_weights gathers them)",
                          path);
    float *host = malloc(m->n_floats * sizeof(float));
    uint16_t *half = dtype == OLMO_ST_BF16 ? malloc(m->n_floats * sizeof(uint16_t)) : NULL;
    if (!host || (dtype == OLMO_ST_BF16 && !half)) {
        free(host);
        free(half);
        return olmo_error("out of memory saving '%s'", path);
    }
    int rc = m->be->to_host(m->be, host, m->weights, m->n_floats * sizeof(float));
    if (half)
        for (size_t i = 0; i < m->n_floats; i++) half[i] = float_to_bf16(host[i]);
    struct olmo_st_writer w = {0};
    if (!rc) rc = olmo_st_writer_set_metadata(&w, "format", "pt");
    for (int i = 0; i < m->n_tensors && !rc; i++) {
        const struct olmo_param *p = &m->params[i];
        int64_t shape[2] = {p->rows, p->cols};
        const void *data = half ? (const void *)(half + p->offset) : (const void *)(host + p->offset);
        rc = olmo_st_writer_add(&w, p->name, dtype, p->cols == 1 ? 1 : 2, shape, data);
    }
    if (!rc) rc = olmo_st_writer_save(&w, path);
    olmo_st_writer_free(&w);
    free(host);
    free(half);
    return rc;
}
