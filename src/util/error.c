#include "util/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char last_error[2048];

int olmo_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return -1;
}

int olmo_error_context(const char *fmt, ...) {
    char prefix[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    size_t plen = strlen(prefix), old_len = strlen(last_error);
    if (plen + 2 + old_len >= sizeof last_error) old_len = sizeof last_error - plen - 3;
    memmove(last_error + plen + 2, last_error, old_len);
    memcpy(last_error, prefix, plen);
    memcpy(last_error + plen, ": ", 2);
    last_error[plen + 2 + old_len] = 0;
    return -1;
}

const char *olmo_last_error(void) { return last_error[0] ? last_error : "unknown error"; }

void *olmo_malloc(size_t bytes, const char *what) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) olmo_error("out of memory allocating %zu bytes for %s", bytes, what);
    return p;
}

void *olmo_calloc(size_t count, size_t size, const char *what) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) olmo_error("out of memory allocating %zu x %zu bytes for %s", count, size, what);
    return p;
}
