/* Fuzz targets for line-oriented JSON: the strict JSONL string extractor
 * (olmoc tokenize's input) on the raw bytes, and the multiple-choice task
 * file loader (olmoc eval --task) on the same bytes as a file. */
#include "data/jsonl.h"
#include "fuzz_input.h"
#include "eval/evaluate.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct olmo_json_text text = {0};
    size_t err_off = 0;
    const char *err = NULL;
    olmo_json_get_string((const char *)data, size, "text", &text, &err_off, &err);
    olmo_json_text_free(&text);

    const char *path = fuzz_write_input(data, size, ".jsonl");
    struct olmo_mc_task task;
    if (path && olmo_mc_task_load(path, 1000, &task) == 0) olmo_mc_task_free(&task);
    return 0;
}
