#include "config/config.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "util/error.h"
#include "util/fs.h"

/* F_ENUM: an enum stored as int, named by a NULL-terminated table */
enum field_type { F_INT, F_LONG, F_U64, F_DOUBLE, F_BOOL, F_STRING, F_SCHEDULE, F_NONFINITE, F_ENUM };

struct field {
    const char *key;
    enum field_type type;
    size_t offset;
    size_t size; /* F_STRING: buffer size */
    const char *const *names; /* F_ENUM: value i's name; NULL-terminated */
    double lo, hi;            /* F_INT, F_LONG, F_DOUBLE: the range (below) */
    int open;                 /* OPEN_LO, OPEN_HI: that end excluded */
};

static const char *const act_ckpt_names[] = {"none", "feed_forward", "block", NULL};
static const char *const saved_acts_names[] = {"exact", "bf16", NULL};
static const char *const sharding_names[] = {"zero1", "fsdp", NULL};
static const char *const optimizer_names[] = {"adamw", "skip_step_adamw", NULL};
static const char *const rope_scaling_names[] = {"none", "yarn", NULL};

/* Each numeric key's range: [lo, hi], an end open where `open` says (OPEN_LO, OPEN_HI); the type's own
 * limits (INT_MAX, LONG_MAX, DBL_MAX) mean "no bound" on that side.  The shapes' 0 is "not set yet"
 * (UNSET_0: the defaults, which olmo_config_validate refuses), and their limits in config.h are checked by
 * olmo_config_check_limits, which names them. */
#define IMAX ((double)INT_MAX)
#define LMAX ((double)LONG_MAX)
#define DMAX DBL_MAX
enum { OPEN_LO = 1, OPEN_HI = 2, UNSET_0 = 4 /* 0 also taken: not set yet */ };
#define F(name, type, lo, hi, open) {#name, type, offsetof(struct olmo_config, name), 0, NULL, lo, hi, open}
#define TX(name, type) F(name, type, 0, 0, 0)
#define TE(name, table) {"train." #name, F_ENUM, offsetof(struct olmo_config, train.name), 0, table, 0, 0, 0}
#define DS(name) \
    {"data." #name, F_STRING, offsetof(struct olmo_config, data.name), sizeof(((struct olmo_config *)0)->data.name), \
     NULL, 0, 0, 0}
