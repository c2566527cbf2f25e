/* Throughput of the checkpoint file hashes on one file, as olmoc reads a
 * checkpoint (checkpoint_hash.c's ckpt_hash_file: 16 MiB preads): XXH3-64,
 * what olmoc writes, and the earlier 64-bit hash, still read.  Run it on a
 * file already in the page cache (the first pass reads it in, untimed) to
 * time the hash rather than the disk.  Prints one JSON object per hash.
 *
 * usage: hash_bench FILE [--repeat N]   (default 3; the best pass counts) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/checkpoint_internal.h"
#include "util/clock.h"
#include "util/error.h"

int main(int argc, char **argv) {
    if (argc < 2 || (argc == 4 && strcmp(argv[2], "--repeat")) || (argc != 2 && argc != 4)) {
        fprintf(stderr, "usage: hash_bench FILE [--repeat N]\n");
        return 2;
    }
    const int repeat = argc == 4 ? atoi(argv[3]) : 3;
    const struct {
        enum ckpt_hash_alg alg;
        const char *name;
    } algs[] = {{CKPT_HASH_LEGACY64, "olmoc_earlier64"}, {CKPT_HASH_XXH3_64, "xxh3_64"}};
    uint64_t h;
    size_t size;
    if (ckpt_hash_file(argv[1], CKPT_HASH_XXH3_64, &h, &size)) { /* into the page cache */
        fprintf(stderr, "hash_bench: %s\n", olmo_last_error());
        return 1;
    }
    for (size_t a = 0; a < sizeof algs / sizeof algs[0]; a++) {
        double best = 1e30;
        for (int r = 0; r < (repeat > 0 ? repeat : 1); r++) {
            const double t0 = olmo_now_seconds();
            if (ckpt_hash_file(argv[1], algs[a].alg, &h, &size)) {
                fprintf(stderr, "hash_bench: %s\n", olmo_last_error());
                return 1;
            }
            const double t = olmo_now_seconds() - t0;
            if (t < best) best = t;
        }
        printf("{\"hash\": \"%s\", \"bytes\": %zu, \"seconds\": %.4f, \"MB_per_s\": %.1f, \"digest\": \"%016llx\"}\n",
               algs[a].name, size, best, (double)size / best / 1e6, (unsigned long long)h);
    }
    return 0;
}
