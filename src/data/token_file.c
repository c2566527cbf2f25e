#include "data/token_file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/config.h"
#include "data/npy.h"
#include "io/remote.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/rng.h"
/* numpy's PCG64 for the OLMo-core order, OLMo-core's mix files */
#include "data/mix_file.h"
#include "data/np_random.h"

int olmo_dtype_parse(const char *s, enum olmo_dtype *out) {
    if (!strcmp(s, "auto") || !s[0]) *out = OLMO_DTYPE_AUTO;
    else if (!strcmp(s, "uint16") || !strcmp(s, "u16")) *out = OLMO_DTYPE_UINT16;
    else if (!strcmp(s, "uint32") || !strcmp(s, "u32")) *out = OLMO_DTYPE_UINT32;
    else return olmo_error("unknown token dtype '%s' (expected auto, uint16 or uint32)", s);
    return 0;
}

static int parse_npy_header(struct olmo_token_file *f) {
    if (olmo_npy_parse_header(f->map, f->map_size, f->path, &f->elem_size, &f->data_offset, &f->n_tokens)) return -1;
    f->data = f->map + f->data_offset;
    return 0;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static int setup_raw(struct olmo_token_file *f, enum olmo_dtype dtype) {
    if (dtype == OLMO_DTYPE_AUTO) {
        if (ends_with(f->path, ".u16") || ends_with(f->path, ".uint16")) dtype = OLMO_DTYPE_UINT16;
        else if (ends_with(f->path, ".u32") || ends_with(f->path, ".uint32")) dtype = OLMO_DTYPE_UINT32;
        else
            return olmo_error("'%s' has no .npy header (offset 0); for a raw token file give its dtype "
                              "(uint16 or uint32, e.g. data.dtype) or name it .u16 / .u32",
                              f->path);
    }
    f->elem_size = dtype == OLMO_DTYPE_UINT16 ? 2 : 4;
    if (f->map_size % (size_t)f->elem_size)
        return olmo_error("'%s': truncated raw uint%d token file: %zu bytes is not a whole number of tokens "
                          "(%zu stray bytes at offset %zu)",
                          f->path, 8 * f->elem_size, f->map_size, f->map_size % (size_t)f->elem_size,
                          f->map_size - f->map_size % (size_t)f->elem_size);
    f->data_offset = 0;
    f->n_tokens = f->map_size / (size_t)f->elem_size;
    f->data = f->map;
    return 0;
}

/* A remote file: its size from the server; the header (if any) from its first bytes.  With a cache
 * directory, the local copy is mapped instead. */
static int open_remote(struct olmo_token_file *f, const char *path, uint8_t **head, size_t *head_len) {
    if (olmo_remote_open(&f->remote, path)) return -1;
    char local[2048];
    const int cached = olmo_remote_cached(f->remote, local, sizeof local);
    if (cached) {
        olmo_remote_close(f->remote);
        f->remote = NULL;
        if (cached < 0) return -1;
        *head = NULL;
        return olmo_map_file(local, "token file", &f->map, &f->map_size);
    }
    f->map_size = (size_t)olmo_remote_size(f->remote);
    /* enough for any .npy header olmoc reads (12 + 65536 bytes) */
    *head_len = f->map_size < 65548 ? f->map_size : 65548;
    if (!(*head = olmo_malloc(*head_len, "token file header"))) return -1;
    const size_t first = *head_len < 4096 ? *head_len : 4096;
    if (olmo_remote_read(f->remote, 0, first, *head)) return -1;
    if (first < *head_len && olmo_npy_is_npy(*head, first)) /* a long header: the rest of it */
        return olmo_remote_read(f->remote, first, *head_len - first, *head + first);
    *head_len = first;
    return 0;
}

int olmo_token_file_open_ex(struct olmo_token_file *f, const char *path, enum olmo_dtype dtype) {
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    uint8_t *head = NULL;
    size_t head_len = 0;
    if (olmo_remote_is_url(path)) {
        if (open_remote(f, path, &head, &head_len)) {
            free(head);
            olmo_token_file_close(f);
            return -1;
        }
    } else if (olmo_map_file(path, "token file", &f->map, &f->map_size)) {
        return -1;
    }
    int rc;
    if (head ? olmo_npy_is_npy(head, head_len) : olmo_npy_is_npy(f->map, f->map_size)) {
        /* the header parser reads no further than the header's end, which a remote file's head holds */
        rc = head ? olmo_npy_parse_header(head, f->map_size, f->path, &f->elem_size, &f->data_offset, &f->n_tokens)
                  : parse_npy_header(f);
        if (!rc && dtype != OLMO_DTYPE_AUTO && f->elem_size != (dtype == OLMO_DTYPE_UINT16 ? 2 : 4))
            rc = olmo_error("'%s': the .npy header says %d-byte tokens but uint%d was requested", path, f->elem_size,
                            dtype == OLMO_DTYPE_UINT16 ? 16 : 32);
    } else if (dtype == OLMO_DTYPE_AUTO && ends_with(path, ".npy")) {
        rc = olmo_error("'%s': not a .npy file (bad magic at offset 0); if it is a raw OLMo/dolma memmap, give "
                        "its dtype (uint16 or uint32, e.g. data.dtype)",
                        path);
    } else {
        rc = setup_raw(f, dtype);
    }
    free(head);
    if (rc) {
        olmo_token_file_close(f);
        return -1;
    }
    return 0;
}

int olmo_token_file_open(struct olmo_token_file *f, const char *path) {
    return olmo_token_file_open_ex(f, path, OLMO_DTYPE_AUTO);
}

void olmo_token_file_close(struct olmo_token_file *f) {
    if (f->map) munmap(f->map, f->map_size);
    olmo_remote_close(f->remote);
    memset(f, 0, sizeof *f);
}

/* A token file that shrinks while it is mapped (truncated or rewritten in
 * place under a running trainer) makes reads of the vanished pages raise
 * SIGBUS.  Reads go through a guard: a SIGBUS handler that, when the faulting
 * address lies in the range this thread is copying from, jumps back to
 * olmo_token_file_read, which reports the file.  Any other SIGBUS goes to the
 * previous disposition (the default: the process dies as before). */
static _Thread_local struct {
    sigjmp_buf jump;
    const uint8_t *lo, *hi; /* the mapping being read */
    volatile sig_atomic_t armed;
} read_guard;
static struct sigaction previous_sigbus;
static pthread_once_t sigbus_once = PTHREAD_ONCE_INIT;

static void on_sigbus(int sig, siginfo_t *info, void *context) {
    const uint8_t *addr = info ? (const uint8_t *)info->si_addr : NULL;
    if (read_guard.armed && addr >= read_guard.lo && addr < read_guard.hi) {
        read_guard.armed = 0;
        siglongjmp(read_guard.jump, 1);
    }
    if ((previous_sigbus.sa_flags & SA_SIGINFO) && previous_sigbus.sa_sigaction) {
        previous_sigbus.sa_sigaction(sig, info, context);
    } else if (!(previous_sigbus.sa_flags & SA_SIGINFO) && previous_sigbus.sa_handler != SIG_DFL &&
               previous_sigbus.sa_handler != SIG_IGN) {
        previous_sigbus.sa_handler(sig);
    } else {
        signal(SIGBUS, SIG_DFL); /* the default action: the process dies of SIGBUS */
        raise(SIGBUS);
    }
}

static void install_sigbus_handler(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER; /* NODEFER: SIGBUS stays unblocked after the jump */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &previous_sigbus);
}

