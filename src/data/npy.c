#include "data/npy.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

static const uint8_t NPY_MAGIC[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

int olmo_npy_is_npy(const uint8_t *p, size_t size) { return size >= 6 && !memcmp(p, NPY_MAGIC, 6); }

int olmo_npy_write_header(FILE *f, int elem_size, uint64_t n) {
    char dict[118];
    int k = snprintf(dict, sizeof dict, "{'descr': '<u%d', 'fortran_order': False, 'shape': (%llu,), }", elem_size,
                     (unsigned long long)n);
    if (k < 0 || k >= (int)sizeof dict - 1) return -1;
    memset(dict + k, ' ', sizeof dict - (size_t)k);
    dict[sizeof dict - 1] = '\n';
    unsigned char head[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)sizeof dict, 0};
    if (fwrite(head, 1, 10, f) != 10 || fwrite(dict, 1, sizeof dict, f) != sizeof dict) return -1;
    return 0;
}

static const char *skip_blanks(const char *s) {
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r') s++;
    return s;
}

/* The value of key in a dict literal ('key': value or "key": value), blanks skipped; NULL if absent. */
static const char *dict_value(const char *dict, const char *key) {
    const size_t n = strlen(key);
    for (const char *k = dict; (k = strpbrk(k, "'\"")); k++) {
        if (strncmp(k + 1, key, n) || k[n + 1] != k[0]) continue;
        const char *colon = skip_blanks(k + n + 2);
        if (*colon == ':') return skip_blanks(colon + 1);
    }
    return NULL;
}

int olmo_npy_parse_header(const uint8_t *p, size_t size, const char *path, int *elem_size, size_t *data_offset,
                          size_t *n_elems) {
    if (size < 10) return olmo_error("'%s': truncated .npy header (file has %zu bytes)", path, size);
    size_t hlen, hstart;
    if (p[6] == 1) {
        hlen = (size_t)p[8] | (size_t)p[9] << 8;
        hstart = 10;
    } else if (p[6] == 2 || p[6] == 3) {
        if (size < 12) return olmo_error("'%s': truncated .npy header", path);
        hlen = (size_t)p[8] | (size_t)p[9] << 8 | (size_t)p[10] << 16 | (size_t)p[11] << 24;
        hstart = 12;
    } else {
        return olmo_error("'%s': unsupported .npy version %d at byte offset 6 (1, 2 and 3 are read)", path, p[6]);
    }
    if (hlen > 65536)
        return olmo_error("'%s': the .npy header length at offset 8 is %zu bytes, more than olmoc reads (65536)", path,
                          hlen);
    if (hstart + hlen > size)
        return olmo_error("'%s': truncated .npy header: %zu header bytes announced at offset 8, file has %zu bytes",
                          path, hlen, size);
    char header[65537];
    memcpy(header, p + hstart, hlen);
    header[hlen] = 0;
    /* the header is a Python dict literal: keys and strings in either quote (numpy reads it with
     * ast.literal_eval), blanks anywhere between tokens */
    const char *descr = dict_value(header, "descr"), *order = dict_value(header, "fortran_order"),
               *shape = dict_value(header, "shape");
    if (!descr || !order || !shape) {
        return olmo_error("'%s': .npy header has no '%s' entry: %.80s", path,
                          !descr ? "descr" : !order ? "fortran_order" : "shape", header);
    }
    const char q = *descr;
    const char *dt = descr + 1, *dt_end = q == '\'' || q == '"' ? strchr(dt, q) : NULL;
    const size_t dt_len = dt_end ? (size_t)(dt_end - dt) : 0;
    if (dt_end && dt_len == 3 && !strncmp(dt, "<u2", 3))
        *elem_size = 2;
    else if (dt_end && dt_len == 3 && (!strncmp(dt, "<u4", 3) || !strncmp(dt, "<i4", 3)))
        *elem_size = 4;
    else
        return olmo_error("'%s': wrong dtype at byte offset %zu: token arrays must be uint16, uint32 or int32 "
                          "(little-endian: '<u2', '<u4', '<i4'), header says %.*s",
                          path, hstart + (size_t)(descr - header), dt_end ? (int)dt_len + 2 : 12, descr);
    const bool fortran = !strncmp(order, "True", 4);
    if (!fortran && strncmp(order, "False", 5))
        return olmo_error("'%s': .npy header's fortran_order is neither True nor False: %.12s", path, order);
    /* shape: "(N,)" with any blanks; anything else is a shape of another rank, said as such */
    const char *sp = shape;
    int rank = -1;
    unsigned long long n = 0;
    if (*sp == '(') {
        sp = skip_blanks(sp + 1);
        if (*sp == ')') {
            rank = 0;
        } else if (*sp >= '0' && *sp <= '9') {
            char *end;
            errno = 0;
            n = strtoull(sp, &end, 10);
            const char *after = skip_blanks(end);
            if (errno) return olmo_error("'%s': .npy shape %.40s is too large", path, shape);
            if (*after == ',' && *skip_blanks(after + 1) == ')') rank = 1;
            else if (*after == ',') rank = 2; /* (a, b, ...) */
        }
    }
    if (rank != 1) {
        const char *close = strchr(shape, ')');
        const int len = close && close - shape < 80 ? (int)(close - shape) + 1 : 40;
        if (rank == 0 || rank == 2)
            return olmo_error("'%s': token array must be 1-D, the .npy header's shape %.*s has %s", path, len, shape,
                              rank == 0 ? "no dimension (a scalar)" : "two or more dimensions");
        return olmo_error("'%s': .npy header's shape is not a tuple of sizes: %.*s", path, len, shape);
    }
    /* Fortran or C order: the same bytes for one dimension */
    *data_offset = hstart + hlen;
    *n_elems = (size_t)n;
    size_t have = size - *data_offset;
    if (*n_elems > have / (size_t)*elem_size)
        return olmo_error("'%s': truncated: header promises %zu tokens of %d bytes from offset %zu, but the file "
                          "ends at offset %zu (room for %zu)",
                          path, *n_elems, *elem_size, *data_offset, size, have / (size_t)*elem_size);
    return 0;
}

