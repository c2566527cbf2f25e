#include "config/config.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "util/error.h"

enum field_type { F_INT, F_LONG, F_U64, F_DOUBLE, F_BOOL, F_STRING, F_SCHEDULE, F_NONFINITE };

struct field {
    const char *key;
    enum field_type type;
    size_t offset;
    size_t size; /* F_STRING: buffer size */
};

#define M(name, type) {"model." #name, type, offsetof(struct olmo_config, model.name), 0}
#define T(name, type) {"train." #name, type, offsetof(struct olmo_config, train.name), 0}
#define DS(name) \
    {"data." #name, F_STRING, offsetof(struct olmo_config, data.name), sizeof(((struct olmo_config *)0)->data.name)}
static const struct field fields[] = {
    M(vocab_size, F_INT),          M(d_model, F_INT),
    M(n_layers, F_INT),            M(n_heads, F_INT),
    M(n_kv_heads, F_INT),          M(mlp_hidden, F_INT),
    M(rope_theta, F_DOUBLE),       M(sliding_window, F_INT),
    M(full_attention_every, F_INT), M(full_attention_last, F_BOOL),
    M(rms_norm_eps, F_DOUBLE),     M(init_std, F_DOUBLE),
    M(eos_token_id, F_INT),        M(pad_token_id, F_INT),
    T(seq_len, F_INT),             T(micro_batch, F_INT),
    T(grad_accum, F_INT),          T(steps, F_LONG),
    T(seed, F_U64),                T(intra_doc_masking, F_BOOL),
    T(z_loss, F_DOUBLE),           T(clip_grad_norm, F_DOUBLE),
    T(lr, F_DOUBLE),               T(beta1, F_DOUBLE),
    T(beta2, F_DOUBLE),            T(eps, F_DOUBLE),
    T(weight_decay, F_DOUBLE),     T(embedding_weight_decay, F_DOUBLE),
    T(schedule, F_SCHEDULE),       T(warmup_steps, F_LONG),
    T(alpha_f, F_DOUBLE),          T(schedule_steps, F_LONG),
    T(log_every, F_INT),
    T(save_every, F_LONG),         T(keep_last, F_INT),
    T(eval_every, F_LONG),         T(eval_batches, F_INT),
    T(peak_flops, F_DOUBLE),       T(nonfinite, F_NONFINITE),
    DS(train_path),                DS(mix),
    DS(dtype),                     DS(out_dir),
    DS(val_paths),                 DS(eval_tasks),
};
#undef M
#undef T
#undef DS

static const char *const schedule_names[] = {"cosine", "linear", "constant"};
static const char *const nonfinite_names[] = {"stop", "skip"};

void olmo_config_defaults(struct olmo_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    /* Architecture constants of Olmo 3 (OLMo-core TransformerConfig.olmo3_7B). */
    cfg->model.rope_theta = 500000.0;
    cfg->model.full_attention_every = 4;
    cfg->model.full_attention_last = true;
    cfg->model.rms_norm_eps = 1e-6;
    cfg->model.init_std = 0.02;
    cfg->model.eos_token_id = 100257;
    cfg->model.pad_token_id = 100277;
    /* Recipe defaults of the Olmo 3 7B Stage 1 script. */
    cfg->train.micro_batch = 1;
    cfg->train.grad_accum = 1;
    cfg->train.z_loss = 1e-5;
    cfg->train.clip_grad_norm = 1.0;
    cfg->train.lr = 3e-4;
    cfg->train.beta1 = 0.9;
    cfg->train.beta2 = 0.95;
    cfg->train.eps = 1e-8;
    cfg->train.weight_decay = 0.1;
    cfg->train.embedding_weight_decay = 0.0;
    cfg->train.schedule = SCHED_COSINE;
    cfg->train.alpha_f = 0.1;
    cfg->train.log_every = 1;
    cfg->train.keep_last = 3;
    cfg->train.eval_batches = 8;
    snprintf(cfg->data.out_dir, sizeof cfg->data.out_dir, "runs/default");
    snprintf(cfg->data.dtype, sizeof cfg->data.dtype, "auto");
}

static const struct field *find_field(const char *key) {
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (strcmp(fields[i].key, key) == 0) return &fields[i];
    return NULL;
}

static int parse_value(struct olmo_config *cfg, const struct field *f, const char *value) {
    char *base = (char *)cfg + f->offset;
    char *end = NULL;
    errno = 0;
    switch (f->type) {
    case F_INT:
    case F_LONG: {
        long long v = strtoll(value, &end, 10);
        if (end == value || *end || errno) return olmo_error("'%s' expects an integer, got '%s'", f->key, value);
        if (f->type == F_INT) {
            if (v < INT_MIN || v > INT_MAX) return olmo_error("'%s' is out of range: %s", f->key, value);
            *(int *)base = (int)v;
        } else {
            *(long *)base = (long)v;
        }
        return 0;
    }
    case F_U64: {
        if (value[0] == '-') return olmo_error("'%s' expects a non-negative integer, got '%s'", f->key, value);
        unsigned long long v = strtoull(value, &end, 10);
        if (end == value || *end || errno) return olmo_error("'%s' expects an integer, got '%s'", f->key, value);
        *(uint64_t *)base = v;
        return 0;
    }
    case F_DOUBLE: {
        double v = strtod(value, &end);
        if (end == value || *end || errno || !isfinite(v))
            return olmo_error("'%s' expects a number, got '%s'", f->key, value);
        *(double *)base = v;
        return 0;
    }
    case F_BOOL:
        if (!strcmp(value, "true")) *(bool *)base = true;
        else if (!strcmp(value, "false")) *(bool *)base = false;
        else return olmo_error("'%s' expects true or false, got '%s'", f->key, value);
        return 0;
    case F_STRING:
        if (strlen(value) >= f->size)
            return olmo_error("'%s' is longer than %zu characters", f->key, f->size - 1);
        strcpy(base, value);
        return 0;
    case F_SCHEDULE:
        for (int i = 0; i < 3; i++)
            if (!strcmp(value, schedule_names[i])) {
                *(enum olmo_schedule_kind *)base = (enum olmo_schedule_kind)i;
                return 0;
            }
        return olmo_error("'%s' must be one of cosine, linear, constant; got '%s'", f->key, value);
    case F_NONFINITE:
        for (int i = 0; i < 2; i++)
            if (!strcmp(value, nonfinite_names[i])) {
                *(enum olmo_nonfinite_policy *)base = (enum olmo_nonfinite_policy)i;
                return 0;
            }
        return olmo_error("'%s' must be stop or skip; got '%s'", f->key, value);
    }
    return olmo_error("internal: bad field type");
}

static int set_key(struct olmo_config *cfg, const char *key, const char *value) {
    const struct field *f = find_field(key);
    if (!f) return olmo_error("unknown key '%s'", key);
    return parse_value(cfg, f, value);
}

int olmo_config_set(struct olmo_config *cfg, const char *assignment) {
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment) return olmo_error("--set expects section.key=value, got '%s'", assignment);
    char key[256];
    size_t len = (size_t)(eq - assignment);
    if (len >= sizeof key) return olmo_error("--set key too long: '%s'", assignment);
    memcpy(key, assignment, len);
    key[len] = 0;
    if (set_key(cfg, key, eq + 1)) return olmo_error_context("--set %s", assignment);
    return 0;
}

