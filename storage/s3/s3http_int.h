/*
 * storage/s3/s3http_int.h: private to s3http.c (the queue, the retries,
 * the thread) and s3http_req.c (one attempt): the client object and the
 * calls between the two.
 */
#ifndef CKPT_STORAGE_S3HTTP_INT_H
#define CKPT_STORAGE_S3HTTP_INT_H

#include <pthread.h>
#include <stdbool.h>

#include <curl/curl.h>

#include "storage/s3/s3http.h"

struct s3http {
	CURLM *multi;
	CURL **easy; /* connections of them: free while easy_free[i] */
	CURL **idle; /* the free ones, a stack */
	unsigned nidle, nconn;
	char *endpoint, *bucket, *region_sig, *access, *secret;
	bool virtual_host;
	unsigned max_tries, timeout_s, backoff_ms;
	pthread_t thread;
	bool started;

	pthread_mutex_t mu; /* everything below */
	pthread_cond_t cond; /* a request of s3http_do finished */
	struct s3req *in_head, *in_tail; /* submitted, not yet seen by the thread */
	bool stopping;
	struct s3http_stats st;

	/* the thread's alone */
	struct s3req *wait_head, *wait_tail; /* queued in order, retries among them by due time */
};

/* "GET", "HEAD", ... */
const char *s3http_method_name(enum s3_method m);
/* e set up for r's next attempt (the HTTP thread); -ENOMEM, -ENAMETOOLONG. */
int s3http_prepare(struct s3http *h, CURL *e, struct s3req *r);
/*
 * What an attempt came to: 0 done, 1 to be tried again, else the error
 * (r->err says it).
 */
int s3http_outcome(struct s3http *h, struct s3req *r, CURLcode cc);

#endif /* CKPT_STORAGE_S3HTTP_INT_H */
