#include "io/remote.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util/error.h"
#include "util/fs.h"

struct olmo_remote {
    char url[1024];       /* as the user wrote it: every message names it */
    char http_url[2048];  /* what is requested */
    char sigv4[160];      /* CURLOPT_AWS_SIGV4 ("aws:amz:REGION:s3"), "" = unsigned */
    char userpwd[520];    /* ACCESS_KEY:SECRET */
    char token_hdr[2100]; /* x-amz-security-token: ... */
    char etag[256];       /* a strong ETag from the HEAD ("" = none) */
    uint64_t size;
    int running; /* prefetches of this file being fetched (under pool.mu) */
};

int olmo_remote_is_url(const char *p) {
    return !strncmp(p, "http://", 7) || !strncmp(p, "https://", 8) || !strncmp(p, "s3://", 5);
}

uint64_t olmo_remote_size(const struct olmo_remote *r) { return r->size; }

/* ------------------------------------------------------------ AWS settings */

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* key = value from [section] of an INI file (the AWS CLI's format); 1 when found */
static int ini_get(const char *file, const char *section, const char *key, char *out, size_t cap) {
    FILE *f = fopen(file, "r");
    if (!f) return 0;
    char line[4096];
    int in = 0, found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        char *s = line, *e;
        while (isspace((unsigned char)*s)) s++;
        for (e = s + strlen(s); e > s && isspace((unsigned char)e[-1]);) *--e = 0;
        if (*s == '[') {
            char *close = strchr(s, ']');
            if (close) *close = 0;
            in = !strcmp(s + 1, section);
        } else if (in && *s != '#' && *s != ';') {
            char *eq = strchr(s, '=');
            if (!eq) continue;
            char *k = s, *ke = eq, *v = eq + 1;
            while (ke > k && isspace((unsigned char)ke[-1])) ke--;
            while (isspace((unsigned char)*v)) v++;
            if ((size_t)(ke - k) == strlen(key) && !strncmp(k, key, (size_t)(ke - k))) {
                snprintf(out, cap, "%s", v);
                found = 1;
            }
        }
    }
    fclose(f);
    return found;
}

static void aws_file(char *out, size_t cap, const char *var, const char *name) {
    const char *v = env(var), *home = env("HOME");
    if (v) snprintf(out, cap, "%s", v);
    else snprintf(out, cap, "%s/.aws/%s", home ? home : "", name);
}

static int resolve_s3(struct olmo_remote *r) {
    const char *bucket = r->url + 5, *slash = strchr(bucket, '/');
    if (!slash || slash == bucket || !slash[1])
        return olmo_error("'%s': an S3 path is s3://BUCKET/KEY", r->url);
    const char *profile = env("AWS_PROFILE") ? env("AWS_PROFILE") : "default";
    char cred_file[1024], conf_file[1024], section[300], region[128] = "", key_id[256] = "", secret[256] = "",
                                                         token[2048] = "";
    aws_file(cred_file, sizeof cred_file, "AWS_SHARED_CREDENTIALS_FILE", "credentials");
    aws_file(conf_file, sizeof conf_file, "AWS_CONFIG_FILE", "config");
    snprintf(section, sizeof section, strcmp(profile, "default") ? "profile %s" : "%s", profile);
    if (env("AWS_REGION")) snprintf(region, sizeof region, "%s", env("AWS_REGION"));
    else if (env("AWS_DEFAULT_REGION")) snprintf(region, sizeof region, "%s", env("AWS_DEFAULT_REGION"));
    else if (!ini_get(conf_file, section, "region", region, sizeof region)) snprintf(region, sizeof region, "us-east-1");
    if (env("AWS_ACCESS_KEY_ID") && env("AWS_SECRET_ACCESS_KEY")) {
        snprintf(key_id, sizeof key_id, "%s", env("AWS_ACCESS_KEY_ID"));
        snprintf(secret, sizeof secret, "%s", env("AWS_SECRET_ACCESS_KEY"));
        if (env("AWS_SESSION_TOKEN")) snprintf(token, sizeof token, "%s", env("AWS_SESSION_TOKEN"));
    } else if (ini_get(cred_file, profile, "aws_access_key_id", key_id, sizeof key_id) &&
               ini_get(cred_file, profile, "aws_secret_access_key", secret, sizeof secret)) {
        ini_get(cred_file, profile, "aws_session_token", token, sizeof token);
    }
    /* the key, URI-encoded as SigV4 canonicalises it (every byte but unreserved ones and '/') */
    char key[1800];
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)slash + 1; *p; p++) {
        if (o + 4 > sizeof key) return olmo_error("'%s': S3 key too long", r->url);
        if (isalnum(*p) || strchr("-_.~/", *p)) key[o++] = (char)*p;
        else o += (size_t)snprintf(key + o, 4, "%%%02X", *p);
    }
    key[o] = 0;
    const int blen = (int)(slash - bucket);
    const char *endpoint = env("AWS_ENDPOINT_URL_S3") ? env("AWS_ENDPOINT_URL_S3") : env("AWS_ENDPOINT_URL");
    int n;
    if (endpoint) {
        size_t el = strlen(endpoint);
        while (el && endpoint[el - 1] == '/') el--;
        n = snprintf(r->http_url, sizeof r->http_url, "%.*s/%.*s/%s", (int)el, endpoint, blen, bucket, key);
    } else if (memchr(bucket, '.', (size_t)blen)) { /* a dotted bucket does not match the TLS wildcard */
        n = snprintf(r->http_url, sizeof r->http_url, "https://s3.%s.amazonaws.com/%.*s/%s", region, blen, bucket, key);
    } else {
        n = snprintf(r->http_url, sizeof r->http_url, "https://%.*s.s3.%s.amazonaws.com/%s", blen, bucket, region, key);
    }
    if (n < 0 || (size_t)n >= sizeof r->http_url) return olmo_error("'%s': URL too long", r->url);
    if (key_id[0]) {
        snprintf(r->sigv4, sizeof r->sigv4, "aws:amz:%s:s3", region);
        snprintf(r->userpwd, sizeof r->userpwd, "%s:%s", key_id, secret);
        if (token[0]) snprintf(r->token_hdr, sizeof r->token_hdr, "x-amz-security-token: %s", token);
    }
    return 0;
}