/* Walks a two-level mapping (section -> key -> scalar). */
static int load_events(struct olmo_config *cfg, yaml_parser_t *parser, const char *path) {
    char section[128] = "", key[128] = "";
    int depth = 0; /* mapping depth */
    bool expect_key = true;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(parser, &ev))
            return olmo_error("%s:%zu: YAML error: %s", path, parser->problem_mark.line + 1,
                              parser->problem ? parser->problem : "unknown");
        size_t line = ev.start_mark.line + 1;
        int rc = 0;
        switch (ev.type) {
        case YAML_STREAM_END_EVENT:
            yaml_event_delete(&ev);
            return 0;
        case YAML_MAPPING_START_EVENT:
            if (depth == 0) {
                depth = 1;
            } else if (depth == 1 && !expect_key) {
                depth = 2;
                expect_key = true;
            } else {
                rc = olmo_error("%s:%zu: nesting deeper than section.key is not supported", path, line);
            }
            break;
        case YAML_MAPPING_END_EVENT:
            depth--;
            expect_key = true;
            break;
        case YAML_SEQUENCE_START_EVENT:
            rc = olmo_error("%s:%zu: a list is not valid here (key '%s%s%s')", path, line, section,
                            depth == 2 ? "." : "", depth == 2 ? key : "");
            break;
        case YAML_ALIAS_EVENT:
            rc = olmo_error("%s:%zu: YAML aliases are not supported", path, line);
            break;
        case YAML_SCALAR_EVENT: {
            const char *text = (const char *)ev.data.scalar.value;
            if (depth == 1 && expect_key) {
                snprintf(section, sizeof section, "%s", text);
                if (strcmp(section, "model") && strcmp(section, "train") && strcmp(section, "data"))
                    rc = olmo_error("%s:%zu: unknown section '%s' (expected model, train or data)", path, line,
                                    section);
                expect_key = false;
            } else if (depth == 1) {
                rc = olmo_error("%s:%zu: section '%s' must be a mapping of keys", path, line, section);
            } else if (depth == 2 && expect_key) {
                snprintf(key, sizeof key, "%s", text);
                expect_key = false;
            } else if (depth == 2) {
                char full[300];
                snprintf(full, sizeof full, "%s.%s", section, key);
                if (set_key(cfg, full, text)) rc = olmo_error_context("%s:%zu", path, line);
                expect_key = true;
            } else {
                rc = olmo_error("%s:%zu: expected a mapping of sections", path, line);
            }
            break;
        }
        default:
            break;
        }
        yaml_event_delete(&ev);
        if (rc) return rc;
    }
}

