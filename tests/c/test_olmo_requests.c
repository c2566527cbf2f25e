/* OLMo-eval request parsing (eval/olmo_tasks.h): OLMo's selection rules and
 * malformed input (runs under ASan too; the parser takes a buffer, the entry
 * point for a fuzzer). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "eval/olmo_tasks.h"
#include "util/error.h"

#define REQ(doc, idx, label, cont)                                                                                  \
    "{\"request_type\":\"loglikelihood\",\"doc_id\":" #doc ",\"idx\":" #idx ",\"label\":" label                    \
    ",\"request\":{\"context\":\"Q" #doc "\",\"continuation\":\"" cont "\"}}\n"

static int parse(const char *text, enum olmo_metric m, struct olmo_eval_requests *rq) {
    return olmo_eval_requests_parse(text, strlen(text), m, "test", rq);
}

static void test_selection(void) {
    struct olmo_eval_requests rq;
    /* unconditional requests dropped; a repeated (doc, continuation) keeps the first */
    const char *mc = REQ(0, 0, "1", " a") REQ(0, 1, "1", " b") REQ(1000000, 0, "1", " a") REQ(1, 0, "0", " c")
        REQ(0, 1, "1", " B") "\n  \r\n" REQ(1, 1, "0", " d");
    CHECK(!parse(mc, OLMO_METRIC_ACC, &rq), "%s", olmo_last_error());
    CHECK(rq.n == 4, "n %d", rq.n);
    CHECK(rq.n == 4 && !strcmp(rq.r[1].continuation, " b") && rq.r[1].label == 1 && rq.r[3].doc_id == 1,
          "selection");
    olmo_eval_requests_free(&rq);
    /* bpb: only the gold continuation, as continuation 0 */
    CHECK(!parse(mc, OLMO_METRIC_BPB, &rq), "%s", olmo_last_error());
    CHECK(rq.n == 2 && rq.r[0].cont_id == 0 && !strcmp(rq.r[0].continuation, " b") &&
              !strcmp(rq.r[1].continuation, " c"),
          "bpb gold");
    olmo_eval_requests_free(&rq);
    /* string, list and null labels keep every request (the first per document counts) */
    const char *gold = REQ(0, 0, "\"x\"", "one") REQ(0, 1, "\"x\"", "two") REQ(1, 0, "[\"a\"]", "three")
        REQ(2, 0, "null", "four") REQ(2, 1, "null", "five");
    CHECK(!parse(gold, OLMO_METRIC_BPB, &rq), "%s", olmo_last_error());
    CHECK(rq.n == 3 && !strcmp(rq.r[0].continuation, "one") && !strcmp(rq.r[2].continuation, "four"), "labels");
    olmo_eval_requests_free(&rq);
}

static void test_errors(void) {
    static const struct {
        const char *text, *msg;
        enum olmo_metric m;
    } cases[] = {
        {"", "no request", OLMO_METRIC_ACC},
        {REQ(1000001, 0, "0", "x"), "no request", OLMO_METRIC_ACC},
        {"[1,2]\n", "not a JSON object", OLMO_METRIC_ACC},
        {"{\"doc_id\":0} {}\n", "text after", OLMO_METRIC_ACC},
        {"{\"doc_id\":-1}\n", "doc_id", OLMO_METRIC_ACC},
        {"{\"doc_id\":0.5}\n", "doc_id", OLMO_METRIC_ACC},
        {"{\"doc_id\":0,\"request_type\":\"generate_until\"}\n", "request_type", OLMO_METRIC_ACC},
        {"{\"doc_id\":0,\"request_type\":\"loglikelihood\",\"idx\":0,\"label\":0,\"request\":{}}\n", "context",
         OLMO_METRIC_ACC},
        {REQ(0, 0, "\"x\"", "a"), "label", OLMO_METRIC_ACC},
        {REQ(0, 0, "{}", "a"), "label", OLMO_METRIC_BPB},
        {"{\"doc_id\":0,\"idx\":1e300}\n", "request_type", OLMO_METRIC_ACC},
        {"{\"a\":\"\\ud800\"}\n", "not a JSON object", OLMO_METRIC_ACC},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct olmo_eval_requests rq;
        int rc = parse(cases[i].text, cases[i].m, &rq);
        CHECK(rc && strstr(olmo_last_error(), cases[i].msg), "case %zu: rc %d, '%s'", i, rc, olmo_last_error());
        if (!rc) olmo_eval_requests_free(&rq);
    }
    /* a NUL byte inside a line, and a buffer without a final newline */
    const char nul[] = "{\"doc_id\":0,\0}\n";
    struct olmo_eval_requests rq;
    CHECK(olmo_eval_requests_parse(nul, sizeof nul - 1, OLMO_METRIC_ACC, "test", &rq) &&
              strstr(olmo_last_error(), "NUL"),
          "NUL: %s", olmo_last_error());
    const char *last = REQ(3, 0, "0", "z");
    CHECK(!olmo_eval_requests_parse(last, strlen(last) - 1, OLMO_METRIC_ACC, "test", &rq) && rq.n == 1,
          "no final newline");
    olmo_eval_requests_free(&rq);
    /* every prefix of a valid file: an error or a parse, never a crash */
    const char *full = REQ(0, 0, "0", " a") REQ(0, 1, "0", " b");
    for (size_t n = 0; n <= strlen(full); n++) {
        if (!olmo_eval_requests_parse(full, n, OLMO_METRIC_LEN_NORM, "test", &rq)) olmo_eval_requests_free(&rq);
    }
}

static void test_config_metric(void) {
    enum olmo_metric m = OLMO_METRIC_ACC;
    const char *c = "{\"task_config\":{\"primary_metric\":\"acc_per_char\"}}";
    CHECK(!olmo_eval_metric_from_config(c, strlen(c), "c", &m) && m == OLMO_METRIC_LEN_NORM, "acc_per_char");
    c = "{\"task_config\":{\"primary_metric\":\"logits_per_byte\"}}";
    CHECK(!olmo_eval_metric_from_config(c, strlen(c), "c", &m) && m == OLMO_METRIC_BPB, "logits_per_byte");
    c = "{\"task_config\":{\"primary_metric\":\"acc_uncond\"}}";
    CHECK(olmo_eval_metric_from_config(c, strlen(c), "c", &m) && strstr(olmo_last_error(), "acc_uncond"), "pmi");
    c = "{\"task_config\":";
    CHECK(olmo_eval_metric_from_config(c, strlen(c), "c", &m), "truncated");
}

int main(void) {
    test_selection();
    test_errors();
    test_config_metric();
    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
