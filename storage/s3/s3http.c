/*
 * S3 requests over HTTP (s3http.h). One thread drives one curl multi
 * handle: at most `connections` requests in flight, each on an easy handle
 * of a fixed set (so the connections they use stay open between requests),
 * the rest queued in order. Requests come from any thread through a queue
 * and curl_multi_wakeup; their completions run on this thread.
 *
 * Signing is libcurl's SigV4 (CURLOPT_AWS_SIGV4). Its traps (checked
 * against Ceph RGW): it does not add x-amz-content-sha256, so every request
 * says UNSIGNED-PAYLOAD (the bytes' integrity is the checkpoint's own
 * checksums, checked on every restore); it signs the query as written, so
 * callers give parameters sorted with values encoded; the key goes through
 * CURLOPT_USERNAME/PASSWORD (a key may hold ':'). A header given empty to
 * remove one of curl's ("Expect:", "Content-Type:") is signed but not sent:
 * the store refuses the signature. So a body goes out without waiting for
 * "100 Continue" by a zero timeout instead, and a POST keeps curl's type.
 *
 * Retries: a refused or dropped connection, a request that moves no byte
 * for timeout_s, HTTP 5xx and 429, and a 200 whose body is an <Error> (S3
 * may answer CompleteMultipartUpload so) are tried again after a random
 * delay up to backoff_ms doubled per try (30 s at most), max_tries in all;
 * then the request fails with the last status and the store's error code.
 * Anything else (4xx) fails at once: it will not get better. Once the
 * backend is being destroyed, a retry waiting for its delay fails at once,
 * and timeout_s later whatever is still queued or in flight is cut short:
 * a store that trickles a byte a second holds the stop no longer.
 *
 * This file: the retries' timing, the thread, the public calls;
 * s3http_req.c: one attempt (its options, the callbacks, what it came to).
 */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <curl/curl.h>

#include "storage/s3/s3http_int.h"

#define BACKOFF_CAP_MS 30000
#define IDLE_POLL_MS 1000

/* ---- finishing a request --------------------------------------------- */

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The delay before the next try: at random up to the ceiling (full jitter). */
static int64_t backoff_ns(const struct s3http *h, unsigned tries)
{
	uint64_t cap = h->backoff_ms, rnd = 0;

	for (unsigned i = 1; i < tries && cap < BACKOFF_CAP_MS; i++)
		cap *= 2;
	if (cap > BACKOFF_CAP_MS)
		cap = BACKOFF_CAP_MS;
	if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd))
		rnd = (uint64_t)now_ns();
	return (int64_t)(cap / 2 + rnd % (cap / 2 + 1)) * 1000000;
}

static void complete(struct s3http *h, struct s3req *r)
{
	pthread_mutex_lock(&h->mu);
	/* the store's "no" (404, 412 ...) is an answer; the network's or a 5xx is a failure */
	if (r->res && (r->status == 0 || r->status >= 500 || r->status == 429))
		h->st.failures++;
	if (r->done) {
		pthread_mutex_unlock(&h->mu);
		r->done(r);
		return;
	}
	r->sync_done = true;
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->mu);
}

/* ---- the thread -------------------------------------------------------- */

/* Into the waiting queue, last (start_due takes each once it is due). */
static void enqueue(struct s3http *h, struct s3req *r)
{
	r->next = NULL;
	if (!h->wait_head)
		h->wait_head = h->wait_tail = r;
	else
		h->wait_tail->next = r, h->wait_tail = r;
}

static void start(struct s3http *h, struct s3req *r)
{
	CURL *e;
	int rc;

	if (r->prep && r->tries == 0)
		r->prep(r);
	if (r->skip) {
		r->res = 0;
		complete(h, r);
		return;
	}
	e = h->idle[--h->nidle];
	r->tries++;
	r->easy = e;
	rc = s3http_prepare(h, e, r);
	if (!rc && curl_multi_add_handle(h->multi, e) != CURLM_OK)
		rc = -ENOMEM;
	if (rc) {
		char name[S3_KEY_MAX + 80];

		h->idle[h->nidle++] = e;
		r->easy = NULL;
		r->res = ipc_errf(r->err, rc, "%s %s: cannot set up the request (%s)",
		                  s3http_method_name(r->method),
		                  s3http_name(h, r->key, name, sizeof(name)), strerror(-rc));
		complete(h, r);
		return;
	}
	pthread_mutex_lock(&h->mu);
	h->st.inflight++;
	h->st.requests++;
	pthread_mutex_unlock(&h->mu);
}