int olmo_config_load(struct olmo_config *cfg, const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return olmo_error("cannot open config '%s': %s", path, strerror(errno));
    yaml_parser_t parser;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, fp);
    int rc = load_events(cfg, &parser, path);
    yaml_parser_delete(&parser);
    fclose(fp);
    return rc;
}

bool olmo_layer_is_full_attention(const struct olmo_model_config *m, int layer) {
    if (m->full_attention_last && layer == m->n_layers - 1) return true;
    return m->full_attention_every > 0 && (layer + 1) % m->full_attention_every == 0;
}

int olmo_config_validate(const struct olmo_config *cfg) {
    const struct olmo_model_config *m = &cfg->model;
    const struct olmo_train_config *t = &cfg->train;
#define POSITIVE(v, name) \
    if ((v) <= 0) return olmo_error("%s must be positive (got %g)", name, (double)(v))
    POSITIVE(m->vocab_size, "model.vocab_size");
    POSITIVE(m->d_model, "model.d_model");
    POSITIVE(m->n_layers, "model.n_layers");
    POSITIVE(m->n_heads, "model.n_heads");
    POSITIVE(m->n_kv_heads, "model.n_kv_heads");
    POSITIVE(m->mlp_hidden, "model.mlp_hidden");
    POSITIVE(m->rope_theta, "model.rope_theta");
    POSITIVE(m->rms_norm_eps, "model.rms_norm_eps");
    POSITIVE(m->init_std, "model.init_std");
    POSITIVE(t->seq_len, "train.seq_len");
    POSITIVE(t->micro_batch, "train.micro_batch");
    POSITIVE(t->grad_accum, "train.grad_accum");
    POSITIVE(t->log_every, "train.log_every");
    POSITIVE(t->lr, "train.lr");
#undef POSITIVE
    if (m->d_model % m->n_heads)
        return olmo_error("model.d_model (%d) must be divisible by model.n_heads (%d)", m->d_model, m->n_heads);
    if ((m->d_model / m->n_heads) % 2)
        return olmo_error("head dim d_model/n_heads = %d must be even for RoPE", m->d_model / m->n_heads);
    if (m->n_heads % m->n_kv_heads)
        return olmo_error("model.n_heads (%d) must be a multiple of model.n_kv_heads (%d)", m->n_heads,
                          m->n_kv_heads);
    if (m->sliding_window < 0) return olmo_error("model.sliding_window must be >= 0 (0 = full attention)");
    if (m->full_attention_every < 0) return olmo_error("model.full_attention_every must be >= 0");
    if (m->eos_token_id < 0 || m->eos_token_id >= m->vocab_size)
        return olmo_error("model.eos_token_id %d is outside the vocabulary [0, %d)", m->eos_token_id,
                          m->vocab_size);
    if (t->steps < 0 || t->warmup_steps < 0 || t->schedule_steps < 0)
        return olmo_error("train.steps, train.warmup_steps and train.schedule_steps must be >= 0");
    if (t->beta1 < 0 || t->beta1 >= 1 || t->beta2 < 0 || t->beta2 >= 1)
        return olmo_error("train.beta1 and train.beta2 must be in [0, 1)");
    if (t->eps <= 0) return olmo_error("train.eps must be positive");
    if (t->alpha_f < 0 || t->alpha_f > 1) return olmo_error("train.alpha_f must be in [0, 1]");
    if (t->z_loss < 0 || t->weight_decay < 0 || t->embedding_weight_decay < 0)
        return olmo_error("train.z_loss and weight decays must be >= 0");
    if (t->save_every < 0) return olmo_error("train.save_every must be >= 0 (0 = no checkpoints)");
    if (t->keep_last < 0) return olmo_error("train.keep_last must be >= 0 (0 = keep every checkpoint)");
    if (t->eval_every < 0) return olmo_error("train.eval_every must be >= 0 (0 = no evaluation)");
    if (t->eval_batches <= 0) return olmo_error("train.eval_batches must be positive");
    if (t->peak_flops < 0) return olmo_error("train.peak_flops must be >= 0 (0 = measure at startup)");
    if (strcmp(cfg->data.dtype, "auto") && strcmp(cfg->data.dtype, "uint16") && strcmp(cfg->data.dtype, "uint32"))
        return olmo_error("data.dtype must be auto, uint16 or uint32; got '%s'", cfg->data.dtype);
    if (cfg->data.mix[0] && cfg->data.train_path[0])
        return olmo_error("set either data.train_path or data.mix, not both");
    return 0;
}