static int copy_tokens(const struct olmo_token_file *f, size_t start, size_t n, int vocab_size, int32_t *dst) {
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

/* The bytes land in dst itself, then widen in place from the last token back (token i's 2 or 4
 * bytes lie at or after its int32's start only when read backwards). */
static int read_remote(const struct olmo_token_file *f, size_t start, size_t n, int vocab_size, int32_t *dst) {
    const size_t es = (size_t)f->elem_size;
    if (olmo_remote_read(f->remote, f->data_offset + start * es, n * es, dst)) return -1;
    const uint8_t *raw = (const uint8_t *)dst;
    if (es == 2)
        for (size_t i = n; i-- > 0;) {
            uint16_t h;
            memcpy(&h, raw + i * 2, 2);
            dst[i] = (int32_t)h;
        }
    for (size_t i = 0; i < n; i++)
        if ((uint32_t)dst[i] >= (uint32_t)vocab_size)
            return olmo_error("'%s': token id %u at byte offset %zu is >= vocab size %d", f->path, (uint32_t)dst[i],
                              f->data_offset + (start + i) * es, vocab_size);
    return 0;
}

int olmo_token_file_read(const struct olmo_token_file *f, size_t start, size_t n, int vocab_size, int32_t *dst) {
    if (start > f->n_tokens || n > f->n_tokens - start)
        return olmo_error("'%s': tokens [%zu, %zu + %zu) are outside its %zu tokens", f->path, start, start, n,
                          f->n_tokens);
    if (f->remote) return read_remote(f, start, n, vocab_size, dst);
    pthread_once(&sigbus_once, install_sigbus_handler);
    read_guard.lo = f->map;
    read_guard.hi = f->map + f->map_size;
    if (sigsetjmp(read_guard.jump, 0)) {
        struct stat st;
        long long now = stat(f->path, &st) ? -1 : (long long)st.st_size;
        return olmo_error("token file '%s' shrank while it was being read (%zu bytes when opened, %lld now): it "
                          "must not be modified while olmoc runs",
                          f->path, f->map_size, now);
    }
    read_guard.armed = 1;
    int rc = copy_tokens(f, start, n, vocab_size, dst);
    read_guard.armed = 0;
    return rc;
}


/* ---------------------------------------------------------------- loader */

int olmo_data_order_parse(const char *s, enum olmo_data_order *out) {
    if (!strcmp(s, "olmo_core")) *out = OLMO_ORDER_OLMO_CORE;
    else if (!strcmp(s, "olmoc")) *out = OLMO_ORDER_OLMOC;
    else return olmo_error("unknown data order '%s' (expected olmo_core or olmoc)", s);
    return 0;
}

static uint64_t mix64(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ULL;
    return h ^ (h >> 29);
}

#define SOURCE_SHIFT 48
#define INDEX_MASK ((1ULL << SOURCE_SHIFT) - 1)

/* OLMo-core: epoch e (1-based) is Generator(PCG64(seed + e)).shuffle(arange(N)).  With
 * max_target_sequence_length (chunks of C instances, NumpyFSLDataLoader.chunk_size) the
 * chunks are shuffled, arange(N / C), and each chunk c stands for its instances c*C .. c*C + C-1
 * in order (OLMo-core's np.repeat(chunks * C, C) + arange(C)). */
static int build_epoch_olmo_core(struct olmo_loader *l) {
    const uint64_t e = (uint64_t)l->epoch + 1;
    if (l->seed > UINT64_MAX - e)
        return olmo_error("train.seed %llu + epoch %llu does not fit in 64 bits (the OLMo-core order seeds "
                          "epoch e with seed + e)",
                          (unsigned long long)l->seed, (unsigned long long)e);
    const size_t C = l->chunk, n_chunks = l->dataset_instances / C;
    for (size_t i = 0; i < n_chunks; i++) l->perm[i] = (uint32_t)i;
    olmo_np_shuffle_u32(l->seed + e, l->perm, n_chunks);
    /* expanded in place from the back: chunk c's instances go to [c*C, c*C + C), never below c */
    if (C > 1)
        for (size_t c = n_chunks; c-- > 0;) {
            const uint32_t first = l->perm[c] * (uint32_t)C;
            for (size_t j = C; j-- > 0;) l->perm[c * C + j] = first + (uint32_t)j;
        }
    l->pos = 0;
    return 0;
}

/* Builds this epoch's order (see the header for the composition rule). */
static int build_epoch(struct olmo_loader *l) {
    if (l->order_kind == OLMO_ORDER_OLMO_CORE) return build_epoch_olmo_core(l);
    size_t o = 0;
    for (int s = 0; s < l->n_sources; s++) {
        const struct olmo_loader_source *src = &l->sources[s];
        size_t n = src->n_instances, reps = src->take / n, rest = src->take % n;
        for (size_t r = 0; r < reps; r++)
            for (size_t i = 0; i < n; i++) l->order[o++] = (uint64_t)s << SOURCE_SHIFT | i;
        if (rest) {
            /* seeded random subset of `rest` instances: partial Fisher-Yates */
            uint64_t *idx = olmo_malloc(n * sizeof(uint64_t), "source subset");
            if (!idx) return -1;
            for (size_t i = 0; i < n; i++) idx[i] = i;
            struct olmo_rng rng;
            olmo_rng_seed(&rng, mix64(mix64(mix64(0x5eed, l->seed), (uint64_t)l->epoch), (uint64_t)s));
            for (size_t i = 0; i < rest; i++) {
                size_t j = i + (size_t)(olmo_rng_next(&rng) % (n - i));
                uint64_t tmp = idx[i];
                idx[i] = idx[j];
                idx[j] = tmp;
                l->order[o++] = (uint64_t)s << SOURCE_SHIFT | idx[i];
            }
            free(idx);
        }
    }
    /* global shuffle: the same permutation olmo_loader_open has always used */
    struct olmo_rng rng;
    olmo_rng_seed(&rng, l->seed + (uint64_t)l->epoch);
    for (size_t i = l->n_instances; i > 1; i--) {
        size_t j = (size_t)(olmo_rng_next(&rng) % i);
        uint64_t tmp = l->order[i - 1];
        l->order[i - 1] = l->order[j];
        l->order[j] = tmp;
    }
    l->pos = 0;
    return 0;
}

struct mix_entry {
    char **paths;
    int n_paths;
    double weight;
};

static void free_entries(struct mix_entry *e, int n) {
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < e[i].n_paths; k++) free(e[i].paths[k]);
        free(e[i].paths);
    }
    free(e);
}

