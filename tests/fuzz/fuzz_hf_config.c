/* Fuzz target: a Hugging Face config.json as `olmoc convert --from-hf` and
 * `olmoc eval HFDIR` read it. */
#include "fuzz_input.h"
#include "model/hf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write_input(data, size, ".json");
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    if (path && olmo_hf_read_config(path, &cfg) == 0) olmo_config_validate(&cfg);
    return 0;
}
