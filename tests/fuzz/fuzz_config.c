/* Fuzz target: the YAML run config (libyaml events, keys, numbers) and its
 * validation. */
#include "config/config.h"
#include "fuzz_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write_input(data, size, ".yaml");
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    if (path && olmo_config_load(&cfg, path) == 0) olmo_config_validate(&cfg);
    return 0;
}
