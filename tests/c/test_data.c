/* Token files, the data mix and the loader state (runs under ASan too). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "config/config.h"
#include "data/mix_file.h"
#include "data/token_file.h"
#include "util/error.h"
#include "util/rng.h"

/* .npy v1 with the given descr and n elements of `elem` bytes from data. */
static void write_npy(const char *name, const char *descr, size_t n, const void *data, size_t elem, size_t cut) {
    char header[128];
    int hl = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (%zu,), }", descr, n);
    int total = 10 + hl + 1;
    int pad = (64 - total % 64) % 64;
    size_t hlen = (size_t)hl + (size_t)pad + 1;
    size_t size = 10 + hlen + n * elem;
    unsigned char *buf = calloc(1, size);
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)(hlen & 0xff);
    buf[9] = (unsigned char)(hlen >> 8);
    memcpy(buf + 10, header, (size_t)hl);
    memset(buf + 10 + hl, ' ', (size_t)pad);
    buf[10 + hlen - 1] = '\n';
    memcpy(buf + 10 + hlen, data, n * elem);
    write_bytes(name, buf, size - cut);
    free(buf);
}

static void test_files(void) {
    uint16_t a16[100];
    uint32_t a32[100];
    for (int i = 0; i < 100; i++) a16[i] = (uint16_t)(i * 7), a32[i] = (uint32_t)(i * 1000 + 3);
    write_npy("a16.npy", "<u2", 100, a16, 2, 0);
    write_npy("a32.npy", "<u4", 100, a32, 4, 0);
    write_npy("i32.npy", "<i4", 100, a32, 4, 0);
    write_npy("f32.npy", "<f4", 100, a32, 4, 0);
    write_npy("trunc.npy", "<u4", 100, a32, 4, 6);
    write_bytes("raw.u16", a16, sizeof a16);
    write_bytes("raw32.npy", a32, sizeof a32); /* an OLMo/dolma memmap: .npy name, no header */
    write_bytes("odd.bin", a16, 199);
    write_bytes("empty.npy", "", 0);

    struct olmo_token_file f;
    int32_t buf[100];
    CHECK(!olmo_token_file_open(&f, path_of("a16.npy")) && f.n_tokens == 100 && f.elem_size == 2, "open u16 npy: %s",
          olmo_last_error());
    CHECK(!olmo_token_file_read(&f, 0, 100, 1000, buf) && buf[99] == 99 * 7, "read u16");
    CHECK(olmo_token_file_read(&f, 0, 100, 500, buf) && error_has("a16.npy", "byte offset"), "id >= vocab: %s",
          olmo_last_error());
    olmo_token_file_close(&f);
    CHECK(!olmo_token_file_open(&f, path_of("a32.npy")) && f.elem_size == 4, "open u32 npy");
    CHECK(!olmo_token_file_read(&f, 10, 5, 1 << 30, buf) && buf[0] == 10003, "read u32");
    /* the error names the exact byte offset of the bad id: token 60 = 60003 */
    {
        char want[64];
        snprintf(want, sizeof want, "at byte offset %zu", f.data_offset + 60 * 4);
        CHECK(olmo_token_file_read(&f, 0, 100, 60000, buf) && error_has("60003", want), "offset of bad id: %s",
              olmo_last_error());
    }
    olmo_token_file_close(&f);
    CHECK(!olmo_token_file_open(&f, path_of("i32.npy")), "open i4 npy");
    olmo_token_file_close(&f);
    CHECK(olmo_token_file_open(&f, path_of("f32.npy")) && error_has("f32.npy", "wrong dtype at byte offset"),
          "float dtype rejected: %s", olmo_last_error());
    CHECK(olmo_token_file_open(&f, path_of("trunc.npy")) && error_has("trunc.npy", "truncated"),
          "truncated npy: %s", olmo_last_error());
    CHECK(olmo_token_file_open(&f, path_of("missing.npy")) && error_has("missing.npy", "No such file"),
          "missing file: %s", olmo_last_error());
    CHECK(olmo_token_file_open(&f, path_of("empty.npy")) && error_has("empty.npy", "empty"), "empty file: %s",
          olmo_last_error());
    /* raw files */
    CHECK(!olmo_token_file_open(&f, path_of("raw.u16")) && f.n_tokens == 100 && f.elem_size == 2, "raw .u16: %s",
          olmo_last_error());
    CHECK(!olmo_token_file_read(&f, 99, 1, 1000, buf) && buf[0] == 693, "raw read");
    olmo_token_file_close(&f);
    CHECK(olmo_token_file_open(&f, path_of("raw32.npy")) && error_has("raw32.npy", "offset 0"),
          "headerless .npy needs a dtype: %s", olmo_last_error());
    CHECK(!olmo_token_file_open_ex(&f, path_of("raw32.npy"), OLMO_DTYPE_UINT32) && f.n_tokens == 100,
          "raw .npy as uint32: %s", olmo_last_error());
    CHECK(!olmo_token_file_read(&f, 1, 1, 1 << 30, buf) && buf[0] == 1003, "raw u32 read");
    olmo_token_file_close(&f);
    CHECK(olmo_token_file_open_ex(&f, path_of("a16.npy"), OLMO_DTYPE_UINT32) && error_has("a16.npy", "uint32"),
          "npy header disagrees with dtype: %s", olmo_last_error());
    CHECK(olmo_token_file_open_ex(&f, path_of("odd.bin"), OLMO_DTYPE_UINT16) &&
              error_has("odd.bin", "stray bytes at offset 198"),
          "odd-sized raw file: %s", olmo_last_error());
    enum olmo_dtype dt;
    CHECK(olmo_dtype_parse("float32", &dt) && !olmo_dtype_parse("u16", &dt) && dt == OLMO_DTYPE_UINT16, "dtype parse");
}