/* "a.npy+b.npy:0.7,c.npy:0.3" */
static int parse_mix(const char *mix, struct mix_entry **out, int *n_out) {
    *out = NULL;
    *n_out = 0;
    size_t len = strlen(mix);
    char *copy = olmo_malloc(len + 1, "data mix");
    if (!copy) return -1;
    memcpy(copy, mix, len + 1);
    int cap = 1;
    for (const char *c = mix; *c; c++) cap += *c == ',';
    struct mix_entry *entries = olmo_calloc((size_t)cap, sizeof *entries, "data mix");
    if (!entries) {
        free(copy);
        return -1;
    }
    int n = 0, rc = 0;
    char *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item && !rc; item = strtok_r(NULL, ",", &save)) {
        while (*item == ' ') item++;
        size_t il = strlen(item);
        while (il && item[il - 1] == ' ') item[--il] = 0;
        if (!il) continue;
        struct mix_entry *e = &entries[n++];
        e->weight = 1.0;
        char *colon = strrchr(item, ':');
        if (colon) {
            char *end;
            errno = 0;
            double w = strtod(colon + 1, &end);
            if (end != colon + 1 && !*end && !errno) {
                if (!(w > 0) || !isfinite(w)) {
                    rc = olmo_error("data mix: weight of '%.*s' must be a positive number, got '%s'",
                                    (int)(colon - item), item, colon + 1);
                    break;
                }
                e->weight = w;
                *colon = 0;
            }
        }
        int np = 1;
        for (const char *c = item; *c; c++) np += *c == '+';
        e->paths = olmo_calloc((size_t)np, sizeof(char *), "data mix");
        if (!e->paths) {
            rc = -1;
            break;
        }
        char *psave = NULL;
        for (char *p = strtok_r(item, "+", &psave); p; p = strtok_r(NULL, "+", &psave)) {
            while (*p == ' ') p++;
            size_t pl = strlen(p);
            while (pl && p[pl - 1] == ' ') p[--pl] = 0;
            if (!pl) continue;
            if (!(e->paths[e->n_paths++] = strdup(p))) {
                rc = olmo_error("out of memory");
                break;
            }
        }
        if (!rc && !e->n_paths) rc = olmo_error("data mix: source %d has no file", n);
    }
    free(copy);
    if (!rc && !n) rc = olmo_error("data mix '%s' names no token file", mix);
    if (rc) {
        free_entries(entries, n);
        return -1;
    }
    *out = entries;
    *n_out = n;
    return 0;
}

