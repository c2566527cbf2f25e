#include "train/metrics.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/fs.h"
#include "util/json.h"

cJSON *olmo_metrics_record(const char *type, long step) {
    cJSON *rec = cJSON_CreateObject();
    cJSON_AddStringToObject(rec, "type", type);
    olmo_metrics_add_int(rec, "step", step);
    return rec;
}

void olmo_metrics_add_num(cJSON *rec, const char *key, const char *fmt, double v) {
    olmo_json_add_num(rec, key, fmt, v);
}

void olmo_metrics_add_int(cJSON *rec, const char *key, long v) { olmo_json_add_int(rec, key, v); }

/* The step of one log line: from the parsed record, or, for a line an older
 * olmoc wrote with a bare nan (not JSON), from its "step" field.  -1: none. */
static long line_step(const char *line) {
    long step = -1;
    cJSON *obj = cJSON_Parse(line);
    if (obj) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(obj, "step");
        if (cJSON_IsNumber(s) && s->valuedouble >= 0 && s->valuedouble <= 9.0e15) step = (long)s->valuedouble;
        cJSON_Delete(obj);
        return step;
    }
    const char *p = strstr(line, "\"step\":");
    if (p) {
        char *end;
        long v = strtol(p + 7, &end, 10);
        if (end != p + 7 && v >= 0 && (*end == ',' || *end == '}')) step = v;
    }
    return step;
}

/* Keeps the lines of steps <= keep_through in text[0..len), compacting in place; counts the rest. */
static int cut_log(const char *path, char *text, size_t len, long keep_through, size_t *kept, long *dropped,
                   bool *partial) {
    size_t n = 0;
    *dropped = 0;
    *partial = false;
    for (size_t at = 0; at < len;) {
        char *line = text + at, *nl = memchr(line, '\n', len - at);
        if (!nl) { /* a line cut short by a kill */
            *partial = true;
            break;
        }
        *nl = 0;
        const size_t l = (size_t)(nl - line);
        const long step = line_step(line);
        if (step < 0)
            return olmo_error("'%s' offset %zu: a line that is not a metrics record (no \"step\"): not a log olmoc "
                              "wrote; repair it or move it away",
                              path, at);
        if (step <= keep_through) {
            memmove(text + n, line, l);
            text[n + l] = '\n';
            n += l + 1;
        } else {
            (*dropped)++;
        }
        at += l + 1;
    }
    *kept = n;
    return 0;
}

/* Cuts an existing log to the steps a resumed run keeps, saying what it removes. */
static int truncate_log(const char *path, long keep_through, FILE *log) {
    if (!olmo_is_file(path)) return 0; /* new, or a device such as /dev/null */
    char *text;
    size_t len;
    if (olmo_read_file(path, (size_t)1 << 31, &text, &len)) return -1;
    const char *nul = memchr(text, 0, len);
    if (nul) {
        const size_t off = (size_t)(nul - text);
        free(text);
        return olmo_error("'%s' has a NUL byte at offset %zu: not a log olmoc wrote (a crash of the machine can "
                          "leave zeros); cut the file before that offset or move it away",
                          path, off);
    }
    size_t kept = len;
    long dropped;
    bool partial;
    int rc = cut_log(path, text, len, keep_through, &kept, &dropped, &partial);
    if (!rc && kept != len) {
        rc = olmo_write_file_atomic(path, text, kept);
        if (!rc && log && dropped && keep_through > 0)
            fprintf(log, "note: removed %ld record%s after step %ld from %s (this run writes them again)\n",
                    dropped, dropped == 1 ? "" : "s", keep_through, path);
        else if (!rc && log && dropped)
            fprintf(log, "note: removed %ld record%s of an earlier run without checkpoints from %s\n", dropped,
                    dropped == 1 ? "" : "s", path);
        if (!rc && log && partial) fprintf(log, "note: removed an incomplete last line from %s\n", path);
    }
    free(text);
    return rc;
}

int olmo_metrics_open(struct olmo_metrics *m, const char *path, long keep_through, FILE *log) {
    memset(m, 0, sizeof *m);
    if (!path) return 0;
    snprintf(m->path, sizeof m->path, "%s", path);
    if (truncate_log(path, keep_through, log)) return -1;
    if (!(m->f = fopen(path, "a"))) return olmo_error("cannot open '%s': %s", path, strerror(errno));
    return 0;
}

int olmo_metrics_write(struct olmo_metrics *m, cJSON *rec) {
    if (!m->f) {
        cJSON_Delete(rec);
        return 0;
    }
    char *text = rec ? cJSON_PrintUnformatted(rec) : NULL;
    cJSON_Delete(rec);
    if (!text) return olmo_error("out of memory formatting a metrics record");
    errno = 0;
    const bool ok = fputs(text, m->f) >= 0 && fputc('\n', m->f) != EOF && fflush(m->f) == 0;
    free(text);
    if (!ok) return olmo_error("writing '%s' failed: %s", m->path, errno ? strerror(errno) : "I/O error");
    return 0;
}

int olmo_metrics_close(struct olmo_metrics *m) {
    if (!m->f) return 0;
    errno = 0;
    const int rc = fclose(m->f);
    m->f = NULL;
    if (rc) return olmo_error("writing '%s' failed: %s", m->path, errno ? strerror(errno) : "I/O error");
    return 0;
}
