/* Hostile and careless inputs: each case here crashed, hung,
 * overflowed a buffer or was silently accepted before its fix.  Runs under
 * ASan+UBSan too; every case is bounded to seconds (an alarm turns a hang
 * into a failure). */
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "config/config.h"
#include "data/token_file.h"
#include "io/safetensors.h"
#include "backend/backend.h"
#include "model/generate.h"
#include "model/hf.h"
#include "model/weights.h"
#include "eval/evaluate.h"
#include "util/error.h"

/* ---------------------------------------------------------------- token files */

/* Weights whose sum overflows to inf: the per-source counts were NaN-derived
 * garbage and build_epoch wrote past the order array. */
static void test_mix_weight_overflow(void) {
    uint16_t tok[64];
    for (int i = 0; i < 64; i++) tok[i] = (uint16_t)i;
    write_bytes("w.u16", tok, sizeof tok);
    char mix[1200];
    snprintf(mix, sizeof mix, "%s:1e308,%s:1e308", path_of("w.u16"), path_of("w.u16"));
    struct olmo_loader l;
    int rc = olmo_loader_open_mix(&l, mix, OLMO_DTYPE_AUTO, 8, 64, 1);
    CHECK(!rc, "weights 1e308,1e308 open: %s", olmo_last_error());
    if (!rc) {
        /* equal weights: an even split of the 16 instances */
        CHECK(l.n_instances == 16 && l.sources[0].take == 8 && l.sources[1].take == 8, "takes %zu %zu of %zu",
              l.sources[0].take, l.sources[1].take, l.n_instances);
        int32_t row[8];
        for (int i = 0; i < 40; i++) CHECK(!olmo_loader_next(&l, row, 1), "next: %s", olmo_last_error());
        olmo_loader_close(&l);
    }
    /* one finite weight so large that N * w overflows though the sum does not */
    snprintf(mix, sizeof mix, "%s:1e308,%s:1e300", path_of("w.u16"), path_of("w.u16"));
    rc = olmo_loader_open_mix(&l, mix, OLMO_DTYPE_AUTO, 8, 64, 1);
    CHECK(!rc && l.sources[0].take == 16 && l.sources[1].take == 0, "1e308 vs 1e300: %s", olmo_last_error());
    if (!rc) olmo_loader_close(&l);
}

/* A FIFO named as a token file: open() waited forever for a writer. */
static void test_fifo_token_file(void) {
    if (mkfifo(path_of("fifo.u16"), 0600)) {
        CHECK(0, "mkfifo failed");
        return;
    }
    struct olmo_token_file f;
    CHECK(olmo_token_file_open(&f, path_of("fifo.u16")) && error_has("fifo.u16", "not a regular file"),
          "FIFO refused: %s", olmo_last_error());
    CHECK(olmo_token_file_open(&f, check_dir) && error_has(check_dir, "directory"), "directory refused: %s", olmo_last_error());
    /* the other inputs opened by name: safetensors, YAML configs, task files (read whole) */
    struct olmo_st_file st;
    CHECK(olmo_st_open(&st, path_of("fifo.u16")) && error_has("fifo.u16", "not a regular file"), "FIFO as safetensors: %s",
          olmo_last_error());
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    CHECK(olmo_config_load(&cfg, path_of("fifo.u16")) && error_has("fifo.u16", "not a regular file"),
          "FIFO as config: %s", olmo_last_error());
    struct olmo_mc_task t;
    CHECK(olmo_mc_task_load(path_of("fifo.u16"), 64, &t) && error_has("fifo.u16", "not a regular file"),
          "FIFO as task file: %s", olmo_last_error());
}

/* The file shrinks while mapped: reading the vanished pages raised SIGBUS. */
static void test_token_file_shrinks(void) {
    enum { N = 64 * 1024 };
    uint16_t *tok = malloc(N * sizeof *tok);
    for (int i = 0; i < N; i++) tok[i] = (uint16_t)(i % 100);
    write_bytes("shrink.u16", tok, N * sizeof *tok);
    struct olmo_loader l;
    CHECK(!olmo_loader_open(&l, path_of("shrink.u16"), 1024, 100, 7), "open: %s", olmo_last_error());
    int32_t *rows = malloc(64 * 1024 * sizeof *rows);
    CHECK(!olmo_loader_next(&l, rows, 2), "read before the shrink: %s", olmo_last_error());
    CHECK(!truncate(path_of("shrink.u16"), 4096), "truncate");
    int rc = olmo_loader_next(&l, rows, 64); /* every instance of the epoch: most are gone now */
    CHECK(rc && error_has("shrink.u16", "shrank while it was being read"), "shrink reported: %s",
          olmo_last_error());
    olmo_loader_close(&l);
    /* a SIGBUS elsewhere still takes its default action (not swallowed by the guard) */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *null = freopen("/dev/null", "w", stderr); /* ASan's report */
        (void)null;
        raise(SIGBUS);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    /* the default action, or (under ASan) its handler's report and exit */
    CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS) || (WIFEXITED(status) && WEXITSTATUS(status)),
          "an unrelated SIGBUS still kills (status %d)", status);
    free(tok);
    free(rows);
}

