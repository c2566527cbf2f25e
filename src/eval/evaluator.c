/* The evaluation loop of olmoc train and olmoc eval (eval/evaluator.h). */
#include "eval/evaluator.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/error.h"
#include "util/json.h"

int olmo_evaluators_open(struct olmo_evaluators *ev, const struct olmo_eval_sources *src,
                         const struct olmo_config *cfg) {
    memset(ev, 0, sizeof *ev);
    const int seq = cfg->train.seq_len, vocab = cfg->model.vocab_size;
    const char *val = src->val_paths ? src->val_paths : "", *tasks = src->tasks ? src->tasks : "";
    enum olmo_dtype dtype;
    int rc = olmo_dtype_parse(cfg->data.dtype, &dtype) || olmo_val_sets_open(val, seq, dtype, &ev->val, &ev->n_val);
    ev->val_documents = src->val_documents;
    for (int i = 0; !rc && src->val_documents && i < ev->n_val; i++)
        rc = olmo_val_set_documents(&ev->val[i], cfg->model.eos_token_id, seq, vocab);
    if (!rc && src->val_documents && !src->val_all_documents && ev->n_val)
        rc = olmo_val_sets_order(ev->val, ev->n_val,
                                 (size_t)cfg->train.micro_batch * (size_t)(src->ranks > 0 ? src->ranks : 1));
    if (!rc && src->val_documents && ev->n_val && src->val_tokenizer && src->val_tokenizer[0])
        rc = olmo_tokenizer_load(&ev->val_tok, src->val_tokenizer);
    if (!rc) rc = olmo_mc_tasks_load(tasks, vocab, &ev->tasks, &ev->n_tasks);
    if (!rc)
        rc = olmo_eval_tasks_open(tasks, src->tokenizer ? src->tokenizer : "", src->tasks_dir, vocab, src->bos_id,
                                  src->limit_docs, &ev->olmo_tasks, &ev->n_olmo_tasks);
    if (rc) {
        olmo_evaluators_close(ev);
        return -1;
    }
    return 0;
}

void olmo_evaluators_close(struct olmo_evaluators *ev) {
    olmo_val_sets_close(ev->val, ev->n_val);
    olmo_mc_tasks_free(ev->tasks, ev->n_tasks);
    olmo_eval_tasks_free(ev->olmo_tasks, ev->n_olmo_tasks);
    olmo_tokenizer_free(ev->val_tok);
    memset(ev, 0, sizeof *ev);
}

int olmo_eval_pad_id(const struct olmo_model_config *mc) {
    return mc->pad_token_id >= 0 && mc->pad_token_id < mc->vocab_size ? mc->pad_token_id : mc->eos_token_id;
}

/* Progress lines of one set or task: "eval step N | NAME | done/total UNIT | rate/s | ETA". */
struct progress_line {
    const struct olmo_eval_sink *out;
    const char *name, *unit;
    double start, last, every;
};

static void progress_report(void *ctx, long done, long total) {
    struct progress_line *p = ctx;
    const double now = olmo_now_seconds();
    if (done >= total || done <= 0 || now - p->last < p->every) return;
    p->last = now;
    const double rate = (double)done / (now - p->start > 0 ? now - p->start : 1e-9);
    char eta[32];
    olmo_format_duration(eta, sizeof eta, (double)(total - done) / rate);
    FILE *f = p->out->progress;
    if (p->out->step >= 0) fprintf(f, "eval step %ld | ", p->out->step);
    fprintf(f, "%s | %ld/%ld %s | %.1f %s/s | ETA %s\n", p->name, done, total, p->unit, rate, p->unit, eta);
    fflush(f);
}

/* The progress reporter for one set or task (its .report NULL when the sink wants none). */
static struct olmo_eval_progress progress_start(struct progress_line *p, const struct olmo_eval_sink *out,
                                                const char *name, const char *unit) {
    const char *e = getenv("OLMOC_EVAL_PROGRESS_SECONDS");
    char *end = NULL;
    const double every = e && *e ? strtod(e, &end) : 5.0;
    *p = (struct progress_line){.out = out, .name = name, .unit = unit, .every = end && *end ? 5.0 : every};
    p->start = p->last = olmo_now_seconds();
    return (struct olmo_eval_progress){.report = out->progress ? progress_report : NULL, .ctx = p};
}

/* {"type": type} with "step" when there is one. */
static cJSON *new_record(const char *type, const struct olmo_eval_sink *out) {
    cJSON *rec = cJSON_CreateObject();
    cJSON_AddStringToObject(rec, "type", type);
    if (out->step >= 0) olmo_json_add_int(rec, "step", out->step);
    return rec;
}

static long count_nulls(const cJSON *item, const char **first_key) {
    long n = 0;
    for (const cJSON *c = item->child; c; c = c->next) {
        if (cJSON_IsNull(c)) {
            if (!n && !*first_key) *first_key = c->string ? c->string : "(a list entry)";
            n++;
        }
        n += count_nulls(c, first_key);
    }
    return n;
}

