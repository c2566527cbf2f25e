/* Test helper for the tokenizer (driven by tests/python/test_tokenizer.py).
 *
 *   tok_tool encode TOKENIZER IN OUT [--split-special] [--stream CHUNK]
 *       IN: records of (u32 length, bytes); OUT: records of (u32 n, n x u32 ids).
 *       --stream CHUNK feeds each record in CHUNK-byte pieces through the
 *       partial (streaming) API, cutting only at UTF-8 character starts.
 *   tok_tool decode TOKENIZER IN OUT [--skip-special]
 *       IN: records of (u32 n, n x u32 ids); OUT: records of (u32 length, bytes).
 *   tok_tool info TOKENIZER
 *       prints vocab_size and the ids of <|endoftext|> and <|pad|>.
 * All integers little-endian. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"
#include "util/error.h"

static int read_u32(FILE *f, uint32_t *v) { return fread(v, 4, 1, f) == 1 ? 0 : -1; }

static int die(const char *what) {
    fprintf(stderr, "tok_tool: %s: %s\n", what, olmo_last_error());
    return 1;
}

/* Streams text through the partial API in pieces of `chunk` bytes. */
static int encode_streamed(struct olmo_encoder *enc, const uint8_t *text, size_t len, size_t chunk, int flags,
                           struct olmo_ids *out) {
    uint8_t *buf = malloc(3 * len + 8);
    uint8_t *carry = malloc(3 * len + 8);
    size_t carry_n = 0, pos = 0;
    int cont = 0, rc = 0;
    while (pos < len) {
        size_t end = pos + chunk < len ? pos + chunk : len;
        while (end < len && (text[end] & 0xC0) == 0x80) end++; /* cut at a character start */
        bool last = end == len;
        size_t n_repl;
        size_t fixed = olmo_utf8_sanitize(text + pos, end - pos, buf, true, NULL, &n_repl);
        memcpy(carry + carry_n, buf, fixed);
        carry_n += fixed;
        size_t consumed = carry_n;
        int f = flags | (last ? 0 : OLMO_ENCODE_PARTIAL) | (cont ? OLMO_ENCODE_CONTINUATION : 0);
        if (olmo_encode(enc, (const char *)carry, carry_n, f, out, last ? NULL : &consumed, NULL)) {
            rc = -1;
            break;
        }
        if (consumed) cont = 1;
        memmove(carry, carry + consumed, carry_n - consumed);
        carry_n -= consumed;
        pos = end;
    }
    free(buf);
    free(carry);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: tok_tool encode|decode|info TOKENIZER [IN OUT] [options]\n");
        return 2;
    }
    struct olmo_tokenizer *tok;
    if (olmo_tokenizer_load(&tok, argv[2])) return die("load");
    if (!strcmp(argv[1], "info")) {
        printf("vocab_size %u\neos %lld\npad %lld\n", olmo_tokenizer_vocab_size(tok),
               (long long)olmo_tokenizer_token_to_id(tok, "<|endoftext|>"),
               (long long)olmo_tokenizer_token_to_id(tok, "<|pad|>"));
        olmo_tokenizer_free(tok);
        return 0;
    }
    if (argc < 5) return 2;
    int flags = 0;
    bool skip_special = false;
    size_t stream = 0;
    for (int i = 5; i < argc; i++) {
        if (!strcmp(argv[i], "--split-special")) flags |= OLMO_ENCODE_SPLIT_SPECIAL;
        else if (!strcmp(argv[i], "--skip-special")) skip_special = true;
        else if (!strcmp(argv[i], "--stream") && i + 1 < argc) stream = strtoul(argv[++i], NULL, 10);
    }
    FILE *in = fopen(argv[3], "rb"), *out = fopen(argv[4], "wb");
    if (!in || !out) {
        fprintf(stderr, "tok_tool: cannot open files\n");
        return 1;
    }
    struct olmo_encoder *enc = olmo_encoder_new(tok);
    if (!enc) return die("encoder");
    struct olmo_ids ids = {0};
    uint32_t n;
    int rc = 0;
    while (read_u32(in, &n) == 0) {
        if (!strcmp(argv[1], "encode")) {
            char *text = malloc(n + 1);
            if (fread(text, 1, n, in) != n) {
                fprintf(stderr, "tok_tool: truncated input\n");
                return 1;
            }
            ids.n = 0;
            int r = stream ? encode_streamed(enc, (const uint8_t *)text, n, stream, flags, &ids)
                           : olmo_encode(enc, text, n, flags, &ids, NULL, NULL);
            free(text);
            if (r) {
                rc = die("encode");
                break;
            }
            uint32_t m = (uint32_t)ids.n;
            fwrite(&m, 4, 1, out);
            fwrite(ids.ids, 4, ids.n, out);
        } else {
            uint32_t *v = malloc((size_t)n * 4 + 4);
            if (fread(v, 4, n, in) != n) {
                fprintf(stderr, "tok_tool: truncated input\n");
                return 1;
            }
            char *text;
            size_t len;
            int r = olmo_decode(tok, v, n, skip_special, &text, &len);
            free(v);
            if (r) {
                rc = die("decode");
                break;
            }
            uint32_t m = (uint32_t)len;
            fwrite(&m, 4, 1, out);
            fwrite(text, 1, len, out);
            free(text);
        }
    }
    olmo_ids_free(&ids);
    olmo_encoder_free(enc);
    olmo_tokenizer_free(tok);
    fclose(in);
    if (fclose(out)) return 1;
    return rc;
}