/* ------------------------------------------------------- the curl handles */

#define PF_THREADS 8
#define PF_BUDGET ((size_t)256 << 20)

struct pf_entry {
    struct olmo_remote *r;
    uint64_t off;
    size_t len;
    uint8_t *buf;
    int state; /* 0 queued, 1 running, 2 done, 3 failed */
    bool orphan; /* discarded while running: the worker frees it */
    char *err;
    struct pf_entry *next;
};

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_open; /* open remote files */
    CURL *idle[2 * PF_THREADS];
    int n_idle;
    struct pf_entry *head;
    size_t bytes;
    pthread_t th[PF_THREADS];
    int n_threads;
    bool stop;
    char cache_dir[1024];
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

static CURL *handle_get(void) {
    pthread_mutex_lock(&pool.mu);
    CURL *h = pool.n_idle ? pool.idle[--pool.n_idle] : NULL;
    pthread_mutex_unlock(&pool.mu);
    if (!h) h = curl_easy_init();
    else curl_easy_reset(h); /* keeps its connections */
    return h;
}

static void handle_put(CURL *h) {
    pthread_mutex_lock(&pool.mu);
    if (pool.n_idle < (int)(sizeof pool.idle / sizeof *pool.idle)) {
        pool.idle[pool.n_idle++] = h;
        h = NULL;
    }
    pthread_mutex_unlock(&pool.mu);
    if (h) curl_easy_cleanup(h);
}

/* ------------------------------------------------------------ one request */

struct xfer {
    CURL *h;
    uint8_t *dst; /* ranged GET: the destination */
    FILE *out;    /* whole GET (the cache): the file */
    size_t cap, got;
    bool overflow;
    long status;
    uint64_t total, length; /* Content-Range's /TOTAL, Content-Length */
    bool have_total, have_length;
    char etag[256];
    char body[400]; /* an error response's first bytes */
    size_t body_len;
};