/* ---------------------------------------------------------------- configs */

/* Strings with YAML's special characters: config.yaml was written with them
 * unescaped, and every checkpoint of the run failed to load. */
static void test_config_yaml_round_trip(void) {
    static const char *const hostile[] = {
        "a\"b",          "back\\slash",      "C:\\new\\table",     "tab\there",    "new\nline",
        "cr\rlf",        "ctrl\x01\x1f\x7f", "# not a comment",    "key: value",   "- item",
        "[flow]",        "{map}",            "&anchor *alias",     "!tag",         "%directive",
        "@at `tick`",    "---",              "...",                " lead trail ", "'single'",
        "true",          "null",             "~",                  "0x1F",         "1e3",
        "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "bom\xef\xbb\xbf", "nel\xc2\x85 ls\xe2\x80\xa8", "",
    };
    const char *cfg_path = path_of("round.yaml");
    for (size_t i = 0; i < sizeof hostile / sizeof hostile[0]; i++) {
        struct olmo_config a, b;
        olmo_config_defaults(&a);
        a.model.vocab_size = 64;
        snprintf(a.data.out_dir, sizeof a.data.out_dir, "runs/%s/x", hostile[i]);
        snprintf(a.data.train_path, sizeof a.data.train_path, "%s", hostile[i]);
        snprintf(a.data.eval_tasks, sizeof a.data.eval_tasks, "%s,%s", hostile[i], hostile[i]);
        CHECK(!olmo_config_write(&a, cfg_path), "write %zu: %s", i, olmo_last_error());
        CHECK(!olmo_config_absolute_paths(&a), "absolute %zu: %s", i, olmo_last_error()); /* as written */
        olmo_config_defaults(&b);
        int rc = olmo_config_load(&b, cfg_path);
        CHECK(!rc, "string %zu reads back: %s", i, olmo_last_error());
        CHECK(!rc && !strcmp(a.data.out_dir, b.data.out_dir) && !strcmp(a.data.train_path, b.data.train_path) &&
                  !strcmp(a.data.eval_tasks, b.data.eval_tasks) && b.model.vocab_size == 64,
              "string %zu round-trips: '%s' -> '%s'", i, a.data.train_path, b.data.train_path);
    }
    /* a path that is not UTF-8 cannot be YAML text: a clear error, not a file that does not load */
    struct olmo_config c;
    olmo_config_defaults(&c);
    snprintf(c.data.train_path, sizeof c.data.train_path, "bad\xff.npy");
    CHECK(olmo_config_write(&c, cfg_path) && error_has("data.train_path", NULL), "non-UTF-8 path: %s",
          olmo_last_error());
}

static int load_text(const char *text) {
    write_text("c.yaml", text);
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    return olmo_config_load(&cfg, path_of("c.yaml"));
}

/* Duplicate keys, duplicate sections and extra documents: last one won. */
static void test_config_duplicates(void) {
    CHECK(!load_text("model:\n  vocab_size: 8\ntrain:\n  seq_len: 4\n"), "plain config: %s", olmo_last_error());
    CHECK(load_text("model:\n  vocab_size: 8\n  d_model: 4\n  vocab_size: 9\n") &&
              error_has("c.yaml:4", "'model.vocab_size' appears twice (first at line 2)"),
          "duplicate key: %s", olmo_last_error());
    CHECK(load_text("model:\n  vocab_size: 8\ntrain:\n  lr: 1\nmodel:\n  d_model: 4\n") &&
              error_has("c.yaml:5", "section 'model' appears twice (first at line 1)"),
          "duplicate section: %s", olmo_last_error());
    CHECK(load_text("model: {vocab_size: 8, vocab_size: 9}\n") && error_has("c.yaml", "appears twice"),
          "duplicate key, flow style: %s", olmo_last_error());
    CHECK(load_text("model:\n  vocab_size: 8\n---\nmodel:\n  vocab_size: 9\n") &&
              error_has("c.yaml:3", "second YAML document"),
          "second document: %s", olmo_last_error());
}

