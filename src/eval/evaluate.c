#include "eval/evaluate.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/np_random.h"
#include "eval/olmo_tasks.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/json.h"

/* basename without directory and without the given extension */
static void short_name(const char *path, const char *ext, char *out, size_t n) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t len = strlen(base), el = strlen(ext);
    if (len > el && !strcmp(base + len - el, ext)) len -= el;
    snprintf(out, n, "%.*s", (int)len, base);
}

/* Splits a comma-separated list into a malloc'ed array of trimmed items. */
static int split_list(const char *list, char ***items, int *n) {
    *items = NULL;
    *n = 0;
    int cap = 0;
    const char *p = list;
    while (*p) {
        const char *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        const char *a = p, *b = end;
        while (a < b && (*a == ' ' || *a == '\t')) a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t')) b--;
        if (b > a) {
            if (*n == cap) {
                cap = cap ? 2 * cap : 8;
                char **q = realloc(*items, sizeof(char *) * (size_t)cap);
                if (!q) return olmo_error("out of memory");
                *items = q;
            }
            char *s = malloc((size_t)(b - a) + 1);
            if (!s) return olmo_error("out of memory");
            memcpy(s, a, (size_t)(b - a));
            s[b - a] = 0;
            (*items)[(*n)++] = s;
        }
        p = *end ? end + 1 : end;
    }
    return 0;
}

static void free_list(char **items, int n) {
    for (int i = 0; i < n; i++) free(items[i]);
    free(items);
}

int olmo_val_sets_open(const char *paths, int seq_len, enum olmo_dtype dtype, struct olmo_val_set **sets, int *n) {
    char **items;
    int count;
    *sets = NULL;
    *n = 0;
    if (split_list(paths, &items, &count)) return -1;
    if (!count) {
        free(items);
        return 0;
    }
    struct olmo_val_set *s = olmo_calloc((size_t)count, sizeof *s, "validation sets");
    int rc = s ? 0 : -1;
    int opened = 0;
    for (int i = 0; i < count && !rc; i++) {
        const char *path = items[i], *eq = strchr(items[i], '=');
        if (eq && eq > items[i] && !memchr(items[i], '/', (size_t)(eq - items[i]))) { /* LABEL=PATH */
            snprintf(s[i].name, sizeof s[i].name, "%.*s", (int)(eq - items[i]), items[i]);
            path = eq + 1;
            if (!*path) {
                rc = olmo_error("validation set '%s' has no path after '='", items[i]);
                break;
            }
        } else {
            short_name(items[i], ".npy", s[i].name, sizeof s[i].name);
        }
        if (olmo_token_file_open_ex(&s[i].file, path, dtype)) {
            rc = olmo_error_context("validation set");
            break;
        }
        opened++;
        s[i].n_instances = s[i].file.n_tokens / (size_t)seq_len;
        if (!s[i].n_instances)
            rc = olmo_error("validation set '%s' has %zu tokens, fewer than one instance of seq_len %d", path,
                            s[i].file.n_tokens, seq_len);
    }
    free_list(items, count);
    if (rc) {
        olmo_val_sets_close(s, opened);
        return -1;
    }
    *sets = s;
    *n = count;
    return 0;
}

void olmo_val_sets_close(struct olmo_val_set *sets, int n) {
    for (int i = 0; i < n; i++) {
        olmo_token_file_close(&sets[i].file);
        free(sets[i].doc_start);
        free(sets[i].doc_len);
        free(sets[i].read_doc);
        free(sets[i].read_pos);
    }
    free(sets);
}

