#include "data/mix_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/remote.h"
#include "util/error.h"

void olmo_mix_file_free(char **paths, int n_paths) {
    for (int i = 0; i < n_paths; i++) free(paths[i]);
    free(paths);
}

/* base + "/" (unless it ends with one) + path with every "{TOKENIZER}" replaced */
static char *resolve(const char *base, const char *path, const char *tokenizer) {
    static const char key[] = "{TOKENIZER}";
    const size_t klen = sizeof key - 1, blen = strlen(base), tlen = strlen(tokenizer);
    size_t n = 0;
    for (const char *p = strstr(path, key); p; p = strstr(p + klen, key)) n++;
    const size_t len = blen + 1 + strlen(path) + n * tlen + 1;
    char *out = malloc(len);
    if (!out) return NULL;
    size_t o = (size_t)snprintf(out, len, "%s%s", base, blen && base[blen - 1] == '/' ? "" : "/");
    for (const char *p = path; *p;) {
        if (!strncmp(p, key, klen)) {
            memcpy(out + o, tokenizer, tlen);
            o += tlen;
            p += klen;
        } else {
            out[o++] = *p++;
        }
    }
    out[o] = 0;
    return out;
}

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n')) s[--n] = 0;
    return s;
}

/* A mix file lists paths: a few hundred lines in OLMo-core's, far below this. */
#define MIX_FILE_MAX ((size_t)16 << 20)
#define MIX_LINE_MAX 8190

/* An http(s):// or s3:// mix file, whole (io/remote.h: retries, the error names the URL and status). */
static int read_remote_mix_file(const char *url, char **buf, size_t *n) {
    struct olmo_remote *r = NULL;
    if (olmo_remote_open(&r, url)) return olmo_error_context("data mix file");
    const uint64_t size = olmo_remote_size(r);
    int rc = 0;
    if (size > MIX_FILE_MAX)
        rc = olmo_error("data mix file '%s' has %llu bytes, more than the %zu MiB a list of paths needs", url,
                        (unsigned long long)size, MIX_FILE_MAX >> 20);
    if (!rc && !(*buf = malloc((size_t)size + 1))) rc = olmo_error("out of memory reading '%s'", url);
    if (!rc && size && olmo_remote_read(r, 0, (size_t)size, *buf)) rc = olmo_error_context("data mix file");
    olmo_remote_close(r);
    if (rc) {
        free(*buf);
        *buf = NULL;
        return -1;
    }
    *n = (size_t)size;
    return 0;
}

/* A local mix file, whole: a regular file only (opened without blocking, so a FIFO is refused instead of
 * waiting for a writer). */
static int read_local_mix_file(const char *file, char **out, size_t *len) {
    const int fd = open(file, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return olmo_error("cannot open data mix file '%s': %s", file, strerror(errno));
    struct stat sb;
    int rc = 0;
    if (fstat(fd, &sb)) rc = olmo_error("cannot open data mix file '%s': %s", file, strerror(errno));
    else if (S_ISDIR(sb.st_mode))
        rc = olmo_error("data mix file '%s' is a directory: data.mix_file names a text file of 'label,path' lines "
                        "(data.mix_base_dir is the directory its paths are under)",
                        file);
    else if (!S_ISREG(sb.st_mode))
        rc = olmo_error("data mix file '%s' is not a regular file (%s): it is read whole, before training, so it "
                        "must be a file on disk",
                        file, S_ISFIFO(sb.st_mode) ? "a FIFO" : S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode) ? "a device"
                                                                                              : "a socket or other");
    else if ((size_t)sb.st_size > MIX_FILE_MAX)
        rc = olmo_error("data mix file '%s' has %lld bytes, more than the %zu MiB a list of paths needs", file,
                        (long long)sb.st_size, MIX_FILE_MAX >> 20);
    char *buf = rc ? NULL : malloc((size_t)sb.st_size + 1);
    if (!rc && !buf) rc = olmo_error("out of memory reading '%s'", file);
    size_t n = 0;
    while (!rc && n < (size_t)sb.st_size) {
        const ssize_t got = read(fd, buf + n, (size_t)sb.st_size - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) rc = olmo_error("reading data mix file '%s' failed: %s", file, strerror(errno));
        if (got <= 0) break; /* a file that shrank: what is there */
        n += (size_t)got;
    }
    close(fd);
    if (rc) {
        free(buf);
        return -1;
    }
    *out = buf;
    *len = n;
    return 0;
}

/* The whole file, NUL-terminated: a URL (io/remote.h) or a local regular file; text without NUL bytes. */
static int read_mix_file(const char *file, char **text, size_t *len) {
    char *buf = NULL;
    size_t n = 0;
    if (olmo_remote_is_url(file) ? read_remote_mix_file(file, &buf, &n) : read_local_mix_file(file, &buf, &n))
        return -1;
    buf[n] = 0;
    const char *nul = memchr(buf, 0, n);
    if (nul) {
        size_t line = 1;
        for (const char *p = buf; p < nul; p++) line += *p == '\n';
        const size_t at = (size_t)(nul - buf);
        free(buf);
        return olmo_error("data mix file '%s' has a NUL byte at offset %zu (line %zu): not a text file", file, at,
                          line);
    }
    *text = buf;
    *len = n;
    return 0;
}

int olmo_mix_file_paths(const char *file, const char *base_dir, const char *tokenizer, char ***paths,
                        int *n_paths) {
    *paths = NULL;
    *n_paths = 0;
    if (!base_dir[0]) return olmo_error("data mix file '%s': set data.mix_base_dir (OLMo-core's mix_base_dir)", file);
    if (!tokenizer[0])
        return olmo_error("data mix file '%s': set data.mix_tokenizer, the id OLMo-core puts for {TOKENIZER} "
                          "(allenai/dolma3-tokenizer for the Olmo 3 mixes with the dolma2 tokenizer)",
                          file);
    char *text = NULL;
    size_t len = 0;
    if (read_mix_file(file, &text, &len)) return -1;
    int cap = 0, n = 0, rc = 0;
    char **out = NULL;
    /* a UTF-8 byte-order mark (an editor's) is the encoding's, not the first label's */
    char *next = len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3) ? text + 3 : text;
    for (int line_num = 1; next && *next; line_num++) {
        char *line = next, *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        next = nl ? nl + 1 : NULL;
        if (strlen(line) > MIX_LINE_MAX) {
            rc = olmo_error("data mix file '%s': line %d is longer than %d characters", file, line_num, MIX_LINE_MAX);
            break;
        }
        char *s = trim(line);
        if (!*s || *s == '#') continue;
        char *comma = strchr(s, ',');
        if (!comma || strchr(comma + 1, ',') || !strstr(comma + 1, "{TOKENIZER}")) {
            rc = olmo_error("data mix file '%s': line %d is not 'label,path' with {TOKENIZER} in the path", file,
                            line_num);
            break;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **grown = realloc(out, (size_t)cap * sizeof *out);
            if (!grown) {
                rc = olmo_error("out of memory reading '%s'", file);
                break;
            }
            out = grown;
        }
        if (!(out[n] = resolve(base_dir, comma + 1, tokenizer))) {
            rc = olmo_error("out of memory reading '%s'", file);
            break;
        }
        n++;
    }
    free(text);
    if (!rc && !n) rc = olmo_error("data mix file '%s' lists no token file", file);
    if (rc) {
        olmo_mix_file_free(out, n);
        return -1;
    }
    *paths = out;
    *n_paths = n;
    return 0;
}