/* An empty config was reported as "model.vocab_size must be positive" without naming the file. */
static void test_config_empty(void) {
    static const char *const empty[] = {"", "# only a comment\n", "---\n", "~\n", "{}\n"};
    for (size_t i = 0; i < sizeof empty / sizeof empty[0]; i++)
        CHECK(load_text(empty[i]) && error_has("c.yaml", "is empty"), "empty config %zu: %s", i, olmo_last_error());
}

/* A subnormal number was "expects a number"; out-of-range ones now say so. */
static void test_config_numbers(void) {
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    CHECK(!olmo_config_set(&cfg, "train.eps=1e-310") && cfg.train.eps == 1e-310, "subnormal accepted: %s",
          olmo_last_error());
    CHECK(!olmo_config_set(&cfg, "train.eps=4.9e-324") && cfg.train.eps > 0, "smallest subnormal: %s",
          olmo_last_error());
    CHECK(olmo_config_set(&cfg, "train.eps=1e-400") && error_has("train.eps", "underflows to 0"), "underflow: %s",
          olmo_last_error());
    CHECK(olmo_config_set(&cfg, "train.lr=1e400") && error_has("train.lr", "out of range"), "overflow: %s",
          olmo_last_error());
    CHECK(olmo_config_set(&cfg, "train.lr=nan") && error_has("train.lr", "expects a number"), "nan: %s",
          olmo_last_error());
    CHECK(olmo_config_set(&cfg, "train.lr=fast") && error_has("train.lr", "expects a number"), "word: %s",
          olmo_last_error());
}

static void small_config(struct olmo_config *cfg) {
    olmo_config_defaults(cfg);
    cfg->model = (struct olmo_model_config){.vocab_size = 64, .d_model = 32, .n_layers = 2, .n_heads = 4,
                                            .n_kv_heads = 2, .mlp_hidden = 64, .rope_theta = 1e4,
                                            .rms_norm_eps = 1e-6, .init_std = 0.02};
    cfg->train.seq_len = 16;
}

