/* olmoc tokenize: text or JSONL in, an OLMo token file out.
 *
 * Pipeline: the main thread reads the inputs in ~1 MiB items cut at
 * document (or, for JSONL, line) boundaries and queues them; worker threads
 * tokenize items; a writer thread writes the results in input order, so the
 * output does not depend on the thread count.  At most `window` items are
 * in flight, so memory stays constant whatever the input size (a JSONL line
 * is kept whole, so the longest line bounds it).  A text document longer
 * than an item is streamed through the encoder's partial mode piece by
 * piece, which gives exactly the tokens of encoding it whole. */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "util/clock.h"
#include "cli/commands.h"
#include "data/jsonl.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

#define ITEM_BYTES (1u << 20)
#define CARRY_MAX (4u * ITEM_BYTES)

enum input_format { FMT_AUTO, FMT_JSONL, FMT_TEXT };
enum doc_unit { DOC_FILE, DOC_PARAGRAPH, DOC_LINE };

struct options {
    const char *tokenizer, *output, *text_key;
    const char **inputs;
    int n_inputs;
    enum input_format format;
    enum doc_unit docs;
    bool strip, skip_bad, raw, parse_special, quiet;
    int elem_size; /* 0 = auto */
    const char *eos, *bos;
    int threads;
};

/* A text document that spans items: its pieces are encoded in order. */
struct stream {
    uint64_t next_piece; /* piece allowed to run */
    uint8_t *carry;      /* sanitized text not consumed yet */
    size_t carry_n, carry_cap;
    bool started, nonempty, failed;
    int64_t last_id;
    int refs;
};

struct item {
    uint64_t seq;
    int file;
    uint8_t *buf;
    size_t len;
    uint64_t line0, offset0;
    bool first_continues, last_continues;
    struct stream *stream;
    uint64_t piece;
    /* results */
    struct olmo_ids ids;
    uint64_t docs, empty, bad_lines, replaced;
    bool failed;
    char err[1200];
    struct item *next;
};

struct ctx {
    struct options opt;
    struct olmo_tokenizer *tok;
    uint32_t eos_id;
    int64_t bos_id;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done, cv_space, cv_stream;
    struct item *qhead, *qtail;
    struct item **slots;
    size_t window;
    uint64_t submitted, written;
    bool reader_done, abort;
    char error[1400];
    /* output */
    FILE *out;
    char tmp_path[1100];
    uint64_t n_tokens, n_docs, n_empty, n_bad, n_replaced, bytes_in;
    double t0, last_progress;
    bool tty;
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: olmoc tokenize --tokenizer TOKENIZER.json -o OUT.npy [options] INPUT...\n\n"
            "Tokenizes documents into an OLMo token file: each document's token ids followed\n"
            "by the EOS token, all concatenated.  Multithreaded and streaming (constant memory);\n"
            "the output is the same for any thread count.\n\n"
            "input:\n"
            "  INPUT...             files, read in order ('-' = standard input); gzip-compressed\n"
            "                       files (.gz) are decompressed on the fly (offsets in errors are\n"
            "                       then offsets in the decompressed text)\n"
            "  --format FMT         jsonl (default for *.jsonl / *.json[.gz]) or text (otherwise)\n"
            "  --text-key KEY       JSONL: the field holding the document (default: text)\n"
            "  --no-strip           JSONL: keep leading/trailing whitespace (default: strip it\n"
            "                       and skip documents left empty, as dolma does; counted)\n"
            "  --skip-bad-lines     JSONL: skip malformed lines and lines without the text field\n"
            "                       (counted) instead of stopping with an error\n"
            "  --docs UNIT          text: what one document is: file (default), paragraph\n"
            "                       (separated by blank lines) or line; empty documents are\n"
            "                       skipped and counted\n"
            "output:\n"
            "  -o, --output FILE    the token file to write (via FILE.tmp, renamed when complete)\n"
            "  --raw                write a headerless array (OLMo / dolma memmap) instead of .npy\n"
            "  --dtype T            uint16 or uint32 (default: uint16 when the vocabulary fits)\n"
            "  --eos TOKEN|ID       appended after every document (default: <|endoftext|>)\n"
            "  --bos TOKEN|ID       also put this token before every document (default: none)\n"
            "  --parse-special      match special tokens written in the text (default: encode them\n"
            "                       as plain text, like dolma's --tokenizer.encode_special_tokens)\n"
            "  --threads N          tokenizer threads (default: number of CPUs)\n"
            "  --quiet              no progress line\n"
            "  --help               show this help\n\n"
            "Invalid UTF-8 is replaced by U+FFFD (counted).  The progress line on stderr shows\n"
            "MB read, MB/s, documents and tokens.\n");
}

/* ------------------------------------------------------------ text utils */

/* Python's str.isspace() for one code point (what dolma's strip() removes). */
static bool py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* Decodes a well-formed 1-3 byte sequence at s (the only lengths py_space
 * needs); returns 0 when s does not start one. */