static size_t on_header(char *b, size_t sz, size_t n, void *arg) {
    struct xfer *x = arg;
    const size_t len = sz * n;
    char line[512];
    snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line - 1 ? len : sizeof line - 1), b);
    if (!strncmp(line, "HTTP/", 5)) { /* a new response (after a redirect or 100 Continue) */
        x->have_total = x->have_length = false;
        x->status = 0;
        x->etag[0] = 0;
    } else if (!strncasecmp(line, "content-length:", 15)) {
        char *end;
        x->length = strtoull(line + 15, &end, 10);
        x->have_length = end != line + 15;
    } else if (!strncasecmp(line, "content-range:", 14)) {
        const char *slash = strchr(line, '/');
        if (slash && isdigit((unsigned char)slash[1])) {
            x->total = strtoull(slash + 1, NULL, 10);
            x->have_total = true;
        }
    } else if (!strncasecmp(line, "etag:", 5)) {
        char *v = line + 5;
        while (*v == ' ') v++;
        size_t vl = strlen(v);
        while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' ')) v[--vl] = 0;
        if (vl < sizeof x->etag) memcpy(x->etag, v, vl + 1);
        else x->etag[0] = 0; /* longer than any store's: no If-Match (the size is still checked) */
    }
    return len;
}

static size_t on_body(char *b, size_t sz, size_t n, void *arg) {
    struct xfer *x = arg;
    const size_t len = sz * n;
    if (!x->status) curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &x->status);
    if (x->status >= 300) { /* keep the start of an error body */
        const size_t k = len < sizeof x->body - 1 - x->body_len ? len : sizeof x->body - 1 - x->body_len;
        memcpy(x->body + x->body_len, b, k);
        x->body[x->body_len += k] = 0;
        return len;
    }
    if (x->out) {
        if (fwrite(b, 1, len, x->out) != len) return 0;
    } else {
        if (len > x->cap - x->got) {
            x->overflow = true;
            return 0;
        }
        memcpy(x->dst + x->got, b, len);
    }
    x->got += len;
    return len;
}

/* " (S3 AccessDenied)" from an S3 error body */
static void s3_code(const struct xfer *x, char *out, size_t cap) {
    const char *c = strstr(x->body, "<Code>"), *e = c ? strstr(c, "</Code>") : NULL;
    if (c && e) snprintf(out, cap, " (S3 %.*s)", (int)(e - c - 6), c + 6);
    else out[0] = 0;
}

enum { OK = 0, RETRY = 1, FATAL = 2 };

/* One HEAD or GET (of [off, off + len), or the whole file when len is 0): OK, RETRY or FATAL. */
static int request(struct olmo_remote *r, CURL *h, bool head, uint64_t off, size_t len, struct xfer *x) {
    char range[64], ifmatch[300];
    struct curl_slist *hdr = NULL;
    curl_easy_setopt(h, CURLOPT_URL, r->http_url);
    curl_easy_setopt(h, CURLOPT_NOBODY, head ? 1L : 0L);
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 20L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L); /* a stalled transfer: retried */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    if (len) {
        snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)off, (unsigned long long)(off + len - 1));
        curl_easy_setopt(h, CURLOPT_RANGE, range);
    }
    if (!head && r->etag[0]) {
        snprintf(ifmatch, sizeof ifmatch, "If-Match: %s", r->etag);
        hdr = curl_slist_append(hdr, ifmatch);
    }
    if (r->sigv4[0]) {
        curl_easy_setopt(h, CURLOPT_AWS_SIGV4, r->sigv4);
        curl_easy_setopt(h, CURLOPT_USERPWD, r->userpwd);
        /* the SHA-256 of the empty payload: S3 wants the header, and it is what SigV4 signs */
        hdr = curl_slist_append(hdr, "x-amz-content-sha256: "
                                     "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        if (r->token_hdr[0]) hdr = curl_slist_append(hdr, r->token_hdr);
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    const CURLcode rc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &x->status);
    curl_slist_free_all(hdr);
    const char *what = head ? "HEAD" : len ? "GET" : "GET (whole file)";
    char rtxt[96] = "";
    if (len) snprintf(rtxt, sizeof rtxt, " bytes %s", range);
    if (x->overflow) {
        olmo_error("%s '%s'%s: the server sent more than the range asked for (HTTP %ld): it does not honour Range "
                   "requests",
                   what, r->url, rtxt, x->status);
        return FATAL;
    }
    if (rc != CURLE_OK && (x->status == 0 || x->status < 300)) {
        olmo_error("%s '%s'%s failed: %s (HTTP %ld)", what, r->url, rtxt, curl_easy_strerror(rc), x->status);
        return rc == CURLE_WRITE_ERROR && x->out ? FATAL : RETRY;
    }
    if (x->status >= 300) {
        char code[96];
        s3_code(x, code, sizeof code);
        olmo_error("%s '%s'%s: HTTP %ld%s%s", what, r->url, rtxt, x->status, code,
                   x->status == 412   ? ": the file changed since it was opened"
                   : x->status == 416 ? ": the range is past the end (the file shrank?)"
                                      : "");
        return x->status >= 500 || x->status == 408 || x->status == 429 ? RETRY : FATAL;
    }
    if (!head && len && x->got != len) {
        olmo_error("GET '%s'%s: truncated response, %zu of %zu bytes (HTTP %ld)", r->url, rtxt, x->got, len,
                   x->status);
        return RETRY;
    }
    if (!head && len && x->status == 206 && x->have_total && x->total != r->size) {
        olmo_error("'%s' changed size while it was read: %llu bytes when opened, %llu now", r->url,
                   (unsigned long long)r->size, (unsigned long long)x->total);
        return FATAL;
    }
    if (!head && len && x->status == 200 && (off != 0 || len != r->size)) {
        olmo_error("GET '%s'%s: HTTP 200 with the whole file: the server does not honour Range requests", r->url,
                   rtxt);
        return FATAL;
    }
    return OK;
}

