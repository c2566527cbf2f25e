/* The content hash of checkpoint files (state.json's "hash64" of each file,
 * with the algorithm in "hash"): streamed while a file is written, or read
 * back from disk.  olmoc writes xxHash's XXH3-64 (seed 0, libxxhash); it
 * reads the 64-bit hash of earlier olmoc versions in checkpoints whose
 * state.json names no algorithm. */
#include "train/checkpoint_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "util/error.h"

/* ---- the earlier olmoc hash (read only) ---- */

static uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static void legacy_begin(struct hash_stream *s, size_t len) {
    s->h = 0x9e3779b97f4a7c15ULL ^ ((uint64_t)len * 0xff51afd7ed558ccdULL);
    s->nbuf = 0;
}

static void hash_word(struct hash_stream *s, uint64_t w) {
    s->h ^= rotl64(w * 0x87c37b91114253d5ULL, 31) * 0x4cf5ad432745937fULL;
    s->h = rotl64(s->h, 27) * 5 + 0x52dce729;
}

static void legacy_update(struct hash_stream *s, const uint8_t *p, size_t n) {
    while (n && s->nbuf) {
        s->buf[s->nbuf++] = *p++;
        n--;
        if (s->nbuf == 8) {
            uint64_t w;
            memcpy(&w, s->buf, 8);
            hash_word(s, w);
            s->nbuf = 0;
        }
    }
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        hash_word(s, w);
    }
    if (n) { /* here nbuf is 0 */
        memcpy(s->buf, p, n);
        s->nbuf = (int)n;
    }
}

static uint64_t legacy_end(struct hash_stream *s) {
    uint64_t tail = 0, h = s->h;
    for (int j = 0; j < s->nbuf; j++) tail |= (uint64_t)s->buf[j] << (8 * j);
    h ^= rotl64(tail * 0x87c37b91114253d5ULL, 31) * 0x4cf5ad432745937fULL;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

/* ---- either, streamed ---- */

const char *ckpt_hash_name(enum ckpt_hash_alg alg) {
    return alg == CKPT_HASH_XXH3_64 ? CKPT_HASH_XXH3_64_NAME : "olmoc's earlier 64-bit hash";
}

int ckpt_stream_begin_hashed(struct olmo_st_stream *s, struct olmo_st_writer *w, struct ckpt_hash *h,
                             const char *path, size_t *bytes) {
    *bytes = olmo_st_writer_file_size(w);
    const int rc = ckpt_hash_begin(h, CKPT_HASH_XXH3_64, *bytes);
    s->hash_update = ckpt_hash_update;
    s->hash_ctx = h;
    return rc ? rc : olmo_st_stream_begin(s, w, path);
}

int ckpt_hash_begin(struct ckpt_hash *h, enum ckpt_hash_alg alg, size_t len) {
    memset(h, 0, sizeof *h);
    h->alg = alg;
    if (alg == CKPT_HASH_LEGACY64) {
        legacy_begin(&h->legacy, len);
        return 0;
    }
    if (!(h->xxh = XXH3_createState())) return olmo_error("out of memory for a file hash");
    if (XXH3_64bits_reset(h->xxh) != XXH_OK) {
        ckpt_hash_free(h);
        return olmo_error("xxHash: cannot start a hash");
    }
    return 0;
}

void ckpt_hash_update(void *ctx, const uint8_t *p, size_t n) {
    struct ckpt_hash *h = ctx;
    if (h->alg == CKPT_HASH_LEGACY64) legacy_update(&h->legacy, p, n);
    else (void)XXH3_64bits_update(h->xxh, p, n); /* fails only for a NULL state */
}

uint64_t ckpt_hash_end(struct ckpt_hash *h) {
    const uint64_t v = h->alg == CKPT_HASH_LEGACY64 ? legacy_end(&h->legacy) : XXH3_64bits_digest(h->xxh);
    ckpt_hash_free(h);
    return v;
}

void ckpt_hash_free(struct ckpt_hash *h) {
    if (h->xxh) XXH3_freeState(h->xxh);
    h->xxh = NULL;
}

uint64_t olmo_hash64(const void *data, size_t len) { return XXH3_64bits(data, len); }

/* Hashes a file read in chunks (no mapping: the page cache, not this
 * process, holds what was read). */
int ckpt_hash_file(const char *path, enum ckpt_hash_alg alg, uint64_t *hash, size_t *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return olmo_error("cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st)) {
        close(fd);
        return olmo_error("cannot stat '%s': %s", path, strerror(errno));
    }
    *size = (size_t)st.st_size;
    uint8_t *buf = malloc(CHUNK_FLOATS * sizeof(float));
    if (!buf) {
        close(fd);
        return olmo_error("out of memory hashing '%s'", path);
    }
    struct ckpt_hash hs;
    if (ckpt_hash_begin(&hs, alg, *size)) {
        free(buf);
        close(fd);
        return olmo_error_context("hashing '%s'", path);
    }
    size_t done = 0;
    int rc = 0;
    while (done < *size) {
        const size_t want = *size - done < CHUNK_FLOATS * sizeof(float) ? *size - done : CHUNK_FLOATS * sizeof(float);
        const ssize_t got = pread(fd, buf, want, (off_t)done);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            rc = olmo_error("reading '%s' failed: %s", path, got < 0 ? strerror(errno) : "the file shrank");
            break;
        }
        ckpt_hash_update(&hs, buf, (size_t)got);
        done += (size_t)got;
    }
    free(buf);
    close(fd);
    *hash = ckpt_hash_end(&hs);
    return rc;
}