int olmo_val_set_documents(struct olmo_val_set *s, int eos_id, int seq_len, int vocab_size) {
    if (seq_len < 2) return olmo_error("seq_len must be at least 2 to evaluate a loss");
    const size_t chunk = (size_t)1 << 20, N = s->file.n_tokens;
    int32_t *buf = olmo_malloc(sizeof(int32_t) * chunk, "document scan");
    size_t cap = 0, nd = 0, start = 0;
    size_t *ds = NULL;
    int *dl = NULL;
    int rc = buf ? 0 : -1;
    for (size_t off = 0; off < N && !rc; off += chunk) {
        const size_t n = N - off < chunk ? N - off : chunk;
        if ((rc = olmo_token_file_read(&s->file, off, n, vocab_size, buf))) break;
        for (size_t i = 0; i < n; i++) {
            if (buf[i] != eos_id) continue;
            const size_t end = off + i + 1; /* the EOS closes its document */
            if (nd == cap) {
                cap = cap ? 2 * cap : 1024;
                size_t *a = realloc(ds, sizeof *a * cap);
                if (a) ds = a;
                int *b = a ? realloc(dl, sizeof *b * cap) : NULL;
                if (b) dl = b;
                if (!a || !b) {
                    rc = olmo_error("out of memory for the documents of '%s'", s->file.path);
                    break;
                }
            }
            ds[nd] = start;
            dl[nd++] = end - start < (size_t)seq_len ? (int)(end - start) : seq_len;
            start = end;
        }
    }
    free(buf);
    if (!rc && !nd) rc = olmo_error("validation set '%s' has no document (no EOS id %d)", s->file.path, eos_id);
    if (rc) {
        free(ds);
        free(dl);
        return olmo_error_context("validation set '%s'", s->name);
    }
    free(s->doc_start);
    free(s->doc_len);
    s->doc_start = ds;
    s->doc_len = dl;
    s->n_docs = nd;
    return 0;
}

int olmo_val_sets_order(struct olmo_val_set *sets, int n, size_t batch_docs) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += sets[i].n_docs;
    if (!batch_docs) return olmo_error("the evaluator's global batch holds no document");
    if (total > UINT32_MAX)
        return olmo_error("the validation sets hold %zu documents, more than OLMo-core's uint32 instance indices",
                          total);
    if (total < batch_docs)
        return olmo_error("the validation sets hold %zu documents, fewer than one global evaluation batch of %zu "
                          "(train.micro_batch x ranks) that OLMo-core's LM evaluator reads; evaluate every "
                          "document instead (olmoc eval --val-all-documents, data.val_all_documents: true)",
                          total, batch_docs);
    const size_t kept = total / batch_docs * batch_docs;
    uint32_t *perm = olmo_malloc(sizeof(uint32_t) * total, "evaluation order");
    if (!perm) return -1;
    for (size_t k = 0; k < total; k++) perm[k] = (uint32_t)k;
    olmo_np_shuffle_u32(0 + 1, perm, total); /* NumpyFSLDataLoader: get_rng(seed 0 + epoch 1) */
    int rc = 0;
    size_t first = 0; /* the set's first index in the dataset */
    for (int i = 0; i < n && !rc; i++) {
        struct olmo_val_set *s = &sets[i];
        free(s->read_doc);
        free(s->read_pos);
        s->read_doc = s->read_pos = NULL;
        s->n_read = 0;
        for (size_t p = 0; p < kept; p++) s->n_read += perm[p] >= first && perm[p] - first < s->n_docs;
        if (!s->n_read) {
            rc = olmo_error("validation set '%s': none of its %zu documents is in the %zu global batches of %zu "
                            "documents that OLMo-core's LM evaluator reads from the %zu documents of all sets "
                            "(it would report NaN); evaluate every document instead (olmoc eval "
                            "--val-all-documents, data.val_all_documents: true)",
                            s->name, s->n_docs, kept / batch_docs, batch_docs, total);
            break;
        }
        s->read_doc = olmo_malloc(sizeof(size_t) * s->n_read, "evaluation order");
        s->read_pos = olmo_malloc(sizeof(size_t) * s->n_read, "evaluation order");
        if (!s->read_doc || !s->read_pos) {
            rc = -1;
            break;
        }
        size_t k = 0;
        for (size_t p = 0; p < kept; p++)
            if (perm[p] >= first && perm[p] - first < s->n_docs) {
                s->read_doc[k] = perm[p] - first;
                s->read_pos[k++] = p;
            }
        s->batch_docs = batch_docs;
        first += s->n_docs;
    }
    free(perm);
    return rc;
}

/* One evaluation batch: forward, then its summed cross-entropy (no z-loss) added to *ce. */
static int add_batch_ce(struct olmo_model *m, const int32_t *inputs, const int32_t *targets, bool doc_masking,
                        double *ce) {
    double ce_sum, z_sum;
    int rc = olmo_model_forward(m, inputs, doc_masking);
    if (!rc) rc = olmo_model_loss(m, targets, 0.0f, 0.0f, &ce_sum, &z_sum);
    if (!rc) *ce += ce_sum;
    return rc;
}