/* n tokens 0..n-1 (so instance k starts with k*seq_len) as uint32. */
static void write_seq_file(const char *name, size_t n, uint32_t base) {
    uint32_t *v = malloc(n * 4);
    for (size_t i = 0; i < n; i++) v[i] = base + (uint32_t)i;
    write_npy(name, "<u4", n, v, 4, 0);
    free(v);
}

static void test_single_file_order(void) {
    const int L = 8;
    write_seq_file("seq.npy", 8 * 50 + 5, 0); /* 50 instances, 5 tokens dropped */
    struct olmo_loader l;
    CHECK(!olmo_loader_open(&l, path_of("seq.npy"), L, 1 << 20, 1234), "open loader: %s", olmo_last_error());
    CHECK(l.n_instances == 50, "50 instances, got %zu", l.n_instances);
    /* the historical order: Fisher-Yates of 0..n-1 with rng(seed + epoch) */
    for (long epoch = 0; epoch < 3; epoch++) {
        size_t want[50];
        struct olmo_rng rng;
        olmo_rng_seed(&rng, 1234 + (uint64_t)epoch);
        for (size_t i = 0; i < 50; i++) want[i] = i;
        for (size_t i = 50; i > 1; i--) {
            size_t j = (size_t)(olmo_rng_next(&rng) % i);
            size_t t = want[i - 1];
            want[i - 1] = want[j];
            want[j] = t;
        }
        int ok = 1;
        int32_t row[8];
        for (size_t i = 0; i < 50; i++) {
            olmo_loader_next(&l, row, 1);
            ok &= row[0] == (int32_t)(want[i] * L) && row[7] == (int32_t)(want[i] * L + 7);
        }
        CHECK(ok, "epoch %ld follows the seeded shuffle", epoch);
    }
    olmo_loader_close(&l);
}

