/* olmoc info: the resolved config, parameter counts and attention layout,
 * and with --ranks a memory plan (train/memplan.h). */
#include <omp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "config/config.h"
#include "data/token_file.h"
#include "model/model.h"
#include "train/memplan.h"
#include "util/error.h"
#include "util/sysmem.h"

struct info_args {
    const char *config, *backend;
    int ranks, shard_degree, data_ranks; /* 0, -1, 0 when not given */
    double memory;                       /* bytes; 0 when not given */
    struct olmo_cli_list sets;
};

#define ARG(field) offsetof(struct info_args, field)
static const struct olmo_cli_option info_options[] = {
    {.kind = OLMO_CLI_ARG, .name = "CONFIG.yaml", .offset = ARG(config)},
    {.kind = OLMO_CLI_LIST, .name = "--set", .offset = ARG(sets), .metavar = "KEY=VALUE",
     .help = "override a config value (repeatable)"},
    {.kind = OLMO_CLI_INT, .name = "--ranks", .offset = ARG(ranks), .metavar = "N", .min = 1, .max = 1 << 20,
     .expects = "needs an integer >= 1 (at most 1048576)", .help = "data-parallel ranks (default 1)"},
    {.kind = OLMO_CLI_INT, .name = "--shard-degree", .offset = ARG(shard_degree), .metavar = "K", .min = 0,
     .max = 1 << 20, .expects = "needs an integer >= 0 (at most 1048576)",
     .help = "fsdp: shard within groups of K ranks (default\n"
             "train.shard_degree; 0 = all ranks)"},
    {.kind = OLMO_CLI_STRING, .name = "--backend", .offset = ARG(backend), .metavar = "NAME",
     .help = "cpu, cpu-openblas, cpu-onednn, cpu-bf16, cuda,\n"
             "cuda-tf32, cuda-bf16, cuda-bf16-cublas (default cpu);\n"
             "a CUDA build is not needed to plan for CUDA"},
    {.kind = OLMO_CLI_SIZE, .name = "--device-memory", .offset = ARG(memory), .metavar = "SIZE",
     .help = "memory per rank, e.g. 141GB or 131.6GiB (an H200);\n"
             "default: for CPU backends this machine's memory (or\n"
             "ulimit), for CUDA not judged"},
    {.kind = OLMO_CLI_INT, .name = "--data", .offset = ARG(data_ranks), .metavar = "RANKS", .min = 1,
     .max = 1000000, .expects = "needs a number of ranks (1 to 1000000)",
     .help = "also open the training data as olmoc train does on RANKS\n"
             "ranks and print '# data: N instances per epoch, M in the\n"
             "files, global batch B, fingerprint F' (F: the loader\n"
             "fingerprint a checkpoint's state.json records;\n"
             "scripts/import_olmo_core.py uses it)"},
    {.kind = OLMO_CLI_END},
};
#undef ARG

static const struct olmo_cli_command info_command = {
    "info",
    "olmoc info CONFIG.yaml [--set KEY=VALUE ...] [--data RANKS] [--ranks N [--shard-degree K]\n"
    "           [--backend NAME] [--device-memory SIZE]]",
    "Prints the resolved config (YAML), parameter counts, FLOPs per token and\n"
    "which layers use sliding-window or full attention.  Relative paths in the file are\n"
    "relative to its directory (printed so from the working directory); --set paths to\n"
    "the working directory.\n\n"
    "With --ranks (or any of --shard-degree, --backend, --device-memory) it adds a\n"
    "memory plan: one rank's bytes for weights, gradients, optimizer state, the\n"
    "compute copy, gathered weights (fsdp), saved activations (by\n"
    "train.activation_checkpointing and train.saved_activations), logits, the\n"
    "backward pass's work buffers, the backend's scratch and communication buffers,\n"
    "for the config's train.micro_batch, seq_len, sharding and shard_degree, and\n"
    "whether that fits.  The figures are what the backend's memory counters count\n"
    "(OLMOC_MEMSTATS=1 olmoc train prints their peak); lines start with '#', so\n"
    "the output stays YAML.",
    info_options,
    NULL,
};

