#include "train/metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* The log is read a chunk at a time (no size limit: a long run's log passes
 * 2 GiB), one line at a time; a line longer than this is no record olmoc wrote. */
#define READ_CHUNK ((size_t)1 << 20)
#define MAX_LINE ((size_t)16 << 20)

struct line_reader {
    FILE *f;
    const char *path;
    char *chunk, *line;
    size_t n, at, len, cap;
    bool eof;
};

/* The next line into r->line[0..len) (NUL-terminated, without its '\n'):
 * 1 a line (*complete: it ended in '\n'), 0 the end of the file, -1 an error. */
static int next_line(struct line_reader *r, uint64_t at, bool *complete) {
    r->len = 0;
    for (;;) {
        if (r->at == r->n) {
            if (r->eof) {
                if (!r->len) return 0;
                *complete = false;
                return 1;
            }
            r->n = fread(r->chunk, 1, READ_CHUNK, r->f);
            r->at = 0;
            if (r->n < READ_CHUNK) {
                if (ferror(r->f)) return olmo_error("reading '%s' failed: %s", r->path, strerror(errno));
                r->eof = true;
            }
            continue;
        }
        const char *s = r->chunk + r->at, *nl = memchr(s, '\n', r->n - r->at);
        const size_t take = nl ? (size_t)(nl - s) : r->n - r->at;
        if (r->len + take > MAX_LINE)
            return olmo_error("'%s' offset %" PRIu64 ": a line of more than %zu MiB: not a log olmoc wrote; repair it or "
                              "move it away",
                              r->path, at, MAX_LINE >> 20);
        if (r->len + take + 1 > r->cap) {
            size_t cap = r->cap ? r->cap : 4096;
            while (cap < r->len + take + 1) cap *= 2;
            char *p = realloc(r->line, cap);
            if (!p) return olmo_error("out of memory reading '%s'", r->path);
            r->line = p;
            r->cap = cap;
        }
        memcpy(r->line + r->len, s, take);
        r->len += take;
        r->line[r->len] = 0;
        r->at += take + (nl ? 1 : 0);
        if (nl) {
            *complete = true;
            return 1;
        }
    }
}

/* What a scan of the log found: the lines of steps <= keep_through are kept. */
struct log_scan {
    long dropped;
    bool partial;      /* a last line cut short by a kill */
    bool interleaved;  /* a kept line after a dropped one: the log is rewritten, not cut */
    uint64_t cut;      /* otherwise the kept lines end here */
};

/* Reads the whole log once: refuses a NUL byte (the first, with its offset)
 * or a line that is no record, and says what the cut removes. */
static int scan_log(struct line_reader *r, long keep_through, struct log_scan *sc) {
    memset(sc, 0, sizeof *sc);
    uint64_t at = 0, bad = UINT64_MAX;
    bool complete, any_dropped = false;
    int got;
    while ((got = next_line(r, at, &complete)) == 1) {
        const char *nul = memchr(r->line, 0, r->len);
        if (nul)
            return olmo_error("'%s' has a NUL byte at offset %" PRIu64 ": not a log olmoc wrote (a crash of the "
                              "machine can leave zeros); cut the file before that offset or move it away",
                              r->path, at + (uint64_t)(nul - r->line));
        if (!complete) {
            sc->partial = true;
            if (!any_dropped) sc->cut = at;
            break;
        }
        const long step = line_step(r->line);
        if (step < 0) {
            if (bad == UINT64_MAX) bad = at; /* reported unless a NUL byte comes later */
        } else if (step <= keep_through) {
            if (any_dropped) sc->interleaved = true;
        } else {
            if (!any_dropped) sc->cut = at;
            any_dropped = true;
            sc->dropped++;
        }
        at += r->len + 1;
    }
    if (got < 0) return -1;
    if (bad != UINT64_MAX)
        return olmo_error("'%s' offset %" PRIu64 ": a line that is not a metrics record (no \"step\"): not a log "
                          "olmoc wrote; repair it or move it away",
                          r->path, bad);
    return 0;
}

