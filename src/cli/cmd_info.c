/* olmoc info: the resolved config, parameter counts and attention layout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "config/config.h"
#include "data/token_file.h"
#include "model/model.h"
#include "util/error.h"

/* "--data": the training data as olmoc train opens it on `ranks` ranks. */
static int print_data(const struct olmo_config *cfg, int ranks) {
    struct olmo_loader l;
    if (olmo_loader_open_run(&l, cfg, ranks)) return olmo_error_context("the training data");
    printf("# data: %zu instances per epoch, %zu in the files, global batch %zu, fingerprint %llu\n", l.n_instances,
           l.order_kind == OLMO_ORDER_OLMO_CORE ? l.dataset_instances : l.n_instances,
           (size_t)cfg->train.micro_batch * (size_t)cfg->train.grad_accum * (size_t)ranks,
           (unsigned long long)l.fingerprint);
    olmo_loader_close(&l);
    return 0;
}

int cmd_info(int argc, char **argv) {
    const char *path = NULL;
    int ranks = 0;
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: olmoc info CONFIG.yaml [--set KEY=VALUE ...] [--data RANKS]\n\n"
                   "Prints the resolved config (YAML), parameter counts, FLOPs per token and\n"
                   "which layers use sliding-window or full attention.\n\n"
                   "  --data RANKS   also open the training data as olmoc train does on RANKS ranks and\n"
                   "                 print '# data: N instances per epoch, M in the files, global batch B,\n"
                   "                 fingerprint F' (F: the loader fingerprint a checkpoint's state.json\n"
                   "                 records; scripts/import_olmo_core.py uses it)\n");
            return 0;
        }
        if (!strcmp(argv[i], "--data")) {
            char *end = NULL;
            long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
            if (i + 1 >= argc || !end || *end || v < 1 || v > 1000000) {
                fprintf(stderr, "olmoc info: --data needs a number of ranks (1 to 1000000)\n");
                return 2;
            }
            ranks = (int)v;
            i++;
        } else if (!strcmp(argv[i], "--set")) {
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
        fprintf(stderr, "usage: olmoc info CONFIG.yaml [--set KEY=VALUE ...] [--data RANKS]\n");
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
    if (ranks && print_data(&cfg, ranks)) goto fail;
    return 0;
fail:
    fprintf(stderr, "olmoc info: %s\n", olmo_last_error());
    return 1;
}