static size_t decode_small(const uint8_t *s, size_t n, uint32_t *cp) {
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    if (s[0] >= 0xC2 && s[0] <= 0xDF && n >= 2 && (s[1] & 0xC0) == 0x80) {
        *cp = (uint32_t)(s[0] & 0x1F) << 6 | (s[1] & 0x3F);
        return 2;
    }
    if (s[0] >= 0xE0 && s[0] <= 0xEF && n >= 3 && (s[1] & 0xC0) == 0x80 && (s[2] & 0xC0) == 0x80) {
        *cp = (uint32_t)(s[0] & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
        return *cp >= 0x800 && (*cp < 0xD800 || *cp > 0xDFFF) ? 3 : 0;
    }
    return 0;
}

static void strip_py(const uint8_t **p, size_t *n) {
    const uint8_t *s = *p;
    size_t len = *n;
    for (;;) {
        uint32_t cp;
        size_t k = len ? decode_small(s, len, &cp) : 0;
        if (!k || !py_space(cp)) break;
        s += k;
        len -= k;
    }
    while (len) {
        size_t j = len - 1;
        while (j > 0 && len - j < 3 && (s[j] & 0xC0) == 0x80) j--;
        uint32_t cp;
        size_t k = decode_small(s + j, len - j, &cp);
        if (k != len - j || !py_space(cp)) break;
        len = j;
    }
    *p = s;
    *n = len;
}

static bool blank_line(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return false;
    return true;
}

/* Offset just after the last document boundary in buf[0, n), 0 if none.
 * JSONL / line: after a '\n'.  paragraph: after a blank line's '\n' (a
 * line holding only spaces, tabs or '\r'; when first_continues, the first
 * line is the tail of a longer line and never blank). */
static size_t last_boundary(enum input_format fmt, enum doc_unit docs, const uint8_t *buf, size_t n,
                            bool first_continues) {
    if (fmt == FMT_JSONL || docs == DOC_LINE) {
        const uint8_t *nl = memrchr(buf, '\n', n);
        return nl ? (size_t)(nl - buf) + 1 : 0;
    }
    if (docs == DOC_FILE) return 0;
    size_t end = n;
    while (end > 0) {
        const uint8_t *nl = memrchr(buf, '\n', end);
        if (!nl) return 0;
        size_t j = (size_t)(nl - buf); /* this '\n' ends the line [ls, j) */
        const uint8_t *prev = j ? memrchr(buf, '\n', j) : NULL;
        size_t ls = prev ? (size_t)(prev - buf) + 1 : 0;
        bool real_line = prev || !first_continues;
        if (real_line && blank_line(buf + ls, j - ls)) return j + 1;
        end = j;
    }
    return 0;
}

/* -------------------------------------------------------------- workers */

/* Records this thread's last error in the item; the writer reports it in input order. */
static void item_fail(struct item *it) {
    it->failed = true;
    snprintf(it->err, sizeof it->err, "%s", olmo_last_error());
}

static int push_doc_end(struct ctx *c, struct olmo_ids *ids, int64_t last_id) {
    if (last_id != (int64_t)c->eos_id) return olmo_ids_push(ids, c->eos_id);
    return 0;
}

static int encode_doc(struct ctx *c, struct olmo_encoder *enc, struct item *it, const uint8_t *s, size_t n,
                      int flags) {
    if (n == 0) {
        it->empty++;
        return 0;
    }
    size_t start = it->ids.n, repl = 0;
    if (c->bos_id >= 0 && olmo_ids_push(&it->ids, (uint32_t)c->bos_id)) return -1;
    size_t body = it->ids.n;
    if (olmo_encode(enc, (const char *)s, n, flags, &it->ids, NULL, &repl)) return -1;
    it->replaced += repl;
    /* dolma: BOS only when the text does not already start with it; EOS only when it does not end with it */
    if (c->bos_id >= 0 && it->ids.n > body && it->ids.ids[body] == (uint32_t)c->bos_id) {
        memmove(it->ids.ids + start, it->ids.ids + body, (it->ids.n - body) * sizeof(uint32_t));
        it->ids.n--;
    }
    if (push_doc_end(c, &it->ids, it->ids.n > start ? (int64_t)it->ids.ids[it->ids.n - 1] : -1)) return -1;
    it->docs++;
    return 0;
}

/* One piece of a streamed document; waits for the previous piece. */
static int encode_piece(struct ctx *c, struct olmo_encoder *enc, struct item *it, const uint8_t *s, size_t n,
                        bool final, int flags) {
    struct stream *st = it->stream;
    uint8_t *fixed = olmo_malloc(3 * n + 1, "text piece");
    if (!fixed) return -1;
    size_t repl;
    size_t fn = olmo_utf8_sanitize(s, n, fixed, true, NULL, &repl);
    it->replaced += repl;
    pthread_mutex_lock(&c->mu);
    while (st->next_piece != it->piece && !c->abort) pthread_cond_wait(&c->cv_stream, &c->mu);
    bool stop = c->abort || st->failed;
    pthread_mutex_unlock(&c->mu);
    int rc = 0;
    if (stop) {
        olmo_error("stopped");
        rc = -1;
        goto out;
    }
    if (st->carry_n + fn > st->carry_cap) {
        size_t cap = 2 * (st->carry_n + fn) + 64;
        uint8_t *nc = realloc(st->carry, cap);
        if (!nc) {
            rc = olmo_error("out of memory for a streamed document");
            goto out;
        }
        st->carry = nc;
        st->carry_cap = cap;
    }
    if (fn) memcpy(st->carry + st->carry_n, fixed, fn);
    st->carry_n += fn;
    if (it->piece == 0 && c->bos_id >= 0 && (rc = olmo_ids_push(&it->ids, (uint32_t)c->bos_id))) goto out;
    size_t before = it->ids.n, consumed = st->carry_n;
    /* Text the encoder could not finish yet (one long pre-token) is carried
     * to the next piece; beyond CARRY_MAX it is encoded as if the text ended
     * there, which bounds memory and time (a 100 MB word, a 16 MB run of
     * spaces) and changes nothing for text with pre-tokens shorter than that. */
    bool whole = final || st->carry_n > CARRY_MAX;
    int f = flags | (whole ? 0 : OLMO_ENCODE_PARTIAL) | (st->started ? OLMO_ENCODE_CONTINUATION : 0);
    if ((rc = olmo_encode(enc, (const char *)st->carry, st->carry_n, f, &it->ids, whole ? NULL : &consumed, NULL)))
        goto out;
    if (st->carry_n) st->nonempty = true;
    if (consumed) st->started = true;
    if (it->ids.n > before) st->last_id = it->ids.ids[it->ids.n - 1];
    if (consumed && st->carry_n > consumed) memmove(st->carry, st->carry + consumed, st->carry_n - consumed);
    st->carry_n -= consumed;
    if (final) {
        if (st->nonempty) {
            if ((rc = push_doc_end(c, &it->ids, st->last_id))) goto out;
            it->docs++;
        } else {
            it->empty++; /* cannot happen: the reader never starts a stream with an empty piece */
        }
    }
out:
    free(fixed);
    pthread_mutex_lock(&c->mu);
    if (rc) st->failed = true;
    st->next_piece++;
    pthread_cond_broadcast(&c->cv_stream);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static int process_jsonl(struct ctx *c, struct olmo_encoder *enc, struct item *it, struct olmo_json_text *jt,
                         int flags) {
    const uint8_t *p = it->buf, *end = it->buf + it->len;
    uint64_t line = it->line0;
    while (p < end) {
        const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
        const uint8_t *le = nl ? nl : end;
        size_t n = (size_t)(le - p);
        if (blank_line(p, n)) {
            it->empty++; /* a blank line: an empty document */
        } else {
            size_t err_off = 0;
            const char *err = NULL;
            int r = olmo_json_get_string((const char *)p, n, c->opt.text_key, jt, &err_off, &err);
            if (r != OLMO_JSON_OK) {
                uint64_t at = it->offset0 + (uint64_t)(p - it->buf) + err_off;
                if (!c->opt.skip_bad) {
                    if (r == OLMO_JSON_MALFORMED)
                        olmo_error("%s:%llu: malformed JSON at byte offset %llu (column %zu): %s "
                                   "(--skip-bad-lines skips such lines)",
                                   c->opt.inputs[it->file], (unsigned long long)line, (unsigned long long)at,
                                   err_off + 1, err);
                    else
                        olmo_error("%s:%llu (byte offset %llu): field \"%s\": %s (--skip-bad-lines skips such lines)",
                                   c->opt.inputs[it->file], (unsigned long long)line,
                                   (unsigned long long)(it->offset0 + (uint64_t)(p - it->buf)), c->opt.text_key, err);
                    return -1;
                }
                it->bad_lines++;
            } else {
                const uint8_t *s = (const uint8_t *)jt->buf;
                size_t sn = jt->len;
                it->replaced += jt->n_replaced;
                if (c->opt.strip) strip_py(&s, &sn);
                if (encode_doc(c, enc, it, s, sn, flags)) {
                    olmo_error_context("%s:%llu", c->opt.inputs[it->file], (unsigned long long)line);
                    return -1;
                }
            }
        }
        line++;
        p = nl ? nl + 1 : end;
    }
    return 0;
}

static int text_doc(struct ctx *c, struct olmo_encoder *enc, struct item *it, size_t ds, size_t de, bool cont,
                    bool partial, int flags) {
    if (!partial && de > ds && it->buf[de - 1] == '\r') de--;
    if (cont || partial) return encode_piece(c, enc, it, it->buf + ds, de - ds, !partial, flags);
    return encode_doc(c, enc, it, it->buf + ds, de - ds, flags);
}

/* Text item: documents per --docs; the first may continue a streamed
 * document (first_continues), the last may go on in the next item
 * (last_continues; the reader then cut it away from whitespace). */
static int process_text(struct ctx *c, struct olmo_encoder *enc, struct item *it, int flags) {
    const uint8_t *b = it->buf;
    size_t n = it->len;
    if (it->first_continues && it->last_continues) return encode_piece(c, enc, it, b, n, false, flags);
    if (c->opt.docs == DOC_FILE) {
        if (it->stream) return encode_piece(c, enc, it, b, n, !it->last_continues, flags);
        return encode_doc(c, enc, it, b, n, flags);
    }
    if (n == 0) return it->first_continues ? encode_piece(c, enc, it, b, 0, true, flags) : 0;
    size_t pos = 0, ds = 0, de = 0;
    bool first = true, have = false, have_cont = false;
    while (pos < n) {
        const uint8_t *nl = memchr(b + pos, '\n', n - pos);
        size_t le = nl ? (size_t)(nl - b) : n;
        bool cont = first && it->first_continues; /* the tail of a line begun in the previous item */
        if (c->opt.docs == DOC_LINE) {
            if (text_doc(c, enc, it, pos, le, cont, !nl && it->last_continues, flags)) return -1;
        } else if (cont || !blank_line(b + pos, le - pos)) {
            if (!have) {
                have = true;
                have_cont = cont;
                ds = pos;
            }
            de = le;
        } else if (have) {
            if (text_doc(c, enc, it, ds, de, have_cont, false, flags)) return -1;
            have = false;
        }
        first = false;
        if (!nl) break;
        pos = le + 1;
    }
    if (have && text_doc(c, enc, it, ds, de, have_cont, it->last_continues && de == n, flags)) return -1;
    return 0;
}

static void *worker_main(void *arg) {
    struct ctx *c = arg;
    struct olmo_encoder *enc = olmo_encoder_new(c->tok);
    struct olmo_json_text jt = {0};
    int flags = c->opt.parse_special ? 0 : OLMO_ENCODE_SPLIT_SPECIAL;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        while (!c->qhead && !c->reader_done && !c->abort) pthread_cond_wait(&c->cv_work, &c->mu);
        if (c->abort || !c->qhead) {
            pthread_mutex_unlock(&c->mu);
            break;
        }
        struct item *it = c->qhead;
        c->qhead = it->next;
        if (!c->qhead) c->qtail = NULL;
        pthread_mutex_unlock(&c->mu);
        int rc;
        if (!enc) rc = -1;
        else if (c->opt.format == FMT_JSONL) rc = process_jsonl(c, enc, it, &jt, flags);
        else if ((rc = process_text(c, enc, it, flags)))
            olmo_error_context("%s, in the text at byte offsets %llu..%llu", c->opt.inputs[it->file],
                               (unsigned long long)it->offset0, (unsigned long long)(it->offset0 + it->len));
        if (rc) item_fail(it);
        pthread_mutex_lock(&c->mu);
        c->slots[it->seq % c->window] = it;
        pthread_cond_broadcast(&c->cv_done);
        pthread_mutex_unlock(&c->mu);
    }
    olmo_json_text_free(&jt);
    olmo_encoder_free(enc);
    return NULL;
}

/* --------------------------------------------------------------- writer */

/* Drops one reference to a streamed document: one per item of it, and one
 * the reader holds while the document is still being cut into items. */
static void stream_unref(struct ctx *c, struct stream *st) {
    pthread_mutex_lock(&c->mu);
    bool last = --st->refs == 0;
    pthread_mutex_unlock(&c->mu);
    if (last) {
        free(st->carry);
        free(st);
    }
}

static void release_item(struct ctx *c, struct item *it) {
    if (it->stream) stream_unref(c, it->stream);
    olmo_ids_free(&it->ids);
    free(it->buf);
    free(it);
}

static void progress(struct ctx *c, bool final) {
    if (c->opt.quiet) return;
    double t = olmo_now_seconds(), dt = t - c->t0;
    if (!final && t - c->last_progress < (c->tty ? 0.5 : 10.0)) return;
    c->last_progress = t;
    fprintf(stderr, "%stokenize: %.1f MB read | %.1f MB/s | %llu docs | %llu tokens%s", c->tty ? "\r" : "",
            (double)c->bytes_in / 1e6, dt > 0 ? (double)c->bytes_in / 1e6 / dt : 0.0,
            (unsigned long long)c->n_docs, (unsigned long long)c->n_tokens, c->tty && !final ? "   " : "\n");
    fflush(stderr);
}

static int write_ids(struct ctx *c, const struct olmo_ids *ids) {
    if (c->opt.elem_size == 4) return fwrite(ids->ids, 4, ids->n, c->out) == ids->n ? 0 : -1;
    uint16_t buf[4096];
    for (size_t i = 0; i < ids->n;) {
        size_t k = 0;
        for (; k < 4096 && i < ids->n; k++, i++) buf[k] = (uint16_t)ids->ids[i];
        if (fwrite(buf, 2, k, c->out) != k) return -1;
    }
    return 0;
}

static void *writer_main(void *arg) {
    struct ctx *c = arg;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        struct item *it;
        while (!(it = c->slots[c->written % c->window]) && !(c->reader_done && c->written == c->submitted) &&
               !c->abort)
            pthread_cond_wait(&c->cv_done, &c->mu);
        if (!it) {
            pthread_mutex_unlock(&c->mu);
            break;
        }
        c->slots[c->written % c->window] = NULL;
        pthread_mutex_unlock(&c->mu);
        bool ok = !it->failed;
        if (ok && write_ids(c, &it->ids)) {
            ok = false;
            snprintf(it->err, sizeof it->err, "writing '%s' failed: %s", c->tmp_path, strerror(errno));
        }
        if (ok) {
            c->n_tokens += it->ids.n;
            c->n_docs += it->docs;
            c->n_empty += it->empty;
            c->n_bad += it->bad_lines;
            c->n_replaced += it->replaced;
            c->bytes_in += it->len;
            progress(c, false);
        }
        pthread_mutex_lock(&c->mu);
        c->written++;
        if (!ok && !c->abort) {
            c->abort = true;
            snprintf(c->error, sizeof c->error, "%s", it->err);
        }
        pthread_cond_broadcast(&c->cv_space);
        pthread_cond_broadcast(&c->cv_work);
        pthread_cond_broadcast(&c->cv_stream);
        pthread_mutex_unlock(&c->mu);
        release_item(c, it);
        if (!ok) break;
    }
    return NULL;
}