static void test_state_resume(void) {
    const int L = 4;
    write_seq_file("r1.npy", 4 * 37, 0);
    write_seq_file("r2.npy", 4 * 11 + 3, 100000);
    write_seq_file("r3.npy", 4 * 5, 200000);
    const char *mix = NULL;
    char mixbuf[1200];
    snprintf(mixbuf, sizeof mixbuf, "%s:0.5,%s+%s:0.5", path_of("r1.npy"), path_of("r2.npy"), path_of("r3.npy"));
    mix = mixbuf;
    for (int variant = 0; variant < 2; variant++) {
        struct olmo_loader a, b;
        int rc = variant ? olmo_loader_open_mix(&a, mix, OLMO_DTYPE_AUTO, L, 1 << 20, 7)
                         : olmo_loader_open(&a, path_of("r1.npy"), L, 1 << 20, 7);
        CHECK(!rc, "open: %s", olmo_last_error());
        int32_t rows[6 * 4], again[6 * 4];
        /* run into the second epoch, save, continue */
        for (int i = 0; i < 9; i++) olmo_loader_next(&a, rows, 6);
        struct olmo_loader_state st;
        olmo_loader_state_get(&a, &st);
        CHECK(st.epoch == 1, "9 x 6 rows of 53 (or 37) instances is in epoch 1 (got %llu)",
              (unsigned long long)st.epoch);
        int32_t expect[40][6 * 4];
        for (int i = 0; i < 40; i++) olmo_loader_next(&a, expect[i], 6);
        /* a fresh loader restored from the state sees the same batches */
        rc = variant ? olmo_loader_open_mix(&b, mix, OLMO_DTYPE_AUTO, L, 1 << 20, 7)
                     : olmo_loader_open(&b, path_of("r1.npy"), L, 1 << 20, 7);
        CHECK(!rc && !olmo_loader_state_set(&b, &st), "restore: %s", olmo_last_error());
        int same = 1;
        for (int i = 0; i < 40; i++) {
            olmo_loader_next(&b, again, 6);
            same &= !memcmp(again, expect[i], sizeof again);
        }
        CHECK(same, "variant %d: resumed loader repeats the next 40 batches exactly", variant);
        olmo_loader_close(&b);
        /* a different seed or seq_len refuses the state */
        rc = variant ? olmo_loader_open_mix(&b, mix, OLMO_DTYPE_AUTO, L, 1 << 20, 8)
                     : olmo_loader_open(&b, path_of("r1.npy"), L, 1 << 20, 8);
        CHECK(!rc && olmo_loader_state_set(&b, &st) && error_has("fingerprint", NULL), "seed mismatch detected: %s",
              olmo_last_error());
        olmo_loader_close(&b);
        olmo_loader_close(&a);
    }
}

static void test_mix(void) {
    const int L = 4;
    write_seq_file("m1.npy", 4 * 300, 0);      /* 300 instances */
    write_seq_file("m2.npy", 4 * 60, 1000000); /* 60 instances */
    char mix[1200];
    snprintf(mix, sizeof mix, "%s:3, %s:1", path_of("m1.npy"), path_of("m2.npy"));
    struct olmo_loader l, l2;
    CHECK(!olmo_loader_open_mix(&l, mix, OLMO_DTYPE_AUTO, L, 1 << 22, 99), "open mix: %s", olmo_last_error());
    CHECK(l.n_instances == 360 && l.sources[0].take == 270 && l.sources[1].take == 90, "takes %zu %zu of %zu",
          l.sources[0].take, l.sources[1].take, l.n_instances);
    CHECK(!olmo_loader_open_mix(&l2, mix, OLMO_DTYPE_AUTO, L, 1 << 22, 99), "open mix again");
    int32_t row[4], row2[4];
    int deterministic = 1;
    for (int epoch = 0; epoch < 2; epoch++) {
        int n1 = 0, n2 = 0, valid = 1;
        int seen1[300] = {0}, seen2[60] = {0};
        for (int i = 0; i < 360; i++) {
            olmo_loader_next(&l, row, 1);
            olmo_loader_next(&l2, row2, 1);
            deterministic &= !memcmp(row, row2, sizeof row);
            valid &= row[1] == row[0] + 1 && row[0] % 4 == 0;
            if (row[0] < 1000000) n1++, seen1[row[0] / 4]++;
            else n2++, seen2[(row[0] - 1000000) / 4]++;
        }
        int max1 = 0, min2 = 99;
        for (int i = 0; i < 300; i++) max1 = seen1[i] > max1 ? seen1[i] : max1;
        for (int i = 0; i < 60; i++) min2 = seen2[i] < min2 ? seen2[i] : min2;
        CHECK(valid && n1 == 270 && n2 == 90, "epoch %d composition %d/%d", epoch, n1, n2);
        CHECK(max1 == 1, "subsampled source: no instance twice in an epoch");
        CHECK(min2 >= 1, "upsampled source (90 of 60): every instance at least once");
    }
    CHECK(deterministic, "same seed, same stream");
    olmo_loader_close(&l);
    olmo_loader_close(&l2);
    CHECK(olmo_loader_open_mix(&l, "x.npy:0", OLMO_DTYPE_AUTO, L, 10, 1) && error_has("positive", NULL),
          "zero weight rejected: %s", olmo_last_error());
    snprintf(mix, sizeof mix, "%s:1,%s", path_of("m1.npy"), path_of("nothere.npy"));
    CHECK(olmo_loader_open_mix(&l, mix, OLMO_DTYPE_AUTO, L, 1 << 22, 1) && error_has("nothere.npy", NULL),
          "missing file in mix: %s", olmo_last_error());
    CHECK(olmo_loader_open(&l, path_of("m2.npy"), 4096, 1 << 22, 1) && error_has("fewer tokens than one", NULL),
          "file shorter than an instance: %s", olmo_last_error());
}

