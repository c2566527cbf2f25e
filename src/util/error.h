/* Error reporting: library functions return nonzero on failure and leave a
 * human-readable message here; the CLI prints it.  Thread-local so that
 * worker threads never clobber each other's messages. */
#ifndef OLMOC_ERROR_H
#define OLMOC_ERROR_H

#include <stddef.h>

#if defined(__GNUC__)
#define OLMO_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define OLMO_PRINTF(a, b)
#endif

/* Sets the message; always returns -1 so callers can `return olmo_error(...)`. */
int olmo_error(const char *fmt, ...) OLMO_PRINTF(1, 2);
/* Prepends context to the current message ("loading x: " + old message). */
int olmo_error_context(const char *fmt, ...) OLMO_PRINTF(1, 2);
const char *olmo_last_error(void);

/* Allocation that reports failure through olmo_error instead of crashing. */
void *olmo_malloc(size_t bytes, const char *what);
void *olmo_calloc(size_t count, size_t size, const char *what);

#endif