/* --------------------------------------------------------------- reader */

/* Queues an item; false when the run is aborting. */
static bool submit(struct ctx *c, struct item *it) {
    pthread_mutex_lock(&c->mu);
    while (c->submitted - c->written >= c->window && !c->abort) pthread_cond_wait(&c->cv_space, &c->mu);
    if (c->abort) {
        pthread_mutex_unlock(&c->mu);
        if (it->stream) stream_unref(c, it->stream);
        free(it->buf);
        free(it);
        return false;
    }
    it->seq = c->submitted++;
    if (c->qtail) c->qtail->next = it;
    else c->qhead = it;
    c->qtail = it;
    pthread_cond_signal(&c->cv_work);
    pthread_mutex_unlock(&c->mu);
    return true;
}

static bool aborted(struct ctx *c) {
    pthread_mutex_lock(&c->mu);
    bool a = c->abort;
    pthread_mutex_unlock(&c->mu);
    return a;
}

static void reader_error(struct ctx *c, const char *msg) {
    pthread_mutex_lock(&c->mu);
    if (!c->abort) {
        c->abort = true;
        snprintf(c->error, sizeof c->error, "%s", msg);
    }
    pthread_cond_broadcast(&c->cv_work);
    pthread_cond_broadcast(&c->cv_done);
    pthread_cond_broadcast(&c->cv_stream);
    pthread_mutex_unlock(&c->mu);
}

