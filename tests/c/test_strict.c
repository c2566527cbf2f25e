/* Strict reading of numbers, configs and headers: each case here was
 * accepted with a surprising meaning, or refused with a misleading message,
 * before its fix.  Runs under ASan+UBSan too. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "config/config.h"
#include "data/npy.h"
#include "model/hf.h"
#include "util/error.h"

static int set(struct olmo_config *cfg, const char *assignment) { return olmo_config_set(cfg, assignment); }

static int load_yaml(const char *text) {
    write_text("c.yaml", text);
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    return olmo_config_load(&cfg, path_of("c.yaml"));
}

/* --set 'train.seed= -1' was 2^64-1 (strtoull takes a minus sign after blanks), lr: 0x10 was 16
 * (strtod reads hexadecimal), 2^64 saturated, and no range was checked at all. */
static void test_config_number_syntax(void) {
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    CHECK(set(&cfg, "train.seed= -1") && error_has("train.seed", "non-negative integer"), "seed -1: %s",
          olmo_last_error());
    CHECK(cfg.train.seed == 0, "seed unchanged: %llu", (unsigned long long)cfg.train.seed);
    CHECK(set(&cfg, "train.seed=-1") && error_has("train.seed", "non-negative"), "seed -1: %s", olmo_last_error());
    CHECK(set(&cfg, "train.seed=18446744073709551616") &&
              error_has("train.seed must be in [0, 18446744073709551615], got 18446744073709551616", NULL),
          "seed 2^64: %s", olmo_last_error());
    CHECK(!set(&cfg, "train.seed=18446744073709551615") && cfg.train.seed == UINT64_MAX, "seed 2^64-1: %s",
          olmo_last_error());
    CHECK(!set(&cfg, "train.seed= 7 ") && cfg.train.seed == 7, "blanks around a number: %s", olmo_last_error());
    CHECK(set(&cfg, "train.lr=0x10") && error_has("'train.lr' expects a number, got '0x10'", "hexadecimal"),
          "hex lr: %s", olmo_last_error());
    CHECK(set(&cfg, "train.steps=0x10") && error_has("'train.steps' expects an integer", "hexadecimal"),
          "hex steps: %s", olmo_last_error());
    CHECK(set(&cfg, "train.lr=infinity") && error_has("'train.lr' expects a number", NULL), "inf: %s",
          olmo_last_error());
    CHECK(set(&cfg, "train.lr=1e") && error_has("'train.lr' expects a number", NULL), "1e: %s", olmo_last_error());
    const char *ok[] = {"train.lr=3e-4", "train.lr=.5", "train.lr=5.", "train.lr=+1E+2", "train.lr=0.0001"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        CHECK(!set(&cfg, ok[i]), "%s accepted: %s", ok[i], olmo_last_error());
    CHECK(cfg.train.lr == 0.0001, "lr %g", cfg.train.lr);
    CHECK(load_yaml("train:\n  lr: 0x10\n") && error_has("c.yaml:2", "hexadecimal"), "hex in YAML: %s",
          olmo_last_error());
}

/* Out-of-range values are refused at once, naming the key and its range. */
static void test_config_ranges(void) {
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    static const struct {
        const char *set, *message;
    } cases[] = {
        {"train.steps=-5", "train.steps must be >= 0, got -5"},
        {"model.rms_norm_eps=1e300", "model.rms_norm_eps must be in [1.1754943508222875e-38, 1], got 1e300"},
        {"model.rms_norm_eps=1e-300", "model.rms_norm_eps must be in"},
        {"model.pad_token_id=-1", "model.pad_token_id must be in [0, 16777215], got -1"},
        {"model.pad_token_id=2147483647", "model.pad_token_id must be in [0, 16777215]"},
        {"model.eos_token_id=-3", "model.eos_token_id must be in [0, 16777215], got -3"},
        {"model.vocab_size=99999999999", "model.vocab_size must be in [1, 2147483647], got 99999999999"},
        {"model.n_layers=-1", "model.n_layers must be >= 1, got -1"},
        {"train.steps=99999999999999999999", "train.steps must be in [0, 9223372036854775807]"},
        {"train.beta1=1", "train.beta1 must be in [0, 1), got 1"},
        {"train.lr=0", "train.lr must be > 0, got 0"},
        {"train.alpha_f=1.5", "train.alpha_f must be in [0, 1], got 1.5"},
        {"model.sliding_window=-1", "model.sliding_window must be >= 0"},
        {"train.keep_last=-2", "train.keep_last must be >= 0"},
        {"data.max_target_sequence_length=-64", "data.max_target_sequence_length must be >= 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK(set(&cfg, cases[i].set) && error_has(cases[i].message, NULL), "%s: %s", cases[i].set,
              olmo_last_error());
    CHECK(load_yaml("model:\n  rms_norm_eps: 1.0e+300\n") && error_has("c.yaml:2", "model.rms_norm_eps must be in"),
          "YAML eps: %s", olmo_last_error());
    /* the same ranges hold for a config built in code */
    olmo_config_defaults(&cfg);
    cfg.model = (struct olmo_model_config){.vocab_size = 64, .d_model = 32, .n_layers = 2, .n_heads = 4,
                                           .n_kv_heads = 2, .mlp_hidden = 64, .rope_theta = 1e4,
                                           .rms_norm_eps = 1e-6, .init_std = 0.02};
    cfg.train.seq_len = 16;
    CHECK(!olmo_config_validate(&cfg), "small config: %s", olmo_last_error());
    cfg.model.rms_norm_eps = 1e300;
    CHECK(olmo_config_validate(&cfg) && error_has("model.rms_norm_eps must be in", NULL), "validate eps: %s",
          olmo_last_error());
    cfg.model.rms_norm_eps = 1e-6;
    cfg.model.pad_token_id = -1;
    CHECK(olmo_config_validate(&cfg) && error_has("model.pad_token_id must be in", NULL), "validate pad: %s",
          olmo_last_error());
}

/* A misspelled key got "unknown key" alone. */
static void test_config_did_you_mean(void) {
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    static const struct {
        const char *set, *message;
    } cases[] = {
        {"train.lrr=1", "unknown key 'train.lrr' (did you mean 'train.lr'?)"},
        {"train.save_evry=3", "did you mean 'train.save_every'?"},
        {"model.lr=1", "did you mean 'train.lr'?"},
        {"seq_len=8", "did you mean 'train.seq_len'?"},
        {"model.vocabsize=8", "did you mean 'model.vocab_size'?"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK(set(&cfg, cases[i].set) && error_has(cases[i].message, NULL), "%s: %s", cases[i].set,
              olmo_last_error());
    CHECK(set(&cfg, "model.zzzz=1") && error_has("unknown key 'model.zzzz'", NULL) && !error_has("did you mean", NULL),
          "nothing close: %s", olmo_last_error());
    CHECK(load_yaml("train:\n  warmup_step: 3\n") && error_has("c.yaml:2", "did you mean 'train.warmup_steps'?"),
          "YAML key: %s", olmo_last_error());
    CHECK(load_yaml("trian:\n  lr: 1\n") && error_has("c.yaml:1", "did you mean 'train'?"), "YAML section: %s",
          olmo_last_error());
}


/* ---------------------------------------------------------------- Hugging Face config.json */

#define HF_SIZES                                                                                      \
    "\"model_type\": \"olmo3\", \"vocab_size\": 64, \"hidden_size\": 32, \"num_hidden_layers\": 2, " \
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 64"
#define HF_BASE HF_SIZES ", \"eos_token_id\": 0"

static int read_hf(const char *text) {
    write_text("config.json", text);
    struct olmo_config cfg;
    olmo_config_defaults(&cfg);
    int rc = olmo_hf_read_config(path_of("config.json"), &cfg);
    return rc ? rc : olmo_config_validate(&cfg);
}

/* Duplicate keys resolved differently from transformers (cJSON the first, Python's json the last);
 * rms_norm_eps 1e300 gave a uniform model; pad id 9000 of a 64-token vocabulary was accepted. */
static void test_hf_config_strict(void) {
    CHECK(!read_hf("{" HF_BASE ", \"pad_token_id\": 1, \"rms_norm_eps\": 1e-6}"), "valid config: %s",
          olmo_last_error());
    CHECK(read_hf("{" HF_BASE ", \"rms_norm_eps\": 1e-6, \"rms_norm_eps\": 1e-5}") &&
              error_has("config.json", "key 'rms_norm_eps' appears twice"),
          "duplicate key: %s", olmo_last_error());
    CHECK(read_hf("{" HF_BASE ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1e4, "
                  "\"rope_theta\": 5e5}}") &&
              error_has("key 'rope_theta' appears twice", NULL),
          "nested duplicate: %s", olmo_last_error());
    CHECK(read_hf("{" HF_BASE ", \"rms_norm_eps\": 1e300}") &&
              error_has("config.json: 'rms_norm_eps'", "model.rms_norm_eps must be in"),
          "eps 1e300: %s", olmo_last_error());
    CHECK(read_hf("{" HF_BASE ", \"rms_norm_eps\": 0}") && error_has("'rms_norm_eps'", "must be in"), "eps 0: %s",
          olmo_last_error());
    CHECK(read_hf("{" HF_BASE ", \"pad_token_id\": 9000}") &&
              error_has("config.json: 'pad_token_id' is 9000, outside the vocabulary [0, 64)", NULL),
          "pad 9000: %s", olmo_last_error());
    CHECK(read_hf("{" HF_BASE ", \"pad_token_id\": -1}") && error_has("'pad_token_id' is -1, outside", NULL),
          "pad -1: %s", olmo_last_error());
    CHECK(read_hf("{" HF_BASE ", \"bos_token_id\": 64}") && error_has("'bos_token_id' is 64, outside", NULL),
          "bos 64: %s", olmo_last_error());
    CHECK(read_hf("{" HF_SIZES ", \"eos_token_id\": [0, 100]}") && error_has("'eos_token_id' is 100, outside", NULL),
          "eos list: %s", olmo_last_error());
    CHECK(read_hf("{\"model_type\": \"olmo3\", \"vocab_size\": 0, \"hidden_size\": 32, \"num_hidden_layers\": 2, "
                  "\"num_attention_heads\": 4, \"intermediate_size\": 64}") &&
              error_has("config.json: 'vocab_size' is 0; it must be positive", NULL),
          "vocab 0: %s", olmo_last_error());
    CHECK(read_hf("{" HF_BASE ", \"sliding_window\": -4}") && error_has("'sliding_window' is -4", NULL),
          "window -4: %s", olmo_last_error());
    CHECK(read_hf("{" HF_BASE ", \"max_position_embeddings\": 3e9}") &&
              error_has("'max_position_embeddings' is 3000000000, beyond olmoc's integers", NULL),
          "3e9 called 'must be an integer': %s", olmo_last_error());
    CHECK(read_hf("{" HF_BASE ",}") && error_has("config.json: not valid JSON (syntax error at byte offset", NULL),
          "trailing comma called 'not a JSON object': %s", olmo_last_error());
    CHECK(read_hf("{" HF_BASE "} {}") && error_has("text after the document", NULL), "two documents: %s",
          olmo_last_error());
    CHECK(read_hf("[1]") && error_has("config.json: not a JSON object", NULL), "a list: %s", olmo_last_error());
}

/* ---------------------------------------------------------------- .npy headers */

/* A version-1 .npy file with this header dict and data_bytes bytes of data, parsed. */
static int parse_npy(const char *dict, size_t data_bytes, int *elem, size_t *n) {
    static uint8_t buf[1 << 17];
    const size_t hlen = strlen(dict);
    if (10 + hlen + data_bytes > sizeof buf) return -2;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (uint8_t)(hlen & 0xff), buf[9] = (uint8_t)(hlen >> 8);
    memcpy(buf + 10, dict, hlen);
    memset(buf + 10 + hlen, 0, data_bytes);
    size_t off;
    return olmo_npy_parse_header(buf, 10 + hlen + data_bytes, "t.npy", elem, &off, n);
}

/* Misleading .npy messages: a 1-D shape written "( 20000 ,)" was "must be 1-D", a header in double
 * quotes "lacks descr", a negative size a promise of 2^64-4 tokens, a header longer than 64 KiB
 * "truncated", and a 1-D array marked Fortran-ordered (the same bytes) refused. */
static void test_npy_messages(void) {
    int elem = 0;
    size_t n = 0;
    CHECK(!parse_npy("{'descr': '<u2', 'fortran_order': False, 'shape': ( 20000 ,), }", 40000, &elem, &n) &&
              n == 20000 && elem == 2,
          "shape ( 20000 ,): %s", olmo_last_error());
    CHECK(!parse_npy("{\"descr\": \"<u4\", \"fortran_order\": False, \"shape\": (4,)}", 16, &elem, &n) && n == 4 &&
              elem == 4,
          "double quotes: %s", olmo_last_error());
    CHECK(!parse_npy("{'descr': '<u2', 'fortran_order': True, 'shape': (3,), }", 6, &elem, &n) && n == 3,
          "1-D Fortran order: %s", olmo_last_error());
    CHECK(parse_npy("{'descr': '<u2', 'fortran_order': False, 'shape': (4, 5), }", 40, &elem, &n) &&
              error_has("t.npy", "must be 1-D, the .npy header's shape (4, 5) has two or more dimensions"),
          "2-D: %s", olmo_last_error());
    CHECK(parse_npy("{'descr': '<u2', 'fortran_order': False, 'shape': (), }", 2, &elem, &n) &&
              error_has("shape () has no dimension", NULL),
          "scalar: %s", olmo_last_error());
    CHECK(parse_npy("{'descr': '<u2', 'fortran_order': False, 'shape': (-4,), }", 8, &elem, &n) &&
              error_has("shape is not a tuple of sizes: (-4,)", NULL),
          "negative size: %s", olmo_last_error());
    CHECK(parse_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", 16, &elem, &n) &&
              error_has("wrong dtype at byte offset", "header says '<f4'") && !error_has("'<f4', ", NULL),
          "float: %s", olmo_last_error());
    CHECK(parse_npy("{'descr': '<u2', 'shape': (4,), }", 8, &elem, &n) &&
              error_has("has no 'fortran_order' entry", NULL),
          "missing key named: %s", olmo_last_error());
    CHECK(parse_npy("{'descr': '<u2', 'fortran_order': False, 'shape': (40,), }", 8, &elem, &n) &&
              error_has("promises 40 tokens of 2 bytes", "(room for 4)"),
          "truncated: %s", olmo_last_error());
    /* a version-2 header of 100000 bytes in a file that holds it: too long for olmoc, not truncated */
    static uint8_t big[100100];
    memcpy(big, "\x93NUMPY\x02\x00", 8);
    const uint32_t hlen = 100000;
    memcpy(big + 8, &hlen, 4);
    memset(big + 12, ' ', hlen);
    size_t off;
    CHECK(olmo_npy_parse_header(big, sizeof big, "big.npy", &elem, &off, &n) &&
              error_has("header length at offset 8 is 100000 bytes, more than olmoc reads", NULL) &&
              !error_has("truncated", NULL),
          "long header: %s", olmo_last_error());
}

static const struct check_case tests[] = {
    {"config_number_syntax", test_config_number_syntax, 0},
    {"config_ranges", test_config_ranges, 0},
    {"config_did_you_mean", test_config_did_you_mean, 0},
    {"hf_config_strict", test_hf_config_strict, 0},
    {"npy_messages", test_npy_messages, 0},
};

/* test_strict [NAME...]: the named cases only (all by default). */
int main(int argc, char **argv) {
    return check_main("test_strict", tests, sizeof tests / sizeof tests[0], argc, argv);
}
