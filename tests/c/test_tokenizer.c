/* Tokenizer, UTF-8 repair and JSONL reader on hand-made inputs (runs under
 * ASan too; the comparison with Hugging Face `tokenizers` is in
 * tests/python/test_tokenizer.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "data/jsonl.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/rng.h"

static void put_cp(char **o, unsigned cp) {
    unsigned char *p = (unsigned char *)*o;
    if (cp < 0x80) {
        *p++ = (unsigned char)cp;
    } else {
        *p++ = (unsigned char)(0xC0 | cp >> 6);
        *p++ = (unsigned char)(0x80 | (cp & 0x3F));
    }
    *o = (char *)p;
}

/* GPT-2 byte -> code point. */
static unsigned byte_cp(int b) {
    int n = 0;
    for (int x = 0; x < 256; x++) {
        int keep = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
        unsigned cp = keep ? (unsigned)x : (unsigned)(256 + n++);
        if (x == b) return cp;
    }
    return 0;
}

/* JSON string literal of one byte-level character (escaping " and \). */
static void json_char(char **o, int b) {
    unsigned cp = byte_cp(b);
    if (cp == '"' || cp == '\\') *(*o)++ = '\\';
    put_cp(o, cp);
}

/* A tokenizer.json: 256 byte tokens (id = byte), a few merges, <|endoftext|> = 300. */
static const char *write_tokenizer(const char *dir) {
    static char path[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    char *buf = malloc(1 << 16), *o = buf;
    o += sprintf(o, "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":300,\"content\":\"<|endoftext|>\",\"single_word\":false,"
                    "\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true}],\"normalizer\":null,"
                    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
                    "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}"
                    "\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\","
                    "\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,"
                    "\"use_regex\":false}]},\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
                    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"fuse_unk\":false,"
                    "\"byte_fallback\":false,\"ignore_merges\":false,\"vocab\":{");
    for (int b = 0; b < 256; b++) {
        *o++ = '"';
        json_char(&o, b);
        o += sprintf(o, "\":%d,", b);
    }
    o += sprintf(o, "\"he\":256,\"ll\":257,\"hell\":258,\"hello\":259,\"");
    json_char(&o, ' ');
    o += sprintf(o, "w\":260,\"<|endoftext|>\":300},\"merges\":[\"h e\",\"l l\",[\"he\",\"ll\"],\"hell o\",\"");
    json_char(&o, ' ');
    o += sprintf(o, " w\"]}}");
    FILE *f = fopen(path, "wb");
    fwrite(buf, 1, (size_t)(o - buf), f);
    fclose(f);
    free(buf);
    return path;
}

static int encode(struct olmo_encoder *e, const char *s, int flags, uint32_t *ids, size_t max) {
    struct olmo_ids v = {0};
    if (olmo_encode(e, s, strlen(s), flags, &v, NULL, NULL)) {
        olmo_ids_free(&v);
        return -1;
    }
    int n = (int)v.n;
    if (v.n) memcpy(ids, v.ids, (v.n < max ? v.n : max) * sizeof(uint32_t));
    olmo_ids_free(&v);
    return n;
}

static int same(const uint32_t *a, int n, const uint32_t *b, int m) {
    return n == m && !memcmp(a, b, (size_t)n * sizeof(uint32_t));
}

static void test_tokenizer(const char *dir) {
    struct olmo_tokenizer *t;
    const char *path = write_tokenizer(dir);
    CHECK(!olmo_tokenizer_load(&t, path), "load: %s", olmo_last_error());
    if (failures) return;
    CHECK(olmo_tokenizer_vocab_size(t) == 301, "vocab size %u", olmo_tokenizer_vocab_size(t));
    CHECK(olmo_tokenizer_token_to_id(t, "<|endoftext|>") == 300 && olmo_tokenizer_token_to_id(t, "hello") == 259 &&
              olmo_tokenizer_token_to_id(t, "nope") == -1,
          "token_to_id");
    CHECK(olmo_tokenizer_is_special(t, 300) && !olmo_tokenizer_is_special(t, 259), "is_special");
    struct olmo_encoder *e = olmo_encoder_new(t);
    uint32_t ids[64];
    int n = encode(e, "hello", 0, ids, 64);
    CHECK(same(ids, n, (uint32_t[]){259}, 1), "hello -> [hello] (n=%d)", n);
    n = encode(e, "hello world<|endoftext|>hell", 0, ids, 64);
    uint32_t want[] = {259, 260, 'o', 'r', 'l', 'd', 300, 258};
    CHECK(same(ids, n, want, 8), "hello world<|endoftext|>hell (n=%d)", n);
    n = encode(e, "x<|endoftext|>", OLMO_ENCODE_SPLIT_SPECIAL, ids, 64);
    uint32_t want2[] = {'x', '<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't', '|', '>'};
    CHECK(same(ids, n, want2, 14), "special token as text (n=%d)", n);
    n = encode(e, "", 0, ids, 64);
    CHECK(n == 0, "empty text");
    /* invalid UTF-8: each maximal invalid subpart becomes U+FFFD (EF BF BD) */
    n = encode(e, "\xff\xe2\x82!", 0, ids, 64);
    uint32_t want3[] = {0xEF, 0xBF, 0xBD, 0xEF, 0xBF, 0xBD, '!'};
    CHECK(same(ids, n, want3, 7), "invalid UTF-8 replaced (n=%d)", n);

    /* decode(encode(x)) == x and streaming == whole on random text */
    struct olmo_rng rng;
    olmo_rng_seed(&rng, 42);
    const char *alphabet[] = {"hello", " ", "world", "\n", "\r\n", "  ", "é", "日本", "😀", "123456", "'s", "<|endoftext|>",
                              "<|", "\t", "ll", "!", "\xff", "\xe2\x82"};
    for (int trial = 0; trial < 200; trial++) {
        char text[4096];
        size_t len = 0;
        int parts = (int)(olmo_rng_next(&rng) % 60);
        for (int k = 0; k < parts; k++) {
            const char *a = alphabet[olmo_rng_next(&rng) % (sizeof alphabet / sizeof alphabet[0])];
            memcpy(text + len, a, strlen(a));
            len += strlen(a);
        }
        struct olmo_ids whole = {0}, streamed = {0};
        size_t repl;
        olmo_encode(e, text, len, 0, &whole, NULL, &repl);
        char *dec;
        size_t dec_len;
        CHECK(!olmo_decode(t, whole.ids, whole.n, false, &dec, &dec_len), "decode");
        uint8_t fixed[3 * 4096];
        size_t fl = olmo_utf8_sanitize((const uint8_t *)text, len, fixed, true, NULL, NULL);
        CHECK(dec_len == fl && !memcmp(dec, fixed, fl), "round trip %d", trial);
        free(dec);
        /* stream in pieces of 1..7 bytes, cut at character starts */
        uint8_t carry[3 * 4096];
        size_t carry_n = 0, pos = 0;
        int cont = 0;
        while (pos < len) {
            size_t end = pos + 1 + olmo_rng_next(&rng) % 7;
            if (end > len) end = len;
            while (end < len && (text[end] & 0xC0) == 0x80) end++;
            bool last = end == len;
            carry_n += olmo_utf8_sanitize((const uint8_t *)text + pos, end - pos, carry + carry_n, true, NULL, NULL);
            size_t consumed = 0;
            int f = (last ? 0 : OLMO_ENCODE_PARTIAL) | (cont ? OLMO_ENCODE_CONTINUATION : 0);
            olmo_encode(e, (const char *)carry, carry_n, f, &streamed, &consumed, NULL);
            if (last) consumed = carry_n;
            if (consumed) cont = 1;
            memmove(carry, carry + consumed, carry_n - consumed);
            carry_n -= consumed;
            pos = end;
        }
        CHECK(whole.n == streamed.n && (!whole.n || !memcmp(whole.ids, streamed.ids, whole.n * 4)),
              "streaming == whole, trial %d", trial);
        olmo_ids_free(&whole);
        olmo_ids_free(&streamed);
    }
    uint32_t bad = 999;
    char *dec;
    CHECK(olmo_decode(t, &bad, 1, false, &dec, NULL) && strstr(olmo_last_error(), "999"), "decode unknown id");
    olmo_encoder_free(e);
    olmo_tokenizer_free(t);
}

static void test_utf8(void) {
    struct {
        const char *in;
        const char *out;
        size_t replaced;
    } cases[] = {
        {"plain ascii", "plain ascii", 0},
        {"caf\xc3\xa9", "caf\xc3\xa9", 0},
        {"\xc3", "\xef\xbf\xbd", 1},
        {"\xe2\x82\xff", "\xef\xbf\xbd\xef\xbf\xbd", 2},        /* truncated + invalid byte */
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 3}, /* surrogate: 3 subparts */
        {"\xf0\x9f\x98\x80\xf0\x9f\x98", "\xf0\x9f\x98\x80\xef\xbf\xbd", 1},
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd", 2}, /* overlong */
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t out[64];
        size_t repl, used;
        size_t n = olmo_utf8_sanitize((const uint8_t *)cases[i].in, strlen(cases[i].in), out, true, &used, &repl);
        CHECK(n == strlen(cases[i].out) && !memcmp(out, cases[i].out, n) && repl == cases[i].replaced,
              "sanitize case %zu", i);
    }
    uint8_t out[16];
    size_t used, repl;
    size_t n = olmo_utf8_sanitize((const uint8_t *)"ab\xf0\x9f", 4, out, false, &used, &repl);
    CHECK(n == 2 && used == 2 && repl == 0, "incomplete tail held back when not final");
    CHECK(olmo_utf8_valid_prefix((const uint8_t *)"abc\xc3\xa9\xff", 6) == 5, "valid prefix");
    /* the decoder and the encoder: every scalar value round-trips; the
     * decoder takes exactly what sanitize keeps */
    size_t bad = 0;
    for (uint32_t cp = 0; cp < 0x110000; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        uint8_t b[4];
        uint32_t back = 0;
        size_t k = olmo_utf8_encode(cp, b);
        if (olmo_utf8_decode(b, k, &back) != k || back != cp || olmo_utf8_decode(b, k - 1, &back) != 0) bad++;
    }
    CHECK(bad == 0, "utf8 encode/decode round trip (%zu bad)", bad);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const uint8_t *s = (const uint8_t *)cases[i].in;
        uint32_t cp;
        size_t k = olmo_utf8_decode(s, strlen(cases[i].in), &cp);
        CHECK((k != 0) == (olmo_utf8_valid_prefix(s, strlen(cases[i].in)) > 0), "decode agrees with validation %zu", i);
    }
    CHECK(olmo_utf8_char_start((const uint8_t *)"a\xf0\x9f\x98\x80", 4, 0) == 1, "char start");
}

