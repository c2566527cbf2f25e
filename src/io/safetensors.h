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

#endif