struct order_opts {
    enum olmo_data_order kind;
    size_t batch_instances;
    int world;
    size_t chunk; /* olmo_core: instances per chunk of max_target_sequence_length tokens (1: none) */
};

/* The OLMo-core order over the opened files: checks the layout, cuts the
 * epoch to whole global batches and builds the first epoch. */
static int setup_olmo_core(struct olmo_loader *l, const struct order_opts *o) {
    if (l->n_sources != 1)
        return olmo_error("data.order olmo_core reads one dataset, the files concatenated in order (join them with "
                          "'+'): a weighted mix of %d sources needs data.order: olmoc",
                          l->n_sources);
    if (o->world <= 0 || o->batch_instances == 0 || o->batch_instances % (size_t)o->world)
        return olmo_error("a global batch of %zu instances cannot be dealt evenly to %d data-parallel ranks",
                          o->batch_instances, o->world);
    if (l->n_instances >= UINT32_MAX)
        return olmo_error("%zu instances: OLMo-core's order indexes instances with uint32", l->n_instances);
    if (l->n_instances < o->batch_instances)
        return olmo_error("'%s'%s: %zu instances of %d tokens, fewer than one global batch of %zu instances (the "
                          "OLMo-core order drops every epoch's last partial batch)",
                          l->files[0].path, l->n_files > 1 ? " and the other files" : "", l->n_instances, l->seq_len,
                          o->batch_instances);
    l->order_kind = OLMO_ORDER_OLMO_CORE;
    l->batch_instances = o->batch_instances;
    l->world = o->world;
    l->chunk = o->chunk;
    l->dataset_instances = l->n_instances;
    l->n_instances = o->batch_instances * (l->dataset_instances / o->batch_instances);
    /* the order, the batch size and the chunking decide which instances a position stands for */
    l->fingerprint = mix64(mix64(l->fingerprint, 0x01c0c0de), (uint64_t)o->batch_instances);
    if (l->chunk > 1) l->fingerprint = mix64(mix64(l->fingerprint, 0xc4c4), (uint64_t)l->chunk);
    l->perm = olmo_malloc(l->dataset_instances * sizeof(uint32_t), "instance order");
    if (!l->perm) return -1;
    return build_epoch(l);
}

