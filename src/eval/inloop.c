/* OLMo-eval tasks during training: one "downstream" record per task in metrics.jsonl. */
#include <cjson/cJSON.h>
#include <stdlib.h>

#include "eval/olmo_tasks.h"
#include "train/metrics.h"
#include "util/clock.h"
#include "util/error.h"

int olmo_eval_task_log(struct olmo_model *m, const struct olmo_eval_task *t, int pad_id, long step, FILE *log,
                       struct olmo_metrics *metrics) {
    double t0 = olmo_now_seconds();
    double *lp = olmo_malloc(sizeof(double) * (size_t)(t->n ? t->n : 1), "task scores");
    struct olmo_eval_result r;
    if (!lp || olmo_eval_score(m, t, pad_id, lp) || olmo_eval_metrics(t, lp, &r)) {
        free(lp);
        return -1;
    }
    free(lp);
    if (log) {
        fprintf(log, "eval step %ld | ", step);
        olmo_eval_result_print(log, t->name, &r, false);
        fprintf(log, "eval step %ld | %s took %.2fs\n", step, t->name, olmo_now_seconds() - t0);
    }
    cJSON *rec = olmo_metrics_record("downstream", step);
    if (!rec) return olmo_error("out of memory");
    cJSON_AddStringToObject(rec, "task", t->name);
    olmo_eval_result_add_json(rec, &r);
    return olmo_metrics_write(metrics, rec);
}
