/* olmoc info: the resolved config, parameter counts and attention layout. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "config/config.h"
#include "model/model.h"
#include "util/error.h"

int cmd_info(int argc, char **argv) {
    const char *path = NULL;
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: olmoc info CONFIG.yaml [--set KEY=VALUE ...]\n\n"
                   "Prints the resolved config (YAML), parameter counts, FLOPs per token and\n"
                   "which layers use sliding-window or full attention.\n");
            return 0;
        }
        if (!strcmp(argv[i], "--set")) {
            if (++i >= argc) {
                fprintf(stderr, "olmoc info: --set needs KEY=VALUE\n");
                return 2;
            }
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "olmoc info: unexpected argument '%s' (see --help)\n", argv[i]);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        fprintf(stderr, "usage: olmoc info CONFIG.yaml [--set KEY=VALUE ...]\n");
        return 2;
    }
    if (olmo_config_load(&cfg, path)) goto fail;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--set") && olmo_config_set(&cfg, argv[++i])) goto fail;
    if (olmo_config_validate(&cfg) || olmo_config_write_fp(&cfg, stdout)) goto fail;
    const struct olmo_model_config *m = &cfg.model;
    printf("# parameters: %zu total, %zu without the input embedding\n", olmo_model_count_params(m, true),
           olmo_model_count_params(m, false));
    printf("# training FLOPs per token at seq_len %d: %.4g\n", cfg.train.seq_len,
           olmo_model_flops_per_token(m, cfg.train.seq_len));
    printf("# attention: ");
    for (int l = 0; l < m->n_layers; l++) putchar(olmo_layer_is_full_attention(m, l) ? 'F' : 'S');
    printf("  (S = sliding window %d, F = full)\n", m->sliding_window);
    return 0;
fail:
    fprintf(stderr, "olmoc info: %s\n", olmo_last_error());
    return 1;
}