/* Opens the files of the sources (takes ownership of entries). */
static int open_entries(struct olmo_loader *l, struct mix_entry *entries, int n_entries, enum olmo_dtype dtype,
                        int seq_len, int vocab_size, uint64_t seed, const struct order_opts *ord) {
    memset(l, 0, sizeof *l);
    if (seq_len <= 0) {
        free_entries(entries, n_entries);
        return olmo_error("seq_len must be positive");
    }
    int n_files = 0;
    for (int i = 0; i < n_entries; i++) n_files += entries[i].n_paths;
    const size_t chunk = ord && ord->kind == OLMO_ORDER_OLMO_CORE ? ord->chunk : 1;
    l->seq_len = seq_len;
    l->vocab_size = vocab_size;
    l->seed = seed;
    l->files = olmo_calloc((size_t)n_files, sizeof *l->files, "token files");
    l->file_first = olmo_calloc((size_t)n_files, sizeof(size_t), "token files");
    l->sources = olmo_calloc((size_t)n_entries, sizeof *l->sources, "data sources");
    if (!l->files || !l->file_first || !l->sources) goto fail;
    l->n_sources = n_entries;
    double wsum = 0;
    uint64_t fp = mix64(mix64(0xda7a, seed), (uint64_t)seq_len);
    for (int s = 0; s < n_entries; s++) {
        struct olmo_loader_source *src = &l->sources[s];
        src->weight = entries[s].weight;
        src->first_file = l->n_files;
        wsum += src->weight;
        uint64_t wbits;
        memcpy(&wbits, &src->weight, 8);
        fp = mix64(mix64(fp, wbits), (uint64_t)entries[s].n_paths);
        for (int k = 0; k < entries[s].n_paths; k++) {
            struct olmo_token_file *f = &l->files[l->n_files];
            if (olmo_token_file_open_ex(f, entries[s].paths[k], dtype)) goto fail;
            l->n_remote += f->remote != NULL;
            l->file_first[l->n_files] = src->n_instances;
            /* OLMo-core's max_target_sequence_length: a file holds whole chunks of `chunk` instances */
            src->n_instances += f->n_tokens / ((size_t)seq_len * chunk) * chunk;
            fp = mix64(mix64(fp, f->n_tokens), (uint64_t)f->elem_size);
            l->n_files++;
            src->n_files++;
        }
        if (src->n_instances == 0) {
            olmo_error("'%s'%s has fewer tokens than one %s %zu", entries[s].paths[0],
                       entries[s].n_paths > 1 ? " (and the other files of its source)" : "",
                       chunk > 1 ? "chunk of data.max_target_sequence_length" : "instance of seq_len",
                       (size_t)seq_len * chunk);
            goto fail;
        }
        if (src->n_instances > INDEX_MASK) {
            olmo_error("source %d has too many instances", s);
            goto fail;
        }
        l->n_instances += src->n_instances;
    }
    /* instances per source and epoch: largest-remainder rounding of N * w / sum(w) */
    size_t given = 0;
    double *frac = olmo_malloc((size_t)n_entries * sizeof(double), "data mix");
    if (!frac) goto fail;
    /* Huge weights (1e308 + 1e308 = inf) would make N * w / sum(w) NaN or inf:
     * then all weights are scaled by a power of two, which keeps every
     * product and quotient as it was, only without the overflow. */
    int scale = 0;
    double wmax = 0;
    for (int s = 0; s < n_entries; s++) wmax = fmax(wmax, l->sources[s].weight);
    if (!isfinite(wsum) || !isfinite((double)l->n_instances * wmax)) {
        scale = -ilogb(wmax);
        wsum = 0;
        for (int s = 0; s < n_entries; s++) wsum += ldexp(l->sources[s].weight, scale);
    }
    for (int s = 0; s < n_entries; s++) {
        double exact = (double)l->n_instances * ldexp(l->sources[s].weight, scale) / wsum;
        if (!(exact >= 0)) exact = 0;
        if (exact > (double)l->n_instances) exact = (double)l->n_instances;
        l->sources[s].take = (size_t)exact;
        frac[s] = exact - (double)l->sources[s].take;
        given += l->sources[s].take;
    }
    if (given > l->n_instances) { /* rounding can never get here; the order array is sized by the total */
        free(frac);
        olmo_error("data mix: the weights give %zu instances per epoch for %zu", given, l->n_instances);
        goto fail;
    }
    while (given < l->n_instances) {
        int best = 0;
        for (int s = 1; s < n_entries; s++)
            if (frac[s] > frac[best]) best = s;
        l->sources[best].take++;
        frac[best] = -1.0;
        given++;
    }
    free(frac);
    l->fingerprint = fp;
    free_entries(entries, n_entries);
    entries = NULL;
    if (ord && ord->kind == OLMO_ORDER_OLMO_CORE) {
        if (setup_olmo_core(l, ord)) goto fail;
        return 0;
    }
    l->order = olmo_malloc(l->n_instances * sizeof(uint64_t), "instance order");
    if (!l->order || build_epoch(l)) goto fail;
    return 0;
fail:
    if (entries) free_entries(entries, n_entries);
    olmo_loader_close(l);
    return -1;
}