static void format_field(const struct olmo_config *cfg, const struct field *f, char *buf, size_t n) {
    const char *base = (const char *)cfg + f->offset;
    switch (f->type) {
    case F_INT: snprintf(buf, n, "%d", *(const int *)base); break;
    case F_LONG: snprintf(buf, n, "%ld", *(const long *)base); break;
    case F_U64: snprintf(buf, n, "%llu", (unsigned long long)*(const uint64_t *)base); break;
    case F_DOUBLE: snprintf(buf, n, "%.17g", *(const double *)base); break;
    case F_BOOL: snprintf(buf, n, "%s", *(const bool *)base ? "true" : "false"); break;
    case F_STRING: snprintf(buf, n, "%s", base); break;
    case F_SCHEDULE: snprintf(buf, n, "%s", schedule_names[*(const enum olmo_schedule_kind *)base]); break;
    case F_NONFINITE: snprintf(buf, n, "%s", nonfinite_names[*(const enum olmo_nonfinite_policy *)base]); break;
    }
}

const char *olmo_config_key(int index) {
    if (index < 0 || (size_t)index >= sizeof fields / sizeof fields[0]) return NULL;
    return fields[index].key;
}

int olmo_config_format(const struct olmo_config *cfg, const char *key, char *buf, size_t n) {
    const struct field *f = find_field(key);
    if (!f) return olmo_error("unknown key '%s'", key);
    format_field(cfg, f, buf, n);
    return 0;
}

int olmo_config_write(const struct olmo_config *cfg, const char *path) {
    FILE *fp = fopen(path, "w");
    if (!fp) return olmo_error("cannot write '%s': %s", path, strerror(errno));
    const char *section = "";
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const struct field *f = &fields[i];
        const char *dot = strchr(f->key, '.');
        if (strncmp(section, f->key, (size_t)(dot - f->key) + 1)) {
            fprintf(fp, "%.*s:\n", (int)(dot - f->key), f->key);
            section = f->key;
        }
        char value[1100];
        format_field(cfg, f, value, sizeof value);
        fprintf(fp, f->type == F_STRING ? "  %s: \"%s\"\n" : "  %s: %s\n", dot + 1, value);
    }
    if (fclose(fp)) return olmo_error("writing '%s' failed: %s", path, strerror(errno));
    return 0;
}