int olmo_eval_val_documents(struct olmo_model *m, const struct olmo_val_set *s, int max_batches, int pad_id,
                            const struct olmo_tokenizer *tok, struct olmo_val_result *r,
                            const struct olmo_eval_progress *progress) {
    const int B = m->batch, T = m->seq_len;
    memset(r, 0, sizeof *r);
    if (!s->doc_start) return olmo_error("validation set '%s' is not in documents mode", s->name);
    size_t n_docs = s->n_docs;
    if (s->batch_docs) { /* OLMo-core's order: the documents of the first max_batches global batches */
        n_docs = s->n_read;
        if (max_batches > 0)
            while (n_docs && s->read_pos[n_docs - 1] >= (size_t)max_batches * s->batch_docs) n_docs--;
        if (!n_docs) return 0; /* r->docs 0: OLMo-core would report NaN for the set */
    } else if (max_batches > 0 && n_docs > (size_t)max_batches * (size_t)B) {
        n_docs = (size_t)max_batches * (size_t)B;
    }
    int32_t *inputs = olmo_malloc(sizeof(int32_t) * (size_t)B * T, "eval inputs");
    int32_t *targets = olmo_malloc(sizeof(int32_t) * (size_t)B * T, "eval targets");
    int rc = (!inputs || !targets) ? -1 : 0;
    double ce = 0.0;
    long labels = 0;
    long long bytes = 0;
    for (size_t d0 = 0; d0 < n_docs && !rc; d0 += (size_t)B) {
        for (size_t j = 0; j < (size_t)B * T; j++) inputs[j] = pad_id, targets[j] = -100;
        for (int b = 0; b < B && d0 + (size_t)b < n_docs && !rc; b++) {
            const size_t d = s->batch_docs ? s->read_doc[d0 + (size_t)b] : d0 + (size_t)b;
            const int L = s->doc_len[d];
            int32_t *row = inputs + (size_t)b * T;
            if ((rc = olmo_token_file_read(&s->file, s->doc_start[d], (size_t)L, m->cfg.vocab_size, row))) break;
            for (int t = 0; t + 1 < L; t++) {
                targets[(size_t)b * T + t] = row[t + 1];
                if (tok && !olmo_tokenizer_is_special(tok, (uint32_t)row[t + 1])) {
                    size_t nb = 0;
                    olmo_tokenizer_token_bytes(tok, (uint32_t)row[t + 1], &nb);
                    bytes += (long long)nb;
                }
            }
            labels += L - 1;
        }
        if (rc || (rc = add_batch_ce(m, inputs, targets, false, &ce))) break;
        const size_t done = d0 + (size_t)B < n_docs ? d0 + (size_t)B : n_docs;
        olmo_eval_progress_tick(progress, (long)done, (long)n_docs);
    }
    free(inputs);
    free(targets);
    if (rc) return olmo_error_context("evaluating '%s'", s->file.path);
    if (!labels) return olmo_error("validation set '%s': its documents have no label tokens", s->name);
    /* OLMo-core averages the un-reduced loss over each instance's label_mask, its
     * tokens: the last one, which has no label, adds a loss of 0 and a weight of 1 */
    r->tokens = labels + (long)n_docs;
    r->loss = ce / (double)r->tokens;
    r->ppl = exp(r->loss);
    r->labels = labels;
    r->docs = (long)n_docs;
    r->bytes = tok ? bytes : -1;
    r->bpb = tok && bytes > 0 ? ce / log(2.0) / (double)bytes : -1.0;
    return 0;
}

void olmo_val_metric_name(char *out, size_t n, const char *set, const char *metric) {
    snprintf(out, n, "eval/lm/%s/%s", set, metric);
}