/* Appends up to ITEM_BYTES to buf (which has room); sets *eof at the end. */
static int read_more(gzFile f, uint8_t *buf, size_t *n, bool *eof) {
    size_t want = ITEM_BYTES;
    while (want > 0) {
        int got = gzread(f, buf + *n, (unsigned)want);
        if (got < 0) return -1;
        if (got == 0) {
            int err;
            gzerror(f, &err);
            if (err != Z_OK) return -1; /* Z_BUF_ERROR: a truncated gzip stream */
            *eof = true;
            return 0;
        }
        *n += (size_t)got;
        want -= (size_t)got;
    }
    return 0;
}

static const char *read_error(gzFile f) {
    int err;
    const char *m = gzerror(f, &err);
    if (err == Z_ERRNO) return strerror(errno);
    if (err == Z_BUF_ERROR) return "unexpected end of the compressed stream (truncated .gz file)";
    return m;
}

static int read_file(struct ctx *c, int fi) {
    const char *path = c->opt.inputs[fi];
    /* zlib reads gzip-compressed and plain files alike */
    errno = 0;
    gzFile f = strcmp(path, "-") ? gzopen(path, "rb") : gzdopen(dup(fileno(stdin)), "rb");
    char msg[1300];
    if (!f) {
        snprintf(msg, sizeof msg, "cannot open input '%s': %s", path, errno ? strerror(errno) : "out of memory");
        reader_error(c, msg);
        return -1;
    }
    gzbuffer(f, 1 << 20);
    size_t cap = 2 * ITEM_BYTES, n = 0;
    uint8_t *buf = malloc(cap);
    if (!buf) {
        reader_error(c, "out of memory");
        gzclose(f);
        return -1;
    }
    uint64_t line = 1, offset = 0, piece = 0;
    struct stream *open_stream = NULL;
    bool eof = false;
    int rc = 0;
    while (!eof || n > 0 || open_stream) {
        if (!eof && n < ITEM_BYTES) {
            if (cap - n < ITEM_BYTES) {
                uint8_t *nb = realloc(buf, cap * 2);
                if (!nb) {
                    reader_error(c, "out of memory reading input");
                    rc = -1;
                    break;
                }
                buf = nb;
                cap *= 2;
            }
            if (read_more(f, buf, &n, &eof)) {
                snprintf(msg, sizeof msg, "reading '%s' failed at byte offset %llu: %s", path,
                         (unsigned long long)(offset + n), read_error(f));
                reader_error(c, msg);
                rc = -1;
                break;
            }
            continue;
        }
        /* decide the cut */
        size_t cut;
        bool last_continues = false;
        bool first_continues = open_stream != NULL;
        if (eof) {
            cut = n;
        } else {
            cut = last_boundary(c->opt.format, c->opt.docs, buf, n, first_continues);
            if (!cut) {
                if (c->opt.format == FMT_JSONL) { /* a long line: read on */
                    if (cap - n < ITEM_BYTES) {
                        uint8_t *nb = realloc(buf, cap * 2);
                        if (!nb) {
                            reader_error(c, "out of memory reading a long JSONL line");
                            rc = -1;
                            break;
                        }
                        buf = nb;
                        cap *= 2;
                    }
                    if (read_more(f, buf, &n, &eof)) {
                        snprintf(msg, sizeof msg, "reading '%s' failed at byte offset %llu: %s", path,
                                 (unsigned long long)(offset + n), read_error(f));
                        reader_error(c, msg);
                        rc = -1;
                        break;
                    }
                    continue;
                }
                /* a document longer than an item: cut inside it, away from
                 * whitespace (so separators stay whole) at a character start */
                cut = n;
                while (cut > 0 && (buf[cut - 1] == ' ' || buf[cut - 1] == '\t' || buf[cut - 1] == '\r' ||
                                   buf[cut - 1] == '\n'))
                    cut--;
                if (cut == 0) cut = n;
                while (cut > 0 && cut < n && (buf[cut] & 0xC0) == 0x80) cut--;
                if (cut == 0) cut = n;
                last_continues = true;
            }
        }
        struct item *it = calloc(1, sizeof *it);
        uint8_t *ib = malloc(cut ? cut : 1);
        if (!it || !ib) {
            free(it);
            free(ib);
            reader_error(c, "out of memory");
            rc = -1;
            break;
        }
        memcpy(ib, buf, cut);
        it->buf = ib;
        it->len = cut;
        it->file = fi;
        it->line0 = line;
        it->offset0 = offset;
        it->first_continues = first_continues;
        it->last_continues = last_continues;
        if (c->opt.format == FMT_JSONL)
            for (const uint8_t *p = ib; (p = memchr(p, '\n', (size_t)(ib + cut - p))); p++) line++;
        if (first_continues || last_continues) {
            if (!open_stream) {
                open_stream = calloc(1, sizeof *open_stream);
                if (!open_stream) {
                    free(it->buf);
                    free(it);
                    reader_error(c, "out of memory");
                    rc = -1;
                    break;
                }
                open_stream->last_id = -1;
                open_stream->refs = 1; /* the reader's, until the document's last item */
                piece = 0;
            }
            it->stream = open_stream;
            it->piece = piece++;
            pthread_mutex_lock(&c->mu);
            open_stream->refs++;
            pthread_mutex_unlock(&c->mu);
            if (!last_continues) {
                stream_unref(c, open_stream);
                open_stream = NULL;
            }
        }
        memmove(buf, buf + cut, n - cut);
        n -= cut;
        offset += cut;
        if (!submit(c, it)) {
            rc = -1;
            break;
        }
        if (eof && n == 0) {
            if (open_stream) continue; /* close the streamed document with an empty final piece */
            break;
        }
    }
    if (open_stream) stream_unref(c, open_stream);
    free(buf);
    gzclose(f);
    return rc;
}