/* Starts what may start: queued requests that are due, while handles are free. */
static int64_t start_due(struct s3http *h, int64_t now)
{
	struct s3req **pp = &h->wait_head, *prev = NULL;
	int64_t next = now + (int64_t)IDLE_POLL_MS * 1000000;

	while (*pp && h->nidle) {
		struct s3req *r = *pp;

		if (r->due_ns > now) {
			if (r->due_ns < next)
				next = r->due_ns;
			prev = r;
			pp = &r->next;
			continue;
		}
		*pp = r->next;
		if (h->wait_tail == r)
			h->wait_tail = prev;
		start(h, r);
	}
	return next;
}

static void cancel(struct s3http *h, struct s3req *r, const char *why);

/* An attempt ended (or is cut short): its easy handle back to the idle set, its bytes counted. */
static struct s3req *detach(struct s3http *h, CURL *e)
{
	struct s3req *r = NULL;

	curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&r);
	curl_multi_remove_handle(h->multi, e);
	h->idle[h->nidle++] = e;
	r->easy = NULL;
	pthread_mutex_lock(&h->mu);
	h->st.inflight--;
	h->st.bytes_up += r->sent;
	h->st.bytes_down += r->got;
	pthread_mutex_unlock(&h->mu);
	return r;
}

static void finished(struct s3http *h, CURLMsg *m)
{
	struct s3req *r = detach(h, m->easy_handle);
	CURLcode cc = m->data.result;
	int rc;

	if (r->method == S3_GET && r->into && !r->error_body)
		r->length = r->got;
	rc = s3http_outcome(h, r, cc);
	if (rc == 1) {
		bool stopping;

		pthread_mutex_lock(&h->mu);
		stopping = h->stopping;
		if (!stopping)
			h->st.retries++;
		pthread_mutex_unlock(&h->mu);
		if (!stopping) {
			r->due_ns = now_ns() + backoff_ns(h, r->tries);
			enqueue(h, r);
			return;
		}
		cancel(h, r, "not tried again: the agent is stopping");
		return;
	}
	curl_slist_free_all(r->headers);
	r->headers = NULL;
	r->res = rc;
	complete(h, r);
}

/* Fails r at once, saying why (the agent is stopping). */
static void cancel(struct s3http *h, struct s3req *r, const char *why)
{
	char name[S3_KEY_MAX + 80];

	curl_slist_free_all(r->headers);
	r->headers = NULL;
	r->res = ipc_errf(r->err, -ECANCELED, "%s %s: %s (%u %s)", s3http_method_name(r->method),
	                  s3http_name(h, r->key, name, sizeof(name)), why, r->tries,
	                  r->tries == 1 ? "try" : "tries");
	complete(h, r);
}

static bool is_idle(const struct s3http *h, CURL *e)
{
	for (unsigned i = 0; i < h->nidle; i++)
		if (h->idle[i] == e)
			return true;
	return false;
}

/*
 * At stop (since stop_ns): a retry waiting for its delay fails at once,
 * and timeout_s on, whatever is still queued or in flight is cut short,
 * so that a store that trickles a byte a second cannot hold the stop.
 */