/* Records the first non-finite value of the set or task named by rec; key names the value */
static void note_nonfinite(struct olmo_eval_check *check, const cJSON *rec, const char *key) {
    if (!check->values && !check->logprobs) {
        const cJSON *set = cJSON_GetObjectItemCaseSensitive(rec, "set");
        const cJSON *task = cJSON_GetObjectItemCaseSensitive(rec, "task");
        const cJSON *name = cJSON_IsString(set) ? set : task;
        snprintf(check->first, sizeof check->first, "%s: %s", cJSON_IsString(name) ? name->valuestring : "?", key);
    }
}

/* rec to the sink; its null values (what was not finite) and logprobs non-finite log-likelihoods counted */
static int emit_counted(const struct olmo_eval_sink *out, cJSON *rec, long logprobs) {
    if (!rec) return olmo_error("out of memory building an evaluation record");
    if (out->check) {
        const char *key = NULL;
        const long n = count_nulls(rec, &key);
        if (n) note_nonfinite(out->check, rec, key ? key : "?");
        else if (logprobs) note_nonfinite(out->check, rec, "a log-likelihood");
        out->check->values += n;
        out->check->logprobs += logprobs;
    }
    if (!out->record) {
        cJSON_Delete(rec);
        return 0;
    }
    return out->record(out->ctx, rec);
}

static int emit(const struct olmo_eval_sink *out, cJSON *rec) { return emit_counted(out, rec, 0); }

/* A set in documents mode: OLMo-core's LM evaluator, its metric names. */
static int eval_documents(struct olmo_model *m, const struct olmo_val_set *set, const struct olmo_eval_settings *s,
                          const struct olmo_tokenizer *tok, const struct olmo_eval_sink *out) {
    struct olmo_val_result r;
    const double t0 = olmo_now_seconds();
    struct progress_line pl;
    const struct olmo_eval_progress pr = progress_start(&pl, out, set->name, "documents");
    if (olmo_eval_val_documents(m, set, s->doc_batches, s->pad_id, tok, &r, &pr)) return -1;
    if (!r.docs) { /* a batch limit that reads none of this set's documents: no figure to report */
        if (out->text)
            fprintf(out->text, "%s: none of its documents is in the first %d global batches of %zu documents read\n",
                    set->name, s->doc_batches, set->batch_docs);
        return 0;
    }
    char ce_name[400], ppl_name[400];
    olmo_val_metric_name(ce_name, sizeof ce_name, set->name, "CE loss");
    olmo_val_metric_name(ppl_name, sizeof ppl_name, set->name, "PPL");
    const bool report = out->step < 0;
    if (out->text && report) {
        fprintf(out->text, "%s %.6f | %s %.4f", ce_name, r.loss, ppl_name, r.ppl);
        if (r.bytes >= 0) fprintf(out->text, " | BPB %.6f (%lld bytes)", r.bpb, r.bytes);
        fprintf(out->text, " | %ld tokens, %ld documents\n", r.tokens, r.docs);
    } else if (out->text) {
        fprintf(out->text, "eval step %ld | %s %.4f | %s %.3f", out->step, ce_name, r.loss, ppl_name, r.ppl);
        if (r.bytes >= 0) fprintf(out->text, " | BPB %.4f", r.bpb);
        fprintf(out->text, " | %ld documents | %.2fs\n", r.docs, olmo_now_seconds() - t0);
    }
    cJSON *rec = new_record("eval", out);
    cJSON_AddStringToObject(rec, "set", set->name);
    olmo_json_add_num(rec, "loss", "%.17g", r.loss);
    olmo_json_add_num(rec, "ppl", "%.17g", r.ppl);
    olmo_json_add_int(rec, "tokens", r.tokens);
    if (report) olmo_json_add_int(rec, "labels", r.labels);
    olmo_json_add_int(rec, "documents", r.docs);
    if (report && r.bytes >= 0) olmo_json_add_int(rec, "bytes", r.bytes);
    if (r.bytes >= 0) olmo_json_add_num(rec, "bpb", "%.17g", r.bpb);
    cJSON *named = cJSON_AddObjectToObject(rec, "metrics");
    /* 17 digits: cJSON's own printing may drop the last bit (its round-trip check allows 1 ulp) */
    olmo_json_add_num(named, ce_name, "%.17g", r.loss);
    olmo_json_add_num(named, ppl_name, "%.17g", r.ppl);
    return emit(out, rec);
}

