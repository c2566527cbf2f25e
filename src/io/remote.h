/* Remote files read by byte ranges through libcurl: http(s):// URLs and
 * s3://BUCKET/KEY objects (the S3 API, requests signed with AWS Signature
 * Version 4 by libcurl when credentials are found).
 *
 * S3 settings, as the AWS tools read them: credentials from
 * AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, else from
 * the profile AWS_PROFILE (default "default") of ~/.aws/credentials
 * (AWS_SHARED_CREDENTIALS_FILE); without any, requests go unsigned (public
 * buckets).  Region: AWS_REGION, AWS_DEFAULT_REGION, the profile's region in
 * ~/.aws/config (AWS_CONFIG_FILE), else us-east-1.  Endpoint:
 * AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (an S3-compatible store, addressed
 * path-style: ENDPOINT/BUCKET/KEY), else https://BUCKET.s3.REGION.amazonaws.com.
 *
 * A file's size comes from a HEAD request (Content-Length) at open; every
 * ranged GET checks that the object still has that size (Content-Range) and,
 * when the server gave a strong ETag, sends If-Match, so a file replaced
 * while it is read is an error, never other bytes.  Failures are retried with
 * exponential backoff (connection errors, truncated bodies, HTTP 408 / 429 /
 * 5xx; OLMOC_REMOTE_RETRIES retries, default 5); other statuses (403, 404,
 * ...) fail at once.  Every error names the URL and the HTTP status.
 *
 * Read-ahead: olmo_remote_prefetch queues a range that a pool of worker
 * threads fetches in the background into a bounded buffer (256 MiB in all);
 * olmo_remote_read of exactly that range then takes the prefetched bytes
 * (waiting for them if they are still in flight). */
#ifndef OLMOC_REMOTE_H
#define OLMOC_REMOTE_H

#include <stddef.h>
#include <stdint.h>

struct olmo_remote;

/* 1 for "http://", "https://" and "s3://" paths. */
int olmo_remote_is_url(const char *path);
/* HEAD: the object must exist and have a size. */
int olmo_remote_open(struct olmo_remote **out, const char *url);
void olmo_remote_close(struct olmo_remote *r);
uint64_t olmo_remote_size(const struct olmo_remote *r);
/* Reads bytes [off, off + len) (thread-safe). */
int olmo_remote_read(struct olmo_remote *r, uint64_t off, size_t len, void *dst);
/* Queues [off, off + len) for a later olmo_remote_read (dropped when the read-ahead buffer is full). */
void olmo_remote_prefetch(struct olmo_remote *r, uint64_t off, size_t len);
/* Forgets the ranges queued for r that were not read yet. */
void olmo_remote_discard(struct olmo_remote *r);

/* The local cache directory of whole remote files ("" = none, the default):
 * process-wide, used by olmo_remote_cached. */
void olmo_remote_set_cache_dir(const char *dir);
/* With a cache directory set: a local copy of the file, downloaded once and
 * reused while the remote size and ETag are unchanged; its path in path.
 * Returns 1 with the path, 0 when no cache directory is set, -1 on error. */
int olmo_remote_cached(struct olmo_remote *r, char *path, size_t cap);

#endif
