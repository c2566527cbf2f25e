#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"
#include "util/fs.h"

/* A header larger than this is rejected (the reference library uses 100 MB). */
#define ST_MAX_HEADER (100u << 20)

static const struct {
    const char *name;
    enum olmo_st_dtype dtype;
    size_t size;
} dtypes[] = {{"F32", OLMO_ST_F32, 4}, {"F64", OLMO_ST_F64, 8}, {"F16", OLMO_ST_F16, 2}, {"BF16", OLMO_ST_BF16, 2}, {"I32", OLMO_ST_I32, 4}, {"I64", OLMO_ST_I64, 8}};

static size_t dtype_size(enum olmo_st_dtype d) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].dtype == d) return dtypes[i].size;
    return 0;
}

static const char *dtype_name(enum olmo_st_dtype d) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].dtype == d) return dtypes[i].name;
    return "?";
}

size_t olmo_st_numel(const struct olmo_st_tensor *t) {
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

/* A JSON number that is a non-negative integer no larger than max. */
static bool is_index(const cJSON *v, double max) {
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble == floor(v->valuedouble) &&
           v->valuedouble <= max;
}

static int parse_tensor(struct olmo_st_file *f, const cJSON *item, struct olmo_st_tensor *t) {
    const char *name = item->string;
    if (strlen(name) >= sizeof t->name) return olmo_error("tensor name too long: '%.60s...'", name);
    strcpy(t->name, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return olmo_error("tensor '%s': header entry needs dtype, shape and two data_offsets", name);
    size_t i;
    for (i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (!strcmp(dt->valuestring, dtypes[i].name)) break;
    if (i == sizeof dtypes / sizeof dtypes[0])
        return olmo_error("tensor '%s': unsupported dtype '%s'", name, dt->valuestring);
    t->dtype = dtypes[i].dtype;
    t->ndim = cJSON_GetArraySize(shape);
    if (t->ndim > 8) return olmo_error("tensor '%s': %d dimensions (at most 8)", name, t->ndim);
    double numel = 1.0;
    for (int d = 0; d < t->ndim; d++) {
        const cJSON *s = cJSON_GetArrayItem(shape, d);
        if (!is_index(s, 9.0e15)) return olmo_error("tensor '%s': bad shape entry", name);
        t->shape[d] = (int64_t)s->valuedouble;
        numel *= s->valuedouble;
    }
    const cJSON *b = cJSON_GetArrayItem(offs, 0), *e = cJSON_GetArrayItem(offs, 1);
    if (!cJSON_IsNumber(b) || !cJSON_IsNumber(e) || b->valuedouble < 0 || e->valuedouble < b->valuedouble ||
        e->valuedouble > (double)f->data_size)
        return olmo_error("tensor '%s': data_offsets outside the %zu-byte data section", name, f->data_size);
    if (!is_index(b, 9.0e15) || !is_index(e, 9.0e15))
        return olmo_error("tensor '%s': data_offsets must be integers, got [%.17g, %.17g]", name, b->valuedouble,
                          e->valuedouble);
    t->begin = (size_t)b->valuedouble;
    t->end = (size_t)e->valuedouble;
    if ((double)(t->end - t->begin) != numel * (double)dtype_size(t->dtype))
        return olmo_error("tensor '%s': %zu bytes do not match shape x %s", name, t->end - t->begin,
                          dtype_name(t->dtype));
    return 0;
}

static int cmp_range(const void *a, const void *b) {
    const struct olmo_st_tensor *x = *(const struct olmo_st_tensor *const *)a, *y = *(const struct olmo_st_tensor *const *)b;
    if (x->begin != y->begin) return (x->begin > y->begin) - (x->begin < y->begin);
    return (x->end > y->end) - (x->end < y->end);
}

/* As the format (and Hugging Face's reader) requires: the byte ranges, in
 * order, tile the data section exactly: no overlap, no hole, nothing after
 * the last tensor.  Zero-length tensors sit anywhere on the seams. */
static int check_coverage(const struct olmo_st_file *f) {
    const struct olmo_st_tensor **order = malloc(sizeof *order * ((size_t)f->n_tensors + 1));
    if (!order) return olmo_error("out of memory reading '%s'", f->path);
    for (int i = 0; i < f->n_tensors; i++) order[i] = &f->tensors[i];
    qsort(order, (size_t)f->n_tensors, sizeof *order, cmp_range);
    int rc = 0;
    size_t pos = 0;
    const struct olmo_st_tensor *prev = NULL;
    for (int i = 0; i < f->n_tensors && !rc; i++) {
        const struct olmo_st_tensor *t = order[i];
        if (t->begin < pos)
            rc = olmo_error("'%s': tensors '%s' and '%s' overlap in the data section", f->path, prev->name, t->name);
        else if (t->begin > pos)
            rc = olmo_error("'%s': bytes [%zu, %zu) of the data section belong to no tensor (before '%s')", f->path,
                            pos, t->begin, t->name);
        if (t->end > t->begin) prev = t;
        pos = t->end;
    }
    if (!rc && pos != f->data_size)
        rc = olmo_error("'%s': the last %zu bytes of the data section belong to no tensor", f->path,
                        f->data_size - pos);
    free(order);
    return rc;
}

/* qsort's comparison gets no context: the file being sorted, per thread */
static _Thread_local const struct olmo_st_file *sort_file;
static int cmp_name(const void *a, const void *b) {
    return strcmp(sort_file->tensors[*(const int *)a].name, sort_file->tensors[*(const int *)b].name);
}

/* Sorts the names once (O(n log n) comparisons whatever the names: nothing
 * an input can make collide) and refuses a name that appears twice. */
static int sort_names(struct olmo_st_file *f) {
    f->sorted = malloc(sizeof *f->sorted * ((size_t)f->n_tensors + 1));
    if (!f->sorted) return olmo_error("out of memory reading '%s'", f->path);
    for (int i = 0; i < f->n_tensors; i++) f->sorted[i] = i;
    sort_file = f;
    qsort(f->sorted, (size_t)f->n_tensors, sizeof *f->sorted, cmp_name);
    sort_file = NULL;
    for (int i = 1; i < f->n_tensors; i++)
        if (!strcmp(f->tensors[f->sorted[i - 1]].name, f->tensors[f->sorted[i]].name))
            return olmo_error("'%s': tensor '%s' appears twice in the header", f->path,
                              f->tensors[f->sorted[i]].name);
    return 0;
}

/* The JSON header: an object from its first byte, then only whitespace
 * (the format's padding) up to the announced length. */
static cJSON *parse_header(struct olmo_st_file *f, size_t hlen) {
    const char *text = (const char *)f->map + 8, *end = NULL;
    if (!hlen || text[0] != '{') {
        olmo_error("'%s': header is not a JSON object (byte 8 is not '{')", f->path);
        return NULL;
    }
    cJSON *root = cJSON_ParseWithLengthOpts(text, hlen, &end, 0);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        olmo_error("'%s': header is not a JSON object", f->path);
        return NULL;
    }
    for (const char *p = end; p < text + hlen; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(root);
            olmo_error("'%s': %zu bytes after the header's JSON (at file offset %zu) are not whitespace padding",
                       f->path, (size_t)(text + hlen - p), (size_t)(p - (const char *)f->map));
            return NULL;
        }
    return root;
}

/* "__metadata__" is a map of strings to strings; kept for olmo_st_metadata. */
static int read_metadata(struct olmo_st_file *f, const cJSON *meta) {
    if (!cJSON_IsObject(meta)) return olmo_error("'%s': __metadata__ is not an object", f->path);
    const cJSON *item;
    int n = 0;
    cJSON_ArrayForEach(item, meta) {
        if (!cJSON_IsString(item))
            return olmo_error("'%s': __metadata__ entry '%s' is not a string", f->path, item->string);
        n++;
    }
    if (!(f->meta = calloc(2 * (size_t)n + 1, sizeof *f->meta))) return olmo_error("out of memory reading '%s'", f->path);
    cJSON_ArrayForEach(item, meta) {
        char **kv = &f->meta[2 * f->n_meta];
        kv[0] = strdup(item->string);
        kv[1] = strdup(item->valuestring);
        f->n_meta++;
        if (!kv[0] || !kv[1]) return olmo_error("out of memory reading '%s'", f->path);
    }
    return 0;
}

const char *olmo_st_metadata(const struct olmo_st_file *f, const char *key) {
    for (int i = f->n_meta - 1; i >= 0; i--) /* duplicate keys: the last, as a JSON object reads */
        if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
    return NULL;
}

static int read_entries(struct olmo_st_file *f, const cJSON *root) {
    size_t count = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, root) count++;
    if (count > INT32_MAX) return olmo_error("'%s': %zu header entries", f->path, count);
    f->tensors = calloc(count + 1, sizeof *f->tensors);
    if (!f->tensors) return olmo_error("out of memory reading '%s'", f->path);
    int n_meta = 0;
    cJSON_ArrayForEach(item, root) {
        if (!strcmp(item->string, "__metadata__")) {
            if (n_meta++) return olmo_error("'%s': __metadata__ appears twice in the header", f->path);
            if (read_metadata(f, item)) return -1;
            continue;
        }
        if (!cJSON_IsObject(item)) return olmo_error("'%s': entry '%s' is not an object", f->path, item->string);
        if (parse_tensor(f, item, &f->tensors[f->n_tensors])) return olmo_error_context("'%s'", f->path);
        f->n_tensors++;
    }
    return sort_names(f);
}

int olmo_st_open(struct olmo_st_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    if (olmo_map_file(path, "safetensors file", &f->map, &f->map_size)) return -1;
    if (f->map_size < 8) {
        olmo_st_close(f);
        return olmo_error("'%s': too small to be a safetensors file", path);
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->map[i];
    if (hlen > ST_MAX_HEADER || hlen > f->map_size - 8) {
        olmo_st_close(f);
        return olmo_error("'%s': header length %llu exceeds the file or the %u-byte limit", path,
                          (unsigned long long)hlen, ST_MAX_HEADER);
    }
    f->data = f->map + 8 + hlen;
    f->data_size = f->map_size - 8 - hlen;
    cJSON *root = parse_header(f, (size_t)hlen);
    if (!root) {
        olmo_st_close(f);
        return -1;
    }
    int rc = read_entries(f, root);
    cJSON_Delete(root);
    if (!rc) rc = check_coverage(f);
    if (rc) olmo_st_close(f);
    return rc;
}

void olmo_st_close(struct olmo_st_file *f) {
    if (f->map) munmap(f->map, f->map_size);
    free(f->tensors);
    free(f->sorted);
    for (int i = 0; f->meta && i < 2 * f->n_meta; i++) free(f->meta[i]);
    free(f->meta);
    memset(f, 0, sizeof *f);
}

const struct olmo_st_tensor *olmo_st_find(const struct olmo_st_file *f, const char *name) {
    int lo = 0, hi = f->sorted ? f->n_tensors : 0;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        const int c = strcmp(f->tensors[f->sorted[mid]].name, name);
        if (!c) return &f->tensors[f->sorted[mid]];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    float v;
    if (exp == 0) v = ldexpf((float)mant, -24);
    else if (exp == 31) v = mant ? NAN : INFINITY;
    else v = ldexpf((float)(mant | 0x400), (int)exp - 25);
    return sign ? -v : v;
}

int olmo_st_read_f32(const struct olmo_st_file *f, const struct olmo_st_tensor *t, float *dst) {
    switch (t->dtype) {
    case OLMO_ST_F32:
    case OLMO_ST_BF16:
    case OLMO_ST_F16: return olmo_st_convert_f32(t->dtype, f->data + t->begin, olmo_st_numel(t), dst);
    case OLMO_ST_F64:
        return olmo_error("tensor '%s' in '%s' is F64 (float64), which olmoc does not read: weights must be F32, "
                          "BF16 or F16",
                          t->name, f->path);
    default: return olmo_error("tensor '%s' in '%s' is %s, not a float type", t->name, f->path, dtype_name(t->dtype));
    }
}

int olmo_st_read_i32(const struct olmo_st_file *f, const struct olmo_st_tensor *t, int32_t *dst) {
    const uint8_t *src = f->data + t->begin;
    size_t n = olmo_st_numel(t);
    if (t->dtype == OLMO_ST_I32) {
        memcpy(dst, src, n * 4);
        return 0;
    }
    if (t->dtype == OLMO_ST_I64) {
        for (size_t i = 0; i < n; i++) {
            int64_t v;
            memcpy(&v, src + 8 * i, 8);
            if (v < INT32_MIN || v > INT32_MAX)
                return olmo_error("tensor '%s' in '%s': value %lld at %zu overflows int32", t->name, f->path,
                                  (long long)v, i);
            dst[i] = (int32_t)v;
        }
        return 0;
    }
    return olmo_error("tensor '%s' in '%s' is %s, not an integer type", t->name, f->path, dtype_name(t->dtype));
}

int olmo_st_writer_add(struct olmo_st_writer *w, const char *name, enum olmo_st_dtype dtype, int ndim, const int64_t *shape,
                  const void *data) {
    if (olmo_st_writer_declare(w, name, dtype, ndim, shape)) return -1;
    struct olmo_st_wtensor *t = &w->items[w->n - 1];
    t->data = malloc(t->bytes ? t->bytes : 1);
    if (!t->data) {
        w->n--; /* as if never added */
        return olmo_error("out of memory for tensor '%s'", name);
    }
    memcpy(t->data, data, t->bytes);
    return 0;
}

void olmo_st_writer_free(struct olmo_st_writer *w) {
    for (int i = 0; i < w->n; i++) free(w->items[i].data);
    free(w->items);
    for (int i = 0; i < w->n_meta; i++) {
        free(w->meta[i][0]);
        free(w->meta[i][1]);
    }
    memset(w, 0, sizeof *w);
}

int olmo_st_writer_set_metadata(struct olmo_st_writer *w, const char *key, const char *value) {
    if (w->n_meta == OLMO_ST_MAX_META) return olmo_error("more than %d __metadata__ entries", OLMO_ST_MAX_META);
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return olmo_error("out of memory for __metadata__ entry '%s'", key);
    }
    w->meta[w->n_meta][0] = k;
    w->meta[w->n_meta][1] = v;
    w->n_meta++;
    return 0;
}

/* The header JSON of w's tensors, padded with spaces to a multiple of 8
 * (keeps the data 8-byte aligned); *hlen_padded its length. */
static char *writer_header(const struct olmo_st_writer *w, size_t *hlen, size_t *padded) {
    cJSON *root = cJSON_CreateObject();
    if (w->n_meta) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        for (int i = 0; i < w->n_meta; i++) cJSON_AddStringToObject(meta, w->meta[i][0], w->meta[i][1]);
    }
    size_t offset = 0;
    for (int i = 0; i < w->n; i++) {
        const struct olmo_st_wtensor *t = &w->items[i];
        cJSON *item = cJSON_AddObjectToObject(root, t->name);
        cJSON_AddStringToObject(item, "dtype", dtype_name(t->dtype));
        cJSON *shape = cJSON_AddArrayToObject(item, "shape");
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        cJSON *offs = cJSON_AddArrayToObject(item, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(offset + t->bytes)));
        offset += t->bytes;
    }
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json) return NULL;
    *hlen = strlen(json);
    *padded = (*hlen + 7) & ~(size_t)7;
    return json;
}

