/*
 * Unit tests of storage/s3/s3http.c against a scripted HTTP server on a
 * 127.0.0.1 port the kernel picks (a thread here; one more per
 * connection): the stop is bounded (a body trickled a byte at a time is
 * cut short timeout_s after it, a retry waiting for its delay fails at
 * once); a key goes into the URL percent-encoded with its dot segments
 * left alone; a Content-Length over the request's cap is refused before
 * the body; a ranged GET answered with other bytes is refused; an ETag
 * holding markup is not taken; more requests than connections do not wait
 * for the thread's idle poll.
 */
#define _GNU_SOURCE /* strcasestr */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <check.h>

#include "storage/s3/s3http.h"
#include "support/check_main.h"

/* ---- the server -------------------------------------------------------- */

enum mode {
	M_OK, /* 200, no body, an ETag of markup on a PUT */
	M_TRICKLE, /* 200, Content-Length 200, a byte every 100 ms */
	M_SLOWDOWN, /* 503 SlowDown */
	M_HUGE, /* 200, Content-Length 1 GiB, 16 bytes, then closed */
	M_SHIFTED, /* a ranged GET: 206 of the bytes one further on, said so */
};

#define MAX_CONNS 16

static struct {
	int lfd;
	unsigned short port;
	enum mode mode;
	atomic_bool quit;
	atomic_int requests;
	pthread_t accepter, conn[MAX_CONNS];
	atomic_int nconn;
	pthread_mutex_t mu;
	char line[2048]; /* the last request line */
} srv;

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static bool send_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL);

		if (k <= 0)
			return false;
		p += k;
		n -= (size_t)k;
	}
	return true;
}

/* One request's head (and body) read; false when the peer went or the test ends. */
static bool read_request(int fd, char *head, size_t cap, unsigned long long *range_a)
{
	size_t n = 0;
	char *end, *cl, *rg;
	unsigned long long body = 0;

	*range_a = ~0ull;
	for (;;) {
		struct pollfd p = {fd, POLLIN, 0};
		ssize_t k;

		if (atomic_load(&srv.quit))
			return false;
		if (poll(&p, 1, 100) <= 0)
			continue;
		k = recv(fd, head + n, cap - 1 - n, 0);
		if (k <= 0)
			return false;
		n += (size_t)k;
		head[n] = '\0';
		if ((end = strstr(head, "\r\n\r\n")))
			break;
		if (n == cap - 1)
			return false;
	}
	if ((cl = strcasestr(head, "\r\nContent-Length:")))
		body = strtoull(cl + 17, NULL, 10);
	if ((rg = strcasestr(head, "\r\nRange: bytes=")))
		*range_a = strtoull(rg + 15, NULL, 10);
	body -= n - (size_t)(end + 4 - head) < body ? n - (size_t)(end + 4 - head) : body;
	while (body) { /* the body is not looked at */
		char sink[4096];
		ssize_t k = recv(fd, sink, body < sizeof(sink) ? body : sizeof(sink), 0);

		if (k <= 0)
			return false;
		body -= (unsigned long long)k;
	}
	pthread_mutex_lock(&srv.mu);
	snprintf(srv.line, sizeof(srv.line), "%.*s", (int)strcspn(head, "\r"), head);
	pthread_mutex_unlock(&srv.mu);
	atomic_fetch_add(&srv.requests, 1);
	return true;
}

