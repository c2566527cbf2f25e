/* The tokenize pipeline: see data/tokenize_pipeline.h. */
#include "data/tokenize_pipeline.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "data/jsonl.h"
#include "data/npy.h"
#include "tokenizer/tokenizer.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/utf8.h"

#define ITEM_BYTES (1u << 20)
#define CARRY_MAX (4u * ITEM_BYTES)

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
    struct olmo_tokenize_options opt;
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
    size_t max_line; /* JSONL: the longest line accepted, in bytes */
    uint64_t n_tokens, n_docs, n_empty, n_bad, n_replaced, bytes_in;
    double t0, last_progress;
    bool tty;
};

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
        if (n > c->max_line) {
            olmo_error("%s:%llu (byte offset %llu): a line of %zu bytes, longer than --max-line-bytes %zu (raise "
                       "it to tokenize such a line whole: it is held in memory several times over)",
                       c->opt.inputs[it->file], (unsigned long long)line,
                       (unsigned long long)(it->offset0 + (uint64_t)(p - it->buf)), n, c->max_line);
            return -1;
        }
        if (olmo_text_blank_line(p, n)) {
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
                if (c->opt.strip) olmo_text_strip_py(&s, &sn);
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
    if (c->opt.docs == OLMO_DOCS_FILE) {
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
        if (c->opt.docs == OLMO_DOCS_LINE) {
            if (text_doc(c, enc, it, pos, le, cont, !nl && it->last_continues, flags)) return -1;
        } else if (cont || !olmo_text_blank_line(b + pos, le - pos)) {
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
        else if (c->opt.format == OLMO_FMT_JSONL) rc = process_jsonl(c, enc, it, &jt, flags);
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

/* One input file being cut into items. */
struct reader {
    int file;
    const char *path;
    gzFile f;
    uint8_t *buf;
    size_t cap, n;
    uint64_t line, offset, piece;
    struct stream *open_stream; /* the document the last item left unfinished */
    bool eof;
};

/* Reads up to ITEM_BYTES more into r->buf, growing it when needed. */
static int reader_fill(struct ctx *c, struct reader *r) {
    if (r->cap - r->n < ITEM_BYTES) {
        uint8_t *nb = realloc(r->buf, r->cap * 2);
        if (!nb) {
            reader_error(c, "out of memory reading input");
            return -1;
        }
        r->buf = nb;
        r->cap *= 2;
    }
    if (read_more(r->f, r->buf, &r->n, &r->eof)) {
        char msg[1300];
        snprintf(msg, sizeof msg, "reading '%s' failed at byte offset %llu: %s", r->path,
                 (unsigned long long)(r->offset + r->n), read_error(r->f));
        reader_error(c, msg);
        return -1;
    }
    return 0;
}

/* Where the next item ends: after the last document boundary in the
 * buffer, or, for a text document longer than the buffer, inside it away
 * from whitespace (so separators stay whole) at a character start.  0: a
 * JSONL line longer than the buffer (read on). */
static size_t reader_cut(const struct ctx *c, const struct reader *r, bool *last_continues) {
    *last_continues = false;
    if (r->eof) return r->n;
    const uint8_t *buf = r->buf;
    size_t n = r->n;
    enum olmo_doc_unit unit = c->opt.format == OLMO_FMT_JSONL ? OLMO_DOCS_LINE : c->opt.docs;
    size_t cut = olmo_text_last_boundary(unit, buf, n, r->open_stream != NULL);
    if (cut || c->opt.format == OLMO_FMT_JSONL) return cut;
    cut = n;
    while (cut > 0 && (buf[cut - 1] == ' ' || buf[cut - 1] == '\t' || buf[cut - 1] == '\r' || buf[cut - 1] == '\n'))
        cut--;
    if (cut == 0) cut = n;
    while (cut > 0 && cut < n && (buf[cut] & 0xC0) == 0x80) cut--; /* a character start */
    if (cut == 0) cut = n;
    if (cut == n) { /* the buffer's end may fall inside a character: its bytes go with the next piece */
        uint32_t cp;
        size_t s = olmo_utf8_char_start(buf, n - 1, 0);
        if (s > 0 && olmo_utf8_decode(buf + s, n - s, &cp) != n - s) cut = s;
    }
    *last_continues = true;
    return cut;
}

/* Attaches it to the streamed document it belongs to (opening one when it
 * starts one), numbering its piece. */
static int reader_attach_stream(struct ctx *c, struct reader *r, struct item *it) {
    if (!it->first_continues && !it->last_continues) return 0;
    if (!r->open_stream) {
        r->open_stream = calloc(1, sizeof *r->open_stream);
        if (!r->open_stream) {
            reader_error(c, "out of memory");
            return -1;
        }
        r->open_stream->last_id = -1;
        r->open_stream->refs = 1; /* the reader's, until the document's last item */
        r->piece = 0;
    }
    it->stream = r->open_stream;
    it->piece = r->piece++;
    pthread_mutex_lock(&c->mu);
    r->open_stream->refs++;
    pthread_mutex_unlock(&c->mu);
    if (!it->last_continues) {
        stream_unref(c, r->open_stream);
        r->open_stream = NULL;
    }
    return 0;
}

/* Cuts the next item off the front of the buffer and queues it. */
static int reader_emit(struct ctx *c, struct reader *r, size_t cut, bool last_continues) {
    struct item *it = calloc(1, sizeof *it);
    uint8_t *ib = malloc(cut ? cut : 1);
    if (!it || !ib) {
        free(it);
        free(ib);
        reader_error(c, "out of memory");
        return -1;
    }
    memcpy(ib, r->buf, cut);
    *it = (struct item){.file = r->file, .buf = ib, .len = cut, .line0 = r->line, .offset0 = r->offset,
                        .first_continues = r->open_stream != NULL, .last_continues = last_continues};
    if (c->opt.format == OLMO_FMT_JSONL)
        for (const uint8_t *p = ib; (p = memchr(p, '\n', (size_t)(ib + cut - p))); p++) r->line++;
    if (reader_attach_stream(c, r, it)) {
        free(ib);
        free(it);
        return -1;
    }
    memmove(r->buf, r->buf + cut, r->n - cut);
    r->n -= cut;
    r->offset += cut;
    return submit(c, it) ? 0 : -1;
}

static int read_file(struct ctx *c, int fi) {
    struct reader r = {.file = fi, .path = c->opt.inputs[fi], .cap = 2 * ITEM_BYTES, .line = 1};
    /* zlib reads gzip-compressed and plain files alike */
    errno = 0;
    r.f = strcmp(r.path, "-") ? gzopen(r.path, "rb") : gzdopen(dup(fileno(stdin)), "rb");
    if (!r.f) {
        char msg[1300];
        snprintf(msg, sizeof msg, "cannot open input '%s': %s", r.path, errno ? strerror(errno) : "out of memory");
        reader_error(c, msg);
        return -1;
    }
    gzbuffer(r.f, 1 << 20);
    r.buf = malloc(r.cap);
    int rc = r.buf ? 0 : -1;
    if (!r.buf) reader_error(c, "out of memory");
    /* at the end, a still open streamed document gets an empty final piece */
    while (!rc && (!r.eof || r.n > 0 || r.open_stream)) {
        if (!r.eof && r.n < ITEM_BYTES) {
            rc = reader_fill(c, &r);
            continue;
        }
        bool last_continues;
        size_t cut = reader_cut(c, &r, &last_continues);
        if (!cut && !r.eof) { /* a JSONL line longer than the buffer: read on, up to --max-line-bytes */
            if (r.n > c->max_line) {
                char msg[1400];
                snprintf(msg, sizeof msg,
                         "%s:%llu (byte offset %llu): a line longer than --max-line-bytes %zu (raise it to "
                         "tokenize such a line whole: it is held in memory several times over)",
                         r.path, (unsigned long long)r.line, (unsigned long long)r.offset, c->max_line);
                reader_error(c, msg);
                rc = -1;
                break;
            }
            rc = reader_fill(c, &r);
            continue;
        }
        rc = reader_emit(c, &r, cut, last_continues);
    }
    if (r.open_stream) stream_unref(c, r.open_stream);
    free(r.buf);
    gzclose(r.f);
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

/* Refuses an output (or its .tmp) that is one of the inputs: the same file
 * by device and inode, so a link or another spelling of the path counts. */
static int check_output_not_input(const struct olmo_tokenize_options *o, const char *tmp_path) {
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

/* The tokenizer, the EOS / BOS ids, the dtype and the output's .tmp file
 * with a provisional .npy header. */
static int setup(struct ctx *c) {
    if (olmo_tokenizer_load(&c->tok, c->opt.tokenizer)) return -1;
    if (resolve_token(c->tok, c->opt.eos, "eos", &c->eos_id)) return -1;
    c->bos_id = -1;
    if (c->opt.bos) {
        uint32_t b;
        if (resolve_token(c->tok, c->opt.bos, "bos", &b)) return -1;
        c->bos_id = b;
    }
    uint32_t vs = olmo_tokenizer_vocab_size(c->tok);
    if (!c->opt.elem_size) c->opt.elem_size = vs <= 65536 ? 2 : 4;
    if (c->opt.elem_size == 2 && vs > 65536)
        return olmo_error("--dtype uint16 cannot hold the ids of a %u-token vocabulary", vs);
    char tmp[sizeof c->tmp_path];
    snprintf(tmp, sizeof tmp, "%s.tmp", c->opt.output);
    if (check_output_not_input(&c->opt, tmp)) return -1;
    /* refuses an output that is a device or FIFO; removes a killed run's .tmp */
    const int fd = olmo_open_tmp(c->opt.output, "token file", tmp, sizeof tmp);
    if (fd < 0) return -1;
    memcpy(c->tmp_path, tmp, sizeof tmp); /* ours to remove from here on */
    c->out = fdopen(fd, "wb");
    if (!c->out) {
        close(fd);
        return olmo_error("cannot create '%s': %s", c->tmp_path, strerror(errno));
    }
    setvbuf(c->out, NULL, _IOFBF, 1 << 20);
    if (!c->opt.raw && olmo_npy_write_header(c->out, c->opt.elem_size, 0))
        return olmo_error("writing '%s' failed", c->tmp_path);
    c->window = (size_t)c->opt.threads * 2 + 2;
    c->slots = calloc(c->window, sizeof *c->slots);
    if (!c->slots) return olmo_error("out of memory");
    c->tty = isatty(fileno(stderr));
    c->t0 = c->last_progress = olmo_now_seconds();
    if (!c->opt.quiet)
        fprintf(stderr, "tokenize: %d input(s), %s, tokenizer %s (vocab %u), EOS %u, %s %s, %d threads\n",
                c->opt.n_inputs, c->opt.format == OLMO_FMT_JSONL ? "jsonl" : "text", c->opt.tokenizer, vs, c->eos_id,
                c->opt.raw ? "raw" : ".npy", c->opt.elem_size == 2 ? "uint16" : "uint32", c->opt.threads);
    return 0;
}

/* Workers and the writer run while this thread reads the inputs. */
static int run_threads(struct ctx *c) {
    pthread_t *workers = calloc((size_t)c->opt.threads, sizeof *workers), writer;
    if (!workers) return olmo_error("out of memory");
    int n_workers = 0;
    bool writer_started = false;
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
    free(workers);
    /* items a failed run left behind */
    for (struct item *it = c->qhead, *nx; it; it = nx) {
        nx = it->next;
        release_item(c, it);
    }
    for (size_t i = 0; i < c->window; i++)
        if (c->slots[i]) release_item(c, c->slots[i]);
    return c->abort ? olmo_error("%s", c->error) : 0;
}

/* The final .npy header, then the .tmp file renamed to the output. */
static int finish(struct ctx *c) {
    if (!c->opt.raw && (fseek(c->out, 0, SEEK_SET) || olmo_npy_write_header(c->out, c->opt.elem_size, c->n_tokens)))
        return olmo_error("patching the .npy header of '%s' failed: %s", c->tmp_path, strerror(errno));
    FILE *out = c->out;
    c->out = NULL;
    if (fclose(out)) return olmo_error("writing '%s' failed: %s", c->tmp_path, strerror(errno));
    if (olmo_commit_tmp(c->tmp_path, c->opt.output, "token file")) return -1;
    progress(c, true);
    double dt = olmo_now_seconds() - c->t0;
    fprintf(stderr,
            "tokenize: wrote %s: %llu tokens (%s) from %llu documents, %.1f MB in %.1fs (%.1f MB/s); "
            "skipped %llu empty documents, %llu bad lines; %llu invalid UTF-8 sequences replaced\n",
            c->opt.output, (unsigned long long)c->n_tokens, c->opt.elem_size == 2 ? "uint16" : "uint32",
            (unsigned long long)c->n_docs, (double)c->bytes_in / 1e6, dt, dt > 0 ? (double)c->bytes_in / 1e6 / dt : 0.0,
            (unsigned long long)c->n_empty, (unsigned long long)c->n_bad, (unsigned long long)c->n_replaced);
    return 0;
}

int olmo_tokenize(const struct olmo_tokenize_options *o) {
    struct ctx *c = calloc(1, sizeof *c);
    if (!c) return olmo_error("out of memory");
    c->opt = *o;
    c->max_line = o->max_line_bytes ? o->max_line_bytes : OLMO_TOKENIZE_MAX_LINE_DEFAULT;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv_work, NULL);
    pthread_cond_init(&c->cv_done, NULL);
    pthread_cond_init(&c->cv_space, NULL);
    pthread_cond_init(&c->cv_stream, NULL);
    int rc = setup(c) || run_threads(c) || finish(c) ? -1 : 0;
    if (rc) {
        if (c->tty && !c->opt.quiet) fputc('\n', stderr); /* end the progress line */
        if (c->out) fclose(c->out);
        if (c->tmp_path[0]) unlink(c->tmp_path);
    }
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv_work);
    pthread_cond_destroy(&c->cv_done);
    pthread_cond_destroy(&c->cv_space);
    pthread_cond_destroy(&c->cv_stream);
    free(c->slots);
    olmo_tokenizer_free(c->tok);
    free(c);
    return rc;
}
