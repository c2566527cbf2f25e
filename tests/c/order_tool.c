/* Test helper for the OLMo-core data order (driven by
 * tests/python/test_olmo_core_order.py, which compares it with numpy and
 * OLMo-core at test time).
 *
 *   order_tool seedseq SEED         SeedSequence(SEED).generate_state(4, uint64), one per line
 *   order_tool raw SEED N           PCG64(SEED).random_raw(N), one per line
 *   order_tool shuffle SEED N       Generator(PCG64(SEED)).shuffle(arange(N, uint32)), one per line
 *   order_tool batches OUT WORLD N [--resume-at K] [--set key=value ...]
 *       opens the loader of a training run (olmo_loader_open_run) for WORLD
 *       data-parallel ranks and writes N global batches (int32, rows as
 *       olmo_loader_next returns them) to OUT.  --resume-at K: after K batches
 *       the position is saved and a fresh loader restored from it reads the
 *       rest.  --think-ms M: sleeps M ms after each batch (a training step)
 *       and prints to stderr the seconds spent waiting in olmo_loader_next.
 *       Prints the final loader state "epoch position n_instances". */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config/config.h"
#include "data/np_random.h"
#include "data/token_file.h"
#include "util/clock.h"
#include "util/error.h"

static int die(const char *what) {
    fprintf(stderr, "order_tool: %s: %s\n", what, olmo_last_error());
    return 1;
}

static int batches(int argc, char **argv) {
    if (argc < 5) return fprintf(stderr, "usage: order_tool batches OUT WORLD N [--resume-at K] [--set k=v ...]\n"), 2;
    const char *out = argv[2];
    const int world = atoi(argv[3]);
    const long n = atol(argv[4]);
    long resume_at = -1, think_ms = 0;
    double waited = 0;
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    for (int i = 5; i < argc; i++) {
        if (!strcmp(argv[i], "--resume-at") && i + 1 < argc) resume_at = atol(argv[++i]);
        else if (!strcmp(argv[i], "--think-ms") && i + 1 < argc) think_ms = atol(argv[++i]);
        else if (!strcmp(argv[i], "--set") && i + 1 < argc) {
            if (olmo_config_set(&cfg, argv[++i])) return die("--set");
        } else return fprintf(stderr, "order_tool: unknown argument '%s'\n", argv[i]), 2;
    }
    struct olmo_loader l;
    if (olmo_loader_open_run(&l, &cfg, world)) return die("open");
    const size_t rows = (size_t)cfg.train.micro_batch * (size_t)cfg.train.grad_accum * (size_t)world;
    int32_t *buf = malloc(rows * (size_t)cfg.train.seq_len * sizeof(int32_t));
    FILE *f = fopen(out, "wb");
    if (!buf || !f) return fprintf(stderr, "order_tool: cannot write '%s'\n", out), 1;
    for (long b = 0; b < n; b++) {
        if (b == resume_at) {
            struct olmo_loader_state st;
            olmo_loader_state_get(&l, &st);
            olmo_loader_close(&l);
            if (olmo_loader_open_run(&l, &cfg, world) || olmo_loader_state_set(&l, &st)) return die("resume");
        }
        const double t0 = olmo_now_seconds();
        if (olmo_loader_next(&l, buf, (int)rows)) return die("next");
        waited += olmo_now_seconds() - t0;
        if (think_ms > 0) nanosleep(&(struct timespec){think_ms / 1000, think_ms % 1000 * 1000000L}, NULL);
        if (fwrite(buf, sizeof(int32_t), rows * (size_t)cfg.train.seq_len, f) != rows * (size_t)cfg.train.seq_len)
            return fprintf(stderr, "order_tool: short write\n"), 1;
    }
    fclose(f);
    if (think_ms > 0) fprintf(stderr, "waited %.3f s in olmo_loader_next over %ld batches\n", waited, n);
    struct olmo_loader_state st;
    olmo_loader_state_get(&l, &st);
    printf("%" PRIu64 " %" PRIu64 " %zu\n", st.epoch, st.position, l.n_instances);
    free(buf);
    olmo_loader_close(&l);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "batches")) return batches(argc, argv);
    if (argc < 3) return fprintf(stderr, "usage: order_tool seedseq|raw|shuffle SEED [N]\n"), 2;
    const uint64_t seed = strtoull(argv[2], NULL, 10);
    const size_t n = argc > 3 ? (size_t)strtoull(argv[3], NULL, 10) : 0;
    if (!strcmp(argv[1], "seedseq")) {
        uint64_t w[4];
        olmo_seed_sequence_u64x4(seed, w);
        for (int i = 0; i < 4; i++) printf("%" PRIu64 "\n", w[i]);
    } else if (!strcmp(argv[1], "raw")) {
        struct olmo_pcg64 g;
        olmo_pcg64_seed(&g, seed);
        for (size_t i = 0; i < n; i++) printf("%" PRIu64 "\n", olmo_pcg64_next64(&g));
    } else if (!strcmp(argv[1], "shuffle")) {
        uint32_t *x = malloc((n ? n : 1) * sizeof(uint32_t));
        if (!x) return 1;
        for (size_t i = 0; i < n; i++) x[i] = (uint32_t)i;
        olmo_np_shuffle_u32(seed, x, n);
        for (size_t i = 0; i < n; i++) printf("%" PRIu32 "\n", x[i]);
        free(x);
    } else {
        return fprintf(stderr, "order_tool: unknown command '%s'\n", argv[1]), 2;
    }
    return 0;
}