int olmo_eval_val_set(struct olmo_model *m, const struct olmo_val_set *s, int max_batches, bool doc_masking,
                      double *loss, long *n_tokens, const struct olmo_eval_progress *progress) {
    const int B = m->batch, T = m->seq_len;
    size_t batches = s->n_instances / (size_t)B;
    if (batches > (size_t)max_batches) batches = (size_t)max_batches;
    if (!batches)
        return olmo_error("validation set '%s' has %zu instances of %d tokens, fewer than one micro-batch of %d",
                          s->file.path, s->n_instances, T, B);
    if (T < 2) return olmo_error("seq_len must be at least 2 to evaluate a loss");
    int32_t *inputs = olmo_malloc(sizeof(int32_t) * (size_t)B * T, "eval inputs");
    int32_t *targets = olmo_malloc(sizeof(int32_t) * (size_t)B * T, "eval targets");
    int rc = (!inputs || !targets) ? -1 : 0;
    double ce = 0.0;
    long labels = 0;
    for (size_t b = 0; b < batches && !rc; b++) {
        rc = olmo_token_file_read(&s->file, b * (size_t)B * T, (size_t)B * T, m->cfg.vocab_size, inputs);
        if (rc) break;
        for (int r = 0; r < B; r++) {
            for (int t = 0; t < T - 1; t++) targets[r * T + t] = inputs[r * T + t + 1];
            targets[r * T + T - 1] = -100;
            labels += T - 1;
        }
        if ((rc = add_batch_ce(m, inputs, targets, doc_masking, &ce))) break;
        olmo_eval_progress_tick(progress, (long)(b + 1), (long)batches);
    }
    free(inputs);
    free(targets);
    if (rc) return olmo_error_context("evaluating '%s'", s->file.path);
    *loss = ce / (double)labels;
    *n_tokens = labels;
    return 0;
}

/* ---- ranked classification ---- */

static int parse_ids(const cJSON *arr, int vocab, int32_t **out, int *n, const char *what, const char *path,
                     int line) {
    if (!cJSON_IsArray(arr)) return olmo_error("%s:%d: '%s' must be a list of token ids", path, line, what);
    int count = cJSON_GetArraySize(arr);
    if (count <= 0) return olmo_error("%s:%d: '%s' is empty", path, line, what);
    *out = malloc(sizeof(int32_t) * (size_t)count);
    if (!*out) return olmo_error("out of memory");
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) {
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
            v->valuedouble >= vocab)
            return olmo_error("%s:%d: '%s' holds %s, not a token id in [0, %d)", path, line, what,
                              cJSON_IsNumber(v) ? "an out-of-range number" : "a non-number", vocab);
        (*out)[i++] = (int32_t)v->valuedouble;
    }
    *n = count;
    return 0;
}

static void free_example(struct olmo_mc_example *e) {
    free(e->context);
    if (e->choices)
        for (int c = 0; c < e->n_choices; c++) free(e->choices[c]);
    free(e->choices);
    free(e->choice_len);
    memset(e, 0, sizeof *e);
}

static int parse_example(const char *text, int vocab, struct olmo_mc_example *e, const char *path, int line) {
    memset(e, 0, sizeof *e);
    cJSON *root = cJSON_Parse(text);
    int rc = 0;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return olmo_error("%s:%d: not a JSON object", path, line);
    }
    const cJSON *ctx = cJSON_GetObjectItemCaseSensitive(root, "context");
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(root, "choices");
    const cJSON *label = cJSON_GetObjectItemCaseSensitive(root, "label");
    if (!ctx || !choices || !label) {
        rc = olmo_error("%s:%d: an example needs 'context', 'choices' and 'label'", path, line);
        goto done;
    }
    if ((rc = parse_ids(ctx, vocab, &e->context, &e->n_context, "context", path, line))) goto done;
    if (!cJSON_IsArray(choices) || cJSON_GetArraySize(choices) < 2) {
        rc = olmo_error("%s:%d: 'choices' must be a list of at least two token-id lists", path, line);
        goto done;
    }
    e->n_choices = cJSON_GetArraySize(choices);
    e->choices = calloc((size_t)e->n_choices, sizeof *e->choices);
    e->choice_len = calloc((size_t)e->n_choices, sizeof *e->choice_len);
    if (!e->choices || !e->choice_len) {
        rc = olmo_error("out of memory");
        goto done;
    }
    for (int c = 0; c < e->n_choices && !rc; c++)
        rc = parse_ids(cJSON_GetArrayItem(choices, c), vocab, &e->choices[c], &e->choice_len[c], "choices", path,
                       line);
    if (rc) goto done;
    if (!cJSON_IsNumber(label) || label->valuedouble != floor(label->valuedouble) || label->valuedouble < 0 ||
        label->valuedouble >= e->n_choices) {
        rc = olmo_error("%s:%d: 'label' must be an index into the %d choices", path, line, e->n_choices);
        goto done;
    }
    e->label = (int)label->valuedouble;
done:
    cJSON_Delete(root);
    if (rc) free_example(e);
    return rc;
}

