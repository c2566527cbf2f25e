#include "data/token_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"
#include "util/rng.h"

/* Parses the .npy v1/v2/v3 header: a 1-D, C-order array of <u2, <u4 or <i4. */
static int parse_npy_header(struct olmo_token_file *f) {
    const uint8_t *p = f->map;
    if (f->map_size < 10 || memcmp(p, "\x93NUMPY", 6))
        return olmo_error("'%s': not a .npy file (bad magic at offset 0)", f->path);
    size_t hlen, hstart;
    if (p[6] == 1) {
        hlen = (size_t)p[8] | (size_t)p[9] << 8;
        hstart = 10;
    } else if (p[6] == 2 || p[6] == 3) {
        if (f->map_size < 12) return olmo_error("'%s': truncated .npy header", f->path);
        hlen = (size_t)p[8] | (size_t)p[9] << 8 | (size_t)p[10] << 16 | (size_t)p[11] << 24;
        hstart = 12;
    } else {
        return olmo_error("'%s': unsupported .npy version %d", f->path, p[6]);
    }
    if (hstart + hlen > f->map_size || hlen > 65536)
        return olmo_error("'%s': .npy header of %zu bytes runs past the end of the file", f->path, hlen);
    char header[65537];
    memcpy(header, p + hstart, hlen);
    header[hlen] = 0;
    const char *descr = strstr(header, "'descr':");
    const char *order = strstr(header, "'fortran_order':");
    const char *shape = strstr(header, "'shape':");
    if (!descr || !order || !shape) return olmo_error("'%s': .npy header lacks descr/fortran_order/shape", f->path);
    const char *dt = descr + 8;
    while (*dt == ' ') dt++;
    if (!strncmp(dt, "'<u2'", 5))
        f->elem_size = 2;
    else if (!strncmp(dt, "'<u4'", 5) || !strncmp(dt, "'<i4'", 5))
        f->elem_size = 4;
    else
        return olmo_error("'%s': token dtype must be uint16, uint32 or int32 (little-endian); header says %.8s",
                          f->path, dt);
    const char *fo = order + 16;
    while (*fo == ' ') fo++;
    if (strncmp(fo, "False", 5)) return olmo_error("'%s': Fortran-ordered arrays are not supported", f->path);
    const char *s = shape + 8;
    while (*s == ' ') s++;
    unsigned long long n = 0;
    int consumed = 0;
    if (sscanf(s, "(%llu,)%n", &n, &consumed) != 1 || consumed == 0)
        return olmo_error("'%s': token array must be 1-D, shape is %.40s", f->path, s);
    f->data_offset = hstart + hlen;
    f->n_tokens = (size_t)n;
    if (f->data_offset + f->n_tokens * (size_t)f->elem_size > f->map_size)
        return olmo_error("'%s': truncated: header promises %zu tokens (%zu bytes) but only %zu data bytes follow",
                          f->path, f->n_tokens, f->n_tokens * (size_t)f->elem_size, f->map_size - f->data_offset);
    f->data = f->map + f->data_offset;
    return 0;
}

int olmo_token_file_open(struct olmo_token_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return olmo_error("cannot open token file '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || st.st_size == 0) {
        close(fd);
        return olmo_error("token file '%s' is empty", path);
    }
    f->map_size = (size_t)st.st_size;
    f->map = mmap(NULL, f->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        return olmo_error("cannot map '%s': %s", path, strerror(errno));
    }
    if (parse_npy_header(f)) {
        olmo_token_file_close(f);
        return -1;
    }
    return 0;
}

void olmo_token_file_close(struct olmo_token_file *f) {
    if (f->map) munmap(f->map, f->map_size);
    memset(f, 0, sizeof *f);
}

int olmo_token_file_read(const struct olmo_token_file *f, size_t start, size_t n, int vocab_size, int32_t *dst) {
    for (size_t i = 0; i < n; i++) {
        size_t idx = start + i;
        uint32_t v;
        if (f->elem_size == 2) {
            uint16_t h;
            memcpy(&h, f->data + idx * 2, 2);
            v = h;
        } else {
            memcpy(&v, f->data + idx * 4, 4);
        }
        if (v >= (uint32_t)vocab_size)
            return olmo_error("'%s': token id %u at byte offset %zu is >= vocab size %d", f->path, v,
                              f->data_offset + idx * (size_t)f->elem_size, vocab_size);
        dst[i] = (int32_t)v;
    }
    return 0;
}

static void shuffle_epoch(struct olmo_loader *l) {
    struct olmo_rng rng;
    olmo_rng_seed(&rng, l->seed + (uint64_t)l->epoch);
    for (size_t i = 0; i < l->n_instances; i++) l->order[i] = i;
    for (size_t i = l->n_instances; i > 1; i--) {
        size_t j = (size_t)(olmo_rng_next(&rng) % i);
        size_t tmp = l->order[i - 1];
        l->order[i - 1] = l->order[j];
        l->order[j] = tmp;
    }
    l->pos = 0;
}

int olmo_loader_open(struct olmo_loader *l, const char *path, int seq_len, int vocab_size, uint64_t seed) {
    memset(l, 0, sizeof *l);
    if (olmo_token_file_open(&l->file, path)) return -1;
    l->seq_len = seq_len;
    l->vocab_size = vocab_size;
    l->seed = seed;
    l->n_instances = l->file.n_tokens / (size_t)seq_len;
    if (l->n_instances == 0) {
        olmo_loader_close(l);
        return olmo_error("'%s' has %zu tokens, fewer than one instance of seq_len %d", path,
                          l->file.n_tokens, seq_len);
    }
    l->order = olmo_malloc(l->n_instances * sizeof(size_t), "instance order");
    if (!l->order) {
        olmo_loader_close(l);
        return -1;
    }
    shuffle_epoch(l);
    return 0;
}

void olmo_loader_close(struct olmo_loader *l) {
    olmo_token_file_close(&l->file);
    free(l->order);
    memset(l, 0, sizeof *l);
}

int olmo_loader_next(struct olmo_loader *l, int32_t *dst, int n_rows) {
    for (int r = 0; r < n_rows; r++) {
        if (l->pos == l->n_instances) {
            l->epoch++;
            shuffle_epoch(l);
        }
        size_t inst = l->order[l->pos++];
        if (olmo_token_file_read(&l->file, inst * (size_t)l->seq_len, (size_t)l->seq_len, l->vocab_size,
                                 dst + (size_t)r * l->seq_len))
            return -1;
    }
    return 0;
}
