/* OLMo-style token data.
 *
 * A token file is a flat array of token ids (documents separated by EOS),
 * either a .npy file (1-D, little-endian uint16 / uint32 / int32) or a raw
 * headerless array as OLMo's and dolma's numpy memmaps are (their files are
 * named .npy too but have no header; give the dtype).  Files are
 * memory-mapped, never read whole.  Each file is cut into instances of
 * seq_len tokens (the tail shorter than seq_len is dropped), as OLMo-core's
 * fixed-sequence-length numpy dataset does.
 *
 * A loader draws instances from one file or from a data mix: several sources
 * (each one or more files) with weights.  Every epoch visits a deterministic,
 * seeded order of instances; the loader's position is a few integers
 * (olmo_loader_state) that a checkpoint can store so that a resumed run gets
 * exactly the same next batch.
 *
 * Epoch composition of a mix: N = total instances of all sources; source s
 * gets take_s = N * w_s / sum(w) instances (largest-remainder rounding).  A
 * source with more instances than take_s contributes a seeded random subset
 * that changes every epoch; one with fewer is repeated (every instance
 * floor(take_s / n_s) times, plus a random subset of the rest).  The chosen
 * instances are then shuffled together with the seed + epoch.  A single
 * file, or a mix of one source, visits every instance once per epoch in the
 * same order as olmo_loader_open always has.
 *
 * Data order (data.order).  "olmo_core" (the default of a training run,
 * olmo_loader_open_run) is OLMo-core's NumpyFSLDataLoader order: the files of
 * one source concatenated in order are the dataset; epoch e (1-based) visits
 * np.random.Generator(PCG64(seed + e)).shuffle(arange(N)) (data/np_random.h)
 * cut to whole global batches (the last partial batch of every epoch is
 * dropped), and each global batch is dealt to the data-parallel ranks in turn:
 * rank r gets the batch's instances r, r + W, r + 2W, ...  olmo_loader_next
 * then returns the global batch with each rank's instances contiguous (rank
 * r's rows are [r * B/W, (r+1) * B/W)), which is how the trainer slices it;
 * a rank's micro-batches are consecutive pieces of its rows, as OLMo-core's
 * split_batch cuts a rank batch.  data.max_target_sequence_length (a
 * multiple C x seq_len) is OLMo-core's option of that name: every file holds
 * only whole chunks of C instances, and the epoch shuffles the chunks
 * (arange(N / C)), each chunk's instances kept together in order.  "olmoc" is the order described above
 * (xoshiro256**, a mix's weights, batches running across epoch boundaries,
 * contiguous rank slices).  OLMo-core reads every file as a headerless
 * memmap: for raw token files the instances are the same; a .npy file with
 * a header is read by olmoc after its header. */
#ifndef OLMOC_TOKEN_FILE_H
#define OLMOC_TOKEN_FILE_H

#include <stddef.h>
#include <stdint.h>

enum olmo_dtype {
    OLMO_DTYPE_AUTO = 0, /* .npy header; raw files by extension .u16 / .u32 */
    OLMO_DTYPE_UINT16,
    OLMO_DTYPE_UINT32,
};
/* "auto", "uint16" / "u16", "uint32" / "u32"; anything else is an error. */
int olmo_dtype_parse(const char *s, enum olmo_dtype *out);

enum olmo_data_order {
    OLMO_ORDER_OLMOC = 0,    /* olmoc's own order (olmo_loader_open*, data.order: olmoc) */
    OLMO_ORDER_OLMO_CORE, /* OLMo-core's NumpyFSLDataLoader order (data.order: olmo_core, the default) */
};
/* "olmo_core" or "olmoc"; anything else is an error. */
int olmo_data_order_parse(const char *s, enum olmo_data_order *out);

struct olmo_remote;
struct olmo_token_file {
    char path[1024];
    struct olmo_remote *remote; /* an http(s):// or s3:// file read by ranges (map NULL); see io/remote.h */
    uint8_t *map;
    size_t map_size;
    const uint8_t *data;
    size_t n_tokens;
    int elem_size; /* 2 (uint16) or 4 (uint32 / int32) */
    size_t data_offset;
};