static const struct field fields[] = {
    F(model.vocab_size, F_INT, 1, IMAX, UNSET_0),
    F(model.d_model, F_INT, 1, IMAX, UNSET_0),
    F(model.n_layers, F_INT, 1, IMAX, UNSET_0),
    F(model.n_heads, F_INT, 1, IMAX, UNSET_0),
    F(model.n_kv_heads, F_INT, 1, IMAX, UNSET_0),
    F(model.mlp_hidden, F_INT, 1, IMAX, UNSET_0),
    F(model.rope_theta, F_DOUBLE, 0, DMAX, OPEN_LO),
    {"model.rope_scaling", F_ENUM, offsetof(struct olmo_config, model.rope_scaling), 0, rope_scaling_names, 0, 0, 0},
    F(model.rope_factor, F_DOUBLE, 1, DMAX, UNSET_0), /* YaRN's: 0 (a config built in code) refused with yarn */
    F(model.rope_original_max_position_embeddings, F_INT, 1, IMAX, UNSET_0),
    F(model.rope_beta_fast, F_DOUBLE, 0, DMAX, OPEN_LO | UNSET_0),
    F(model.rope_beta_slow, F_DOUBLE, 0, DMAX, OPEN_LO | UNSET_0),
    F(model.rope_attention_factor, F_DOUBLE, 0, DMAX, 0), /* 0: from rope_factor */
    F(model.sliding_window, F_INT, 0, IMAX, 0),
    F(model.full_attention_every, F_INT, 0, IMAX, 0),
    F(model.full_attention_last, F_BOOL, 0, 0, 0),
    /* added to mean(x^2) in fp32: a normal float, and no larger than 1 (1e300 made every output uniform) */
    F(model.rms_norm_eps, F_DOUBLE, FLT_MIN, 1, 0),
    F(model.init_std, F_DOUBLE, 0, DMAX, OPEN_LO),
    F(model.eos_token_id, F_INT, 0, OLMO_MAX_VOCAB_SIZE - 1, 0),
    /* outside the vocabulary: evaluation rows are padded with model.eos_token_id (eval/evaluator.h) */
    F(model.pad_token_id, F_INT, 0, OLMO_MAX_VOCAB_SIZE - 1, 0),
    F(train.seq_len, F_INT, 1, IMAX, UNSET_0),
    F(train.micro_batch, F_INT, 1, IMAX, 0),
    F(train.grad_accum, F_INT, 1, IMAX, 0),
    F(train.steps, F_LONG, 0, LMAX, 0),
    TX(train.seed, F_U64),
    TX(train.intra_doc_masking, F_BOOL),
    F(train.z_loss, F_DOUBLE, 0, DMAX, 0),
    F(train.clip_grad_norm, F_DOUBLE, -DMAX, DMAX, 0), /* <= 0: no clipping */
    F(train.lr, F_DOUBLE, 0, DMAX, OPEN_LO),
    F(train.beta1, F_DOUBLE, 0, 1, OPEN_HI),
    F(train.beta2, F_DOUBLE, 0, 1, OPEN_HI),
    F(train.eps, F_DOUBLE, 0, DMAX, OPEN_LO),
    F(train.weight_decay, F_DOUBLE, 0, DMAX, 0),
    F(train.embedding_weight_decay, F_DOUBLE, 0, DMAX, 0),
    TE(optimizer, optimizer_names),
    F(train.rolling_interval_length, F_INT, 0, 1000000, 0),
    F(train.sigma_factor, F_DOUBLE, 0, DMAX, 0),
    TX(train.step_increment_bugfix, F_BOOL),
    TX(train.optim_init_step, F_BOOL),
    TX(train.schedule, F_SCHEDULE),
    F(train.warmup_steps, F_LONG, 0, LMAX, 0),
    F(train.alpha_f, F_DOUBLE, 0, 1, 0),
    F(train.schedule_steps, F_LONG, 0, LMAX, 0),
    F(train.schedule_tokens, F_LONG, 0, LMAX, 0),
    F(train.decay_steps, F_LONG, 0, LMAX, 0),
    F(train.decay_fraction, F_DOUBLE, 0, 1, 0),
    TX(train.schedule2, F_SCHEDULE),
    F(train.schedule2_after, F_LONG, 0, LMAX, 0),
    F(train.schedule2_warmup_steps, F_LONG, 0, LMAX, 0),
    F(train.schedule2_steps, F_LONG, 0, LMAX, 0),
    F(train.schedule2_tokens, F_LONG, 0, LMAX, 0),
    F(train.log_every, F_INT, 1, IMAX, 0),
    F(train.save_every, F_LONG, 0, LMAX, 0),
    F(train.keep_last, F_INT, 0, IMAX, 0),
    F(train.async_save, F_BOOL, 0, 0, 0),
    F(train.eval_every, F_LONG, 0, LMAX, 0),
    F(train.eval_batches, F_INT, 1, IMAX, 0),
    F(train.peak_flops, F_DOUBLE, 0, DMAX, 0),
    F(train.collective_timeout, F_DOUBLE, 0, DMAX, 0), /* 0: no watchdog */
    TX(train.nonfinite, F_NONFINITE),
    TE(activation_checkpointing, act_ckpt_names),
    F(train.block_every, F_INT, 1, IMAX, 0),
    TE(saved_activations, saved_acts_names),
    TE(sharding, sharding_names),
    F(train.shard_degree, F_INT, 0, IMAX, 0),
    DS(train_path),                DS(mix),
    DS(dtype),                     DS(out_dir),
    DS(order),                     DS(mix_file),
    DS(mix_base_dir),              DS(mix_tokenizer),
    DS(val_paths),                 DS(eval_tasks),
    DS(remote_cache_dir),
    DS(tokenizer),                 DS(eval_tasks_dir),
    F(data.val_documents, F_BOOL, 0, 0, 0),
    F(data.max_target_sequence_length, F_INT, 0, IMAX, 0),
    F(data.val_all_documents, F_BOOL, 0, 0, 0),
};
#undef F
#undef TX
#undef TE
#undef DS