static void test_config(void) {
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    char set[1300];
    snprintf(set, sizeof set, "data.mix=%s:1,%s:1", path_of("m1.npy"), path_of("m2.npy"));
    CHECK(!olmo_config_set(&cfg, set), "--set data.mix: %s", olmo_last_error());
    CHECK(!olmo_config_set(&cfg, "data.dtype=uint32"), "--set data.dtype");
    struct olmo_loader l;
    CHECK(!olmo_loader_open_config(&l, &cfg.data, 4, 1 << 22, 1) && l.n_sources == 2, "open from config: %s",
          olmo_last_error());
    olmo_loader_close(&l);
    CHECK(!olmo_config_set(&cfg, "data.dtype=float") && strcmp(cfg.data.dtype, "float") == 0, "set any string");
    cfg.model.vocab_size = 10, cfg.model.d_model = 8, cfg.model.n_layers = 1, cfg.model.n_heads = 2;
    cfg.model.n_kv_heads = 1, cfg.model.mlp_hidden = 8, cfg.model.eos_token_id = 0, cfg.train.seq_len = 4;
    CHECK(olmo_config_validate(&cfg) && error_has("data.dtype", NULL), "bad dtype rejected: %s", olmo_last_error());
}

/* The OLMo-core order's refusals and its loader state (the order itself is
 * compared with OLMo-core by tests/python/test_olmo_core_order.py). */
static void test_olmo_core_order(void) {
    const int L = 8;
    uint16_t tok[8 * 21];
    for (int i = 0; i < 8 * 21; i++) tok[i] = (uint16_t)i;
    write_bytes("oc.u16", tok, sizeof tok); /* 21 instances */
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    char set[1300];
    snprintf(set, sizeof set, "data.train_path=%s", path_of("oc.u16"));
    CHECK(!olmo_config_set(&cfg, set), "--set: %s", olmo_last_error());
    cfg.model.vocab_size = 1 << 16, cfg.train.seq_len = L, cfg.train.micro_batch = 2, cfg.train.grad_accum = 2;
    CHECK(!strcmp(cfg.data.order, "olmo_core"), "olmo_core is the default order");
    struct olmo_loader l, m;
    /* 2 ranks: global batches of 8, 2 per epoch (5 instances dropped) */
    CHECK(!olmo_loader_open_run(&l, &cfg, 2), "open: %s", olmo_last_error());
    CHECK(l.n_instances == 16 && l.dataset_instances == 21, "epoch of whole batches: %zu", l.n_instances);
    int32_t rows[8 * 8], again[8 * 8];
    CHECK(olmo_loader_next(&l, rows, 4) && error_has("whole global batches", NULL), "part of a batch refused");
    int seen[21] = {0}, ok = 1;
    for (int b = 0; b < 2; b++) {
        ok &= !olmo_loader_next(&l, rows, 8);
        for (int r = 0; r < 8; r++) seen[rows[r * L] / L]++;
    }
    int distinct = 0;
    for (int i = 0; i < 21; i++) distinct += seen[i] == 1;
    CHECK(ok && distinct == 16, "an epoch visits 16 distinct instances once (%d)", distinct);
    struct olmo_loader_state st;
    olmo_loader_state_get(&l, &st);
    CHECK(st.epoch == 0 && st.position == 16, "state at the epoch end: %llu %llu", (unsigned long long)st.epoch,
          (unsigned long long)st.position);
    CHECK(!olmo_loader_next(&l, rows, 8), "next epoch");
    CHECK(!olmo_loader_open_run(&m, &cfg, 2) && !olmo_loader_state_set(&m, &st) && !olmo_loader_next(&m, again, 8) &&
              !memcmp(rows, again, sizeof rows),
          "resumed at the epoch boundary: %s", olmo_last_error());
    st.position = 4;
    CHECK(olmo_loader_state_set(&m, &st), "a position inside a global batch is refused");
    olmo_loader_close(&m);
    /* the global batch size is part of the data's identity; the rank count is not */
    olmo_loader_state_get(&l, &st);
    CHECK(!olmo_loader_open_run(&m, &cfg, 4) && olmo_loader_state_set(&m, &st), "other batch size refused");
    olmo_loader_close(&m);
    cfg.train.grad_accum = 4;
    CHECK(!olmo_loader_open_run(&m, &cfg, 1) && !olmo_loader_state_set(&m, &st), "other rank count accepted: %s",
          olmo_last_error());
    olmo_loader_close(&m);
    CHECK(!olmo_config_set(&cfg, "data.order=olmoc") && !olmo_loader_open_run(&m, &cfg, 1) &&
              olmo_loader_state_set(&m, &st),
          "other order refused");
    olmo_loader_close(&m);
    olmo_loader_close(&l);
    CHECK(!olmo_config_set(&cfg, "data.order=olmo_core"), "set order");
    cfg.train.grad_accum = 11; /* 22 instances per batch > 21 */
    CHECK(olmo_loader_open_run(&m, &cfg, 1) && error_has("fewer than one global batch", "oc.u16"),
          "less than a batch: %s", olmo_last_error());
    cfg.train.grad_accum = 1;
    CHECK(olmo_loader_open_run(&m, &cfg, 3) == 0, "3 ranks x 2: %s", olmo_last_error());
    olmo_loader_close(&m);
    CHECK(!olmo_config_set(&cfg, "data.order=random") && olmo_loader_open_run(&m, &cfg, 1) &&
              error_has("data.order", "olmo_core or olmoc"),
          "unknown order: %s", olmo_last_error());
}

