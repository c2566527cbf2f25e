/* Bounded work on hostile or unusual inputs, and readers of a live run:
 * safetensors names crafted to collide, a gzip bomb of OLMo-eval requests,
 * a request buffer of more than 2^31 lines, data.mix_file as a FIFO, a
 * directory, with NUL bytes or a BOM, a metrics log over 2 GiB on resume,
 * and a run directory whose newest checkpoint is rotated away while
 * olmoc eval opens it.  Each case failed (hung, took minutes, overflowed or
 * was refused) before its fix; runs under ASan+UBSan too. */
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "backend/backend.h"
#include "check.h"
#include "config/config.h"
#include "data/mix_file.h"
#include "eval/olmo_tasks.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train/source.h"
#include "train/trainer.h"
#include "util/error.h"
#include "util/fs.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---------------------------------------------------------------- safetensors */

/* FNV-1a 64, the hash olmoc's safetensors reader used for tensor names. */
#define FNV_PRIME 0x100000001b3ULL
static uint64_t fnv_state(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * FNV_PRIME;
    return h;
}

/* A header of n tensors (F32 [1] each) named names[i] (each NAME_LEN bytes). */
#define NAME_LEN 12
static double open_seconds(const char *file, const char *names, int n) {
    const size_t cap = (size_t)n * (NAME_LEN + 80) + 16;
    char *h = malloc(cap);
    size_t len = 0;
    h[len++] = '{';
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(h + len, cap - len, "%s\"%.*s\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[%d,%d]}",
                                i ? "," : "", NAME_LEN, names + (size_t)i * NAME_LEN, 4 * i, 4 * i + 4);
    h[len++] = '}';
    unsigned char *buf = calloc(1, 8 + len + (size_t)n * 4);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)len >> (8 * i));
    memcpy(buf + 8, h, len);
    write_bytes(file, buf, 8 + len + (size_t)n * 4);
    free(buf);
    free(h);
    const double t0 = now();
    struct olmo_st_file f;
    const int rc = olmo_st_open(&f, path_of(file));
    CHECK(!rc && f.n_tensors == n, "open %s: %s", file, olmo_last_error());
    bool found = true;
    for (int i = 0; !rc && i < n; i += 101) {
        char name[NAME_LEN + 1];
        memcpy(name, names + (size_t)i * NAME_LEN, NAME_LEN);
        name[NAME_LEN] = 0;
        const struct olmo_st_tensor *t = olmo_st_find(&f, name);
        found &= t && t->begin == (size_t)4 * i;
    }
    CHECK(found, "%s: every name found at its offset", file);
    if (!rc) olmo_st_close(&f);
    return now() - t0;
}

/* 100k names whose FNV-1a hashes share their low 18 bits (the reader's table
 * of 2^18 slots for 100k names): every name probed every earlier one, 5e9
 * string comparisons (65 s).  Built by meeting in the middle: a 4-byte
 * prefix, two free bytes forward, two bytes backward from the target slot. */