/* by enum olmo_schedule_kind; cos_with_warmup and linear_with_warmup (OLMo-core's names) are accepted too */
static const char *const schedule_names[] = {"cosine", "linear", "constant", "half_cos_with_warmup", "wsd", "none"};
#define N_SCHEDULES (int)(sizeof schedule_names / sizeof schedule_names[0])
static const char *const nonfinite_names[] = {"stop", "skip"};

void olmo_config_defaults(struct olmo_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    /* Architecture constants of Olmo 3 (OLMo-core TransformerConfig.olmo3_7B). */
    cfg->model.rope_theta = 500000.0;
    cfg->model.rope_factor = 8; /* OLMo-core's YaRNRoPEScalingConfig defaults (used with rope_scaling: yarn) */
    cfg->model.rope_original_max_position_embeddings = 8192;
    cfg->model.rope_beta_fast = 32;
    cfg->model.rope_beta_slow = 1;
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
    cfg->train.optimizer = OLMO_OPTIM_ADAMW;
    cfg->train.rolling_interval_length = 128; /* SkipStepAdamWConfig's defaults */
    cfg->train.sigma_factor = 6;
    cfg->train.step_increment_bugfix = true;
    cfg->train.schedule = OLMO_SCHED_COSINE;
    cfg->train.alpha_f = 0.1;
    cfg->train.decay_fraction = 0.1;
    cfg->train.schedule2 = OLMO_SCHED_NONE;
    cfg->train.log_every = 1;
    cfg->train.keep_last = 3;
    cfg->train.eval_batches = 8;
    cfg->train.block_every = 1;
    cfg->train.collective_timeout = 600; /* longer than a 7B checkpoint save, which the other ranks wait for */
    snprintf(cfg->data.out_dir, sizeof cfg->data.out_dir, "runs/default");
    snprintf(cfg->data.dtype, sizeof cfg->data.dtype, "auto");
    snprintf(cfg->data.order, sizeof cfg->data.order, "olmo_core");
}

static void format_field(const struct olmo_config *cfg, const struct field *f, char *buf, size_t n);

static const struct field *find_field(const char *key) {
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (strcmp(fields[i].key, key) == 0) return &fields[i];
    return NULL;
}

/* Levenshtein distance of two short strings (keys; longer ones count as far apart). */
static size_t edit_distance(const char *a, const char *b) {
    const size_t na = strlen(a), nb = strlen(b);
    if (na > 255 || nb > 255) return SIZE_MAX;
    size_t row[256];
    for (size_t j = 0; j <= nb; j++) row[j] = j;
    for (size_t i = 1; i <= na; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            const size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[nb];
}

/* " (did you mean 'KEY'?)" for the known key closest to an unknown one, or "" when none is close: within a
 * third of its length in edits, or the same name in another section (model.lr -> train.lr). */
static void suggest_key(const char *key, char *out, size_t n) {
    const char *dot = strchr(key, '.'), *name = dot ? dot + 1 : key;
    const char *best = NULL;
    size_t best_d = SIZE_MAX;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const char *fname = strchr(fields[i].key, '.') + 1;
        size_t d = !strcmp(name, fname) ? 1 : edit_distance(key, fields[i].key);
        if (!dot) { /* no section given: compare the names */
            const size_t dn = edit_distance(name, fname);
            if (dn != SIZE_MAX && dn + 1 < d) d = dn + 1;
        }
        if (d < best_d) best_d = d, best = fields[i].key;
    }
    const size_t len = strlen(key);
    if (best && (best_d <= 2 || best_d * 3 <= len)) snprintf(out, n, " (did you mean '%s'?)", best);
    else if (n) out[0] = 0;
}

/* Decimal text as YAML and C write numbers: [+-]digits[.digits][e[+-]digits] (integers: no fraction or
 * exponent).  strtod and strtoull take more: leading blanks, hexadecimal (0x10 read as 16), inf, nan, and
 * strtoull a minus sign (-1 read as 2^64-1). */
static bool is_decimal(const char *s, bool integer) {
    const char *p = s;
    if (*p == '+' || *p == '-') p++;
    const char *digits = p;
    while (*p >= '0' && *p <= '9') p++;
    bool any = p > digits;
    if (!integer && *p == '.') {
        const char *frac = ++p;
        while (*p >= '0' && *p <= '9') p++;
        any |= p > frac;
    }
    if (!any) return false;
    if (!integer && (*p == 'e' || *p == 'E')) {
        p++;
        if (*p == '+' || *p == '-') p++;
        const char *exp = p;
        while (*p >= '0' && *p <= '9') p++;
        if (p == exp) return false;
    }
    return *p == 0;
}

