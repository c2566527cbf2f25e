/* OLMo-style token data: a flat array of token ids (documents separated by
 * EOS) in a .npy file, memory-mapped, cut into fixed-length instances that
 * are visited in a seeded random order, reshuffled every epoch. */
#ifndef OLMOC_TOKEN_FILE_H
#define OLMOC_TOKEN_FILE_H

#include <stddef.h>
#include <stdint.h>

struct olmo_token_file {
    char path[1024];
    uint8_t *map;
    size_t map_size;
    const uint8_t *data;
    size_t n_tokens;
    int elem_size; /* 2 (uint16) or 4 (uint32 / int32) */
    size_t data_offset;
};

int olmo_token_file_open(struct olmo_token_file *f, const char *path);
void olmo_token_file_close(struct olmo_token_file *f);
/* Copies tokens [start, start+n) into dst, checking each id < vocab_size. */
int olmo_token_file_read(const struct olmo_token_file *f, size_t start, size_t n, int vocab_size, int32_t *dst);

struct olmo_loader {
    struct olmo_token_file file;
    int seq_len, vocab_size;
    uint64_t seed;
    size_t n_instances;
    size_t *order; /* permutation of instance indices for the current epoch */
    long epoch;
    size_t pos;    /* next index into order */
};

int olmo_loader_open(struct olmo_loader *l, const char *path, int seq_len, int vocab_size, uint64_t seed);
void olmo_loader_close(struct olmo_loader *l);
/* Fills n_rows instances of seq_len tokens; starts a new shuffled epoch when one runs out. */
int olmo_loader_next(struct olmo_loader *l, int32_t *dst, int n_rows);

#endif
