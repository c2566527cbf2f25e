/* The run's metrics log, data.out_dir/metrics.jsonl: one JSON object per line
 * (a training step, a validation set, a downstream task), built with cJSON so
 * names are escaped.  Floats keep the digits they always had (17 significant
 * digits for losses, grad norm and LR); a value that is not finite (NaN, inf)
 * is written as null, which JSON readers accept.  Every write is checked and
 * flushed (a full disk stops the run instead of truncating the log); the file
 * is not fsync'ed per record.
 *
 * On resume the log is read back (streamed: any size, 64-bit offsets) and
 * cut to the records of the steps the checkpoint holds; every record removed
 * is reported, and a file that is not a log olmoc wrote (a NUL byte, a line
 * with no step, a line over 16 MiB) is refused with its offset instead of
 * being rewritten. */
#ifndef OLMOC_METRICS_H
#define OLMOC_METRICS_H

#include <cjson/cJSON.h>
#include <stdio.h>

struct olmo_metrics {
    FILE *f; /* NULL: records are discarded (ranks other than 0, benchmarks) */
    char path[4200];
};

/* Opens path for appending after keeping only the records with step <=
 * keep_through (0 for a new run).  Notes about removed records go to log (may
 * be NULL).  path NULL: a log that discards everything. */
int olmo_metrics_open(struct olmo_metrics *m, const char *path, long keep_through, FILE *log);
/* Appends rec as one line and flushes; takes ownership of rec. */
int olmo_metrics_write(struct olmo_metrics *m, cJSON *rec);
/* Closes the file, reporting a failed final write. */
int olmo_metrics_close(struct olmo_metrics *m);

/* Record builders: a new object {"type": type, "step": step}, and fields
 * formatted with fmt (printf, one double) or null when v is not finite. */
cJSON *olmo_metrics_record(const char *type, long step);
void olmo_metrics_add_num(cJSON *rec, const char *key, const char *fmt, double v);
void olmo_metrics_add_int(cJSON *rec, const char *key, long v);

#endif