/* ----------------------------------------------------------------- main */

static int resolve_token(const struct olmo_tokenizer *tok, const char *s, const char *what, uint32_t *id) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*s && !*end && !errno) {
        if (v < 0 || (uint64_t)v >= olmo_tokenizer_vocab_size(tok))
            return olmo_error("%s id %lld is outside the vocabulary [0, %u)", what, v, olmo_tokenizer_vocab_size(tok));
        *id = (uint32_t)v;
        return 0;
    }
    int64_t r = olmo_tokenizer_token_to_id(tok, s);
    if (r < 0) return olmo_error("%s token '%s' is not in the tokenizer (give --%s ID or TOKEN)", what, s, what);
    *id = (uint32_t)r;
    return 0;
}

static int write_npy_header(FILE *f, int elem_size, uint64_t n) {
    char dict[118];
    int k = snprintf(dict, sizeof dict, "{'descr': '<u%d', 'fortran_order': False, 'shape': (%llu,), }", elem_size,
                     (unsigned long long)n);
    if (k < 0 || k >= (int)sizeof dict - 1) return -1;
    memset(dict + k, ' ', sizeof dict - (size_t)k);
    dict[sizeof dict - 1] = '\n';
    unsigned char head[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)sizeof dict, 0};
    if (fwrite(head, 1, 10, f) != 10 || fwrite(dict, 1, sizeof dict, f) != sizeof dict) return -1;
    return 0;
}

