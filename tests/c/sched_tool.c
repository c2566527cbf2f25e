/* Test helper for the learning-rate schedules (driven by
 * tests/python/test_olmo_core_schedule.py, which compares them with
 * OLMo-core's scheduler objects at test time).
 *
 *   sched_tool OUT WORLD FIRST LAST [--config FILE] [--set key=value ...]
 *       writes the learning rate of optimizer steps FIRST..LAST (float64, as
 *       the trainer computes it for WORLD data-parallel ranks) to OUT and
 *       prints the schedule length OLMo-core's Trainer would use for
 *       train.schedule_tokens and train.schedule2_tokens (0 when unset). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "optim/schedule.h"
#include "util/error.h"

int main(int argc, char **argv) {
    if (argc < 5) return fprintf(stderr, "usage: sched_tool OUT WORLD FIRST LAST [--set k=v ...]\n"), 2;
    const long world = atol(argv[2]), first = atol(argv[3]), last = atol(argv[4]);
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    cfg.model.vocab_size = cfg.model.d_model = cfg.model.mlp_hidden = 8; /* any valid shape */
    cfg.model.n_layers = cfg.model.n_heads = cfg.model.n_kv_heads = 2;
    cfg.model.eos_token_id = 0;
    cfg.model.pad_token_id = 1;
    cfg.train.seq_len = 8;
    for (int i = 5; i < argc; i += 2) {
        if (i + 1 >= argc || (strcmp(argv[i], "--set") && strcmp(argv[i], "--config")))
            return fprintf(stderr, "sched_tool: bad argument '%s'\n", argv[i]), 2;
        if (!strcmp(argv[i], "--config") ? olmo_config_load(&cfg, argv[i + 1]) : olmo_config_set(&cfg, argv[i + 1]))
            return fprintf(stderr, "sched_tool: %s\n", olmo_last_error()), 1;
    }
    if (olmo_config_validate(&cfg)) return fprintf(stderr, "sched_tool: %s\n", olmo_last_error()), 1;
    const struct olmo_train_config *t = &cfg.train;
    const long tokens_per_step = (long)t->micro_batch * t->grad_accum * world * t->seq_len;
    FILE *f = fopen(argv[1], "wb");
    if (!f) return fprintf(stderr, "sched_tool: cannot write '%s'\n", argv[1]), 1;
    for (long s = first; s <= last; s++) {
        const double lr = olmo_lr_at_batch(t, tokens_per_step, s);
        if (fwrite(&lr, sizeof lr, 1, f) != 1) return fprintf(stderr, "sched_tool: short write\n"), 1;
    }
    fclose(f);
    printf("%ld %ld\n", t->schedule_tokens ? olmo_schedule_steps_for_tokens(t->schedule_tokens, tokens_per_step) : 0,
           t->schedule2_tokens ? olmo_schedule_steps_for_tokens(t->schedule2_tokens, tokens_per_step) : 0);
    return 0;
}