int olmo_mc_task_load(const char *path, int vocab_size, struct olmo_mc_task *t) {
    memset(t, 0, sizeof *t);
    short_name(path, ".jsonl", t->name, sizeof t->name);
    char *text;
    size_t len;
    if (olmo_read_file(path, (size_t)1 << 30, &text, &len)) return olmo_error_context("task file");
    const char *nul = memchr(text, 0, len); /* would silently end the file there */
    if (nul) {
        int at_line = 1;
        for (const char *c = text; c < nul; c++) at_line += *c == '\n';
        size_t offset = (size_t)(nul - text);
        free(text);
        return olmo_error("task file '%s': NUL byte at offset %zu (line %d); a task file is JSON lines text", path,
                          offset, at_line);
    }
    int cap = 0, rc = 0, line = 0;
    for (char *l = text; l && !rc;) {
        char *nl = strchr(l, '\n');
        if (nl) *nl = 0;
        line++;
        const char *p = l;
        l = nl ? nl + 1 : NULL;
        while (*p == ' ' || *p == '\t' || *p == '\r') p++;
        if (!*p) continue;
        if (t->n == cap) {
            cap = cap ? 2 * cap : 64;
            struct olmo_mc_example *q = realloc(t->ex, sizeof *q * (size_t)cap);
            if (!q) {
                rc = olmo_error("out of memory");
                break;
            }
            t->ex = q;
        }
        rc = parse_example(p, vocab_size, &t->ex[t->n], path, line);
        if (!rc) t->n++;
    }
    free(text);
    if (!rc && !t->n) rc = olmo_error("task file '%s' has no examples", path);
    if (rc) olmo_mc_task_free(t);
    return rc;
}

void olmo_mc_task_free(struct olmo_mc_task *t) {
    for (int i = 0; i < t->n; i++) free_example(&t->ex[i]);
    free(t->ex);
    memset(t, 0, sizeof *t);
}

int olmo_mc_tasks_load(const char *paths, int vocab_size, struct olmo_mc_task **tasks, int *n) {
    char **items;
    int count;
    *tasks = NULL;
    *n = 0;
    if (split_list(paths, &items, &count)) return -1;
    int k = 0; /* OLMo-eval task names, sets and directories are src/eval's (eval/olmo_tasks.h) */
    for (int i = 0; i < count; i++) {
        if (olmo_eval_is_olmo_spec(items[i])) free(items[i]);
        else items[k++] = items[i];
    }
    count = k;
    struct olmo_mc_task *t = count ? olmo_calloc((size_t)count, sizeof *t, "tasks") : NULL;
    int rc = (count && !t) ? -1 : 0, loaded = 0;
    for (int i = 0; i < count && !rc; i++) {
        rc = olmo_mc_task_load(items[i], vocab_size, &t[i]);
        if (!rc) loaded++;
    }
    free_list(items, count);
    if (rc) {
        olmo_mc_tasks_free(t, loaded);
        return -1;
    }
    *tasks = t;
    *n = count;
    return 0;
}

void olmo_mc_tasks_free(struct olmo_mc_task *tasks, int n) {
    for (int i = 0; i < n; i++) olmo_mc_task_free(&tasks[i]);
    free(tasks);
}

/* One line of --scores-out: an example's prediction and each choice's log-likelihood. */
static int write_scores(FILE *fp, const char *task, int index, const struct olmo_mc_example *e, int pred,
                        int pred_per_token, const double *lp) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "task", task);
    olmo_json_add_int(o, "index", index);
    olmo_json_add_int(o, "label", e->label);
    olmo_json_add_int(o, "pred", pred);
    olmo_json_add_int(o, "pred_per_token", pred_per_token);
    cJSON *logprobs = cJSON_AddArrayToObject(o, "logprobs");
    for (int c = 0; c < e->n_choices; c++) olmo_json_append_num(logprobs, "%.17g", lp[c]);
    cJSON *lengths = cJSON_AddArrayToObject(o, "lengths");
    for (int c = 0; c < e->n_choices; c++) olmo_json_append_int(lengths, e->choice_len[c]);
    return olmo_json_write_line(fp, o, "the scores");
}

/* One scored row: which example/choice, where the choice starts, its length. */
struct mc_row {
    int ex, choice, start, len;
};