static void stop_sweep(struct s3http *h, int64_t now, int64_t stop_ns)
{
	bool late = now - stop_ns >= (int64_t)h->timeout_s * 1000000000;
	struct s3req **pp = &h->wait_head, *prev = NULL;

	while (*pp) {
		struct s3req *r = *pp;

		if (r->tries == 0 && !late) {
			prev = r;
			pp = &r->next;
			continue;
		}
		*pp = r->next;
		if (h->wait_tail == r)
			h->wait_tail = prev;
		cancel(h, r, "not tried again: the agent is stopping");
	}
	for (unsigned i = 0; late && i < h->nconn; i++) {
		CURL *e = h->easy[i];
		if (is_idle(h, e))
			continue;
		cancel(h, detach(h, e), "cut short: the agent is stopping");
	}
}

static int poll_ms(int64_t next, int64_t now)
{
	int64_t ms = (next - now + 999999) / 1000000;

	return ms < 0 ? 0 : ms > IDLE_POLL_MS ? IDLE_POLL_MS : (int)ms;
}

static void *http_main(void *arg)
{
	struct s3http *h = arg;
	int64_t stop_ns = 0; /* when the stop was first seen */

	for (;;) {
		struct s3req *in;
		int64_t now = now_ns(), next;
		int running = 0, left;
		bool stopping, more, freed = false;
		CURLMsg *m;

		pthread_mutex_lock(&h->mu);
		in = h->in_head;
		h->in_head = h->in_tail = NULL;
		stopping = h->stopping;
		h->st.queued = 0;
		pthread_mutex_unlock(&h->mu);
		while (in) {
			struct s3req *r = in;

			in = in->next;
			enqueue(h, r);
		}
		if (stopping) {
			stop_ns = stop_ns ? stop_ns : now;
			stop_sweep(h, now, stop_ns);
		}
		next = start_due(h, now);
		curl_multi_perform(h->multi, &running);
		while ((m = curl_multi_info_read(h->multi, &left)))
			if (m->msg == CURLMSG_DONE) {
				finished(h, m);
				freed = true;
			}
		/* a handle came free with requests waiting: round again, not after the poll */
		if (freed && h->wait_head)
			next = now;
		if (stopping && !h->wait_head && h->nidle == h->nconn) {
			/* a completion may have submitted more (a shard's abort) */
			pthread_mutex_lock(&h->mu);
			more = h->in_head != NULL;
			pthread_mutex_unlock(&h->mu);
			if (!more)
				break;
		}
		/* until curl has work, a retry is due or a submit wakes it */
		curl_multi_poll(h->multi, NULL, 0, poll_ms(next, now_ns()), NULL);
	}
	return NULL;
}

/* ---- the public calls --------------------------------------------------- */

void s3req_init(struct s3req *r, enum s3_method m, const char *key)
{
	memset(r, 0, offsetof(struct s3req, url));
	r->url[0] = '\0';
	r->method = m;
	snprintf(r->key, sizeof(r->key), "%s", key);
}

void s3req_clear(struct s3req *r)
{
	free(r->reply);
	r->reply = NULL;
	r->reply_len = r->reply_cap = 0;
	curl_slist_free_all(r->headers);
	r->headers = NULL;
}

void s3http_submit(struct s3http *h, struct s3req *r)
{
	r->next = NULL;
	r->due_ns = 0;
	r->res = 0;
	r->err[0] = '\0';
	pthread_mutex_lock(&h->mu);
	if (!h->in_head)
		h->in_head = h->in_tail = r;
	else
		h->in_tail->next = r, h->in_tail = r;
	h->st.queued++;
	pthread_mutex_unlock(&h->mu);
	curl_multi_wakeup(h->multi);
}

int s3http_do(struct s3http *h, struct s3req *r)
{
	if (h->started && pthread_equal(pthread_self(), h->thread))
		return ipc_errf(r->err, -EDEADLK, "%s: a blocking S3 call on the HTTP thread",
		                r->key);
	r->done = NULL;
	r->sync_done = false;
	s3http_submit(h, r);
	pthread_mutex_lock(&h->mu);
	while (!r->sync_done)
		pthread_cond_wait(&h->cond, &h->mu);
	pthread_mutex_unlock(&h->mu);
	return r->res;
}

void s3http_get_stats(struct s3http *h, struct s3http_stats *out)
{
	pthread_mutex_lock(&h->mu);
	*out = h->st;
	pthread_mutex_unlock(&h->mu);
}