static int retries(void) {
    const char *v = env("OLMOC_REMOTE_RETRIES");
    const int n = v ? atoi(v) : 5;
    return n < 0 ? 0 : n > 30 ? 30 : n;
}

/* request() with retries and exponential backoff (0.25 s, doubling, at most 8 s) */
static int perform(struct olmo_remote *r, bool head, uint64_t off, size_t len, struct xfer *x, FILE *out) {
    pthread_once(&curl_once, curl_init_once);
    CURL *h = handle_get();
    if (!h) return olmo_error("'%s': cannot create a libcurl handle", r->url);
    const int tries = retries() + 1;
    double delay = 0.25;
    int rc = FATAL;
    for (int t = 0; t < tries; t++) {
        *x = (struct xfer){.h = h, .dst = x->dst, .out = out, .cap = len};
        if (out && (fseek(out, 0, SEEK_SET) || ftruncate(fileno(out), 0))) {
            rc = FATAL;
            olmo_error("'%s': cannot rewrite the cache file: %s", r->url, strerror(errno));
            break;
        }
        if ((rc = request(r, h, head, off, len, x)) != RETRY) break;
        if (t + 1 < tries) {
            struct timespec ts = {(time_t)delay, (long)((delay - (double)(time_t)delay) * 1e9)};
            nanosleep(&ts, NULL);
            delay = delay * 2 > 8 ? 8 : delay * 2;
        }
    }
    handle_put(h);
    if (rc == RETRY && tries > 1) olmo_error_context("after %d attempts", tries);
    return rc == OK ? 0 : -1;
}

int olmo_remote_open(struct olmo_remote **out, const char *url) {
    *out = NULL;
    struct olmo_remote *r = olmo_calloc(1, sizeof *r, "remote file");
    if (!r) return -1;
    int rc = 0;
    if (strlen(url) >= sizeof r->url) rc = olmo_error("URL too long: '%.60s...'", url);
    snprintf(r->url, sizeof r->url, "%s", url);
    if (!rc && !strncmp(url, "s3://", 5)) rc = resolve_s3(r);
    else if (!rc) snprintf(r->http_url, sizeof r->http_url, "%s", url);
    struct xfer x = {0};
    if (!rc) rc = perform(r, true, 0, 0, &x, NULL);
    if (!rc && !x.have_length)
        rc = olmo_error("HEAD '%s' (HTTP %ld): no Content-Length, so the file's size is unknown", url, x.status);
    if (!rc && x.length == 0) rc = olmo_error("token file '%s' is empty", url);
    if (rc) {
        free(r);
        return -1;
    }
    r->size = x.length;
    if (x.etag[0] && strncmp(x.etag, "W/", 2)) snprintf(r->etag, sizeof r->etag, "%s", x.etag);
    pthread_mutex_lock(&pool.mu);
    pool.n_open++;
    pthread_mutex_unlock(&pool.mu);
    *out = r;
    return 0;
}

static int read_range(struct olmo_remote *r, uint64_t off, size_t len, void *dst) {
    if (off > r->size || len > r->size - off)
        return olmo_error("'%s': bytes [%llu, %llu) are outside its %llu bytes", r->url, (unsigned long long)off,
                          (unsigned long long)(off + len), (unsigned long long)r->size);
    if (!len) return 0;
    struct xfer x = {.dst = dst};
    return perform(r, false, off, len, &x, NULL);
}