int olmo_mc_eval(struct olmo_model *m, const struct olmo_mc_task *t, int pad_id, struct olmo_mc_result *r,
                 FILE *scores, const struct olmo_eval_progress *progress) {
    const int B = m->batch, T = m->seq_len, V = m->cfg.vocab_size;
    int total_rows = 0;
    for (int i = 0; i < t->n; i++) total_rows += t->ex[i].n_choices;
    struct mc_row *rows = olmo_calloc((size_t)total_rows, sizeof *rows, "task rows");
    double *lp = olmo_calloc((size_t)total_rows, sizeof *lp, "task scores");
    int32_t *tokens = olmo_malloc(sizeof(int32_t) * (size_t)B * T, "task batch");
    float *logit_row = olmo_malloc(sizeof(float) * (size_t)V, "logit row");
    int rc = (!rows || !lp || !tokens || !logit_row) ? -1 : 0;
    int k = 0;
    for (int i = 0; i < t->n && !rc; i++)
        for (int c = 0; c < t->ex[i].n_choices && !rc; c++) {
            const struct olmo_mc_example *e = &t->ex[i];
            int len = e->choice_len[c];
            if (len > T) rc = olmo_error("task '%s' example %d: choice %d has %d tokens, more than seq_len %d",
                                         t->name, i + 1, c, len, T);
            /* OLMo's rule: the query is context + choice without its last token (never an
             * input), cut from the left to seq_len: the context keeps T - len + 1 tokens */
            int ctx = e->n_context < T - len + 1 ? e->n_context : T - len + 1;
            rows[k++] = (struct mc_row){i, c, ctx, len};
        }
    for (int first = 0; first < total_rows && !rc; first += B) {
        int nb = total_rows - first < B ? total_rows - first : B;
        for (size_t j = 0; j < (size_t)B * T; j++) tokens[j] = pad_id;
        for (int b = 0; b < nb; b++) {
            const struct mc_row *row = &rows[first + b];
            const struct olmo_mc_example *e = &t->ex[row->ex];
            int32_t *dst = tokens + (size_t)b * T;
            memcpy(dst, e->context + (e->n_context - row->start), sizeof(int32_t) * (size_t)row->start);
            const int fits = T - row->start < row->len ? T - row->start : row->len; /* len - 1 when cut */
            memcpy(dst + row->start, e->choices[row->choice], sizeof(int32_t) * (size_t)fits);
        }
        if ((rc = olmo_model_forward(m, tokens, false))) break;
        for (int b = 0; b < nb; b++) {
            const struct mc_row *row = &rows[first + b];
            const int32_t *choice = t->ex[row->ex].choices[row->choice];
            double sum = 0.0;
            for (int j = 0; j < row->len; j++) {
                /* logits at position p-1 predict the token at position p */
                size_t pos = (size_t)b * T + (size_t)(row->start + j - 1);
                if ((rc = olmo_model_logits_rows(m, (int)pos, 1, logit_row))) break;
                double mx = -INFINITY, s = 0.0;
                for (int v = 0; v < V; v++)
                    if (logit_row[v] > mx) mx = logit_row[v];
                for (int v = 0; v < V; v++) s += exp((double)logit_row[v] - mx);
                sum += (double)logit_row[choice[j]] - (mx + log(s));
            }
            lp[first + b] = sum;
        }
        if (!rc) olmo_eval_progress_tick(progress, first + nb, total_rows);
    }
    int correct = 0, correct_tok = 0;
    r->nonfinite = 0;
    for (k = 0; k < total_rows && !rc; k++) r->nonfinite += !isfinite(lp[k]);
    k = 0;
    for (int i = 0; i < t->n && !rc; i++) {
        const struct olmo_mc_example *e = &t->ex[i];
        int best = 0, best_tok = 0;
        for (int c = 1; c < e->n_choices; c++) {
            if (lp[k + c] > lp[k + best]) best = c;
            if (lp[k + c] / e->choice_len[c] > lp[k + best_tok] / e->choice_len[best_tok]) best_tok = c;
        }
        correct += best == e->label;
        correct_tok += best_tok == e->label;
        if (scores && (rc = write_scores(scores, t->name, i, e, best, best_tok, lp + k))) break;
        k += e->n_choices;
    }
    free(rows);
    free(lp);
    free(tokens);
    free(logit_row);
    if (rc) return olmo_error_context("task '%s'", t->name);
    r->n = t->n;
    r->acc = (double)correct / t->n;
    r->acc_per_token = (double)correct_tok / t->n;
    return 0;
}