/* Writes the kept lines of the log to path.tmp and renames it over path. */
static int rewrite_log(struct line_reader *r, long keep_through) {
    char tmp[4300];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", r->path) >= (int)sizeof tmp)
        return olmo_error("path too long: '%s'", r->path);
    FILE *out = fopen(tmp, "wb");
    if (!out) return olmo_error("cannot write '%s': %s", tmp, strerror(errno));
    rewind(r->f);
    r->n = r->at = 0;
    r->eof = false;
    uint64_t at = 0;
    bool complete;
    int got, ok = 1;
    while (ok && (got = next_line(r, at, &complete)) == 1 && complete) {
        if (line_step(r->line) <= keep_through)
            ok = fwrite(r->line, 1, r->len, out) == r->len && fputc('\n', out) != EOF;
        at += r->len + 1;
    }
    errno = 0;
    ok = ok && got >= 0 && fflush(out) == 0 && fsync(fileno(out)) == 0;
    const int err = errno;
    if (fclose(out) || !ok) {
        unlink(tmp);
        return got < 0 ? -1 : olmo_error("writing '%s' failed: %s", tmp, err ? strerror(err) : "I/O error");
    }
    if (rename(tmp, r->path)) {
        const int e = errno;
        unlink(tmp);
        return olmo_error("cannot rename '%s' to '%s': %s", tmp, r->path, strerror(e));
    }
    return 0;
}

/* Cuts the log at byte `cut` (what follows is all removed): no copy, whatever its size. */
static int cut_log(const char *path, uint64_t cut) {
    const int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return olmo_error("cannot open '%s': %s", path, strerror(errno));
    int rc = 0;
    if (ftruncate(fd, (off_t)cut) || fsync(fd)) rc = olmo_error("cutting '%s' failed: %s", path, strerror(errno));
    close(fd);
    return rc;
}

/* Cuts an existing log to the steps a resumed run keeps, saying what it
 * removes.  The log is streamed (bounded memory, 64-bit offsets): a cut at
 * the first removed record when everything after it goes (the usual case),
 * else a rewrite of the kept records through a temporary file. */
static int truncate_log(const char *path, long keep_through, FILE *log) {
    if (!olmo_is_file(path)) return 0; /* new, or a device such as /dev/null */
    struct line_reader r = {.path = path};
    if (!(r.f = fopen(path, "rb"))) return olmo_error("cannot open '%s': %s", path, strerror(errno));
    r.chunk = malloc(READ_CHUNK);
    struct log_scan sc;
    int rc = r.chunk ? scan_log(&r, keep_through, &sc) : olmo_error("out of memory reading '%s'", path);
    if (!rc && (sc.dropped || sc.partial)) {
        rc = sc.interleaved ? rewrite_log(&r, keep_through) : cut_log(path, sc.cut);
        if (!rc && log && sc.dropped && keep_through > 0)
            fprintf(log, "note: removed %ld record%s after step %ld from %s (this run writes them again)\n",
                    sc.dropped, sc.dropped == 1 ? "" : "s", keep_through, path);
        else if (!rc && log && sc.dropped)
            fprintf(log, "note: removed %ld record%s of an earlier run without checkpoints from %s\n", sc.dropped,
                    sc.dropped == 1 ? "" : "s", path);
        if (!rc && log && sc.partial) fprintf(log, "note: removed an incomplete last line from %s\n", path);
    }
    fclose(r.f);
    free(r.chunk);
    free(r.line);
    return rc;
}

int olmo_metrics_open(struct olmo_metrics *m, const char *path, long keep_through, FILE *log) {
    memset(m, 0, sizeof *m);
    if (!path) return 0;
    snprintf(m->path, sizeof m->path, "%s", path);
    if (truncate_log(path, keep_through, log)) return -1;
    /* a device such as /dev/null takes the records; a FIFO would block the run until read, a directory or
     * socket cannot be appended to */
    struct stat st;
    if (!stat(path, &st) && !S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode))
        return olmo_error("the metrics log '%s' is a %s, not a regular file: remove it or choose another data.out_dir",
                          path, S_ISFIFO(st.st_mode) ? "FIFO" : S_ISDIR(st.st_mode) ? "directory" : "special file");
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
