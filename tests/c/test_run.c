/* The training run's pieces that need no data files: the startup peak FLOP/s
 * measurement on a backend that only queues work, the datasheet GPU peaks,
 * the micro-batch size limit,
 * and the metrics log (JSON for non-finite values, escaped names, checked
 * writes, what resume keeps and what it refuses). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "config/config.h"
#include "train/metrics.h"
#include "train/run.h"
#include "train/trainer.h"
#include "util/error.h"
#include "util/fs.h"

static int failures, checks;

static void check(int ok, const char *what) {
    checks++;
    if (!ok) failures++;
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    if (!ok) printf("     last error: %s\n", olmo_last_error());
}

/* A device: a GEMM is only queued; synchronize waits QUEUED_SECONDS per product. */
#define QUEUED_SECONDS 0.02
static int queued;
static int queued_gemm(const struct olmo_backend *be, bool ta, bool tb, int m, int n, int k, float alpha, const void *a,
                       enum olmo_float_type at, int lda, const void *b, enum olmo_float_type bt, int ldb, float beta,
                       float *c, int ldc) {
    (void)be, (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)at, (void)lda, (void)b;
    (void)bt, (void)ldb, (void)beta, (void)c, (void)ldc;
    queued++;
    return 0;
}
static int wait_for_queue(const struct olmo_backend *be) {
    (void)be;
    if (queued) usleep((useconds_t)(queued * QUEUED_SECONDS * 1e6));
    queued = 0;
    return 0;
}

static void test_peak_waits_for_the_device(void) {
    struct olmo_backend *cpu = olmo_backend_create("cpu");
    if (!cpu) {
        check(0, "cpu backend");
        return;
    }
    struct olmo_backend device = *cpu; /* the CPU's memory ops and state, a device's GEMM and synchronize */
    device.gemm = queued_gemm;
    device.synchronize = wait_for_queue;
    const double peak = olmo_measure_peak_flops(&device), n = 2048;
    olmo_backend_destroy(cpu);
    printf("     measured %.3g FLOP/s on a device that takes %.2fs a product\n", peak, QUEUED_SECONDS);
    check(peak > 0 && peak <= 2 * n * n * n / QUEUED_SECONDS * 1.01, "peak FLOP/s counts the device's time");
}