/* A set of seq_len windows: mean next-token loss over its first micro-batches. */
static int eval_windows(struct olmo_model *m, const struct olmo_val_set *set, const struct olmo_eval_settings *s,
                        const struct olmo_eval_sink *out) {
    double loss;
    long tokens;
    const double t0 = olmo_now_seconds();
    struct progress_line pl;
    const struct olmo_eval_progress pr = progress_start(&pl, out, set->name, "batches");
    if (olmo_eval_val_set(m, set, s->val_batches, s->doc_masking, &loss, &tokens, &pr)) return -1;
    if (out->text && out->step < 0)
        fprintf(out->text, "%s: loss %.6f | ppl %.4f | %ld tokens\n", set->name, loss, exp(loss), tokens);
    else if (out->text)
        fprintf(out->text, "eval step %ld | %s | loss %.4f | ppl %.3f | %ld tokens | %.2fs\n", out->step, set->name,
                loss, exp(loss), tokens, olmo_now_seconds() - t0);
    cJSON *rec = new_record("eval", out);
    cJSON_AddStringToObject(rec, "set", set->name);
    olmo_json_add_num(rec, "loss", "%.17g", loss);
    olmo_json_add_num(rec, "ppl", "%.17g", exp(loss));
    olmo_json_add_int(rec, "tokens", tokens);
    return emit(out, rec);
}

/* A multiple-choice task of token ids. */
static int eval_mc(struct olmo_model *m, const struct olmo_mc_task *t, const struct olmo_eval_settings *s,
                   const struct olmo_eval_sink *out) {
    struct olmo_mc_result r;
    struct progress_line pl;
    const struct olmo_eval_progress pr = progress_start(&pl, out, t->name, "choices");
    if (olmo_mc_eval(m, t, s->pad_id, &r, out->scores, &pr)) return -1;
    if (out->text && out->step < 0)
        fprintf(out->text, "%s: acc %.4f | acc_per_token %.4f | %d examples\n", t->name, r.acc, r.acc_per_token, r.n);
    else if (out->text)
        fprintf(out->text, "eval step %ld | task %s | acc %.4f | acc_per_token %.4f | %d examples\n", out->step,
                t->name, r.acc, r.acc_per_token, r.n);
    cJSON *rec = new_record("downstream", out);
    cJSON_AddStringToObject(rec, "task", t->name);
    olmo_json_add_num(rec, "acc", "%.17g", r.acc);
    olmo_json_add_num(rec, "acc_per_token", "%.17g", r.acc_per_token);
    olmo_json_add_int(rec, "n", r.n);
    return emit_counted(out, rec, r.nonfinite);
}

/* Each instance's continuation log-likelihood, one JSON line each. */
static int write_task_scores(FILE *fp, const struct olmo_eval_task *t, const double *lp) {
    for (int k = 0; k < t->n; k++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "task", t->name);
        olmo_json_add_int(o, "doc_id", t->inst[k].doc_id);
        olmo_json_add_int(o, "cont_id", t->inst[k].cont_id);
        olmo_json_add_num(o, "logprob", "%.17g", lp[k]);
        olmo_json_add_int(o, "tokens", t->inst[k].n_cont);
        if (olmo_json_write_line(fp, o, "the scores")) return olmo_error_context("task '%s'", t->name);
    }
    return 0;
}

/* An OLMo-eval task: OLMo's in-loop metrics. */
static int eval_olmo_task(struct olmo_model *m, const struct olmo_eval_task *t, const struct olmo_eval_settings *s,
                          const struct olmo_eval_sink *out) {
    const double t0 = olmo_now_seconds();
    double *lp = olmo_malloc(sizeof(double) * (size_t)(t->n ? t->n : 1), "task scores");
    struct olmo_eval_result r;
    struct progress_line pl;
    const struct olmo_eval_progress pr = progress_start(&pl, out, t->name, "requests");
    if (!lp || olmo_eval_score(m, t, s->pad_id, lp, &pr) || olmo_eval_metrics(t, lp, &r) ||
        (out->scores && write_task_scores(out->scores, t, lp))) {
        free(lp);
        return -1;
    }
    long nonfinite = 0;
    for (int k = 0; k < t->n; k++) nonfinite += !isfinite(lp[k]);
    free(lp);
    if (out->text && out->step < 0) {
        olmo_eval_result_print(out->text, t->name, &r, false);
    } else if (out->text) {
        fprintf(out->text, "eval step %ld | ", out->step);
        olmo_eval_result_print(out->text, t->name, &r, false);
        fprintf(out->text, "eval step %ld | %s took %.2fs\n", out->step, t->name, olmo_now_seconds() - t0);
    }
    cJSON *rec = new_record("downstream", out);
    cJSON_AddStringToObject(rec, "task", t->name);
    olmo_eval_result_add_json(rec, &r);
    return emit_counted(out, rec, nonfinite);
}

int olmo_eval_run(struct olmo_model *m, const struct olmo_evaluators *ev, const struct olmo_eval_settings *s,
                  const struct olmo_eval_sink *out) {
    int rc = 0;
    for (int i = 0; !rc && i < ev->n_val; i++)
        rc = ev->val_documents ? eval_documents(m, &ev->val[i], s, ev->val_tok, out)
                               : eval_windows(m, &ev->val[i], s, out);
    for (int i = 0; !rc && i < ev->n_tasks; i++) rc = eval_mc(m, &ev->tasks[i], s, out);
    for (int i = 0; !rc && i < ev->n_olmo_tasks; i++) rc = eval_olmo_task(m, &ev->olmo_tasks[i], s, out);
    if (out->text) fflush(out->text);
    return rc;
}
