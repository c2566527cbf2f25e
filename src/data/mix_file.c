#include "data/mix_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int olmo_mix_file_paths(const char *file, const char *base_dir, const char *tokenizer, char ***paths,
                        int *n_paths) {
    *paths = NULL;
    *n_paths = 0;
    if (!base_dir[0]) return olmo_error("data mix file '%s': set data.mix_base_dir (OLMo-core's mix_base_dir)", file);
    if (!tokenizer[0])
        return olmo_error("data mix file '%s': set data.mix_tokenizer, the id OLMo-core puts for {TOKENIZER} "
                          "(allenai/dolma3-tokenizer for the Olmo 3 mixes with the dolma2 tokenizer)",
                          file);
    FILE *f = fopen(file, "r");
    if (!f) return olmo_error("cannot open data mix file '%s': %s", file, strerror(errno));
    char line[8192];
    int cap = 0, n = 0, rc = 0;
    char **out = NULL;
    for (int line_num = 1; fgets(line, sizeof line, f); line_num++) {
        if (!strchr(line, '\n') && !feof(f)) {
            rc = olmo_error("data mix file '%s': line %d is longer than %zu characters", file, line_num,
                            sizeof line - 2);
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
    if (!rc && ferror(f)) rc = olmo_error("reading data mix file '%s' failed", file);
    fclose(f);
    if (!rc && !n) rc = olmo_error("data mix file '%s' lists no token file", file);
    if (rc) {
        olmo_mix_file_free(out, n);
        return -1;
    }
    *paths = out;
    *n_paths = n;
    return 0;
}