static int parse_args(struct options *o, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    o->text_key = "text";
    o->strip = true;
    o->eos = "<|endoftext|>";
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    o->threads = ncpu > 0 ? (int)ncpu : 1;
    o->inputs = calloc((size_t)argc, sizeof(char *));
    if (!o->inputs) return olmo_error("out of memory");
    bool fmt_given = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VALUE \
    if (!v) return olmo_error("%s needs a value", a); \
    i++
        if (!strcmp(a, "--tokenizer")) { NEED_VALUE; o->tokenizer = v; }
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) { NEED_VALUE; o->output = v; }
        else if (!strcmp(a, "--text-key")) { NEED_VALUE; o->text_key = v; }
        else if (!strcmp(a, "--eos")) { NEED_VALUE; o->eos = v; }
        else if (!strcmp(a, "--bos")) { NEED_VALUE; o->bos = v; }
        else if (!strcmp(a, "--format")) {
            NEED_VALUE;
            fmt_given = true;
            if (!strcmp(v, "jsonl")) o->format = FMT_JSONL;
            else if (!strcmp(v, "text")) o->format = FMT_TEXT;
            else return olmo_error("--format must be jsonl or text, got '%s'", v);
        } else if (!strcmp(a, "--docs")) {
            NEED_VALUE;
            if (!strcmp(v, "file")) o->docs = DOC_FILE;
            else if (!strcmp(v, "paragraph")) o->docs = DOC_PARAGRAPH;
            else if (!strcmp(v, "line")) o->docs = DOC_LINE;
            else return olmo_error("--docs must be file, paragraph or line, got '%s'", v);
        } else if (!strcmp(a, "--dtype")) {
            NEED_VALUE;
            if (!strcmp(v, "uint16")) o->elem_size = 2;
            else if (!strcmp(v, "uint32")) o->elem_size = 4;
            else if (!strcmp(v, "auto")) o->elem_size = 0;
            else return olmo_error("--dtype must be uint16, uint32 or auto, got '%s'", v);
        } else if (!strcmp(a, "--threads")) {
            NEED_VALUE;
            char *end;
            long t = strtol(v, &end, 10);
            if (*end || t < 1 || t > 1024) return olmo_error("--threads must be 1..1024, got '%s'", v);
            o->threads = (int)t;
        } else if (!strcmp(a, "--no-strip")) o->strip = false;
        else if (!strcmp(a, "--skip-bad-lines")) o->skip_bad = true;
        else if (!strcmp(a, "--raw")) o->raw = true;
        else if (!strcmp(a, "--parse-special")) o->parse_special = true;
        else if (!strcmp(a, "--quiet")) o->quiet = true;
        else if (a[0] == '-' && a[1]) return olmo_error("unknown option '%s' (see olmoc tokenize --help)", a);
        else o->inputs[o->n_inputs++] = a;
