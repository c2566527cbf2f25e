/* Fuzz target: the safetensors reader (header JSON, offsets, shapes, dtypes)
 * and the dtype conversions of every tensor it accepts. */
#include <stdlib.h>

#include "fuzz_input.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write_input(data, size, ".safetensors");
    struct st_file f;
    if (!path || st_open(&f, path) != 0) return 0;
    for (int i = 0; i < f.n_tensors; i++) {
        const struct st_tensor *t = &f.tensors[i];
        size_t n = st_numel(t);
        if (n > (1u << 20) || st_find(&f, t->name) == NULL) continue;
        void *buf = malloc(n ? n * sizeof(float) : 1);
        if (!buf) break;
        if (t->dtype == ST_I32 || t->dtype == ST_I64)
            st_read_i32(&f, t, buf);
        else
            st_read_f32(&f, t, buf);
        free(buf);
    }
    st_close(&f);
    return 0;
}
