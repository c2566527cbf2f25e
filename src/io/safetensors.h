/* safetensors (Hugging Face's tensor file format): an 8-byte little-endian
 * header length, a JSON header naming each tensor's dtype, shape and byte
 * range, then the raw data.  The reader never trusts the header: its size is
 * bounded and every offset, shape and dtype is checked against the file;
 * as the format says, the header is one JSON object (padding: whitespace
 * only), names are unique, `__metadata__` maps strings to strings, offsets
 * are integers and the byte ranges tile the data section (no overlap, no
 * hole).  Names are hashed: a header parses in time linear in its size. */
#ifndef OLMOC_SAFETENSORS_H
#define OLMOC_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

enum st_dtype { ST_F32, ST_F64, ST_F16, ST_BF16, ST_I32, ST_I64 };

struct st_tensor {
    char name[160];
    enum st_dtype dtype;
    int ndim;
    int64_t shape[8];
    size_t begin, end; /* byte range inside the data section */
};

struct st_file {
    char path[1024];
    uint8_t *map;      /* whole file, mmap'ed read-only */
    size_t map_size;
    const uint8_t *data;
    size_t data_size;
    int n_tensors;
    struct st_tensor *tensors;
    int *slots; /* hash table of the names: index into tensors, -1 = empty */
    size_t n_slots;
};

int st_open(struct st_file *f, const char *path);
void st_close(struct st_file *f);
const struct st_tensor *st_find(const struct st_file *f, const char *name);
size_t st_numel(const struct st_tensor *t);
/* Converts any float dtype to float32 into dst (numel floats). */
int st_read_f32(const struct st_file *f, const struct st_tensor *t, float *dst);
/* Reads an integer tensor (I32 or I64) into int32 dst, range-checked. */
int st_read_i32(const struct st_file *f, const struct st_tensor *t, int32_t *dst);

/* Writer: collects tensors (data is copied), then writes atomically
 * (temp file + fsync + rename). */
struct st_writer {
    int n, cap;
    struct st_wtensor {
        char name[160];
        enum st_dtype dtype;
        int ndim;
        int64_t shape[8];
        void *data;
        size_t bytes;
    } *items;
    int n_meta; /* "__metadata__" string pairs */
    char meta[8][2][64];
};

int st_writer_add(struct st_writer *w, const char *name, enum st_dtype dtype, int ndim, const int64_t *shape,
                  const void *data);
/* Adds a "__metadata__" entry (e.g. "format": "pt", which transformers expects). */
int st_writer_set_metadata(struct st_writer *w, const char *key, const char *value);
int st_writer_save(struct st_writer *w, const char *path);
void st_writer_free(struct st_writer *w);

/* Streaming writer, for files larger than one wants in memory: declare every
 * tensor (st_writer_declare: name, dtype, shape; no data), st_stream_begin
 * writes the header to path.tmp, st_stream_write appends the data in file
 * order (any pieces), st_stream_finish checks that exactly the declared bytes
 * came, fsyncs and renames into place.  The file is byte-identical to what
 * st_writer_save writes for the same tensors.  hash_update (optional, set
 * before begin) sees every byte written, header included. */
struct st_stream {
    char path[1100], tmp[1110];
    int fd;
    size_t expected, written; /* data-section bytes */
    size_t size;              /* file bytes so far */
    void (*hash_update)(void *ctx, const uint8_t *p, size_t n);
    void *hash_ctx;
};
int st_writer_declare(struct st_writer *w, const char *name, enum st_dtype dtype, int ndim, const int64_t *shape);
/* The size of the file st_writer_save / the streaming writer writes for w's tensors. */
size_t st_writer_file_size(const struct st_writer *w);
int st_stream_begin(struct st_stream *s, const struct st_writer *w, const char *path);
int st_stream_write(struct st_stream *s, const void *data, size_t bytes);
int st_stream_finish(struct st_stream *s);
void st_stream_abort(struct st_stream *s); /* removes path.tmp */

/* n values of a float dtype (F32, BF16, F16; little-endian bytes) widened to float32. */
int st_convert_f32(enum st_dtype dtype, const void *src, size_t n, float *dst);
size_t st_dtype_size(enum st_dtype d);
const char *st_dtype_name(enum st_dtype d);

#endif