static void *serve_conn(void *arg)
{
	int fd = (int)(intptr_t)arg;
	char head[8192], reply[512];
	unsigned long long a;

	while (read_request(fd, head, sizeof(head), &a)) {
		bool put = strncmp(head, "PUT ", 4) == 0, go_on = true;

		switch (srv.mode) {
		case M_OK:
			snprintf(reply, sizeof(reply),
			         "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n%s\r\n",
			         put ? "ETag: \"x</ETag><Part>\"\r\n" : "");
			go_on = send_all(fd, reply, strlen(reply));
			break;
		case M_TRICKLE:
			snprintf(reply, sizeof(reply),
			         "HTTP/1.1 200 OK\r\nContent-Length: 200\r\n\r\n");
			go_on = send_all(fd, reply, strlen(reply));
			for (int i = 0; go_on && i < 200 && !atomic_load(&srv.quit); i++) {
				usleep(100000);
				go_on = send_all(fd, "x", 1);
			}
			break;
		case M_SLOWDOWN:
			snprintf(reply, sizeof(reply),
			         "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 36\r\n\r\n"
			         "<Error><Code>SlowDown</Code></Error>");
			go_on = send_all(fd, reply, strlen(reply));
			break;
		case M_HUGE:
			snprintf(reply, sizeof(reply),
			         "HTTP/1.1 200 OK\r\nContent-Length: "
			         "1073741824\r\n\r\n0123456789abcdef");
			send_all(fd, reply, strlen(reply));
			go_on = false;
			break;
		case M_SHIFTED:
			snprintf(
			    reply, sizeof(reply),
			    "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes %llu-%llu/100\r\n"
			    "Content-Length: 10\r\n\r\n0123456789",
			    a + 1, a + 10);
			go_on = send_all(fd, reply, strlen(reply));
			break;
		}
		if (!go_on)
			break;
	}
	close(fd);
	return NULL;
}

static void *accept_loop(void *arg)
{
	(void)arg;
	while (!atomic_load(&srv.quit)) {
		struct pollfd p = {srv.lfd, POLLIN, 0};
		int fd, i;

		if (poll(&p, 1, 100) <= 0)
			continue;
		fd = accept(srv.lfd, NULL, NULL);
		if (fd < 0)
			continue;
		i = atomic_fetch_add(&srv.nconn, 1);
		if (i >= MAX_CONNS ||
		    pthread_create(&srv.conn[i], NULL, serve_conn, (void *)(intptr_t)fd)) {
			close(fd);
			atomic_fetch_sub(&srv.nconn, 1);
		}
	}
	return NULL;
}

static void server_start(enum mode m)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof(a);

	srv.mode = m;
	atomic_store(&srv.quit, false);
	atomic_store(&srv.requests, 0);
	atomic_store(&srv.nconn, 0);
	srv.line[0] = '\0';
	pthread_mutex_init(&srv.mu, NULL);
	srv.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(srv.lfd, 0);
	ck_assert_int_eq(bind(srv.lfd, (struct sockaddr *)&a, sizeof(a)), 0);
	ck_assert_int_eq(listen(srv.lfd, 16), 0);
	ck_assert_int_eq(getsockname(srv.lfd, (struct sockaddr *)&a, &al), 0);
	srv.port = ntohs(a.sin_port);
	ck_assert_int_eq(pthread_create(&srv.accepter, NULL, accept_loop, NULL), 0);
}

static void server_stop(void)
{
	atomic_store(&srv.quit, true);
	pthread_join(srv.accepter, NULL);
	for (int i = 0; i < atomic_load(&srv.nconn); i++)
		pthread_join(srv.conn[i], NULL);
	close(srv.lfd);
	pthread_mutex_destroy(&srv.mu);
}

/* ---- the client ---------------------------------------------------------- */

static struct s3http *client(unsigned timeout_s, unsigned max_tries, unsigned backoff_ms)
{
	char endpoint[64], err[IPC_ERRLEN];
	struct s3http_opts o = {.endpoint = endpoint,
	                        .bucket = "bkt",
	                        .region = "us-east-1",
	                        .access_key = "a",
	                        .secret_key = "s",
	                        .connections = 2,
	                        .max_tries = max_tries,
	                        .timeout_s = timeout_s,
	                        .backoff_ms = backoff_ms};
	struct s3http *h = NULL;

	snprintf(endpoint, sizeof(endpoint), "http://127.0.0.1:%u", srv.port);
	ck_assert_msg(s3http_create(&o, &h, err) == 0, "s3http_create: %s", err);
	return h;
}

struct waiter {
	pthread_mutex_t mu;
	bool done;
	int res;
	char err[IPC_ERRLEN];
};