/* Opens a .npy token file (dtype from its header).  A path may be an
 * http(s):// or s3:// URL (io/remote.h): read by byte ranges, or mapped from
 * a local copy when a cache directory is set (data.remote_cache_dir). */
int olmo_token_file_open(struct olmo_token_file *f, const char *path);
/* Opens a .npy file or a raw token file.  With a dtype other than AUTO a raw
 * file is read as that dtype; a .npy header must then agree with it. */
int olmo_token_file_open_ex(struct olmo_token_file *f, const char *path, enum olmo_dtype dtype);
void olmo_token_file_close(struct olmo_token_file *f);
/* Copies tokens [start, start+n) into dst, checking each id < vocab_size
 * (the error names the file and the byte offset of the bad id). */
int olmo_token_file_read(const struct olmo_token_file *f, size_t start, size_t n, int vocab_size, int32_t *dst);

struct olmo_loader_source {
    double weight;
    int first_file, n_files;
    size_t n_instances; /* over its files */
    size_t take;        /* instances per epoch */
};

struct olmo_loader {
    struct olmo_token_file *files;
    size_t *file_first; /* first instance index of each file within its source */
    int n_files;
    int n_remote; /* files read from a URL by ranges: the loader reads their next batch ahead */
    struct olmo_loader_source *sources;
    int n_sources;
    int seq_len, vocab_size;
    uint64_t seed;
    uint64_t fingerprint;
    size_t n_instances; /* instances per epoch */
    uint64_t *order;    /* this epoch's instances: source << 48 | index within source */
    long epoch;
    size_t pos; /* next index into order */
    /* OLMO_ORDER_OLMO_CORE: n_instances is the instances served per epoch
     * (whole global batches), dataset_instances all of them */
    enum olmo_data_order order_kind;
    size_t batch_instances;   /* instances per global batch */
    int world;                /* data-parallel ranks a global batch is dealt to */
    size_t chunk;             /* instances per shuffled chunk (data.max_target_sequence_length / seq_len) */
    size_t dataset_instances; /* instances of the concatenated files */
    uint32_t *perm;           /* this epoch's permutation of the dataset (instead of order) */
};

/* The position of a loader: store these three integers in a checkpoint. */
struct olmo_loader_state {
    uint64_t epoch;       /* epochs completed before the current one */
    uint64_t position;    /* instances of the current epoch already returned */
    uint64_t fingerprint; /* hash of seed, seq_len, files (sizes, dtypes) and weights */
};

/* One .npy file (kept for existing callers). */
int olmo_loader_open(struct olmo_loader *l, const char *path, int seq_len, int vocab_size, uint64_t seed);
/* A data mix: "PATH[+PATH...][:WEIGHT],..." e.g. "web.npy:0.7,code1.npy+code2.npy:0.3"
 * (weight 1 when left out).  dtype applies to raw files (see olmo_token_file_open_ex). */
int olmo_loader_open_mix(struct olmo_loader *l, const char *mix, enum olmo_dtype dtype, int seq_len, int vocab_size,
                         uint64_t seed);
/* From a run config: data.mix when set, else data.train_path; data.dtype for raw files. */
struct olmo_data_config;
int olmo_loader_open_config(struct olmo_loader *l, const struct olmo_data_config *d, int seq_len, int vocab_size,
                            uint64_t seed);
/* The loader of a training run: data.order (default olmo_core) with global
 * batches of train.micro_batch x train.grad_accum x world instances dealt to
 * world data-parallel ranks; data.mix / data.train_path, data.dtype,
 * train.seq_len, model.vocab_size, train.seed. */
struct olmo_config;
int olmo_loader_open_run(struct olmo_loader *l, const struct olmo_config *cfg, int world);
void olmo_loader_close(struct olmo_loader *l);
/* Fills n_rows instances of seq_len tokens; starts a new shuffled epoch when
 * one runs out.  In the olmo_core order n_rows must be one global batch. */
int olmo_loader_next(struct olmo_loader *l, int32_t *dst, int n_rows);

void olmo_loader_state_get(const struct olmo_loader *l, struct olmo_loader_state *s);
/* Moves the loader to a saved position; fails (changing nothing) when the
 * state was saved for different data, seed or seq_len. */
int olmo_loader_state_set(struct olmo_loader *l, const struct olmo_loader_state *s);

#endif