int olmo_st_writer_save(struct olmo_st_writer *w, const char *path) {
    size_t hlen, padded;
    char *json = writer_header(w, &hlen, &padded);
    if (!json) return olmo_error("out of memory writing '%s'", path);
    char tmp[4200];
    const int fd = olmo_open_tmp(path, "safetensors file", tmp, sizeof tmp);
    FILE *fp = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!fp) {
        free(json);
        if (fd < 0) return -1;
        const int err = errno;
        close(fd);
        unlink(tmp);
        return olmo_error("cannot write '%s': %s", tmp, strerror(err));
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(len8, 1, 8, fp) == 8 && fwrite(json, 1, hlen, fp) == hlen;
    for (size_t i = hlen; i < padded && ok; i++) ok = fputc(' ', fp) != EOF;
    for (int i = 0; i < w->n && ok; i++) ok = fwrite(w->items[i].data, 1, w->items[i].bytes, fp) == w->items[i].bytes;
    free(json);
    ok = ok && fflush(fp) == 0 && fsync(fileno(fp)) == 0;
    if (fclose(fp) || !ok) {
        unlink(tmp);
        return olmo_error("writing '%s' failed: %s", path, strerror(errno));
    }
    return olmo_commit_tmp(tmp, path, "safetensors file");
}