int olmo_loader_open_mix(struct olmo_loader *l, const char *mix, enum olmo_dtype dtype, int seq_len, int vocab_size,
                         uint64_t seed) {
    memset(l, 0, sizeof *l);
    struct mix_entry *entries;
    int n_entries;
    if (parse_mix(mix, &entries, &n_entries)) return -1;
    return open_entries(l, entries, n_entries, dtype, seq_len, vocab_size, seed, NULL);
}

int olmo_loader_open(struct olmo_loader *l, const char *path, int seq_len, int vocab_size, uint64_t seed) {
    memset(l, 0, sizeof *l);
    struct mix_entry *e = olmo_calloc(1, sizeof *e, "data source");
    if (!e) return -1;
    e->weight = 1.0;
    e->paths = olmo_calloc(1, sizeof(char *), "data source");
    if (!e->paths || !(e->paths[0] = strdup(path))) {
        free_entries(e, 1);
        return olmo_error("out of memory");
    }
    e->n_paths = 1;
    return open_entries(l, e, 1, OLMO_DTYPE_AUTO, seq_len, vocab_size, seed, NULL);
}

static int open_data_config(struct olmo_loader *l, const struct olmo_data_config *d, int seq_len, int vocab_size,
                            uint64_t seed, const struct order_opts *ord) {
    memset(l, 0, sizeof *l);
    enum olmo_dtype dtype = OLMO_DTYPE_AUTO;
    if (olmo_dtype_parse(d->dtype, &dtype)) return olmo_error_context("data.dtype");
    olmo_remote_set_cache_dir(d->remote_cache_dir);
    struct mix_entry *e;
    int n;
    if (d->mix[0]) {
        if (parse_mix(d->mix, &e, &n)) return olmo_error_context("data.mix");
        if (open_entries(l, e, n, dtype, seq_len, vocab_size, seed, ord)) return olmo_error_context("data.mix");
        return 0;
    }
    if (d->mix_file[0]) {
        if (!(e = olmo_calloc(1, sizeof *e, "data source"))) return -1;
        e->weight = 1.0;
        if (olmo_mix_file_paths(d->mix_file, d->mix_base_dir, d->mix_tokenizer, &e->paths, &e->n_paths)) {
            free(e);
            return olmo_error_context("data.mix_file");
        }
        if (open_entries(l, e, 1, dtype, seq_len, vocab_size, seed, ord)) return olmo_error_context("data.mix_file");
        return 0;
    }
    if (!d->train_path[0]) return olmo_error("no training data: set data.train_path, data.mix or data.mix_file");
    e = olmo_calloc(1, sizeof *e, "data source");
    if (!e) return -1;
    e->weight = 1.0;
    e->paths = olmo_calloc(1, sizeof(char *), "data source");
    if (!e->paths || !(e->paths[0] = strdup(d->train_path))) {
        free_entries(e, 1);
        return olmo_error("out of memory");
    }
    e->n_paths = 1;
    return open_entries(l, e, 1, dtype, seq_len, vocab_size, seed, ord);
}