/* A bound as text: integers whole, doubles in the fewest digits that read back. */
static void format_bound(double v, enum field_type type, char *buf, size_t n) {
    if (type == F_LONG && v >= LMAX) { /* LONG_MAX rounds up to 2^63 as a double */
        snprintf(buf, n, "%ld", LONG_MAX);
        return;
    }
    if (type != F_DOUBLE) {
        snprintf(buf, n, "%.0f", v);
        return;
    }
    for (int digits = 6; digits <= 17; digits++) {
        snprintf(buf, n, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) return;
    }
}

/* The field's range refusal: "KEY must be in [lo, hi], got VALUE" (or >= lo / <= hi for one-sided ones;
 * both ends for a value beyond what the type holds). */
static int range_error(const struct field *f, const char *value, bool beyond_type) {
    const double type_max = f->type == F_INT ? IMAX : f->type == F_LONG ? LMAX : DMAX;
    const double type_min = f->type == F_INT ? (double)INT_MIN : f->type == F_LONG ? (double)LONG_MIN : -DMAX;
    char lo[40], hi[40];
    format_bound(f->lo, f->type, lo, sizeof lo);
    format_bound(f->hi, f->type, hi, sizeof hi);
    const bool has_lo = f->lo > type_min, has_hi = f->hi < type_max || beyond_type;
    if (has_lo && has_hi)
        return olmo_error("%s must be in %c%s, %s%c, got %s", f->key, f->open & OPEN_LO ? '(' : '[', lo, hi,
                          f->open & OPEN_HI ? ')' : ']', value);
    if (has_lo) return olmo_error("%s must be %s %s, got %s", f->key, f->open & OPEN_LO ? ">" : ">=", lo, value);
    return olmo_error("%s must be %s %s, got %s", f->key, f->open & OPEN_HI ? "<" : "<=", hi, value);
}

static bool in_range(const struct field *f, double v) {
    if (v == 0 && (f->open & UNSET_0)) return true;
    return ((f->open & OPEN_LO) ? v > f->lo : v >= f->lo) && ((f->open & OPEN_HI) ? v < f->hi : v <= f->hi);
}

/* What a number that is not decimal text is told. */
static int not_decimal(const struct field *f, const char *value, const char *what) {
    const char *p = value + (value[0] == '+' || value[0] == '-');
    const bool hex = p[0] == '0' && (p[1] == 'x' || p[1] == 'X');
    return olmo_error("'%s' expects %s, got '%s'%s", f->key, what, value,
                      hex ? " (numbers are read as decimal; hexadecimal is not)" : "");
}

