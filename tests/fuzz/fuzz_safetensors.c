/* Fuzz target: the safetensors reader (header JSON, offsets, shapes, dtypes)
 * and the dtype conversions of every tensor it accepts. */
#include <stdlib.h>

#include "fuzz_input.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write_input(data, size, ".safetensors");
    struct olmo_st_file f;
    if (!path || olmo_st_open(&f, path) != 0) return 0;
    for (int i = 0; i < f.n_tensors; i++) {
        const struct olmo_st_tensor *t = &f.tensors[i];
        size_t n = olmo_st_numel(t);
        if (n > (1u << 20) || olmo_st_find(&f, t->name) == NULL) continue;
        void *buf = malloc(n ? n * sizeof(float) : 1);
        if (!buf) break;
        if (t->dtype == OLMO_ST_I32 || t->dtype == OLMO_ST_I64)
            olmo_st_read_i32(&f, t, buf);
        else
            olmo_st_read_f32(&f, t, buf);
        free(buf);
    }
    olmo_st_close(&f);
    return 0;
}