static char *dup_or(const char *s, bool *fail)
{
	char *d = strdup(s ? s : "");

	if (!d)
		*fail = true;
	return d;
}

int s3http_create(const struct s3http_opts *o, struct s3http **out, char *err)
{
	struct s3http *h;
	bool fail = false;
	char sig[160];
	int rc;

	*out = NULL;
	if (curl_global_init(CURL_GLOBAL_DEFAULT))
		return ipc_errf(err, -ENOMEM, "cannot initialise libcurl");
	h = calloc(1, sizeof(*h));
	if (!h) {
		curl_global_cleanup();
		return ipc_errf(err, -ENOMEM, "out of memory");
	}
	pthread_mutex_init(&h->mu, NULL);
	pthread_cond_init(&h->cond, NULL);
	h->nconn = o->connections ? o->connections : 8;
	h->max_tries = o->max_tries ? o->max_tries : 1;
	h->timeout_s = o->timeout_s ? o->timeout_s : 60;
	h->backoff_ms = o->backoff_ms ? o->backoff_ms : 200;
	h->virtual_host = o->virtual_host;
	snprintf(sig, sizeof(sig), "aws:amz:%s:s3", o->region);
	h->endpoint = dup_or(o->endpoint, &fail);
	h->bucket = dup_or(o->bucket, &fail);
	h->region_sig = dup_or(sig, &fail);
	h->access = dup_or(o->access_key, &fail);
	h->secret = dup_or(o->secret_key, &fail);
	h->easy = calloc(h->nconn, sizeof(*h->easy));
	h->idle = calloc(h->nconn, sizeof(*h->idle));
	h->multi = curl_multi_init();
	if (fail || !h->easy || !h->idle || !h->multi) {
		rc = ipc_errf(err, -ENOMEM, "out of memory");
		goto fail;
	}
	/* the endpoint without a trailing '/': keys are appended after one */
	while (*h->endpoint && h->endpoint[strlen(h->endpoint) - 1] == '/')
		h->endpoint[strlen(h->endpoint) - 1] = '\0';
	for (unsigned i = 0; i < h->nconn; i++) {
		h->easy[i] = curl_easy_init();
		if (!h->easy[i]) {
			rc = ipc_errf(err, -ENOMEM, "out of memory");
			goto fail;
		}
		h->idle[h->nidle++] = h->easy[i];
	}
	if (curl_multi_setopt(h->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)h->nconn) ||
	    curl_multi_setopt(h->multi, CURLMOPT_MAXCONNECTS, (long)h->nconn)) {
		rc = ipc_errf(err, -EINVAL, "libcurl refused the connection limit");
		goto fail;
	}
	rc = pthread_create(&h->thread, NULL, http_main, h);
	if (rc) {
		rc = ipc_errf(err, -rc, "cannot start the S3 thread: %s", strerror(rc));
		goto fail;
	}
	h->started = true;
	*out = h;
	return 0;
fail:
	s3http_destroy(h);
	return rc;
}

static void wipe_free(char *s)
{
	if (s) {
		explicit_bzero(s, strlen(s));
		free(s);
	}
}

void s3http_destroy(struct s3http *h)
{
	if (!h)
		return;
	if (h->started) {
		pthread_mutex_lock(&h->mu);
		h->stopping = true;
		pthread_mutex_unlock(&h->mu);
		curl_multi_wakeup(h->multi);
		pthread_join(h->thread, NULL);
	}
	for (unsigned i = 0; h->easy && i < h->nconn; i++)
		if (h->easy[i])
			curl_easy_cleanup(h->easy[i]);
	if (h->multi)
		curl_multi_cleanup(h->multi);
	free(h->easy);
	free(h->idle);
	free(h->endpoint);
	free(h->bucket);
	free(h->region_sig);
	wipe_free(h->access);
	wipe_free(h->secret);
	pthread_cond_destroy(&h->cond);
	pthread_mutex_destroy(&h->mu);
	free(h);
	curl_global_cleanup();
}