/* ------------------------------------------------------------- read-ahead */

static void unlink_entry(struct pf_entry *e) {
    for (struct pf_entry **p = &pool.head; *p; p = &(*p)->next)
        if (*p == e) {
            *p = e->next;
            pool.bytes -= e->len;
            return;
        }
}

static void free_entry(struct pf_entry *e) {
    free(e->buf);
    free(e->err);
    free(e);
}

static void *worker(void *arg) {
    (void)arg;
    pthread_mutex_lock(&pool.mu);
    for (;;) {
        struct pf_entry *e = pool.head;
        while (e && e->state != 0) e = e->next;
        if (!e) {
            if (pool.stop) break;
            pthread_cond_wait(&pool.cv, &pool.mu);
            continue;
        }
        e->state = 1;
        e->r->running++;
        pthread_mutex_unlock(&pool.mu);
        int rc = -1;
        if ((e->buf = malloc(e->len ? e->len : 1))) rc = read_range(e->r, e->off, e->len, e->buf);
        else olmo_error("out of memory for the read-ahead of '%s'", e->r->url);
        char *err = rc ? strdup(olmo_last_error()) : NULL;
        pthread_mutex_lock(&pool.mu);
        e->r->running--;
        e->state = rc ? 3 : 2;
        e->err = err;
        if (e->orphan) free_entry(e);
        pthread_cond_broadcast(&pool.cv);
    }
    pthread_mutex_unlock(&pool.mu);
    return NULL;
}

void olmo_remote_prefetch(struct olmo_remote *r, uint64_t off, size_t len) {
    if (off > r->size || len > r->size - off || !len || len > PF_BUDGET) return;
    pthread_mutex_lock(&pool.mu);
    struct pf_entry *last = NULL;
    for (struct pf_entry *e = pool.head; e; e = e->next) {
        if (e->r == r && e->off == off && e->len == len) goto out; /* queued already */
        last = e;
    }
    /* full: forget the oldest ranges fetched and never read, else skip this one */
    while (pool.bytes + len > PF_BUDGET) {
        struct pf_entry *old = pool.head;
        while (old && old->state < 2) old = old->next;
        if (!old) goto out;
        unlink_entry(old);
        free_entry(old);
        last = NULL;
        for (struct pf_entry *e = pool.head; e; e = e->next) last = e;
    }
    struct pf_entry *n = calloc(1, sizeof *n);
    if (!n) goto out;
    *n = (struct pf_entry){.r = r, .off = off, .len = len};
    if (last) last->next = n;
    else pool.head = n;
    pool.bytes += len;
    while (pool.n_threads < PF_THREADS && !pool.stop) {
        if (pthread_create(&pool.th[pool.n_threads], NULL, worker, NULL)) break;
        pool.n_threads++;
    }
    if (!pool.n_threads) { /* no worker to fetch it: the read fetches the range itself */
        unlink_entry(n);
        free_entry(n);
        goto out;
    }
    pthread_cond_broadcast(&pool.cv);
out:
    pthread_mutex_unlock(&pool.mu);
}

int olmo_remote_read(struct olmo_remote *r, uint64_t off, size_t len, void *dst) {
    pthread_mutex_lock(&pool.mu);
    struct pf_entry *e = pool.head;
    while (e && !(e->r == r && e->off == off && e->len == len)) e = e->next;
    if (!e) {
        pthread_mutex_unlock(&pool.mu);
        return read_range(r, off, len, dst);
    }
    while (e->state < 2) pthread_cond_wait(&pool.cv, &pool.mu);
    unlink_entry(e);
    pthread_mutex_unlock(&pool.mu);
    int rc = 0;
    if (e->state == 2) memcpy(dst, e->buf, len);
    else rc = olmo_error("%s", e->err ? e->err : "read-ahead failed");
    free_entry(e);
    return rc;
}

static void discard_locked(struct olmo_remote *r) {
    for (struct pf_entry **p = &pool.head; *p;) {
        struct pf_entry *e = *p;
        if (e->r != r) {
            p = &e->next;
            continue;
        }
        *p = e->next;
        pool.bytes -= e->len;
        if (e->state == 1) e->orphan = true;
        else free_entry(e);
    }
}