static void on_done(struct s3req *r)
{
	struct waiter *w = r->ctx;

	pthread_mutex_lock(&w->mu);
	w->done = true;
	w->res = r->res;
	snprintf(w->err, sizeof(w->err), "%s", r->err);
	pthread_mutex_unlock(&w->mu);
}

static void wait_requests(int n, double seconds)
{
	double t0 = now_s();

	while (atomic_load(&srv.requests) < n && now_s() - t0 < seconds)
		usleep(10000);
	ck_assert_int_ge(atomic_load(&srv.requests), n);
}

/* A body trickled a byte every 100 ms (never "no byte for timeout_s"): cut at the stop. */
START_TEST(test_stop_cuts_trickle)
{
	struct waiter w = {PTHREAD_MUTEX_INITIALIZER, false, 0, ""};
	struct s3req *r = calloc(1, sizeof(*r));
	struct s3http *h;
	double t0, took;

	server_start(M_TRICKLE);
	h = client(2, 1, 100);
	s3req_init(r, S3_GET, "k");
	r->done = on_done;
	r->ctx = &w;
	s3http_submit(h, r);
	wait_requests(1, 5);
	usleep(2500000); /* past timeout_s: the bytes keep it alive */
	pthread_mutex_lock(&w.mu);
	ck_assert_msg(!w.done, "the request ended before the stop: %d %s", w.res, w.err);
	pthread_mutex_unlock(&w.mu);
	t0 = now_s();
	s3http_destroy(h);
	took = now_s() - t0;
	ck_assert_msg(took < 4.5, "the stop took %.1f s with a body trickling in", took);
	ck_assert(w.done);
	ck_assert_int_eq(w.res, -ECANCELED);
	ck_assert_msg(strstr(w.err, "cut short: the agent is stopping"), "%s", w.err);
	s3req_clear(r);
	free(r);
	server_stop();
}
END_TEST

/* A retry waiting for its delay (up to 20 s here) fails at once at the stop. */
START_TEST(test_stop_drops_retry)
{
	struct waiter w = {PTHREAD_MUTEX_INITIALIZER, false, 0, ""};
	struct s3req *r = calloc(1, sizeof(*r));
	struct s3http *h;
	double t0, took;

	server_start(M_SLOWDOWN);
	h = client(5, 3, 20000);
	s3req_init(r, S3_HEAD, "k");
	r->done = on_done;
	r->ctx = &w;
	s3http_submit(h, r);
	wait_requests(1, 5);
	usleep(200000);
	t0 = now_s();
	s3http_destroy(h);
	took = now_s() - t0;
	ck_assert_msg(took < 2.0, "the stop took %.1f s with a retry waiting", took);
	ck_assert(w.done);
	ck_assert_int_eq(w.res, -ECANCELED);
	ck_assert_int_eq(atomic_load(&srv.requests), 1); /* not tried again */
	s3req_clear(r);
	free(r);
	server_stop();
}
END_TEST

/* A key (a listing's: the store's) is a key: encoded, its "../" not resolved. */
START_TEST(test_key_encoded)
{
	struct s3req *r = calloc(1, sizeof(*r));
	struct s3http *h;

	server_start(M_OK);
	h = client(5, 1, 100);
	s3req_init(r, S3_DELETE, "p/step-1/../step-2/a b?c#d");
	ck_assert_int_eq(s3http_do(h, r), 0);
	pthread_mutex_lock(&srv.mu);
	ck_assert_str_eq(srv.line, "DELETE /bkt/p/step-1/../step-2/a%20b%3Fc%23d HTTP/1.1");
	pthread_mutex_unlock(&srv.mu);
	s3req_clear(r);
	s3req_init(r, S3_DELETE, "p/k");
	snprintf(r->query, sizeof(r->query), "uploadId=2~x");
	ck_assert_int_eq(s3http_do(h, r), 0);
	pthread_mutex_lock(&srv.mu);
	ck_assert_str_eq(srv.line, "DELETE /bkt/p/k?uploadId=2~x HTTP/1.1");
	pthread_mutex_unlock(&srv.mu);
	s3req_clear(r);
	s3http_destroy(h);
	free(r);
	server_stop();
}
END_TEST

