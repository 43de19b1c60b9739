/*
 * storage/s3/s3http.h: private to the S3 backend (storage/s3/). S3
 * requests over HTTP (s3http.c), signed by libcurl's SigV4, driven by one
 * curl multi handle on a thread of their own: a bounded set of keep-alive
 * connections, requests queued from any thread, retried with back-off and
 * jitter where the store or the network says "later" (5xx, 429, timeouts,
 * refused connections), then failed with the HTTP status and the store's
 * error code. And the few XML replies S3 sends, read as hostile input
 * (s3xml.c).
 *
 * Errors: negative errno, and a sentence in `err` (IPC_ERRLEN bytes).
 */
#ifndef CKPT_STORAGE_S3HTTP_H
#define CKPT_STORAGE_S3HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ipc/base/base.h"

struct curl_slist;

#define S3_KEY_MAX 768 /* an object key, prefix included */
#define S3_QUERY_MAX 1280 /* a query string, encoded */
#define S3_ETAG_MAX 80
#define S3_REPLY_MAX (1u << 20) /* a reply body read into memory (not into `into`) */

enum s3_method { S3_GET, S3_HEAD, S3_PUT, S3_POST, S3_DELETE };

struct s3http_opts {
	const char *endpoint; /* "http://host:port" or "https://host" */
	const char *bucket;
	bool virtual_host; /* https://bucket.host/key instead of https://host/bucket/key */
	const char *region;
	const char *access_key, *secret_key; /* copied; wiped at destroy */
	unsigned connections; /* requests in flight at once (1..256) */
	unsigned max_tries; /* attempts of one request that the store answers "later" */
	unsigned timeout_s; /* a request that moves no byte for this long is retried */
	unsigned backoff_ms; /* the first retry's ceiling (doubles, up to 30 s) */
};

/*
 * One request. The submitter owns it (and body/into) until done runs. Set
 * the fields above "results"; s3req_init zeroes the rest.
 */
struct s3req {
	enum s3_method method;
	char key[S3_KEY_MAX]; /* "" for the bucket itself */
	char query[S3_QUERY_MAX]; /* "" or sorted parameters, values encoded */
	const void *body; /* PUT, POST: sent as is, never copied */
	uint64_t body_len;
	const char *content_type; /* NULL: none */
	bool if_none_match; /* "If-None-Match: *": 412 when the key exists */
	uint64_t meta_zstd; /* PUT, POST ?uploads: "x-amz-meta-ckpt-zstd: N" (0: none) */
	bool ranged; /* GET bytes [range_off, range_off + range_len) */
	uint64_t range_off, range_len;
	void *into; /* GET: the body into this buffer, at most into_cap bytes */
	uint64_t into_cap;
	size_t reply_max; /* else the body into reply (malloc'd), at most this (0: S3_REPLY_MAX) */
	void (*done)(struct s3req *); /* the HTTP thread, once finished; NULL: s3http_do */
	void (*prep)(struct s3req *); /* the HTTP thread, before the first try; may set skip */
	bool skip; /* finish at once, res 0, nothing sent */
	void *ctx;

	/* results */
	int res; /* 0, or negative errno (the store's answer or the network's) */
	long status; /* the last HTTP status (0: none came) */
	char etag[S3_ETAG_MAX]; /* as sent, quotes removed */
	uint64_t length; /* HEAD: Content-Length; GET: bytes received */
	uint64_t total; /* ranged GET: the object's size from Content-Range (0: not said) */
	int64_t date; /* the store's clock: its Date header (unix seconds), 0 if none */
	uint64_t
	    zstd_size; /* HEAD, GET: x-amz-meta-ckpt-zstd (a compressed shard's size), 0 if none */
	char *reply; /* the body when not `into` (NUL after it); s3req_clear frees */
	size_t reply_len;
	unsigned tries;
	char err[IPC_ERRLEN]; /* res != 0: what failed, on which key, after how many tries */

	/* s3http.c's */
	struct s3req *next;
	int64_t due_ns; /* a retry waits until then */
	uint64_t sent, got;
	uint64_t sent_first, sent_last; /* a ranged GET: the bytes its Content-Range says */
	bool sync_done, too_big, error_body, has_range;
	size_t reply_cap;
	void *easy;
	struct curl_slist *headers;
	char url[S3_KEY_MAX * 3 + S3_QUERY_MAX + 320]; /* the key percent-encoded */
};

struct s3http_stats {
	uint64_t requests, retries, failures;
	uint64_t bytes_up, bytes_down;
	unsigned inflight, queued;
};

struct s3http;

/* Starts the HTTP thread. */
int s3http_create(const struct s3http_opts *o, struct s3http **out, char *err);
/*
 * Lets requests in flight finish for up to timeout_s (no more retries: a
 * retry waiting for its delay fails at once), cuts short what is left,
 * stops the thread. NULL is fine.
 */
void s3http_destroy(struct s3http *h);

/* Zeroes r (its results included) and sets the method and the key. */
void s3req_init(struct s3req *r, enum s3_method m, const char *key);
/* Frees what a finished request holds (the reply). */
void s3req_clear(struct s3req *r);
/* Queues r; any thread; never blocks. r->done runs on the HTTP thread. */
void s3http_submit(struct s3http *h, struct s3req *r);
/* Queues r and waits for it: r->res. Any thread but the HTTP thread. */
int s3http_do(struct s3http *h, struct s3req *r);
/* "s3://bucket/key" of a key, for messages. */
const char *s3http_name(const struct s3http *h, const char *key, char *buf, size_t len);
void s3http_get_stats(struct s3http *h, struct s3http_stats *out);

/* Percent-encodes s (RFC 3986: A-Z a-z 0-9 - . _ ~ stay) into buf; -ENAMETOOLONG. */
int s3_encode(const char *s, char *buf, size_t len);

/* ---- s3xml.c: the replies' XML ------------------------------------------ */

/*
 * The text of the first element `name` in xml[0, len) (entities decoded)
 * into out (NUL-terminated): 0; -ENOENT if none; -ENAMETOOLONG if longer
 * than len - 1; -EINVAL if the element is not closed or holds markup.
 */
int s3xml_text(const char *xml, size_t len, const char *name, char *out, size_t outlen);
/*
 * Calls fn with the inside of each element `name` in xml[0, len), in
 * document order, until fn returns non-zero (which is returned). 0 when
 * every one was seen; -EINVAL when one is not closed.
 */
int s3xml_each(const char *xml, size_t len, const char *name,
               int (*fn)(void *ctx, const char *in, size_t inlen), void *ctx);

#endif /* CKPT_STORAGE_S3HTTP_H */