void olmo_remote_discard(struct olmo_remote *r) {
    pthread_mutex_lock(&pool.mu);
    discard_locked(r);
    pthread_mutex_unlock(&pool.mu);
}

void olmo_remote_close(struct olmo_remote *r) {
    if (!r) return;
    pthread_mutex_lock(&pool.mu);
    discard_locked(r);
    while (r->running) pthread_cond_wait(&pool.cv, &pool.mu);
    const bool last = --pool.n_open == 0;
    int n_threads = 0;
    if (last) { /* no file left: the workers and the idle handles go */
        pool.stop = true;
        n_threads = pool.n_threads;
        pthread_cond_broadcast(&pool.cv);
    }
    pthread_mutex_unlock(&pool.mu);
    for (int i = 0; i < n_threads; i++) pthread_join(pool.th[i], NULL);
    if (last) {
        pthread_mutex_lock(&pool.mu);
        for (int i = 0; i < pool.n_idle; i++) curl_easy_cleanup(pool.idle[i]);
        pool.n_idle = 0;
        pool.n_threads = 0;
        pool.stop = false;
        pthread_mutex_unlock(&pool.mu);
    }
    free(r);
}

/* ------------------------------------------------------------ local cache */

void olmo_remote_set_cache_dir(const char *dir) {
    pthread_mutex_lock(&pool.mu);
    snprintf(pool.cache_dir, sizeof pool.cache_dir, "%s", dir ? dir : "");
    pthread_mutex_unlock(&pool.mu);
}

int olmo_remote_cached(struct olmo_remote *r, char *path, size_t cap) {
    char dir[1024];
    pthread_mutex_lock(&pool.mu);
    snprintf(dir, sizeof dir, "%s", pool.cache_dir);
    pthread_mutex_unlock(&pool.mu);
    if (!dir[0]) return 0;
    if (olmo_make_dirs(dir)) return olmo_error_context("the remote cache directory '%s'", dir);
    /* DIR/<hash of the URL>-<file name>, with <that>.etag beside it */
    uint64_t hash = 1469598103934665603ULL;
    for (const char *p = r->url; *p; p++) hash = (hash ^ (unsigned char)*p) * 1099511628211ULL;
    const char *base = strrchr(r->url, '/');
    char name[80];
    size_t o = 0;
    for (const char *p = base ? base + 1 : r->url; *p && o < sizeof name - 1; p++)
        name[o++] = isalnum((unsigned char)*p) || strchr("-_.", *p) ? *p : '_';
    name[o] = 0;
    char meta[1200], tmp[1200], want[300], have[300] = "";
    int n = snprintf(path, cap, "%s/%016llx-%s", dir, (unsigned long long)hash, name);
    if (n < 0 || (size_t)n >= cap || (size_t)n + 16 >= sizeof meta)
        return olmo_error("remote cache path too long under '%s'", dir);
    snprintf(meta, sizeof meta, "%s.meta", path);
    snprintf(want, sizeof want, "%llu %s", (unsigned long long)r->size, r->etag);
    FILE *f = fopen(meta, "r");
    if (f) {
        if (!fgets(have, sizeof have, f)) have[0] = 0;
        fclose(f);
    }
    struct stat st;
    if (!strcmp(have, want) && !stat(path, &st) && (uint64_t)st.st_size == r->size) return 1;
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *out = fopen(tmp, "w+b");
    if (!out) return olmo_error("cannot write the cache file '%s': %s", tmp, strerror(errno));
    struct xfer x = {0};
    int rc = perform(r, false, 0, 0, &x, out);
    if (!rc && x.got != r->size)
        rc = olmo_error("GET '%s': %zu bytes, but HEAD said %llu: the file changed while it was cached", r->url, x.got,
                        (unsigned long long)r->size);
    if (fclose(out) && !rc) rc = olmo_error("writing the cache file '%s' failed: %s", tmp, strerror(errno));
    unlink(meta); /* the file first, then its size and ETag: a copy is used only when both agree */
    if (!rc && rename(tmp, path)) rc = olmo_error("cannot rename '%s': %s", tmp, strerror(errno));
    if (!rc && (f = fopen(meta, "w"))) {
        fputs(want, f);
        if (fclose(f)) rc = olmo_error("writing '%s' failed", meta);
    }
    if (rc) unlink(tmp);
    return rc ? -1 : 1;
}
