#include "data/npy.h"

#include <stdio.h>
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
        return olmo_error("'%s': unsupported .npy version %d at byte offset 6", path, p[6]);
    }
    if (hlen > 65536 || hstart + hlen > size)
        return olmo_error("'%s': truncated .npy header: %zu header bytes announced at offset 8, file has %zu bytes",
                          path, hlen, size);
    char header[65537];
    memcpy(header, p + hstart, hlen);
    header[hlen] = 0;
    const char *descr = strstr(header, "'descr':");
    const char *order = strstr(header, "'fortran_order':");
    const char *shape = strstr(header, "'shape':");
    if (!descr || !order || !shape) return olmo_error("'%s': .npy header lacks descr/fortran_order/shape", path);
    const char *dt = descr + 8;
    while (*dt == ' ') dt++;
    if (!strncmp(dt, "'<u2'", 5))
        *elem_size = 2;
    else if (!strncmp(dt, "'<u4'", 5) || !strncmp(dt, "'<i4'", 5))
        *elem_size = 4;
    else
        return olmo_error("'%s': wrong dtype at byte offset %zu: token arrays must be uint16, uint32 or int32 "
                          "(little-endian), header says %.8s",
                          path, hstart + (size_t)(dt - header), dt);
    const char *fo = order + 16;
    while (*fo == ' ') fo++;
    if (strncmp(fo, "False", 5)) return olmo_error("'%s': Fortran-ordered arrays are not supported", path);
    const char *s = shape + 8;
    while (*s == ' ') s++;
    unsigned long long n = 0;
    int consumed = 0;
    if (sscanf(s, "(%llu,)%n", &n, &consumed) != 1 || consumed == 0)
        return olmo_error("'%s': token array must be 1-D, shape is %.40s", path, s);
    *data_offset = hstart + hlen;
    *n_elems = (size_t)n;
    size_t have = size - *data_offset;
    if (*n_elems > have / (size_t)*elem_size)
        return olmo_error("'%s': truncated: header promises %zu tokens (%zu bytes from offset %zu) but the file "
                          "ends at offset %zu",
                          path, *n_elems, *n_elems * (size_t)*elem_size, *data_offset, size);
    return 0;
}