static int parse_value(struct olmo_config *cfg, const struct field *f, const char *value) {
    char *base = (char *)cfg + f->offset;
    char *end = NULL;
    errno = 0;
    switch (f->type) {
    case F_INT:
    case F_LONG: {
        if (!is_decimal(value, true)) return not_decimal(f, value, "an integer");
        long long v = strtoll(value, &end, 10);
        if (errno || (f->type == F_INT && (v < INT_MIN || v > INT_MAX))) return range_error(f, value, true);
        if (!in_range(f, (double)v)) return range_error(f, value, false);
        if (f->type == F_INT) *(int *)base = (int)v;
        else *(long *)base = (long)v;
        return 0;
    }
    case F_U64: {
        if (!is_decimal(value, true) || value[0] == '-')
            return not_decimal(f, value, "a non-negative integer");
        unsigned long long v = strtoull(value, &end, 10);
        if (errno) return olmo_error("%s must be in [0, %llu], got %s", f->key, (unsigned long long)UINT64_MAX, value);
        *(uint64_t *)base = v;
        return 0;
    }
    case F_DOUBLE: {
        if (!is_decimal(value, false)) return not_decimal(f, value, "a number");
        double v = strtod(value, &end);
        /* ERANGE: overflow (inf), or underflow, where a subnormal result is still the number written */
        if (isinf(v) || (errno == ERANGE && fabs(v) >= DBL_MIN))
            return olmo_error("'%s' is out of range: %s (a double ends at %g)", f->key, value, DBL_MAX);
        if (errno == ERANGE && v == 0)
            return olmo_error("'%s' underflows to 0: %s (the smallest positive double is %g)", f->key, value,
                              4.9406564584124654e-324);
        if (!in_range(f, v)) return range_error(f, value, false);
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
        if (!strcmp(value, "cos_with_warmup")) value = "cosine";
        if (!strcmp(value, "linear_with_warmup")) value = "linear";
        for (int i = 0; i < N_SCHEDULES; i++)
            if (!strcmp(value, schedule_names[i])) {
                *(enum olmo_schedule_kind *)base = (enum olmo_schedule_kind)i;
                return 0;
            }
        return olmo_error("'%s' must be one of cosine (cos_with_warmup), linear (linear_with_warmup), constant, "
                          "half_cos_with_warmup, wsd%s; got '%s'",
                          f->key, strcmp(f->key, "train.schedule2") ? "" : ", none", value);
    case F_NONFINITE:
        for (int i = 0; i < 2; i++)
            if (!strcmp(value, nonfinite_names[i])) {
                *(enum olmo_nonfinite_policy *)base = (enum olmo_nonfinite_policy)i;
                return 0;
            }
        return olmo_error("'%s' must be stop or skip; got '%s'", f->key, value);
    case F_ENUM: {
        _Static_assert(sizeof(enum olmo_act_ckpt) == sizeof(int) && sizeof(enum olmo_sharding) == sizeof(int) &&
                           sizeof(enum olmo_optimizer_kind) == sizeof(int) &&
                           sizeof(enum olmo_rope_scaling) == sizeof(int),
                       "F_ENUM stores an int");
        char list[256] = "";
        for (int i = 0; f->names[i]; i++) {
            if (!strcmp(value, f->names[i])) {
                *(int *)base = i;
                return 0;
            }
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", f->names[i]);
        }
        return olmo_error("'%s' must be one of %s; got '%s'", f->key, list, value);
    }
    }
    return olmo_error("internal: bad field type");
}

static int set_key(struct olmo_config *cfg, const char *key, const char *value) {
    const struct field *f = find_field(key);
    if (!f) {
        char hint[300];
        suggest_key(key, hint, sizeof hint);
        return olmo_error("unknown key '%s'%s", key, hint);
    }
    if (f->type == F_STRING) return parse_value(cfg, f, value);
    /* blanks around a number or a name (--set 'train.seed= -1'), as YAML drops them around a plain scalar */
    while (*value == ' ' || *value == '\t') value++;
    char trimmed[128];
    size_t len = strlen(value);
    while (len && (value[len - 1] == ' ' || value[len - 1] == '\t')) len--;
    if (len >= sizeof trimmed) return olmo_error("'%s' does not take a value of %zu characters", key, len);
    memcpy(trimmed, value, len);
    trimmed[len] = 0;
    return parse_value(cfg, f, trimmed);
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

enum { N_FIELDS = sizeof fields / sizeof fields[0], N_SECTIONS = 3 };
static const char *const section_names[N_SECTIONS] = {"model", "train", "data"};

/* Where the YAML walk is; each section and key may appear once (YAML says
 * mapping keys are unique; libyaml leaves that check to the application). */
struct load_state {
    const char *path;
    char section[128], key[128];
    int depth; /* mapping depth */
    bool expect_key;
    int documents;
    size_t section_line[N_SECTIONS], field_line[N_FIELDS]; /* where each was set; 0 = not yet */
    size_t key_line;
};

static int on_section(struct load_state *ls, const char *text, size_t line) {
    snprintf(ls->section, sizeof ls->section, "%s", text);
    ls->expect_key = false;
    for (int i = 0; i < N_SECTIONS; i++) {
        if (strcmp(text, section_names[i])) continue;
        if (ls->section_line[i])
            return olmo_error("%s:%zu: section '%s' appears twice (first at line %zu)", ls->path, line, text,
                              ls->section_line[i]);
        ls->section_line[i] = line;
        return 0;
    }
    const char *near = NULL;
    for (int i = 0; i < N_SECTIONS; i++)
        if (edit_distance(text, section_names[i]) <= 2) near = section_names[i];
    if (near) return olmo_error("%s:%zu: unknown section '%s' (did you mean '%s'?)", ls->path, line, text, near);
    return olmo_error("%s:%zu: unknown section '%s' (expected model, train or data)", ls->path, line, text);
}

static int on_value(struct olmo_config *cfg, struct load_state *ls, const char *text, size_t line) {
    char full[300];
    snprintf(full, sizeof full, "%s.%s", ls->section, ls->key);
    ls->expect_key = true;
    const struct field *f = find_field(full);
    if (!f) {
        char hint[300];
        suggest_key(full, hint, sizeof hint);
        return olmo_error("%s:%zu: unknown key '%s'%s", ls->path, ls->key_line, full, hint);
    }
    size_t *seen = &ls->field_line[f - fields];
    if (*seen)
        return olmo_error("%s:%zu: key '%s' appears twice (first at line %zu)", ls->path, ls->key_line, full, *seen);
    *seen = ls->key_line;
    if (parse_value(cfg, f, text)) return olmo_error_context("%s:%zu", ls->path, line);
    return 0;
}

static int on_scalar(struct olmo_config *cfg, struct load_state *ls, const yaml_event_t *ev, size_t line) {
    const char *text = (const char *)ev->data.scalar.value;
    if (ls->depth == 1 && ls->expect_key) return on_section(ls, text, line);
    if (ls->depth == 1) return olmo_error("%s:%zu: section '%s' must be a mapping of keys", ls->path, line, ls->section);
    if (ls->depth == 2 && ls->expect_key) {
        snprintf(ls->key, sizeof ls->key, "%s", text);
        ls->key_line = line;
        ls->expect_key = false;
        return 0;
    }
    if (ls->depth == 2) return on_value(cfg, ls, text, line);
    if (!text[0] || !strcmp(text, "~") || !strcmp(text, "null"))
        return olmo_error("config '%s' is empty (expected model, train and data sections)", ls->path);
    return olmo_error("%s:%zu: expected a mapping of sections", ls->path, line);
}

/* One event of the two-level mapping (section -> key -> scalar). */
static int on_event(struct olmo_config *cfg, struct load_state *ls, const yaml_event_t *ev) {
    size_t line = ev->start_mark.line + 1;
    switch (ev->type) {
    case YAML_DOCUMENT_START_EVENT:
        if (++ls->documents > 1)
            return olmo_error("%s:%zu: a second YAML document; a config is a single document", ls->path, line);
        return 0;
    case YAML_MAPPING_START_EVENT:
        if (ls->depth == 0) {
            ls->depth = 1;
        } else if (ls->depth == 1 && !ls->expect_key) {
            ls->depth = 2;
            ls->expect_key = true;
        } else {
            return olmo_error("%s:%zu: nesting deeper than section.key is not supported", ls->path, line);
        }
        return 0;
    case YAML_MAPPING_END_EVENT:
        ls->depth--;
        ls->expect_key = true;
        return 0;
    case YAML_SEQUENCE_START_EVENT:
        return olmo_error("%s:%zu: a list is not valid here (key '%s%s%s')", ls->path, line, ls->section,
                          ls->depth == 2 ? "." : "", ls->depth == 2 ? ls->key : "");
    case YAML_ALIAS_EVENT: return olmo_error("%s:%zu: YAML aliases are not supported", ls->path, line);
    case YAML_SCALAR_EVENT: return on_scalar(cfg, ls, ev, line);
    default: return 0;
    }
}

static int load_events(struct olmo_config *cfg, yaml_parser_t *parser, const char *path) {
    struct load_state ls = {.path = path, .expect_key = true};
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(parser, &ev))
            return olmo_error("%s:%zu: YAML error: %s", path, parser->problem_mark.line + 1,
                              parser->problem ? parser->problem : "unknown");
        bool end = ev.type == YAML_STREAM_END_EVENT;
        int rc = end ? 0 : on_event(cfg, &ls, &ev);
        yaml_event_delete(&ev);
        if (rc) return rc;
        if (!end) continue;
        bool any = false;
        for (int i = 0; i < N_SECTIONS; i++) any |= ls.section_line[i] != 0;
        if (!any) return olmo_error("config '%s' is empty (expected model, train and data sections)", path);
        /* a relative path in the file is relative to the file's directory (config/paths.c) */
        char dir[4096];
        const char *slash = strrchr(path, '/');
        if (!slash) return 0;
        snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
        for (size_t i = 0; i < N_FIELDS; i++)
            if (ls.field_line[i] && olmo_config_rebase_path(cfg, fields[i].key, dir))
                return olmo_error_context("%s:%zu", path, ls.field_line[i]);
        return 0;
    }
}