/* MFU's datasheet peak by device name and backend precision (train/peak.h). */
static void test_datasheet_peaks(void) {
    const struct {
        const char *device, *backend;
        double tflops;
        const char *what;
    } cases[] = {
        {"NVIDIA H100 80GB HBM3", "cuda-bf16", 989.4, "datasheet bf16 dense peak of H100 SXM"},
        {"NVIDIA H100 80GB HBM3", "cuda-bf16-cublas", 989.4, "datasheet bf16 dense peak of H100 SXM"},
        {"NVIDIA H100 80GB HBM3", "cuda-tf32", 494.7, "datasheet tf32 dense peak of H100 SXM"},
        {"NVIDIA H100 80GB HBM3", "cuda", 66.9, "datasheet fp32 dense peak of H100 SXM"},
        {"NVIDIA H100 PCIe", "cuda-bf16", 756.0, "datasheet bf16 dense peak of H100 PCIe"},
        {"NVIDIA H100 NVL", "cuda-bf16", 835.5, "datasheet bf16 dense peak of H100 NVL"},
        {"NVIDIA H200", "cuda-bf16", 989.4, "datasheet bf16 dense peak of H200 SXM"},
        {"NVIDIA H200 NVL", "cuda", 60.0, "datasheet fp32 dense peak of H200 NVL"},
        {"NVIDIA A100-SXM4-80GB", "cuda-bf16", 312.0, "datasheet bf16 dense peak of A100"},
        {"NVIDIA A100 80GB PCIe", "cuda-tf32", 156.0, "datasheet tf32 dense peak of A100"},
        {"NVIDIA GeForce RTX 4090", "cuda-bf16", 0.0, ""},
        {NULL, "cpu", 0.0, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char what[160] = "";
        const double peak = olmo_datasheet_peak_flops(cases[i].device, cases[i].backend, what, sizeof what);
        char name[200];
        snprintf(name, sizeof name, "datasheet peak of %s on %s", cases[i].device ? cases[i].device : "the host",
                 cases[i].backend);
        check(fabs(peak - cases[i].tflops * 1e12) < 1e6 && (!peak || !strcmp(what, cases[i].what)), name);
    }
}

static void tiny_config(struct olmo_config *cfg) {
    olmo_config_defaults(cfg);
    cfg->model.vocab_size = 64, cfg->model.d_model = 32, cfg->model.n_layers = 1, cfg->model.n_heads = 4;
    cfg->model.n_kv_heads = 2, cfg->model.mlp_hidden = 64, cfg->model.eos_token_id = 0, cfg->model.pad_token_id = 1;
}

static void test_micro_batch_must_fit_int(void) {
    struct olmo_config cfg;
    tiny_config(&cfg);
    cfg.train.micro_batch = 1 << 20, cfg.train.seq_len = 1 << 16; /* 2^36 tokens: 0 in int */
    struct olmo_trainer tr;
    struct olmo_backend *cpu = olmo_backend_create("cpu");
    const int rc = olmo_trainer_init(&tr, &cfg, cpu);
    check(rc != 0 && strstr(olmo_last_error(), "train.micro_batch x train.seq_len"),
          "micro_batch x seq_len beyond int is refused before allocating");
    if (!rc) olmo_trainer_destroy(&tr);
    cfg.train.micro_batch = 2, cfg.train.seq_len = 16;
    const int ok = olmo_trainer_init(&tr, &cfg, cpu);
    check(ok == 0, "a small micro-batch is accepted");
    if (!ok) olmo_trainer_destroy(&tr);
    olmo_backend_destroy(cpu);
}

static char *slurp(const char *path) {
    char *text;
    size_t len;
    return olmo_read_file(path, 1 << 20, &text, &len) ? NULL : text;
}

static void spit(const char *path, const char *text, size_t len) {
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(text, 1, len, f);
        fclose(f);
    }
}

static void test_records(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    struct olmo_metrics m;
    check(olmo_metrics_open(&m, path, 0, NULL) == 0, "open a new log");
    cJSON *rec = olmo_metrics_record("eval", 7);
    cJSON_AddStringToObject(rec, "set", "a \"quoted\"\\name\n");
    olmo_metrics_add_num(rec, "loss", "%.17g", NAN);
    olmo_metrics_add_num(rec, "ppl", "%.17g", INFINITY);
    olmo_metrics_add_num(rec, "lr", "%.17g", 0.1);
    olmo_metrics_add_int(rec, "tokens", 496);
    check(olmo_metrics_write(&m, rec) == 0 && olmo_metrics_close(&m) == 0, "write a record");
    char *text = slurp(path);
    check(text && !strcmp(text, "{\"type\":\"eval\",\"step\":7,\"set\":\"a \\\"quoted\\\"\\\\name\\n\",\"loss\":null,"
                                "\"ppl\":null,\"lr\":0.10000000000000001,\"tokens\":496}\n"),
          "non-finite values are null, names escaped, 17 significant digits");
    if (text) printf("     %s", text);
    cJSON *back = text ? cJSON_Parse(text) : NULL;
    const cJSON *set = cJSON_GetObjectItemCaseSensitive(back, "set");
    check(cJSON_IsString(set) && !strcmp(set->valuestring, "a \"quoted\"\\name\n"), "the record parses back");
    cJSON_Delete(back);
    free(text);
    /* a new run in the directory of one that saved no checkpoint */
    FILE *notes = tmpfile();
    check(notes && olmo_metrics_open(&m, path, 0, notes) == 0 && olmo_metrics_close(&m) == 0, "start over");
    char said[512] = "";
    rewind(notes);
    said[fread(said, 1, sizeof said - 1, notes)] = 0;
    fclose(notes);
    text = slurp(path);
    check(text && !text[0] && strstr(said, "removed 1 record of an earlier run"), "the old records go, and it is said");
    free(text);
}