/* "--data": the training data as olmoc train opens it on `ranks` ranks (l opened by the caller). */
static void print_data(const struct olmo_config *cfg, int ranks, const struct olmo_loader *l) {
    printf("# data: %zu instances per epoch, %zu in the files, global batch %zu, fingerprint %llu\n", l->n_instances,
           l->order_kind == OLMO_ORDER_OLMO_CORE ? l->dataset_instances : l->n_instances,
           (size_t)cfg->train.micro_batch * (size_t)cfg->train.grad_accum * (size_t)ranks,
           (unsigned long long)l->fingerprint);
}

int cmd_info(int argc, char **argv) {
    struct info_args a = {.shard_degree = -1};
    int status;
    if (olmo_cli_parse(&info_command, &a, argc, argv, &status)) return status;
    if (!a.config) return olmo_cli_usage_error(&info_command);
    const char *path = a.config, *backend = a.backend ? a.backend : "cpu";
    const int ranks = a.ranks, shard_degree = a.shard_degree, data_ranks = a.data_ranks;
    const bool plan = a.ranks || a.shard_degree >= 0 || a.backend || a.memory > 0;
    double have = a.memory;
    struct olmo_loader loader;
    bool loader_open = false;
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    if (olmo_config_load(&cfg, path)) goto fail;
    if (olmo_cli_apply_sets(&a.sets, &cfg)) goto fail;
    if (olmo_config_validate(&cfg)) {
        /* A memory mode this build does not run yet is still planned (from its design): the rest of
         * the config must be valid. */
        struct olmo_config rest = cfg;
        char why[512];
        snprintf(why, sizeof why, "%s", olmo_last_error());
        rest.train.activation_checkpointing = OLMO_ACT_CKPT_NONE;
        rest.train.sharding = OLMO_SHARDING_ZERO1;
        rest.train.shard_degree = 0;
        if (olmo_config_validate(&rest)) goto fail;
        fprintf(stderr, "olmoc info: note: %s (olmoc train refuses this config; planned from the design)\n", why);
    }
    /* everything that can fail before anything is printed: an error is the output's last line */
    if (data_ranks) {
        if (olmo_loader_open_run(&loader, &cfg, data_ranks)) {
            olmo_error_context("the training data");
            goto fail;
        }
        loader_open = true;
    }
    struct olmo_mem_plan p;
    const struct olmo_mem_plan_options o = {.ranks = ranks ? ranks : 1, .shard_degree = shard_degree,
                                            .backend = backend, .threads = omp_get_max_threads()};
    if (plan && olmo_mem_plan(&cfg, &o, &p)) goto fail;
    if (olmo_config_write_fp(&cfg, stdout)) goto fail;
    const struct olmo_model_config *m = &cfg.model;
    printf("# parameters: %zu total, %zu without the input embedding\n", olmo_model_count_params(m, true),
           olmo_model_count_params(m, false));
    printf("# training FLOPs per token at seq_len %d: %.4g\n", cfg.train.seq_len,
           olmo_model_flops_per_token(m, cfg.train.seq_len));
    printf("# attention: ");
    for (int l = 0; l < m->n_layers; l++) putchar(olmo_layer_is_full_attention(m, l) ? 'F' : 'S');
    printf("  (S = sliding window %d, F = full)\n", m->sliding_window);
    if (loader_open) {
        print_data(&cfg, data_ranks, &loader);
        olmo_loader_close(&loader);
        loader_open = false;
    }
    if (!plan) return 0;
    const char *have_what = "--device-memory";
    if (!(a.memory > 0) && !p.device) {
        have = (double)olmo_memory_limit();
        have_what = "this process's memory limit: physical memory or ulimit, shared by the ranks on this machine";
    }
    printf("# micro-batch %d x %d tokens, activation_checkpointing %s (block_every %d)\n", cfg.train.micro_batch,
           cfg.train.seq_len,
           cfg.train.activation_checkpointing == OLMO_ACT_CKPT_NONE           ? "none"
           : cfg.train.activation_checkpointing == OLMO_ACT_CKPT_FEED_FORWARD ? "feed_forward"
                                                                          : "block",
           cfg.train.block_every);
    olmo_mem_plan_print(&p, stdout, have, have_what);
    return 0;
fail:
    if (loader_open) olmo_loader_close(&loader);
    fflush(stdout); /* whatever was printed comes before the error */
    fprintf(stderr, "olmoc info: %s\n", olmo_last_error());
    return 1;
}
