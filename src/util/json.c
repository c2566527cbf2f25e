#include "util/json.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

cJSON *olmo_json_num(const char *fmt, double v) {
    if (!isfinite(v)) return cJSON_CreateNull();
    char text[64];
    snprintf(text, sizeof text, fmt, v);
    return cJSON_CreateRaw(text);
}

static cJSON *json_int(long long v) {
    char text[32];
    snprintf(text, sizeof text, "%lld", v);
    return cJSON_CreateRaw(text);
}

void olmo_json_add_num(cJSON *obj, const char *key, const char *fmt, double v) {
    cJSON *item = olmo_json_num(fmt, v);
    if (item && !cJSON_AddItemToObject(obj, key, item)) cJSON_Delete(item);
}

void olmo_json_add_int(cJSON *obj, const char *key, long long v) {
    cJSON *item = json_int(v);
    if (item && !cJSON_AddItemToObject(obj, key, item)) cJSON_Delete(item);
}

void olmo_json_append_num(cJSON *arr, const char *fmt, double v) {
    cJSON *item = olmo_json_num(fmt, v);
    if (item && !cJSON_AddItemToArray(arr, item)) cJSON_Delete(item);
}

void olmo_json_append_int(cJSON *arr, long long v) {
    cJSON *item = json_int(v);
    if (item && !cJSON_AddItemToArray(arr, item)) cJSON_Delete(item);
}

int olmo_json_write_line(FILE *fp, cJSON *obj, const char *what) {
    char *text = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (!text) return olmo_error("out of memory formatting a JSON record");
    errno = 0;
    const bool ok = fputs(text, fp) >= 0 && fputc('\n', fp) != EOF;
    free(text);
    if (!ok) return olmo_error("writing %s failed: %s", what, errno ? strerror(errno) : "I/O error");
    return 0;
}