/* OLMo-core mix files: "label,path" lines with {TOKENIZER} under a base directory. */
static void test_mix_file(void) {
    const char *text = "# comment\n\nweb,a/{TOKENIZER}/x.npy\r\n  code,b/{TOKENIZER}/{TOKENIZER}.npy  \n";
    write_bytes("mix.txt", text, strlen(text));
    char **paths;
    int n;
    CHECK(!olmo_mix_file_paths(path_of("mix.txt"), "/base", "tok/id", &paths, &n) && n == 2 &&
              !strcmp(paths[0], "/base/a/tok/id/x.npy") && !strcmp(paths[1], "/base/b/tok/id/tok/id.npy"),
          "mix file paths: %s", olmo_last_error());
    if (n == 2) olmo_mix_file_free(paths, n);
    CHECK(!olmo_mix_file_paths(path_of("mix.txt"), "/base/", "t", &paths, &n) && !strcmp(paths[0], "/base/a/t/x.npy"),
          "base dir ending in /");
    olmo_mix_file_free(paths, n);
    CHECK(olmo_mix_file_paths(path_of("mix.txt"), "", "t", &paths, &n) && error_has("mix_base_dir", NULL),
          "no base dir: %s", olmo_last_error());
    CHECK(olmo_mix_file_paths(path_of("mix.txt"), "/b", "", &paths, &n) && error_has("mix_tokenizer", NULL),
          "no tokenizer: %s", olmo_last_error());
    write_bytes("bad.txt", "web,a/x.npy\n", 12);
    CHECK(olmo_mix_file_paths(path_of("bad.txt"), "/b", "t", &paths, &n) && error_has("line 1", "{TOKENIZER}"),
          "path without {TOKENIZER}: %s", olmo_last_error());
    write_bytes("bad.txt", "# only\n\n", 8);
    CHECK(olmo_mix_file_paths(path_of("bad.txt"), "/b", "t", &paths, &n) && error_has("no token file", NULL),
          "empty mix: %s", olmo_last_error());
}

int main(void) {
    snprintf(check_dir, sizeof check_dir, "/tmp/olmoc_test_data_XXXXXX");
    if (!mkdtemp(check_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_files();
    test_single_file_order();
    test_state_resume();
    test_mix();
    test_config();
    test_olmo_core_order();
    test_mix_file();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", check_dir);
    if (system(cmd)) printf("warning: could not remove %s\n", check_dir);
    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