int olmo_config_load(struct olmo_config *cfg, const char *path) {
    size_t size;
    int fd = olmo_open_regular(path, "config", &size);
    if (fd < 0) return -1;
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        close(fd);
        return olmo_error("cannot open config '%s': %s", path, strerror(errno));
    }
    yaml_parser_t parser;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, fp);
    int rc = load_events(cfg, &parser, path);
    yaml_parser_delete(&parser);
    fclose(fp);
    return rc;
}

int olmo_config_check_ranges(const struct olmo_config *cfg) {
    for (size_t i = 0; i < N_FIELDS; i++) {
        const struct field *f = &fields[i];
        const char *base = (const char *)cfg + f->offset;
        double v;
        if (f->type == F_INT) v = *(const int *)base;
        else if (f->type == F_LONG) v = (double)*(const long *)base;
        else if (f->type == F_DOUBLE) v = *(const double *)base;
        else continue;
        if (!in_range(f, v)) {
            char text[64];
            format_field(cfg, f, text, sizeof text);
            return range_error(f, text, false);
        }
    }
    return 0;
}

/* The shortest decimal that reads back as v (3e-4, not 0.00029999999999999997): as the user wrote it. */
static void shortest_double(char *buf, size_t n, double v) {
    if (v == floor(v) && fabs(v) < 1e15) { /* 500000, not 5e+05 */
        snprintf(buf, n, "%.0f", v);
        return;
    }
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(buf, n, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) return;
    }
}

