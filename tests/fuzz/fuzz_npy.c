/* Fuzz target: token files, as a .npy (header parsed) and as a raw uint32
 * memmap, and reading their first tokens with the vocabulary check. */
#include "data/token_file.h"
#include "fuzz_input.h"

static void read_some(const char *path, enum olmo_dtype dtype) {
    struct olmo_token_file f;
    if (olmo_token_file_open_ex(&f, path, dtype) != 0) return;
    int32_t ids[256];
    size_t n = f.n_tokens < 256 ? f.n_tokens : 256;
    olmo_token_file_read(&f, 0, n, 50000, ids);
    if (f.n_tokens > n) olmo_token_file_read(&f, f.n_tokens - n, n, 1 << 30, ids);
    olmo_token_file_close(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write_input(data, size, ".npy");
    if (path) read_some(path, OLMO_DTYPE_AUTO);
    path = fuzz_write_input(data, size, ".raw");
    if (path) read_some(path, OLMO_DTYPE_UINT32);
    return 0;
}