/* Content-Length: 1 GiB on a GET that takes 1 KiB: refused before its body. */
START_TEST(test_content_length_refused)
{
	struct s3req *r = calloc(1, sizeof(*r));
	struct s3http *h;

	server_start(M_HUGE);
	h = client(5, 2, 100);
	s3req_init(r, S3_GET, "p/manifest.json");
	r->reply_max = 1024;
	ck_assert_int_eq(s3http_do(h, r), -EFBIG);
	ck_assert_msg(strstr(r->err, "larger than 1024 bytes"), "%s", r->err);
	ck_assert_int_eq(r->tries, 1); /* it will not get better */
	ck_assert_uint_eq(r->reply_len, 0);
	s3req_clear(r);
	s3http_destroy(h);
	free(r);
	server_stop();
}
END_TEST

/* Bytes 10-19 asked for, 11-20 sent (and said): not taken as 10-19. */
START_TEST(test_range_checked)
{
	struct s3req *r = calloc(1, sizeof(*r));
	char buf[10];
	struct s3http *h;

	server_start(M_SHIFTED);
	h = client(5, 1, 100);
	s3req_init(r, S3_GET, "p/shard");
	r->ranged = true;
	r->range_off = 10;
	r->range_len = 10;
	r->into = buf;
	r->into_cap = sizeof(buf);
	ck_assert_int_eq(s3http_do(h, r), -EPROTO);
	ck_assert_msg(strstr(r->err, "bytes 10-19 asked for, the store sent 10 bytes saying they "
	                             "are bytes 11-20"),
	              "%s", r->err);
	s3req_clear(r);
	s3http_destroy(h);
	free(r);
	server_stop();
}
END_TEST

/* An ETag of markup would go into CompleteMultipartUpload's XML: not taken. */
START_TEST(test_etag_markup)
{
	struct s3req *r = calloc(1, sizeof(*r));
	struct s3http *h;

	server_start(M_OK);
	h = client(5, 1, 100);
	s3req_init(r, S3_PUT, "p/shard");
	r->body = "abc";
	r->body_len = 3;
	ck_assert_int_eq(s3http_do(h, r), 0);
	ck_assert_str_eq(r->etag, "");
	s3req_clear(r);
	s3http_destroy(h);
	free(r);
	server_stop();
}
END_TEST

/* More requests than connections: each starts as soon as one is free. */
START_TEST(test_queue_moves)
{
	struct waiter w[8];
	struct s3req *r = calloc(8, sizeof(*r));
	struct s3http *h;
	double t0, took;
	bool all = false;

	server_start(M_OK);
	h = client(5, 1, 100); /* 2 connections */
	t0 = now_s();
	for (int i = 0; i < 8; i++) {
		w[i] = (struct waiter){PTHREAD_MUTEX_INITIALIZER, false, 0, ""};
		s3req_init(&r[i], S3_HEAD, "k");
		r[i].done = on_done;
		r[i].ctx = &w[i];
		s3http_submit(h, &r[i]);
	}
	while (!all && now_s() - t0 < 10) {
		usleep(1000);
		all = true;
		for (int i = 0; i < 8; i++) {
			pthread_mutex_lock(&w[i].mu);
			all &= w[i].done;
			pthread_mutex_unlock(&w[i].mu);
		}
	}
	took = now_s() - t0;
	ck_assert(all);
	ck_assert_msg(took < 0.8, "8 requests over 2 connections took %.2f s", took);
	s3http_destroy(h);
	for (int i = 0; i < 8; i++)
		s3req_clear(&r[i]);
	free(r);
	server_stop();
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("s3http");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_stop_cuts_trickle);
	tcase_add_test(tc, test_stop_drops_retry);
	tcase_add_test(tc, test_key_encoded);
	tcase_add_test(tc, test_content_length_refused);
	tcase_add_test(tc, test_range_checked);
	tcase_add_test(tc, test_etag_markup);
	tcase_add_test(tc, test_queue_moves);
	suite_add_tcase(s, tc);
	return s;
}