static void format_field(const struct olmo_config *cfg, const struct field *f, char *buf, size_t n) {
    const char *base = (const char *)cfg + f->offset;
    switch (f->type) {
    case F_INT: snprintf(buf, n, "%d", *(const int *)base); break;
    case F_LONG: snprintf(buf, n, "%ld", *(const long *)base); break;
    case F_U64: snprintf(buf, n, "%llu", (unsigned long long)*(const uint64_t *)base); break;
    case F_DOUBLE: shortest_double(buf, n, *(const double *)base); break;
    case F_BOOL: snprintf(buf, n, "%s", *(const bool *)base ? "true" : "false"); break;
    case F_STRING: snprintf(buf, n, "%s", base); break;
    case F_SCHEDULE: snprintf(buf, n, "%s", schedule_names[*(const enum olmo_schedule_kind *)base]); break;
    case F_NONFINITE: snprintf(buf, n, "%s", nonfinite_names[*(const enum olmo_nonfinite_policy *)base]); break;
    case F_ENUM: snprintf(buf, n, "%s", f->names[*(const int *)base]); break;
    }
}

int olmo_config_check_range(const char *key, double value) {
    const struct field *f = find_field(key);
    if (!f || (f->type != F_INT && f->type != F_LONG && f->type != F_DOUBLE))
        return olmo_error("internal: '%s' is not a numeric key", key);
    if (in_range(f, value)) return 0;
    char text[64];
    format_bound(value, F_DOUBLE, text, sizeof text);
    return range_error(f, text, false);
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

static bool emit_scalar(yaml_emitter_t *e, const char *text, yaml_scalar_style_t style) {
    yaml_event_t ev;
    return yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)text, (int)strlen(text), 1, 1, style) &&
           yaml_emitter_emit(e, &ev);
}

static bool emit_event(yaml_emitter_t *e, int which) {
    yaml_event_t ev;
    bool ok = false;
    switch (which) {
    case YAML_STREAM_START_EVENT: ok = yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING); break;
    case YAML_STREAM_END_EVENT: ok = yaml_stream_end_event_initialize(&ev); break;
    case YAML_DOCUMENT_START_EVENT: ok = yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1); break;
    case YAML_DOCUMENT_END_EVENT: ok = yaml_document_end_event_initialize(&ev, 1); break;
    case YAML_MAPPING_START_EVENT:
        ok = yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_MAPPING_STYLE);
        break;
    case YAML_MAPPING_END_EVENT: ok = yaml_mapping_end_event_initialize(&ev); break;
    default: break;
    }
    return ok && yaml_emitter_emit(e, &ev);
}

