/* safetensors (Hugging Face's tensor file format): an 8-byte little-endian
 * header length, a JSON header naming each tensor's dtype, shape and byte
 * range, then the raw data.  The reader never trusts the header: its size is
 * bounded and every offset, shape and dtype is checked against the file;
 * as the format says, the header is one JSON object (padding: whitespace
 * only), names are unique, `__metadata__` maps strings to strings, offsets
 * are integers and the byte ranges tile the data section (no overlap, no
 * hole).  Names are sorted once and looked up by binary search: a header
 * parses in O(n log n) time for n names, whatever the names are (no hash an
 * input could make collide). */
#ifndef OLMOC_SAFETENSORS_H
#define OLMOC_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

enum olmo_st_dtype { OLMO_ST_F32, OLMO_ST_F64, OLMO_ST_F16, OLMO_ST_BF16, OLMO_ST_I32, OLMO_ST_I64 };

struct olmo_st_tensor {
    char name[160];
    enum olmo_st_dtype dtype;
    int ndim;
    int64_t shape[8];
    size_t begin, end; /* byte range inside the data section */
};

struct olmo_st_file {
    char path[1024];
    uint8_t *map;      /* whole file, mmap'ed read-only */
    size_t map_size;
    const uint8_t *data;
    size_t data_size;
    int n_tensors;
    struct olmo_st_tensor *tensors;
    int *sorted; /* indices into tensors, in strcmp order of their names */
    int n_meta;  /* "__metadata__": its string pairs, in header order */
    char **meta; /* key 0, value 0, key 1, value 1, ... */
};

int olmo_st_open(struct olmo_st_file *f, const char *path);
void olmo_st_close(struct olmo_st_file *f);
const struct olmo_st_tensor *olmo_st_find(const struct olmo_st_file *f, const char *name);
/* The value of "__metadata__" entry key, or NULL when the header has none. */
const char *olmo_st_metadata(const struct olmo_st_file *f, const char *key);
size_t olmo_st_numel(const struct olmo_st_tensor *t);
/* Converts any float dtype to float32 into dst (numel floats). */
int olmo_st_read_f32(const struct olmo_st_file *f, const struct olmo_st_tensor *t, float *dst);
/* Reads an integer tensor (I32 or I64) into int32 dst, range-checked. */
int olmo_st_read_i32(const struct olmo_st_file *f, const struct olmo_st_tensor *t, int32_t *dst);

#define OLMO_ST_MAX_META 16

/* Writer: collects tensors (data is copied), then writes atomically
 * (temp file + fsync + rename). */
struct olmo_st_writer {
    int n, cap;
    struct olmo_st_wtensor {
        char name[160];
        enum olmo_st_dtype dtype;
        int ndim;
        int64_t shape[8];
        void *data;
        size_t bytes;
    } *items;
    int n_meta; /* "__metadata__" string pairs (at most OLMO_ST_MAX_META), owned */
    char *meta[OLMO_ST_MAX_META][2];
};

int olmo_st_writer_add(struct olmo_st_writer *w, const char *name, enum olmo_st_dtype dtype, int ndim, const int64_t *shape,
                  const void *data);
/* Adds a "__metadata__" entry (e.g. "format": "pt", which transformers expects); the strings are copied. */
int olmo_st_writer_set_metadata(struct olmo_st_writer *w, const char *key, const char *value);
int olmo_st_writer_save(struct olmo_st_writer *w, const char *path);
void olmo_st_writer_free(struct olmo_st_writer *w);

/* Streaming writer, for files larger than one wants in memory: declare every
 * tensor (olmo_st_writer_declare: name, dtype, shape; no data), olmo_st_stream_begin
 * writes the header to path.tmp, olmo_st_stream_write appends the data in file
 * order (any pieces), olmo_st_stream_finish checks that exactly the declared bytes
 * came, fsyncs and renames into place.  The file is byte-identical to what
 * olmo_st_writer_save writes for the same tensors.  hash_update (optional, set
 * before begin) sees every byte written, header included. */
struct olmo_st_stream {
    char path[1100], tmp[1110];
    int fd;
    size_t expected, written; /* data-section bytes */
    size_t size;              /* file bytes so far */
    void (*hash_update)(void *ctx, const uint8_t *p, size_t n);
    void *hash_ctx;
};
int olmo_st_writer_declare(struct olmo_st_writer *w, const char *name, enum olmo_st_dtype dtype, int ndim, const int64_t *shape);
/* The size of the file olmo_st_writer_save / the streaming writer writes for w's tensors. */
size_t olmo_st_writer_file_size(const struct olmo_st_writer *w);
int olmo_st_stream_begin(struct olmo_st_stream *s, const struct olmo_st_writer *w, const char *path);
int olmo_st_stream_write(struct olmo_st_stream *s, const void *data, size_t bytes);
int olmo_st_stream_finish(struct olmo_st_stream *s);
void olmo_st_stream_abort(struct olmo_st_stream *s); /* removes path.tmp */

/* n values of a float dtype (F32, BF16, F16; little-endian bytes) widened to float32. */
int olmo_st_convert_f32(enum olmo_st_dtype dtype, const void *src, size_t n, float *dst);
size_t olmo_st_dtype_size(enum olmo_st_dtype d);
const char *olmo_st_dtype_name(enum olmo_st_dtype d);

#endif