/* Absurd sizes are refused up front, naming the key and the limit. */
static void test_config_limits(void) {
    struct olmo_config cfg;
    small_config(&cfg);
    CHECK(!olmo_config_validate(&cfg), "small config valid: %s", olmo_last_error());
    static const struct {
        const char *set, *key;
    } cases[] = {
        {"model.n_layers=2147483647", "model.n_layers is 2147483647, above olmoc's limit of 1024"},
        {"model.vocab_size=16777217", "model.vocab_size is 16777217, above olmoc's limit of 16777216"},
        {"model.d_model=131072", "model.d_model is 131072, above olmoc's limit of 65536"},
        {"model.mlp_hidden=2000000000", "model.mlp_hidden is 2000000000"},
        {"train.seq_len=2000000000", "train.seq_len is 2000000000"},
        {"train.micro_batch=100000", "train.micro_batch is 100000"},
        {"train.micro_batch=4096", "train.micro_batch x train.seq_len is"}, /* with seq_len 2^20 below */
        {"train.grad_accum=2000000000", "train.grad_accum is 2000000000"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        small_config(&cfg);
        if (i == 6) cfg.train.seq_len = 1 << 20;
        CHECK(!olmo_config_set(&cfg, cases[i].set), "set %s", cases[i].set);
        CHECK(olmo_config_validate(&cfg) && error_has(cases[i].key, NULL), "%s refused: %s", cases[i].set,
              olmo_last_error());
    }
    /* a Hugging Face config.json with 2^31-1 layers: 72 s and 2 GB before failing */
    write_text("config.json", "{\"model_type\": \"olmo3\", \"vocab_size\": 64, \"hidden_size\": 32, "
                              "\"num_hidden_layers\": 2147483647, \"num_attention_heads\": 4, "
                              "\"intermediate_size\": 64}");
    small_config(&cfg);
    CHECK(olmo_hf_read_config(path_of("config.json"), &cfg) &&
              error_has("config.json", "'num_hidden_layers' is 2147483647, above olmoc's limit of 1024"),
          "HF config with 2^31-1 layers: %s", olmo_last_error());
}

/* ---------------------------------------------------------------- safetensors */

/* 8-byte length, the header as given, then `data` zero bytes. */
static void write_st(const char *name, const char *header, size_t data) {
    size_t hlen = strlen(header);
    unsigned char *buf = calloc(1, 8 + hlen + data);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    memcpy(buf + 8, header, hlen);
    write_bytes(name, buf, 8 + hlen + data);
    free(buf);
}

static int st_open_fails(const char *header, size_t data, const char *message) {
    write_st("h.safetensors", header, data);
    struct olmo_st_file f;
    if (!olmo_st_open(&f, path_of("h.safetensors"))) {
        olmo_st_close(&f);
        printf("  accepted: %s\n", header);
        return 0;
    }
    if (!error_has("h.safetensors", message)) {
        printf("  wrong message: %s\n", olmo_last_error());
        return 0;
    }
    return 1;
}

/* The header checks, tightened to what the format says. */
static void test_safetensors_format(void) {
    struct olmo_st_file f;
    write_st("ok.safetensors",
             "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}}   ",
             8);
    CHECK(!olmo_st_open(&f, path_of("ok.safetensors")) && f.n_tensors == 2 && olmo_st_find(&f, "z"), "valid file: %s",
          olmo_last_error());
    olmo_st_close(&f);
    /* a zero-length entry sorting between two overlapping tensors hid the overlap */
    CHECK(st_open_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                        "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
                        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                        12, "overlap"),
          "overlap around a zero-length tensor");
    CHECK(st_open_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}xyz", 4,
                        "not whitespace padding"),
          "bytes after the JSON inside the header length");
    CHECK(st_open_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0.5,4.5]}}", 8,
                        "data_offsets must be integers"),
          "fractional offsets");
    CHECK(st_open_fails("{\"__metadata__\":5,\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                        "__metadata__ is not an object"),
          "non-object __metadata__");
    CHECK(st_open_fails("{\"__metadata__\":{\"format\":1},\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
                        "\"data_offsets\":[0,4]}}",
                        4, "is not a string"),
          "non-string __metadata__ value");
    CHECK(st_open_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                        "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                        12, "bytes [4, 8) of the data section belong to no tensor"),
          "a hole between tensors");
    CHECK(st_open_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 12,
                        "the last 8 bytes of the data section belong to no tensor"),
          "bytes after the last tensor");
    CHECK(st_open_fails(" {\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "byte 8 is not '{'"),
          "header not starting with '{'");
}

/* Header parsing was quadratic in the number of tensors (13 MB: 221 s). */
static void test_safetensors_many_tensors(void) {
    enum { N = 200000 };
    size_t cap = (size_t)N * 80 + 16, len = 0;
    char *h = malloc(cap);
    h[len++] = '{';
    for (int i = 0; i < N; i++)
        len += (size_t)snprintf(h + len, cap - len, "%s\"layer.%d.w\":{\"dtype\":\"F32\",\"shape\":[1],"
                                "\"data_offsets\":[%d,%d]}", i ? "," : "", i, 4 * i, 4 * i + 4);
    h[len++] = '}';
    h[len] = 0;
    printf("  header of %zu bytes, %d tensors\n", len, N);
    write_st("many.safetensors", h, (size_t)N * 4);
    free(h);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct olmo_st_file f;
    int rc = olmo_st_open(&f, path_of("many.safetensors"));
    CHECK(!rc && f.n_tensors == N, "open: %s", olmo_last_error());
    bool found = true;
    for (int i = 0; i < N && !rc; i += 997) {
        char name[64];
        snprintf(name, sizeof name, "layer.%d.w", i);
        const struct olmo_st_tensor *t = olmo_st_find(&f, name);
        found &= t && t->begin == (size_t)4 * i;
    }
    CHECK(found && !olmo_st_find(&f, "layer.x.w"), "names found");
    if (!rc) olmo_st_close(&f);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("  parsed in %.2f s\n", s);
    CHECK(s < 15, "a %d-tensor header parses in seconds, took %.1f s", N, s);
}