static void test_full_disk(void) {
    struct olmo_metrics m;
    if (olmo_metrics_open(&m, "/dev/full", 0, NULL)) {
        check(0, "open /dev/full");
        return;
    }
    const int rc = olmo_metrics_write(&m, olmo_metrics_record("train", 1));
    check(rc != 0 && strstr(olmo_last_error(), "/dev/full") && strstr(olmo_last_error(), "No space left"),
          "a write to a full disk is an error naming the file");
    olmo_metrics_close(&m);
}

static void test_resume(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/resume.jsonl", dir);
    /* steps 1..4 (step 2 as an older olmoc wrote NaN: not JSON) and a line cut short by a kill */
    const char log_text[] = "{\"type\":\"train\",\"step\":1,\"loss\":4.5}\n"
                            "{\"type\":\"train\",\"step\":2,\"loss\":-nan}\n"
                            "{\"type\":\"eval\",\"step\":2,\"set\":\"v\",\"loss\":4}\n"
                            "{\"type\":\"train\",\"step\":3,\"loss\":4.1}\n"
                            "{\"type\":\"train\",\"step\":4,\"loss\":4.0}\n"
                            "{\"type\":\"train\",\"st";
    spit(path, log_text, sizeof log_text - 1);
    FILE *notes = tmpfile();
    struct olmo_metrics m;
    check(olmo_metrics_open(&m, path, 2, notes) == 0 && olmo_metrics_close(&m) == 0, "resume at step 2");
    char *text = slurp(path);
    check(text && !strcmp(text, "{\"type\":\"train\",\"step\":1,\"loss\":4.5}\n"
                                "{\"type\":\"train\",\"step\":2,\"loss\":-nan}\n"
                                "{\"type\":\"eval\",\"step\":2,\"set\":\"v\",\"loss\":4}\n"),
          "records up to the checkpoint kept, an old NaN record included");
    free(text);
    char said[512] = "";
    rewind(notes);
    size_t n = fread(said, 1, sizeof said - 1, notes);
    said[n] = 0;
    fclose(notes);
    printf("%s", said);
    check(strstr(said, "removed 2 records after step 2") && strstr(said, "incomplete last line"),
          "what resume removes is said");

    const char nul_text[] = "{\"type\":\"train\",\"step\":1}\n{\"type\":\"tr\0\0\0\0\",\"step\":2}\n";
    spit(path, nul_text, sizeof nul_text - 1);
    check(olmo_metrics_open(&m, path, 1, NULL) != 0 && strstr(olmo_last_error(), path) &&
              strstr(olmo_last_error(), "NUL byte at offset 37"),
          "a NUL byte is refused with the file and offset");
    char *after;
    size_t len = 0;
    check(!olmo_read_file(path, 1 << 20, &after, &len) && len == sizeof nul_text - 1, "and the file is left as it was");
    if (len) free(after);

    spit(path, "{\"step\":1}\nhello\n", 17);
    check(olmo_metrics_open(&m, path, 1, NULL) != 0 && strstr(olmo_last_error(), "offset 11"),
          "a line that is no record is refused with its offset");
}

int main(void) {
    char dir[] = "/tmp/olmoc_test_run_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    test_peak_waits_for_the_device();
    test_datasheet_peaks();
    test_micro_batch_must_fit_int();
    test_records(dir);
    test_full_disk();
    test_resume(dir);
    olmo_remove_tree(dir);
    printf("%d/%d checks passed\n", checks - failures, checks);
    return failures ? 1 : 0;
}
