/* The paths a config names.  Inside a config file a relative path is relative to the file's directory
 * (olmo_config_load); a path given on the command line stays relative to the working directory.  Written
 * configs (a run's config.yaml, a checkpoint's) carry absolute paths, so that reading one back from its
 * run or step directory names the same files. */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/config.h"
#include "util/error.h"

enum path_kind {
    ONE,   /* one path */
    LIST,  /* PATH,PATH,... */
    SEARCH, /* DIR:DIR:... */
    MIX,   /* PATH[+PATH...][:WEIGHT],... */
    TASKS, /* NAME-or-PATH,...: an entry is a path when it has a '/' or ends in .jsonl (before a :metric) */
};

static const struct {
    const char *key;
    size_t offset, size;
    enum path_kind kind;
} path_keys[] = {
#define P(name, kind) \
    {"data." #name, offsetof(struct olmo_config, data.name), sizeof(((struct olmo_config *)0)->data.name), kind}
    P(train_path, ONE),  P(mix, MIX),           P(mix_file, ONE), P(mix_base_dir, ONE), P(out_dir, ONE),
    P(val_paths, LIST),  P(eval_tasks, TASKS), P(tokenizer, ONE), P(eval_tasks_dir, SEARCH),
    P(remote_cache_dir, ONE),
#undef P
};
#define N_PATH_KEYS (sizeof path_keys / sizeof path_keys[0])

/* Appends s[0..n) to the buffer; false when it does not fit. */
struct sbuf {
    char *p;
    size_t len, cap;
};
static bool put(struct sbuf *b, const char *s, size_t n) {
    if (b->len + n >= b->cap) return false;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return true;
}

static bool is_symlink(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0 && S_ISLNK(st.st_mode);
}

static bool is_blank(char c) { return c == ' ' || c == '\t'; }

/* BASE/REL with "." and "NAME/.." removed; a ".." after a symbolic link is kept, as the kernel would
 * follow the link first.  An absolute REL, a URL (scheme://) or an empty one is copied unchanged.  A list's
 * entry (trim) loses its blanks around it, as the lists' readers drop them. */
static bool rebase_one(struct sbuf *b, const char *rel, size_t n, const char *base, bool trim) {
    while (trim && n && is_blank(*rel)) rel++, n--;
    while (trim && n && is_blank(rel[n - 1])) n--;
    char path[8192];
    bool keep = !n || *rel == '/' || memmem(rel, n, "://", 3);
    int w = keep ? snprintf(path, sizeof path, "%.*s", (int)n, rel)
                 : snprintf(path, sizeof path, "%s/%.*s", base, (int)n, rel);
    if (w < 0 || (size_t)w >= sizeof path) return false;
    if (keep) return put(b, path, (size_t)w);
    char out[8192];
    size_t len = 0, starts[4096];
    int depth = 0;
    const bool absolute = path[0] == '/';
    if (absolute) out[len++] = '/';
    out[len] = 0;
    for (char *save = NULL, *c = strtok_r(path, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
        if (!strcmp(c, ".")) continue;
        /* the last component kept, with its '/', is "../": a ".." after it stays */
        const bool after_dotdot =
            depth > 0 && len - starts[depth - 1] == 3 && !memcmp(out + starts[depth - 1], "../", 3);
        if (!strcmp(c, "..") && depth > 0 && !after_dotdot) {
            out[len > 0 && out[len - 1] == '/' ? len - 1 : len] = 0;
            if (!is_symlink(out[0] ? out : "/")) {
                len = starts[--depth];
                out[len] = 0;
                continue;
            }
            out[strlen(out)] = '/';
        }
        if (!strcmp(c, "..") && depth == 0 && absolute) continue; /* /.. is / */
        size_t cl = strlen(c);
        if (depth == (int)(sizeof starts / sizeof starts[0]) || len + cl + 2 >= sizeof out) return false;
        starts[depth++] = len;
        memcpy(out + len, c, cl);
        len += cl;
        out[len++] = '/';
        out[len] = 0;
    }
    if (len > 1 && out[len - 1] == '/') out[--len] = 0;
    if (!len) out[len++] = '.', out[len] = 0;
    return put(b, out, len);
}

static bool is_task_path(const char *s, size_t n) {
    if (memchr(s, '/', n)) return true;
    const char *colon = memchr(s, ':', n);
    size_t m = colon ? (size_t)(colon - s) : n;
    while (m && s[m - 1] == ' ') m--;
    return m > 6 && !memcmp(s + m - 6, ".jsonl", 6);
}

/* value (of the given kind) with each of its paths rebased on base, into b */
static bool rebase_value(struct sbuf *b, const char *value, enum path_kind kind, const char *base) {
    if (kind == ONE) return rebase_one(b, value, strlen(value), base, false);
    const char sep = kind == SEARCH ? ':' : ',';
    for (const char *item = value;;) {
        const char *end = strchr(item, sep);
        size_t n = end ? (size_t)(end - item) : strlen(item);
        bool ok = true;
        if (kind == MIX) {
            /* the weight: after the last ':' of the entry, when it reads as a number (token_file.c) */
            size_t paths_n = n;
            const char *colon = NULL;
            for (size_t i = n; i-- > 0;)
                if (item[i] == ':') {
                    colon = item + i;
                    break;
                }
            if (colon) {
                char num[64], *e;
                size_t wn = (size_t)(item + n - colon - 1);
                if (wn < sizeof num) {
                    memcpy(num, colon + 1, wn);
                    num[wn] = 0;
                    if (wn && (strtod(num, &e), e != num) && !*e) paths_n = (size_t)(colon - item);
                }
            }
            for (const char *p = item, *pend = item + paths_n; ok;) {
                const char *plus = memchr(p, '+', (size_t)(pend - p));
                size_t pn = plus ? (size_t)(plus - p) : (size_t)(pend - p);
                ok = rebase_one(b, p, pn, base, true) && (!plus || put(b, "+", 1));
                if (!plus) break;
                p = plus + 1;
            }
            ok = ok && put(b, item + paths_n, n - paths_n);
        } else if (kind == TASKS && !is_task_path(item, n)) {
            ok = put(b, item, n);
        } else {
            /* a validation set's LABEL=PATH (eval/evaluate.c): a '=' with no '/' before it */
            const char *a = item;
            size_t an = n;
            while (an && is_blank(*a)) a++, an--;
            const char *eq = kind == LIST ? memchr(a, '=', an) : NULL;
            if (eq && (eq == a || memchr(a, '/', (size_t)(eq - a)))) eq = NULL;
            if (eq) ok = put(b, a, (size_t)(eq - a) + 1) && rebase_one(b, eq + 1, an - (size_t)(eq - a) - 1, base, true);
            else ok = rebase_one(b, item, n, base, true);
        }
        if (!ok) return false;
        if (!end) return true;
        if (!put(b, &sep, 1)) return false;
        item = end + 1;
    }
}

static int rebase_field(struct olmo_config *cfg, size_t k, const char *base) {
    char *value = (char *)cfg + path_keys[k].offset;
    char *out = malloc(path_keys[k].size);
    if (!out) return olmo_error("out of memory");
    struct sbuf b = {out, 0, path_keys[k].size};
    out[0] = 0;
    int rc = 0;
    if (!rebase_value(&b, value, path_keys[k].kind, base))
        rc = olmo_error("%s: '%s' relative to '%s' is longer than %zu characters", path_keys[k].key, value, base,
                        path_keys[k].size - 1);
    else memcpy(value, out, b.len + 1);
    free(out);
    return rc;
}

int olmo_config_rebase_path(struct olmo_config *cfg, const char *key, const char *base_dir) {
    for (size_t k = 0; k < N_PATH_KEYS; k++)
        if (!strcmp(path_keys[k].key, key)) return rebase_field(cfg, k, base_dir);
    return 0;
}

int olmo_config_absolute_paths(struct olmo_config *cfg) {
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd)) return olmo_error("cannot read the working directory: %s", strerror(errno));
    for (size_t k = 0; k < N_PATH_KEYS; k++)
        if (rebase_field(cfg, k, cwd)) return -1;
    return 0;
}