/* ---- streaming writer ---- */

size_t olmo_st_writer_file_size(const struct olmo_st_writer *w) {
    size_t hlen, padded, total = 0;
    char *json = writer_header(w, &hlen, &padded);
    if (!json) return 0;
    free(json);
    for (int i = 0; i < w->n; i++) total += w->items[i].bytes;
    return 8 + padded + total;
}

int olmo_st_writer_declare(struct olmo_st_writer *w, const char *name, enum olmo_st_dtype dtype, int ndim, const int64_t *shape) {
    if (strlen(name) >= sizeof w->items[0].name || ndim > 8) return olmo_error("bad tensor '%s'", name);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        void *p = realloc(w->items, sizeof *w->items * (size_t)cap);
        if (!p) return olmo_error("out of memory");
        w->items = p;
        w->cap = cap;
    }
    struct olmo_st_wtensor *t = &w->items[w->n++];
    memset(t, 0, sizeof *t);
    strcpy(t->name, name);
    t->dtype = dtype;
    t->ndim = ndim;
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        numel *= (size_t)shape[i];
    }
    t->bytes = numel * dtype_size(dtype);
    return 0;
}

static void stream_hash(struct olmo_st_stream *s, const uint8_t *p, size_t n) {
    if (s->hash_update) s->hash_update(s->hash_ctx, p, n);
}