int olmo_loader_open_config(struct olmo_loader *l, const struct olmo_data_config *d, int seq_len, int vocab_size,
                            uint64_t seed) {
    return open_data_config(l, d, seq_len, vocab_size, seed, NULL);
}

int olmo_loader_open_run(struct olmo_loader *l, const struct olmo_config *cfg, int world) {
    memset(l, 0, sizeof *l);
    struct order_opts ord = {.world = world};
    if (olmo_data_order_parse(cfg->data.order, &ord.kind)) return olmo_error_context("data.order");
    ord.batch_instances = (size_t)cfg->train.micro_batch * (size_t)cfg->train.grad_accum * (size_t)world;
    if (olmo_config_chunk_instances(cfg, &ord.chunk)) return -1;
    return open_data_config(l, &cfg->data, cfg->train.seq_len, cfg->model.vocab_size, cfg->train.seed, &ord);
}

void olmo_loader_close(struct olmo_loader *l) {
    if (l->files)
        for (int i = 0; i < l->n_files; i++) olmo_token_file_close(&l->files[i]);
    free(l->files);
    free(l->file_first);
    free(l->sources);
    free(l->order);
    free(l->perm);
    memset(l, 0, sizeof *l);
}

/* The file of an instance and the instance's index within it. */
static int locate(const struct olmo_loader *l, uint64_t packed, size_t *local) {
    const struct olmo_loader_source *src = &l->sources[packed >> SOURCE_SHIFT];
    size_t idx = (size_t)(packed & INDEX_MASK);
    /* last file of the source whose first instance is <= idx */
    int lo = src->first_file, hi = src->first_file + src->n_files - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (l->file_first[mid] <= idx) lo = mid;
        else hi = mid - 1;
    }
    *local = idx - l->file_first[lo];
    return lo;
}

static int read_instance(const struct olmo_loader *l, uint64_t packed, int32_t *dst) {
    size_t local;
    const int file = locate(l, packed, &local);
    return olmo_token_file_read(&l->files[file], local * (size_t)l->seq_len, (size_t)l->seq_len, l->vocab_size, dst);
}