#undef NEED_VALUE
    }
    if (!o->tokenizer) return olmo_error("--tokenizer TOKENIZER.json is required");
    if (!o->output) return olmo_error("-o OUTPUT is required");
    if (!o->n_inputs) return olmo_error("no input files");
    if (!fmt_given) {
        const char *f = o->inputs[0];
        size_t n = strlen(f);
        if (n >= 3 && !strcmp(f + n - 3, ".gz")) n -= 3;
        bool j = (n >= 6 && !strncmp(f + n - 6, ".jsonl", 6)) || (n >= 5 && !strncmp(f + n - 5, ".json", 5));
        o->format = j ? FMT_JSONL : FMT_TEXT;
    }
    return 0;
}

/* Refuses an output (or its .tmp) that is one of the inputs: the same file
 * by device and inode, so a link or another spelling of the path counts. */
static int check_output_not_input(const struct options *o, const char *tmp_path) {
    const char *outs[2] = {o->output, tmp_path};
    for (int k = 0; k < 2; k++) {
        struct stat so;
        if (stat(outs[k], &so)) continue; /* does not exist yet: cannot be an input */
        for (int i = 0; i < o->n_inputs; i++) {
            struct stat si;
            bool is_stdin = !strcmp(o->inputs[i], "-");
            if (is_stdin ? fstat(STDIN_FILENO, &si) : stat(o->inputs[i], &si)) continue;
            if (si.st_dev == so.st_dev && si.st_ino == so.st_ino)
                return olmo_error("the output '%s' is the input '%s'%s: writing it would destroy the input "
                                  "(choose another -o)",
                                  outs[k], o->inputs[i], is_stdin ? " (standard input)" : "");
        }
    }
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
    struct ctx *c = calloc(1, sizeof *c);
    if (!c) {
        fprintf(stderr, "olmoc tokenize: out of memory\n");
        return 1;
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv_work, NULL);
    pthread_cond_init(&c->cv_done, NULL);
    pthread_cond_init(&c->cv_space, NULL);
    pthread_cond_init(&c->cv_stream, NULL);
    int status = 1;
    pthread_t *workers = NULL, writer;
    int n_workers = 0;
    bool writer_started = false;
    if (parse_args(&c->opt, argc, argv)) {
        fprintf(stderr, "olmoc tokenize: %s\n", olmo_last_error());
        usage(stderr);
        free(c->opt.inputs);
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv_work);
        pthread_cond_destroy(&c->cv_done);
        pthread_cond_destroy(&c->cv_space);
        pthread_cond_destroy(&c->cv_stream);
        free(c);
        return 2;
    }
    if (olmo_tokenizer_load(&c->tok, c->opt.tokenizer)) goto fail;
    if (resolve_token(c->tok, c->opt.eos, "eos", &c->eos_id)) goto fail;
    c->bos_id = -1;
    if (c->opt.bos) {
        uint32_t b;
        if (resolve_token(c->tok, c->opt.bos, "bos", &b)) goto fail;
        c->bos_id = b;
    }
    uint32_t vs = olmo_tokenizer_vocab_size(c->tok);
    if (!c->opt.elem_size) c->opt.elem_size = vs <= 65536 ? 2 : 4;
    if (c->opt.elem_size == 2 && vs > 65536) {
        olmo_error("--dtype uint16 cannot hold the ids of a %u-token vocabulary", vs);
        goto fail;
    }
    snprintf(c->tmp_path, sizeof c->tmp_path, "%s.tmp", c->opt.output);
    if (check_output_not_input(&c->opt, c->tmp_path)) {
        c->tmp_path[0] = 0; /* not ours to remove */
        goto fail;
    }
    c->out = fopen(c->tmp_path, "wb");
    if (!c->out) {
        olmo_error("cannot create '%s': %s", c->tmp_path, strerror(errno));
        goto fail;
    }
    setvbuf(c->out, NULL, _IOFBF, 1 << 20);
    if (!c->opt.raw && write_npy_header(c->out, c->opt.elem_size, 0)) {
        olmo_error("writing '%s' failed", c->tmp_path);
        goto fail;
    }
    c->window = (size_t)c->opt.threads * 2 + 2;
    c->slots = calloc(c->window, sizeof *c->slots);
    workers = calloc((size_t)c->opt.threads, sizeof *workers);
    if (!c->slots || !workers) {
        olmo_error("out of memory");
        goto fail;
    }
    c->tty = isatty(fileno(stderr));
    c->t0 = c->last_progress = olmo_now_seconds();
    if (!c->opt.quiet)
        fprintf(stderr, "tokenize: %d input(s), %s, tokenizer %s (vocab %u), EOS %u, %s %s, %d threads\n",
                c->opt.n_inputs, c->opt.format == FMT_JSONL ? "jsonl" : "text", c->opt.tokenizer, vs, c->eos_id,
                c->opt.raw ? "raw" : ".npy", c->opt.elem_size == 2 ? "uint16" : "uint32", c->opt.threads);
    for (; n_workers < c->opt.threads; n_workers++)
        if (pthread_create(&workers[n_workers], NULL, worker_main, c)) break;
    if (n_workers == 0 || pthread_create(&writer, NULL, writer_main, c)) {
        reader_error(c, "cannot start threads");
    } else {
        writer_started = true;
        for (int i = 0; i < c->opt.n_inputs; i++)
            if (aborted(c) || read_file(c, i)) break;
    }
    pthread_mutex_lock(&c->mu);
    c->reader_done = true;
    pthread_cond_broadcast(&c->cv_work);
    pthread_cond_broadcast(&c->cv_done);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < n_workers; i++) pthread_join(workers[i], NULL);
    if (writer_started) pthread_join(writer, NULL);
    /* items a failed run left behind */
    for (struct item *it = c->qhead, *nx; it; it = nx) {
        nx = it->next;
        release_item(c, it);
    }
    for (size_t i = 0; i < c->window; i++)
        if (c->slots[i]) release_item(c, c->slots[i]);
    if (c->abort) {
        olmo_error("%s", c->error);
        goto fail;
    }
    if (!c->opt.raw && (fseek(c->out, 0, SEEK_SET) || write_npy_header(c->out, c->opt.elem_size, c->n_tokens))) {
        olmo_error("patching the .npy header of '%s' failed: %s", c->tmp_path, strerror(errno));
        goto fail;
    }
    FILE *out = c->out;
    c->out = NULL;
    if (fclose(out)) {
        olmo_error("writing '%s' failed: %s", c->tmp_path, strerror(errno));
        goto fail;
    }
    if (rename(c->tmp_path, c->opt.output)) {
        olmo_error("cannot rename '%s' to '%s': %s", c->tmp_path, c->opt.output, strerror(errno));
        goto fail;
    }
    progress(c, true);
    double dt = olmo_now_seconds() - c->t0;
    fprintf(stderr,
            "tokenize: wrote %s: %llu tokens (%s) from %llu documents, %.1f MB in %.1fs (%.1f MB/s); "
            "skipped %llu empty documents, %llu bad lines; %llu invalid UTF-8 sequences replaced\n",
            c->opt.output, (unsigned long long)c->n_tokens, c->opt.elem_size == 2 ? "uint16" : "uint32",
            (unsigned long long)c->n_docs, (double)c->bytes_in / 1e6, dt, dt > 0 ? (double)c->bytes_in / 1e6 / dt : 0.0,
            (unsigned long long)c->n_empty, (unsigned long long)c->n_bad, (unsigned long long)c->n_replaced);
    status = 0;
fail:
    if (status) {
        if (c->tty && !c->opt.quiet) fputc('\n', stderr);
        fprintf(stderr, "olmoc tokenize: %s\n", olmo_last_error());
        if (c->out) {
            fclose(c->out);
            c->out = NULL;
        }
        if (c->tmp_path[0]) unlink(c->tmp_path);
    }
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv_work);
    pthread_cond_destroy(&c->cv_done);
    pthread_cond_destroy(&c->cv_space);
    pthread_cond_destroy(&c->cv_stream);
    free(c->slots);
    free(workers);
    olmo_tokenizer_free(c->tok);
    free(c->opt.inputs);
    free(c);
    return status;
}
