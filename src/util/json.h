/* JSON output through cJSON, so that every name is escaped: numbers keep the
 * digits their printf format gives (17 significant digits for losses), and a
 * value that is not finite (NaN, inf), which JSON cannot hold, is written as
 * null. */
#ifndef OLMOC_JSON_H
#define OLMOC_JSON_H

#include <cjson/cJSON.h>
#include <stdio.h>

/* A number formatted with fmt (printf, one double), or null when v is not finite. */
cJSON *olmo_json_num(const char *fmt, double v);
/* Adds key: olmo_json_num(fmt, v) / an integer to obj. */
void olmo_json_add_num(cJSON *obj, const char *key, const char *fmt, double v);
void olmo_json_add_int(cJSON *obj, const char *key, long long v);
/* Appends v to the array arr. */
void olmo_json_append_num(cJSON *arr, const char *fmt, double v);
void olmo_json_append_int(cJSON *arr, long long v);
/* Writes obj as one line of unformatted JSON and deletes it (NULL: out of
 * memory); what names fp in the error of a failed write. */
int olmo_json_write_line(FILE *fp, cJSON *obj, const char *what);

#endif