/* An F64 tensor was "not a float type". */
static void test_safetensors_f64_message(void) {
    write_st("f64.safetensors", "{\"w\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16);
    struct olmo_st_file f;
    CHECK(!olmo_st_open(&f, path_of("f64.safetensors")), "open: %s", olmo_last_error());
    float out[2];
    CHECK(olmo_st_read_f32(&f, olmo_st_find(&f, "w"), out) && error_has("is F64", "must be F32, BF16 or F16") &&
              !error_has("not a float type", NULL),
          "F64 message: %s", olmo_last_error());
    olmo_st_close(&f);
}

/* ---------------------------------------------------------------- task files */

/* A NUL byte ended the file there: the examples after it were dropped silently. */
static void test_task_file_nul(void) {
    static const char ex[] = "{\"context\": [1, 2], \"choices\": [[3], [4]], \"label\": 0}\n";
    const size_t obj = sizeof ex - 2; /* the object without its newline */
    char text[512];
    size_t n = 0;
    memcpy(text + n, ex, obj), n += obj;
    text[n++] = 0; /* right after the first object: before the fix, one example and no error */
    for (int i = 0; i < 3; i++) memcpy(text + n, ex, sizeof ex - 1), n += sizeof ex - 1;
    write_bytes("nul.jsonl", text, n);
    struct olmo_mc_task t;
    char want[64];
    snprintf(want, sizeof want, "NUL byte at offset %zu (line 1)", obj);
    CHECK(olmo_mc_task_load(path_of("nul.jsonl"), 64, &t) && error_has("nul.jsonl", want), "NUL refused: %s",
          olmo_last_error());
    write_bytes("ok.jsonl", ex, sizeof ex - 1);
    CHECK(!olmo_mc_task_load(path_of("ok.jsonl"), 64, &t) && t.n == 1, "a clean task file loads: %s",
          olmo_last_error());
    olmo_mc_task_free(&t);
}

/* A sharded model (fully sharded training: no full-size weights) handed to
 * what needs them is refused with a message, not dereferenced. */
static void test_sharded_model_refused(void) {
    struct olmo_model_config c = {.vocab_size = 61, .d_model = 32, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                                  .mlp_hidden = 48, .rope_theta = 10000.0, .rms_norm_eps = 1e-6, .init_std = 0.02,
                                  .eos_token_id = 0, .pad_token_id = 1};
    struct olmo_backend *be = olmo_backend_create("cpu");
    struct olmo_model m;
    if (!be || olmo_model_create_sharded(&m, &c, be)) {
        CHECK(0, "sharded model: %s", olmo_last_error());
        if (be) olmo_backend_destroy(be);
        return;
    }
    CHECK(olmo_hf_load_weights(&m, check_dir) && error_has("sharded", "no full-size weights"), "hf load: %s",
          olmo_last_error());
    CHECK(olmo_hf_save_weights(&m, path_of("w.safetensors"), OLMO_ST_BF16) && error_has("sharded", "no full-size weights"),
          "hf save: %s", olmo_last_error());
    CHECK(olmo_weights_save(&m, m.weights, path_of("w.safetensors")) && error_has("sharded", "no full-size weights"),
          "weights save: %s", olmo_last_error());
    CHECK(olmo_weights_load(&m, path_of("w.safetensors")) && error_has("sharded", "olmo_weights_read"),
          "weights load: %s", olmo_last_error());
    struct olmo_gen g;
    CHECK(olmo_gen_create(&g, &m, 16, 4) && error_has("generation", "sharded"), "generate: %s", olmo_last_error());
    olmo_model_destroy(&m);
    olmo_backend_destroy(be);
}

static const struct check_case tests[] = {
    {"mix_weight_overflow", test_mix_weight_overflow, 0},
    {"fifo_token_file", test_fifo_token_file, 0},
    {"token_file_shrinks", test_token_file_shrinks, 0},
    {"config_yaml_round_trip", test_config_yaml_round_trip, 0},
    {"config_duplicates", test_config_duplicates, 0},
    {"config_empty", test_config_empty, 0},
    {"config_numbers", test_config_numbers, 0},
    {"config_limits", test_config_limits, 0},
    {"safetensors_format", test_safetensors_format, 0},
    {"safetensors_many_tensors", test_safetensors_many_tensors, 0},
    {"safetensors_f64_message", test_safetensors_f64_message, 0},
    {"task_file_nul", test_task_file_nul, 0},
    {"sharded_model_refused", test_sharded_model_refused, 0},
};

/* test_hostile [NAME...]: the named cases only (all by default). */
int main(int argc, char **argv) {
    return check_main("test_hostile", tests, sizeof tests / sizeof tests[0], argc, argv);
}