static void test_safetensors_colliding_names(void) {
    enum { N = 100000, BITS = 18 };
    const uint64_t mask = ((uint64_t)1 << BITS) - 1;
    static const char alpha[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.";
    uint64_t inv = FNV_PRIME; /* FNV_PRIME^-1 mod 2^64 (Newton) */
    for (int i = 0; i < 6; i++) inv *= 2 - FNV_PRIME * inv;
    const uint64_t target = 12345;
    int32_t *back = malloc(sizeof(int32_t) << BITS); /* state -> the two last bytes that lead to target */
    for (uint64_t s = 0; s <= mask; s++) back[s] = -1;
    for (int c = 0; c < 64; c++)
        for (int d = 0; d < 64; d++) {
            const uint64_t s = ((((target * inv) ^ (uint8_t)alpha[d]) * inv) ^ (uint8_t)alpha[c]) & mask;
            back[s] = c * 64 + d;
        }
    char *bad = malloc((size_t)N * NAME_LEN), *good = malloc((size_t)N * NAME_LEN);
    int n = 0;
    for (int p = 0; n < N; p++) {
        char name[NAME_LEN + 1];
        snprintf(name, sizeof name, "t%07d", p); /* 8 bytes, then 4 chosen */
        const uint64_t h0 = fnv_state(name, 8);
        for (int a = 0; a < 64 && n < N; a++)
            for (int b = 0; b < 64 && n < N; b++) {
                const uint64_t s = ((((h0 ^ (uint8_t)alpha[a]) * FNV_PRIME) ^ (uint8_t)alpha[b]) * FNV_PRIME) & mask;
                if (back[s] < 0) continue;
                name[8] = alpha[a];
                name[9] = alpha[b];
                name[10] = alpha[back[s] / 64];
                name[11] = alpha[back[s] % 64];
                memcpy(bad + (size_t)n * NAME_LEN, name, NAME_LEN);
                n++;
            }
    }
    int same = 0;
    for (int i = 0; i < N; i++) same += (fnv_state(bad + (size_t)i * NAME_LEN, NAME_LEN) & mask) == target;
    CHECK(same == N, "the crafted names collide (%d of %d)", same, N);
    for (int i = 0; i < N; i++) {
        char name[NAME_LEN + 1];
        snprintf(name, sizeof name, "layer.%06d", i);
        memcpy(good + (size_t)i * NAME_LEN, name, NAME_LEN);
    }
    const double t_good = open_seconds("names.safetensors", good, N);
    const double t_bad = open_seconds("colliding.safetensors", bad, N);
    printf("  %d ordinary names: %.2f s, %d colliding names: %.2f s\n", N, t_good, N, t_bad);
    CHECK(t_bad < 3 * t_good + 1.0, "colliding names open in about the time of ordinary ones (%.2f s vs %.2f s)",
          t_bad, t_good);
    free(back);
    free(bad);
    free(good);
}

/* ---------------------------------------------------------------- OLMo-eval requests */

/* 3 MB of gzip inflating to 3.2 GB was read whole: now refused past 100x its size. */
static void test_request_gzip_bomb(void) {
    gzFile g = gzopen(path_of("requests.jsonl.gz"), "wb9");
    char *block = malloc(1 << 20);
    memset(block, ' ', 1 << 20);
    block[(1 << 20) - 1] = '\n';
    for (int i = 0; i < 256; i++) gzwrite(g, block, 1 << 20); /* 256 MiB of blank lines, about 250 KB */
    gzclose(g);
    free(block);
    char *text = NULL;
    size_t len = 0;
    const double t0 = now();
    const int rc = olmo_eval_read_file(path_of("requests.jsonl.gz"), (size_t)4 << 30, &text, &len);
    printf("  %s in %.2f s\n", rc ? olmo_last_error() : "read whole", now() - t0);
    CHECK(rc && error_has("gzip bomb", "requests.jsonl.gz"), "a gzip bomb is refused: %s", olmo_last_error());
    if (!rc) free(text);
    /* an ordinary compressed file reads */
    g = gzopen(path_of("ok.jsonl.gz"), "wb");
    gzputs(g, "{\"a\":1}\n");
    gzclose(g);
    CHECK(!olmo_eval_read_file(path_of("ok.jsonl.gz"), (size_t)4 << 30, &text, &len) && len == 8, "small gzip: %s",
          olmo_last_error());
    if (len == 8) free(text);
}

/* The line counter was an int: past 2^31 lines it overflowed (UBSan abort,
 * and a negative line in the message).  2^31 empty lines, from one 1 MiB
 * page of newlines mapped 2048 times, then a bad line. */
static void test_request_lines_64bit(void) {
    const size_t chunk = (size_t)1 << 20, n_chunks = 2048, total = chunk * n_chunks + 4096;
    const int fd = memfd_create("newlines", 0);
    char *nl = malloc(chunk);
    memset(nl, '\n', chunk);
    CHECK(fd >= 0 && write(fd, nl, chunk) == (ssize_t)chunk, "memfd");
    free(nl);
    char *base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CHECK(base != MAP_FAILED, "reserve %zu bytes", total);
    if (base == MAP_FAILED || fd < 0) return;
    bool ok = true;
    for (size_t i = 0; i < n_chunks && ok; i++)
        ok = mmap(base + i * chunk, chunk, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0) != MAP_FAILED;
    CHECK(ok, "map the newlines");
    memcpy(base + n_chunks * chunk, "oops\n", 5);
    struct olmo_eval_requests rq;
    const double t0 = now();
    const int rc = olmo_eval_requests_parse(base, n_chunks * chunk + 5, OLMO_METRIC_ACC, "big", &rq);
    printf("  %s (%.2f s)\n", olmo_last_error(), now() - t0);
    CHECK(rc && error_has("big:2147483649: not a JSON object", NULL), "line 2^31 + 1 named: %s", olmo_last_error());
    if (!rc) olmo_eval_requests_free(&rq);
    munmap(base, total);
    close(fd);
}

/* ---------------------------------------------------------------- data.mix_file */

/* A FIFO hung the open (a reader waiting for a writer); a directory, NUL bytes
 * and a BOM got messages about something else. */
static void test_mix_file_not_text(void) {
    char **paths = NULL;
    int n = 0;
    CHECK(!mkfifo(path_of("mix.fifo"), 0600), "mkfifo");
    CHECK(olmo_mix_file_paths(path_of("mix.fifo"), "/b", "t", &paths, &n) && error_has("not a regular file", "FIFO"),
          "a FIFO is refused, not waited on: %s", olmo_last_error());
    CHECK(olmo_mix_file_paths(check_dir, "/b", "t", &paths, &n) && error_has("is a directory", NULL),
          "a directory: %s", olmo_last_error());
    write_bytes("nul.txt", "web,a/{TOKENIZER}/x.npy\ncode,b/{TOK\0ENIZER}.npy\n", 48);
    CHECK(olmo_mix_file_paths(path_of("nul.txt"), "/b", "t", &paths, &n) &&
              error_has("NUL byte at offset 35 (line 2)", NULL),
          "NUL bytes: %s", olmo_last_error());
    write_text("bom.txt", "\xEF\xBB\xBF# Olmo 3 mix\nweb,a/{TOKENIZER}/x.npy\n");
    CHECK(!olmo_mix_file_paths(path_of("bom.txt"), "/b", "t", &paths, &n) && n == 1 && !strcmp(paths[0], "/b/a/t/x.npy"),
          "a UTF-8 BOM is the encoding's, not part of the first line: %s", olmo_last_error());
    if (!failures) olmo_mix_file_free(paths, n);
}

/* ---------------------------------------------------------------- metrics.jsonl */

/* --resume read the whole log with a 2 GiB limit: a long run's log blocked
 * every resume.  2 GiB + of records (64 KiB lines), then records to remove. */
static void test_metrics_over_2gib(void) {
    const char *path = path_of("metrics.jsonl");
    FILE *f = fopen(path, "wb");
    const size_t line = (size_t)64 << 10;
    char *rec = malloc(line);
    const int head = snprintf(rec, line, "{\"type\":\"train\",\"step\":1,\"pad\":\"");
    memset(rec + head, 'x', line - (size_t)head - 3);
    memcpy(rec + line - 3, "\"}\n", 3);
    const size_t n = ((size_t)2 << 30) / line + 16;
    bool ok = f != NULL;
    for (size_t i = 0; i < n && ok; i++) ok = fwrite(rec, 1, line, f) == line;
    free(rec);
    const char tail[] = "{\"type\":\"train\",\"step\":2}\n{\"type\":\"train\",\"step\":3}\n{\"type\":\"tr";
    ok = ok && fwrite(tail, 1, sizeof tail - 1, f) == sizeof tail - 1;
    CHECK(f && !fclose(f) && ok, "write a %zu-byte log", n * line);
    if (!ok) return;
    FILE *notes = tmpfile();
    struct olmo_metrics m;
    const double t0 = now();
    const int rc = olmo_metrics_open(&m, path, 1, notes);
    printf("  resume over %.2f GiB: %s (%.2f s)\n", (double)(n * line) / (1 << 30), rc ? olmo_last_error() : "ok",
           now() - t0);
    CHECK(!rc, "a log over 2 GiB is cut on resume: %s", olmo_last_error());
    if (!rc) olmo_metrics_close(&m);
    struct stat sb;
    CHECK(!stat(path, &sb) && (size_t)sb.st_size == n * line, "the records of steps after 1 removed (size %lld)",
          (long long)sb.st_size);
    char said[512] = "";
    rewind(notes);
    said[fread(said, 1, sizeof said - 1, notes)] = 0;
    fclose(notes);
    CHECK(strstr(said, "removed 2 records after step 1") && strstr(said, "incomplete last line"), "said: %s", said);
    unlink(path);
    /* a record to keep after one to remove: rewritten, in order */
    const char mixed[] = "{\"step\":1,\"a\":1}\n{\"step\":5}\n{\"step\":1,\"a\":2}\n";
    write_bytes("m2.jsonl", mixed, sizeof mixed - 1);
    CHECK(!olmo_metrics_open(&m, path_of("m2.jsonl"), 1, NULL) && !olmo_metrics_close(&m), "interleaved: %s",
          olmo_last_error());
    char *text = NULL;
    size_t len = 0;
    CHECK(!olmo_read_file(path_of("m2.jsonl"), 1 << 20, &text, &len) &&
              !strcmp(text, "{\"step\":1,\"a\":1}\n{\"step\":1,\"a\":2}\n"),
          "kept records rewritten in order: %s", text ? text : olmo_last_error());
    free(text);
}

/* ---------------------------------------------------------------- a live run's checkpoints */

static struct olmo_trainer tr;
static struct olmo_ckpt_state ckst;
static char run_dir[600];
static int rotations_left;

static int save_step(long step) {
    ckst.step = step;
    ckst.tokens = 0;
    char path[4096];
    return olmo_ckpt_save(run_dir, &tr, &ckst, path, sizeof path);
}

/* What a live run does between olmoc eval's listing and its opening of the
 * newest checkpoint: saves a newer one and removes the older ones (keep_last 1). */
static void rotate(const char *checkpoint, void *arg) {
    (void)arg;
    if (rotations_left <= 0) return;
    rotations_left--;
    const long next = strtol(strrchr(checkpoint, '-') + 1, NULL, 10) + 1;
    if (save_step(next) || olmo_ckpt_retain(run_dir, 1)) printf("  rotation failed: %s\n", olmo_last_error());
}

static void test_eval_of_a_live_run(void) {
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    cfg.model = (struct olmo_model_config){.vocab_size = 64, .d_model = 32, .n_layers = 2, .n_heads = 4,
                                           .n_kv_heads = 2, .mlp_hidden = 64, .rope_theta = 1e4,
                                           .rms_norm_eps = 1e-6, .init_std = 0.02};
    cfg.train.seq_len = 16;
    cfg.train.micro_batch = 1;
    struct olmo_backend *be = olmo_backend_create("cpu");
    snprintf(run_dir, sizeof run_dir, "%s/run", check_dir);
    CHECK(be && !olmo_trainer_init(&tr, &cfg, be) && !olmo_trainer_init_weights(&tr, 7) && !save_step(1) &&
              !save_step(2),
          "a run directory with checkpoints: %s", olmo_last_error());
    if (failures) return;
    olmo_source_open_hook = rotate;
    struct olmo_model_source src;
    struct olmo_config got;
    rotations_left = 1;
    int rc = olmo_source_resolve(run_dir, NULL, &src, &got);
    printf("  resolve: %s | note: %s\n", rc ? olmo_last_error() : "ok", src.note);
    CHECK(!rc && strstr(src.dir, "step-000003") && strstr(src.note, "step-000002' was rotated away") &&
              strstr(src.note, "using the newest") && src.rotated == 1,
          "resolve opens the newest checkpoint after a rotation: %s | %s", olmo_last_error(), src.note);
    struct olmo_model m = {0};
    rotations_left = 2; /* twice while loading */
    rc = rc || olmo_model_create(&m, &got.model, be) || olmo_source_load_weights(&src, &m);
    printf("  load: %s | note: %s\n", rc ? olmo_last_error() : "ok", src.note);
    CHECK(!rc && strstr(src.dir, "step-000005") && src.rotated == 3, "the load follows two more rotations: %s",
          olmo_last_error());
    bool same = !rc;
    for (size_t i = 0; same && i < m.n_floats; i++) same = m.weights[i] == tr.model.weights[i];
    CHECK(same, "the weights loaded are the run's");
    olmo_model_destroy(&m);
    /* a run that keeps rotating faster than the checkpoint opens: an error that says so */
    rotations_left = 1000;
    rc = olmo_source_resolve(run_dir, NULL, &src, &got);
    CHECK(rc && src.rotated == OLMO_SOURCE_RETRIES, "retries are bounded (%d): %s", src.rotated, olmo_last_error());
    /* a damaged checkpoint that is not rotated away is reported as it is */
    rotations_left = 0;
    char path[4200];
    olmo_ckpt_find_latest(run_dir, path, sizeof path);
    strcat(path, "/config.yaml");
    unlink(path);
    CHECK(olmo_source_resolve(run_dir, NULL, &src, &got) && error_has("config.yaml is missing", NULL) && !src.rotated,
          "damage is not retried: %s", olmo_last_error());
    olmo_source_open_hook = NULL;
    olmo_trainer_destroy(&tr);
    olmo_backend_destroy(be);
}

static const struct check_case tests[] = {
    {"safetensors_colliding_names", test_safetensors_colliding_names, 40},
    {"request_gzip_bomb", test_request_gzip_bomb, 60},
    {"request_lines_64bit", test_request_lines_64bit, 120},
    {"mix_file_not_text", test_mix_file_not_text, 10},
    {"metrics_over_2gib", test_metrics_over_2gib, 200},
    {"eval_of_a_live_run", test_eval_of_a_live_run, 60},
};

/* test_bounded [NAME...]: the named cases only (all by default). */
int main(int argc, char **argv) {
    return check_main("test_bounded", tests, sizeof tests / sizeof tests[0], argc, argv);
}