/* Every field, section by section; strings double-quoted with YAML's escapes
 * (libyaml's emitter), so any path reads back as written. */
static bool emit_config(yaml_emitter_t *e, const struct olmo_config *cfg, const char **bad_key) {
    if (!emit_event(e, YAML_STREAM_START_EVENT) || !emit_event(e, YAML_DOCUMENT_START_EVENT) ||
        !emit_event(e, YAML_MAPPING_START_EVENT))
        return false;
    const char *section = NULL;
    for (size_t i = 0; i < N_FIELDS; i++) {
        const struct field *f = &fields[i];
        const char *dot = strchr(f->key, '.');
        if (!section || strncmp(section, f->key, (size_t)(dot - f->key) + 1)) {
            char name[32];
            snprintf(name, sizeof name, "%.*s", (int)(dot - f->key), f->key);
            if ((section && !emit_event(e, YAML_MAPPING_END_EVENT)) || !emit_scalar(e, name, YAML_PLAIN_SCALAR_STYLE) ||
                !emit_event(e, YAML_MAPPING_START_EVENT))
                return false;
            section = f->key;
        }
        char value[16400];
        format_field(cfg, f, value, sizeof value);
        *bad_key = f->key; /* e.g. a path that is not UTF-8 (YAML text is Unicode) */
        if (!emit_scalar(e, dot + 1, YAML_PLAIN_SCALAR_STYLE) ||
            !emit_scalar(e, value, f->type == F_STRING ? YAML_DOUBLE_QUOTED_SCALAR_STYLE : YAML_PLAIN_SCALAR_STYLE))
            return false;
        *bad_key = NULL;
    }
    return emit_event(e, YAML_MAPPING_END_EVENT) && emit_event(e, YAML_MAPPING_END_EVENT) &&
           emit_event(e, YAML_DOCUMENT_END_EVENT) && emit_event(e, YAML_STREAM_END_EVENT) && yaml_emitter_flush(e);
}

/* Emits the config to fp; name is the file for messages.  Does not close fp. */
static int emit_to(const struct olmo_config *cfg, FILE *fp, const char *name) {
    yaml_emitter_t e;
    if (!yaml_emitter_initialize(&e)) return olmo_error("out of memory writing '%s'", name);
    yaml_emitter_set_output_file(&e, fp);
    yaml_emitter_set_unicode(&e, 1); /* UTF-8 as is; only non-printable characters escaped */
    yaml_emitter_set_width(&e, -1);  /* no line folding */
    const char *bad_key = NULL;
    bool ok = emit_config(&e, cfg, &bad_key);
    char problem[300];
    snprintf(problem, sizeof problem, "%s%s%s", e.problem ? e.problem : "cannot emit YAML",
             bad_key ? " in the value of " : "", bad_key ? bad_key : "");
    yaml_emitter_delete(&e);
    if (!ok) return olmo_error("writing '%s' failed: %s", name, problem);
    if (fflush(fp) || ferror(fp)) return olmo_error("writing '%s' failed: %s", name, strerror(errno));
    return 0;
}

int olmo_config_write_fp(const struct olmo_config *cfg, FILE *fp) { return emit_to(cfg, fp, "the config"); }

int olmo_config_write(const struct olmo_config *cfg, const char *path) {
    /* with absolute paths: the file is read back from its own directory (config/paths.c) */
    struct olmo_config *abs = malloc(sizeof *abs);
    if (!abs) return olmo_error("out of memory writing '%s'", path);
    *abs = *cfg;
    if (olmo_config_absolute_paths(abs)) {
        free(abs);
        return olmo_error_context("writing '%s'", path);
    }
    /* a FIFO there would block the writer; a device would be written through */
    if (olmo_check_output(path, "config")) {
        free(abs);
        return -1;
    }
    FILE *fp = fopen(path, "w");
    if (!fp) {
        free(abs);
        return olmo_error("cannot write '%s': %s", path, strerror(errno));
    }
    int rc = emit_to(abs, fp, path);
    free(abs);
    if (fclose(fp) && rc == 0) rc = olmo_error("writing '%s' failed: %s", path, strerror(errno));
    return rc;
}