static int stream_put(struct olmo_st_stream *s, const void *data, size_t n) {
    const uint8_t *p = data;
    stream_hash(s, p, n);
    while (n) {
        ssize_t k = write(s->fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return olmo_error("writing '%s' failed: %s", s->tmp, strerror(errno));
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int olmo_st_stream_begin(struct olmo_st_stream *s, const struct olmo_st_writer *w, const char *path) {
    void (*hash_update)(void *, const uint8_t *, size_t) = s->hash_update;
    void *hash_ctx = s->hash_ctx;
    memset(s, 0, sizeof *s);
    s->hash_update = hash_update;
    s->hash_ctx = hash_ctx;
    s->fd = -1;
    if (snprintf(s->path, sizeof s->path, "%s", path) >= (int)sizeof s->path ||
        snprintf(s->tmp, sizeof s->tmp, "%s.tmp", path) >= (int)sizeof s->tmp)
        return olmo_error("path too long: '%s'", path);
    size_t hlen, padded;
    char *json = writer_header(w, &hlen, &padded);
    if (!json) return olmo_error("out of memory writing '%s'", path);
    s->fd = olmo_open_tmp(path, "safetensors file", s->tmp, sizeof s->tmp);
    if (s->fd < 0) {
        free(json);
        return -1;
    }
    for (int i = 0; i < w->n; i++) s->expected += w->items[i].bytes;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int rc = stream_put(s, len8, 8) || stream_put(s, json, hlen);
    for (size_t i = hlen; i < padded && !rc; i++) rc = stream_put(s, " ", 1);
    free(json);
    s->size = 8 + padded;
    if (rc) olmo_st_stream_abort(s);
    return rc ? -1 : 0;
}

int olmo_st_stream_write(struct olmo_st_stream *s, const void *data, size_t bytes) {
    if (s->written + bytes > s->expected)
        return olmo_error("internal: '%s': %zu data bytes written, more than the header's %zu", s->path,
                          s->written + bytes, s->expected);
    if (stream_put(s, data, bytes)) return -1;
    s->written += bytes;
    s->size += bytes;
    return 0;
}

int olmo_st_stream_finish(struct olmo_st_stream *s) {
    if (s->written != s->expected) {
        olmo_st_stream_abort(s);
        return olmo_error("internal: '%s': %zu data bytes written, the header announces %zu", s->path, s->written,
                          s->expected);
    }
    const int fd = s->fd;
    s->fd = -1;
    if (fsync(fd) || close(fd)) {
        unlink(s->tmp);
        return olmo_error("writing '%s' failed: %s", s->path, strerror(errno));
    }
    return olmo_commit_tmp(s->tmp, s->path, "safetensors file");
}

void olmo_st_stream_abort(struct olmo_st_stream *s) {
    if (s->fd >= 0) {
        close(s->fd);
        unlink(s->tmp);
    }
    s->fd = -1;
}

int olmo_st_convert_f32(enum olmo_st_dtype dtype, const void *src_bytes, size_t n, float *dst) {
    const uint8_t *src = src_bytes;
    switch (dtype) {
    case OLMO_ST_F32: memcpy(dst, src, n * 4); return 0;
    case OLMO_ST_BF16:
        for (size_t i = 0; i < n; i++) {
            uint32_t bits = (uint32_t)(src[2 * i] | (src[2 * i + 1] << 8)) << 16;
            memcpy(&dst[i], &bits, 4);
        }
        return 0;
    case OLMO_ST_F16:
        for (size_t i = 0; i < n; i++) dst[i] = half_to_float((uint16_t)(src[2 * i] | (src[2 * i + 1] << 8)));
        return 0;
    default: return olmo_error("%s is not a float type olmoc reads (F32, BF16, F16)", dtype_name(dtype));
    }
}

size_t olmo_st_dtype_size(enum olmo_st_dtype d) { return dtype_size(d); }
const char *olmo_st_dtype_name(enum olmo_st_dtype d) { return dtype_name(d); }