/* Read-ahead of remote files: the instances of the next n_rows positions of this epoch are queued
 * for the background fetch (io/remote.h) while the caller trains on this batch.  The next epoch's
 * order is built only when it starts, so its first batch is read when it is asked for. */
static void prefetch_next(const struct olmo_loader *l, size_t n_rows) {
    if (!l->n_remote || l->pos + n_rows > l->n_instances) return;
    for (size_t k = 0; k < n_rows; k++) {
        const uint64_t packed = l->order_kind == OLMO_ORDER_OLMO_CORE ? l->perm[l->pos + k] : l->order[l->pos + k];
        size_t local;
        const struct olmo_token_file *f = &l->files[locate(l, packed, &local)];
        const size_t bytes = (size_t)l->seq_len * (size_t)f->elem_size;
        if (f->remote) olmo_remote_prefetch(f->remote, f->data_offset + local * bytes, bytes);
    }
}

/* OLMo-core: one global batch, rank r's instances (r, r + W, ...) in rows [r * B/W, (r+1) * B/W) */
static int next_olmo_core(struct olmo_loader *l, int32_t *dst, int n_rows) {
    const size_t B = l->batch_instances, W = (size_t)l->world, per_rank = B / W;
    if (n_rows < 0 || (size_t)n_rows != B)
        return olmo_error("the OLMo-core data order hands out whole global batches of %zu instances, not %d", B,
                          n_rows);
    if (l->pos + B > l->n_instances) {
        l->epoch++;
        if (build_epoch(l)) return -1;
    }
    for (size_t r = 0; r < W; r++)
        for (size_t k = 0; k < per_rank; k++) {
            const uint32_t idx = l->perm[l->pos + k * W + r];
            if (read_instance(l, idx, dst + (r * per_rank + k) * (size_t)l->seq_len)) return -1;
        }
    l->pos += B;
    prefetch_next(l, B);
    return 0;
}

int olmo_loader_next(struct olmo_loader *l, int32_t *dst, int n_rows) {
    if (l->order_kind == OLMO_ORDER_OLMO_CORE) return next_olmo_core(l, dst, n_rows);
    for (int r = 0; r < n_rows; r++) {
        if (l->pos == l->n_instances) {
            l->epoch++;
            if (build_epoch(l)) return -1;
        }
        if (read_instance(l, l->order[l->pos++], dst + (size_t)r * l->seq_len)) return -1;
    }
    if (n_rows > 0) prefetch_next(l, (size_t)n_rows);
    return 0;
}

void olmo_loader_state_get(const struct olmo_loader *l, struct olmo_loader_state *s) {
    s->epoch = (uint64_t)l->epoch;
    s->position = l->pos;
    s->fingerprint = l->fingerprint;
}

int olmo_loader_state_set(struct olmo_loader *l, const struct olmo_loader_state *s) {
    if (s->fingerprint != l->fingerprint)
        return olmo_error("data loader state was saved for other data (fingerprint %016llx, this data %016llx): "
                          "the files, their sizes, the mix weights, seed, seq_len, data.order and (olmo_core order) the "
                          "global batch size must be the same",
                          (unsigned long long)s->fingerprint, (unsigned long long)l->fingerprint);
    if (s->position > l->n_instances || s->epoch > (uint64_t)LONG_MAX ||
        (l->order_kind == OLMO_ORDER_OLMO_CORE && s->position % l->batch_instances))
        return olmo_error("data loader state out of range: position %llu of %zu instances",
                          (unsigned long long)s->position, l->n_instances);
    if ((long)s->epoch != l->epoch) {
        long old = l->epoch;
        size_t old_pos = l->pos;
        l->epoch = (long)s->epoch;
        if (build_epoch(l)) {
            l->epoch = old;
            build_epoch(l);
            l->pos = old_pos;
            return -1;
        }
    }
    l->pos = (size_t)s->position;
    for (int i = 0; i < l->n_files; i++)
        if (l->files[i].remote) olmo_remote_discard(l->files[i].remote); /* read ahead for the old position */
    return 0;
}