static void test_jsonl(void) {
    struct olmo_json_text jt = {0};
    size_t off;
    const char *err;
    struct {
        const char *line;
        int rc;
        const char *value;
        size_t off;
    } cases[] = {
        {"{\"text\": \"hello\"}", OLMO_JSON_OK, "hello", 0},
        {"  {\"id\": 1, \"meta\": {\"a\": [1, -2.5e+3, true, false, null, \"x\"]}, \"text\": \"a\\nb\\t\\\"q\\\"\\\\\"}  ",
         OLMO_JSON_OK, "a\nb\t\"q\"\\", 0},
        {"{\"text\": \"\\u00e9\\u65e5\\ud83d\\ude00\\/\"}", OLMO_JSON_OK, "é日😀/", 0},
        {"{\"text\": \"lone \\ud800 x\"}", OLMO_JSON_OK, "lone \xef\xbf\xbd x", 0},
        {"{\"text\": \"first\", \"text\": \"last\"}", OLMO_JSON_OK, "last", 0},
        {"{\"te\\u0078t\": \"escaped key\"}", OLMO_JSON_OK, "escaped key", 0},
        {"{\"title\": \"x\"}", OLMO_JSON_NO_KEY, NULL, 0},
        {"{\"text\": 5}", OLMO_JSON_NO_KEY, NULL, 0},
        {"{\"text\": \"x\",}", OLMO_JSON_MALFORMED, NULL, 13},
        {"{\"text\": \"x\"} extra", OLMO_JSON_MALFORMED, NULL, 14},
        {"[1, 2]", OLMO_JSON_MALFORMED, NULL, 0},
        {"{\"text\": \"unterminated", OLMO_JSON_MALFORMED, NULL, 22},
        {"{\"text\": \"tab\there\"}", OLMO_JSON_MALFORMED, NULL, 13},
        {"{\"text\": \"x\", \"n\": 01}", OLMO_JSON_MALFORMED, NULL, 20},
        {"{\"text\": \"bad \\q escape\"}", OLMO_JSON_MALFORMED, NULL, 15},
        {"{\"a\": tru}", OLMO_JSON_MALFORMED, NULL, 6},
        {"", OLMO_JSON_MALFORMED, NULL, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = olmo_json_get_string(cases[i].line, strlen(cases[i].line), "text", &jt, &off, &err);
        CHECK(rc == cases[i].rc, "json case %zu: rc %d want %d (%s)", i, rc, cases[i].rc, rc ? err : "");
        if (rc == OLMO_JSON_OK && cases[i].value)
            CHECK(jt.len == strlen(cases[i].value) && !memcmp(jt.buf, cases[i].value, jt.len), "json case %zu value",
                  i);
        if (rc == OLMO_JSON_MALFORMED) CHECK(off == cases[i].off, "json case %zu: error offset %zu want %zu", i, off,
                                             cases[i].off);
    }
    /* deep nesting is an error, not a stack overflow */
    char deep[5000];
    size_t k = 0;
    k += (size_t)sprintf(deep, "{\"a\": ");
    for (int i = 0; i < 2000; i++) deep[k++] = '[';
    deep[k] = 0;
    CHECK(olmo_json_get_string(deep, k, "text", &jt, &off, &err) == OLMO_JSON_MALFORMED, "deep nesting");
    olmo_json_text_free(&jt);
}

int main(void) {
    char dir[] = "/tmp/olmoc_test_tok_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_utf8();
    test_jsonl();
    test_tokenizer(dir);
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    unlink(path);
    rmdir(dir);
    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
