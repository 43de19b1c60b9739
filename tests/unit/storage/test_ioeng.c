/*
 * Unit tests of storage/io/ioeng.c, each run on both engines (pwrite, then
 * io_uring): write and read back with registered and unregistered buffers
 * through an O_DIRECT file, FIFO prep order with more requests than slots,
 * injected short transfers, -EAGAIN, -EIO/-ENOSPC and 0-byte writes, EOF,
 * fsync, done() chaining the next request, several submitting threads, and
 * destroy with requests still queued and in flight.
 *
 * Where io_uring_queue_init fails here, the io_uring cases are not run and
 * the program exits 77 (skipped) once the pwrite cases have passed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <check.h>

#include "storage/io/ioeng.h"
#include "support/check_main.h"

#define BLK 4096u

static const enum ioeng_kind kinds[] = {IOENG_PWRITE, IOENG_URING};

/* ---- fixtures --------------------------------------------------------- */

struct waiter {
	pthread_mutex_t m;
	pthread_cond_t c;
	unsigned done;
};

struct treq {
	struct io_req r;
	struct waiter *w;
	unsigned idx;
	unsigned calls; /* io_result calls seen (engine thread) */
	int64_t inject_err; /* for INJ_ERR */
	unsigned chain; /* done() submits an fsync of the same request */
	struct ioeng *e;
};

enum inject {
	INJ_NONE,
	INJ_SHORT,
	INJ_EAGAIN,
	INJ_EAGAIN_FOREVER,
	INJ_ERR,
	INJ_ZERO,
};

/* Set before the engine is created, read on its thread. */
static enum inject inject;

static int64_t inject_result(const struct io_req *r, int64_t res)
{
	struct treq *t = (struct treq *)r;

	t->calls++;
	switch (inject) {
	case INJ_SHORT:
		if (r->op != IO_FSYNC && res > 1 && t->calls <= 3)
			return res / 2; /* the kernel moved more; the rest goes again */
		return res;
	case INJ_EAGAIN:
		return t->calls <= 5 ? -EAGAIN : res;
	case INJ_EAGAIN_FOREVER:
		return -EAGAIN;
	case INJ_ERR:
		return t->inject_err ? t->inject_err : res;
	case INJ_ZERO:
		return r->op == IO_WRITE ? 0 : res;
	default:
		return res;
	}
}

static struct fsops inject_ops;

static char tmpdir[512];

static void setup(void)
{
	const char *base = getenv("CK_TMPDIR");

	snprintf(tmpdir, sizeof(tmpdir), "%s/ioeng-XXXXXX", base && *base ? base : "/tmp");
	ck_assert_ptr_nonnull(mkdtemp(tmpdir));
	inject = INJ_NONE;
	inject_ops = fsops_posix;
	inject_ops.io_result = inject_result;
}

static void teardown(void)
{
	char cmd[600];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", tmpdir);
}

/* An O_DIRECT file where the directory takes it, else a buffered one. */
static int open_file(const char *name, bool direct)
{
	char p[600];
	int fd = -1;

	snprintf(p, sizeof(p), "%s/%s", tmpdir, name);
	if (direct)
		fd = open(p, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
	if (fd < 0)
		fd = open(p, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	ck_assert_int_ge(fd, 0);
	return fd;
}

static struct ioeng *engine(int i, unsigned depth, const struct fsops *ops)
{
	struct ioeng_opts o = {.kind = kinds[i], .queue_depth = depth, .ops = ops};
	char err[IPC_ERRLEN] = "";
	struct ioeng *e = NULL;
	int rc = ioeng_create(&o, &e, err);

	ck_assert_msg(rc == 0, "ioeng_create: %s", err);
	ck_assert_str_eq(ioeng_name(e), i ? "io_uring" : "pwrite");
	return e;
}

static void waiter_init(struct waiter *w)
{
	pthread_mutex_init(&w->m, NULL);
	pthread_cond_init(&w->c, NULL);
	w->done = 0;
}

static void waiter_wait(struct waiter *w, unsigned n)
{
	pthread_mutex_lock(&w->m);
	while (w->done < n)
		pthread_cond_wait(&w->c, &w->m);
	pthread_mutex_unlock(&w->m);
}

static unsigned waiter_count(struct waiter *w)
{
	unsigned n;

	pthread_mutex_lock(&w->m);
	n = w->done;
	pthread_mutex_unlock(&w->m);
	return n;
}

static void on_done(struct io_req *r)
{
	struct treq *t = (struct treq *)r;
	struct waiter *w = t->w;

	if (t->chain && r->op == IO_WRITE && r->res == (int64_t)r->len) {
		t->chain = 0;
		r->op = IO_FSYNC; /* the same request goes out again, from done() */
		ioeng_submit(t->e, r);
		return;
	}
	pthread_mutex_lock(&w->m);
	w->done++;
	pthread_cond_broadcast(&w->c);
	pthread_mutex_unlock(&w->m);
}

static void req(struct treq *t, struct waiter *w, enum io_op op, int fd, void *buf, uint64_t len,
                uint64_t off, int buf_index)
{
	memset(t, 0, sizeof(*t));
	t->r.op = op;
	t->r.fd = fd;
	t->r.buf = buf;
	t->r.len = len;
	t->r.off = off;
	t->r.buf_index = buf_index;
	t->r.done = on_done;
	t->w = w;
}

static void *aligned(size_t n)
{
	void *p = NULL;

	ck_assert_int_eq(posix_memalign(&p, BLK, n), 0);
	return p;
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(seed * 131 + i * 7 + (i >> 12));
}

/* ---- round trips ------------------------------------------------------ */

#define NB 16
#define BSZ (64u << 10)

static void roundtrip(int i, bool reg)
{
	struct ioeng *e = engine(i, 4, NULL);
	static struct treq t[2 * NB];
	struct iovec iov[2 * NB];
	struct ioeng_stats st;
	struct waiter w;
	char err[IPC_ERRLEN] = "";
	int fd = open_file("rt", true);
	int rc;

	waiter_init(&w);
	for (int k = 0; k < 2 * NB; k++) {
		iov[k].iov_base = aligned(BSZ);
		iov[k].iov_len = BSZ;
		fill(iov[k].iov_base, BSZ, k < NB ? (unsigned)k : 999u);
	}
	if (reg) {
		rc = ioeng_register_buffers(e, iov, 2 * NB, err);
		if (i == 1) {
			ck_assert_msg(rc == 0, "register: %s", err);
			ck_assert(ioeng_registered(e));
			ck_assert_str_eq(ioeng_detail(e), "io_uring, 32 registered buffers");
		} else {
			ck_assert_int_eq(rc, -EOPNOTSUPP);
			ck_assert(!ioeng_registered(e));
			ck_assert_str_eq(ioeng_detail(e), "pwrite (configured)");
		}
	}
	for (int k = 0; k < NB; k++) {
		req(&t[k], &w, IO_WRITE, fd, iov[k].iov_base, BSZ, (uint64_t)k * BSZ, reg ? k : -1);
		ioeng_submit(e, &t[k].r);
	}
	waiter_wait(&w, NB);
	req(&t[0], &w, IO_FSYNC, fd, NULL, 0, 0, -1);
	ioeng_submit(e, &t[0].r);
	waiter_wait(&w, NB + 1);
	ck_assert_int_eq(t[0].r.res, 0);
	for (int k = 0; k < NB; k++) {
		req(&t[NB + k], &w, IO_READ, fd, iov[NB + k].iov_base, BSZ, (uint64_t)k * BSZ,
		    reg ? NB + k : -1);
		ioeng_submit(e, &t[NB + k].r);
	}
	waiter_wait(&w, 2 * NB + 1);
	for (int k = 0; k < NB; k++) {
		ck_assert_int_eq(t[NB + k].r.res, BSZ);
		ck_assert_msg(memcmp(iov[k].iov_base, iov[NB + k].iov_base, BSZ) == 0,
		              "block %d reads back different bytes", k);
	}
	ioeng_get_stats(e, &st);
	ck_assert_uint_eq(st.bytes_written, (uint64_t)NB * BSZ);
	ck_assert_uint_eq(st.bytes_read, (uint64_t)NB * BSZ);
	ck_assert_uint_eq(st.writes, NB);
	ck_assert_uint_eq(st.reads, NB);
	ck_assert_uint_eq(st.fsyncs, 1);
	ck_assert_uint_eq(st.errors, 0);
	ck_assert_uint_eq(st.inflight, 0);
	ioeng_destroy(e);
	close(fd);
	for (int k = 0; k < 2 * NB; k++)
		free(iov[k].iov_base);
}

START_TEST(test_roundtrip_unregistered)
{
	roundtrip(_i, false);
}
END_TEST

START_TEST(test_roundtrip_registered)
{
	roundtrip(_i, true);
}
END_TEST

/* A registration the kernel refuses: the detail says why, requests still go out. */
START_TEST(test_register_refused)
{
	struct ioeng *e = engine(1, 4, NULL);
	struct iovec bad = {.iov_base = NULL, .iov_len = BLK};
	char err[IPC_ERRLEN] = "";
	unsigned char *buf = aligned(BLK), *back = aligned(BLK);
	struct treq t;
	struct waiter w;
	int fd = open_file("reg", true);
	int rc;

	waiter_init(&w);
	rc = ioeng_register_buffers(e, &bad, 1, err);
	ck_assert_int_lt(rc, 0);
	ck_assert(!ioeng_registered(e));
	ck_assert_msg(
	    strncmp(ioeng_detail(e), "io_uring, unregistered buffers (io_uring_register_buffers: ",
	            strlen("io_uring, unregistered buffers (io_uring_register_buffers: ")) == 0,
	    "detail: %s", ioeng_detail(e));
	ck_assert_msg(strstr(err, "unregistered") != NULL, "err: %s", err);
	fill(buf, BLK, 5);
	req(&t, &w, IO_WRITE, fd, buf, BLK, 0, 0); /* index 0: nothing registered */
	ioeng_submit(e, &t.r);
	waiter_wait(&w, 1);
	ck_assert_int_eq(t.r.res, BLK);
	req(&t, &w, IO_READ, fd, back, BLK, 0, 0);
	ioeng_submit(e, &t.r);
	waiter_wait(&w, 2);
	ck_assert_int_eq(t.r.res, BLK);
	ck_assert(memcmp(buf, back, BLK) == 0);
	ioeng_destroy(e);
	close(fd);
	free(buf);
	free(back);
}
END_TEST

/* Sets CAP_IPC_LOCK in the effective set (which lifts RLIMIT_MEMLOCK) on or off. */
static void ipc_lock_cap(bool on)
{
	struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
	struct __user_cap_data_struct d[2];
	unsigned bit = 1u << (CAP_IPC_LOCK % 32);

	if (syscall(SYS_capget, &h, d) < 0 || !(d[CAP_IPC_LOCK / 32].permitted & bit))
		return; /* not ours to change: the limit applies anyway */
	if (on)
		d[CAP_IPC_LOCK / 32].effective |= bit;
	else
		d[CAP_IPC_LOCK / 32].effective &= ~bit;
	ck_assert_int_eq(syscall(SYS_capset, &h, d), 0);
}

/*
 * The case met in production: a pool larger than RLIMIT_MEMLOCK (an agent
 * not started with LimitMEMLOCK=infinity). The detail names the limit.
 */
START_TEST(test_register_memlock)
{
	struct rlimit old, rl;
	struct iovec iov = {.iov_len = 1u << 20};
	char err[IPC_ERRLEN] = "";
	unsigned char *back = aligned(BLK);
	struct ioeng *e;
	struct treq t;
	struct waiter w;
	int fd = open_file("memlock", true);
	int rc;

	ck_assert_int_eq(getrlimit(RLIMIT_MEMLOCK, &old), 0);
	if (old.rlim_max != RLIM_INFINITY && old.rlim_max < (64u << 10)) {
		fprintf(stderr, "RLIMIT_MEMLOCK's hard limit is below 64 KiB: case not run\n");
		return;
	}
	rl = old;
	rl.rlim_cur = 64u << 10;
	ck_assert_int_eq(setrlimit(RLIMIT_MEMLOCK, &rl), 0);
	ipc_lock_cap(false); /* io_uring looks at it when the ring is made */
	e = engine(1, 4, NULL);
	iov.iov_base = aligned(iov.iov_len);
	fill(iov.iov_base, iov.iov_len, 41);
	rc = ioeng_register_buffers(e, &iov, 1, err);
	ck_assert_int_eq(rc, -ENOMEM);
	ck_assert(!ioeng_registered(e));
	ck_assert_str_eq(ioeng_detail(e),
	                 "io_uring, unregistered buffers (io_uring_register_buffers: "
	                 "Cannot allocate memory; RLIMIT_MEMLOCK is 64 KiB)");
	ck_assert_msg(strstr(err, "LimitMEMLOCK") != NULL, "err: %s", err);
	waiter_init(&w);
	req(&t, &w, IO_WRITE, fd, iov.iov_base, BLK, 0, 0);
	ioeng_submit(e, &t.r);
	waiter_wait(&w, 1);
	ck_assert_int_eq(t.r.res, BLK);
	req(&t, &w, IO_READ, fd, back, BLK, 0, 0);
	ioeng_submit(e, &t.r);
	waiter_wait(&w, 2);
	ck_assert_int_eq(t.r.res, BLK);
	ck_assert(memcmp(iov.iov_base, back, BLK) == 0);
	ioeng_destroy(e);
	ipc_lock_cap(true);
	setrlimit(RLIMIT_MEMLOCK, &old);
	close(fd);
	free(iov.iov_base);
	free(back);
}
END_TEST

/* ---- order and slots -------------------------------------------------- */

#define NFIFO 64
#define FIFO_DEPTH 4

static struct {
	atomic_uint prepped;
	atomic_uint finished;
	unsigned order[NFIFO];
	atomic_uint max_busy;
	struct ioeng *e;
} fifo;

static void fifo_prep(struct io_req *r)
{
	struct treq *t = (struct treq *)r;
	unsigned n = atomic_fetch_add(&fifo.prepped, 1);
	unsigned busy = n - atomic_load(&fifo.finished); /* prepped before us, not done */
	struct ioeng_stats st;

	fifo.order[n] = t->idx;
	if (busy > atomic_load(&fifo.max_busy))
		atomic_store(&fifo.max_busy, busy);
	ioeng_get_stats(fifo.e, &st);
	ck_assert_uint_lt(st.inflight, FIFO_DEPTH);
}

static void fifo_done(struct io_req *r)
{
	atomic_fetch_add(&fifo.finished, 1);
	on_done(r);
}

START_TEST(test_fifo_prep_order)
{
	struct ioeng *e = engine(_i, FIFO_DEPTH, NULL);
	static struct treq t[NFIFO];
	unsigned char *buf = aligned(NFIFO * BLK);
	struct waiter w;
	int fd = open_file("fifo", true);

	memset(&fifo, 0, sizeof(fifo));
	fifo.e = e;
	waiter_init(&w);
	fill(buf, NFIFO * BLK, 3);
	for (unsigned k = 0; k < NFIFO; k++) {
		req(&t[k], &w, IO_WRITE, fd, buf + k * BLK, BLK, (uint64_t)k * BLK, -1);
		t[k].idx = k;
		t[k].r.prep = fifo_prep;
		t[k].r.done = fifo_done;
		ioeng_submit(e, &t[k].r);
	}
	waiter_wait(&w, NFIFO);
	for (unsigned k = 0; k < NFIFO; k++) {
		ck_assert_uint_eq(fifo.order[k], k);
		ck_assert_int_eq(t[k].r.res, BLK);
	}
	ck_assert_uint_lt(atomic_load(&fifo.max_busy), FIFO_DEPTH);
	ioeng_destroy(e);
	close(fd);
	free(buf);
}
END_TEST

/* ---- injected results ------------------------------------------------- */

static void check_file(int fd, const unsigned char *want, size_t n)
{
	unsigned char *got = aligned((n + BLK - 1) / BLK * BLK); /* the fd may be O_DIRECT */

	ck_assert_int_eq(pread(fd, got, n, 0), (ssize_t)n);
	ck_assert_msg(memcmp(got, want, n) == 0, "file content differs");
	free(got);
}

#define NSHORT 8
#define SHORT_LEN 100003u

START_TEST(test_short_transfers)
{
	static struct treq t[NSHORT];
	unsigned char *buf = malloc(NSHORT * SHORT_LEN), *back = calloc(NSHORT, SHORT_LEN);
	struct ioeng_stats st;
	struct waiter w;
	struct ioeng *e;
	int fd = open_file("short", false); /* injected remainders are not aligned */

	inject = INJ_SHORT;
	e = engine(_i, 3, &inject_ops);
	waiter_init(&w);
	fill(buf, NSHORT * SHORT_LEN, 11);
	for (unsigned k = 0; k < NSHORT; k++) {
		req(&t[k], &w, IO_WRITE, fd, buf + k * SHORT_LEN, SHORT_LEN, k * SHORT_LEN, -1);
		ioeng_submit(e, &t[k].r);
	}
	waiter_wait(&w, NSHORT);
	for (unsigned k = 0; k < NSHORT; k++) {
		ck_assert_int_eq(t[k].r.res, SHORT_LEN);
		ck_assert_uint_ge(t[k].calls, 4); /* three short, then the rest */
	}
	check_file(fd, buf, NSHORT * SHORT_LEN);
	for (unsigned k = 0; k < NSHORT; k++) {
		req(&t[k], &w, IO_READ, fd, back + k * SHORT_LEN, SHORT_LEN, k * SHORT_LEN, -1);
		ioeng_submit(e, &t[k].r);
	}
	waiter_wait(&w, 2 * NSHORT);
	for (unsigned k = 0; k < NSHORT; k++)
		ck_assert_int_eq(t[k].r.res, SHORT_LEN);
	ck_assert(memcmp(buf, back, NSHORT * SHORT_LEN) == 0);
	ioeng_get_stats(e, &st);
	ck_assert_uint_ge(st.retries, 2 * NSHORT * 3);
	ck_assert_uint_eq(st.bytes_written, NSHORT * SHORT_LEN);
	ck_assert_uint_eq(st.bytes_read, NSHORT * SHORT_LEN);
	ck_assert_uint_eq(st.errors, 0);
	ioeng_destroy(e);
	close(fd);
	free(buf);
	free(back);
}
END_TEST

START_TEST(test_eagain_retried)
{
	static struct treq t[8];
	unsigned char *buf = malloc(8 * BLK);
	struct ioeng_stats st;
	struct waiter w;
	struct ioeng *e;
	int fd = open_file("again", false);

	inject = INJ_EAGAIN;
	e = engine(_i, 2, &inject_ops);
	waiter_init(&w);
	fill(buf, 8 * BLK, 17);
	for (unsigned k = 0; k < 8; k++) {
		req(&t[k], &w, IO_WRITE, fd, buf + k * BLK, BLK, k * BLK, -1);
		ioeng_submit(e, &t[k].r);
	}
	waiter_wait(&w, 8);
	for (unsigned k = 0; k < 8; k++) {
		ck_assert_int_eq(t[k].r.res, BLK);
		ck_assert_uint_eq(t[k].calls, 6);
	}
	check_file(fd, buf, 8 * BLK);
	ioeng_get_stats(e, &st);
	ck_assert_uint_eq(st.retries, 8 * 5);
	ck_assert_uint_eq(st.errors, 0);
	ioeng_destroy(e);
	close(fd);
	free(buf);
}
END_TEST

START_TEST(test_eagain_bounded)
{
	unsigned char *buf = malloc(BLK);
	struct ioeng_stats st;
	struct treq t;
	struct waiter w;
	struct ioeng *e;
	int fd = open_file("forever", false);

	inject = INJ_EAGAIN_FOREVER;
	e = engine(_i, 2, &inject_ops);
	waiter_init(&w);
	memset(buf, 1, BLK);
	req(&t, &w, IO_WRITE, fd, buf, BLK, 0, -1);
	ioeng_submit(e, &t.r);
	waiter_wait(&w, 1);
	ck_assert_int_eq(t.r.res, -EAGAIN);
	ck_assert_uint_ge(t.calls, 100); /* tried many times, then gave up */
	ck_assert_uint_le(t.calls, 100000);
	ioeng_get_stats(e, &st);
	ck_assert_uint_eq(st.errors, 1);
	ioeng_destroy(e);
	close(fd);
	free(buf);
}
END_TEST

START_TEST(test_errors_reach_res)
{
	static const int64_t errs[] = {-EIO, -ENOSPC, 0, -EIO};
	unsigned char *buf = malloc(4 * BLK);
	struct treq t[4];
	struct ioeng_stats st;
	struct waiter w;
	struct ioeng *e;
	int fd = open_file("errs", false);

	inject = INJ_ERR;
	e = engine(_i, 2, &inject_ops);
	waiter_init(&w);
	memset(buf, 2, 4 * BLK);
	for (unsigned k = 0; k < 4; k++) {
		req(&t[k], &w, k == 3 ? IO_FSYNC : IO_WRITE, fd, buf + k * BLK, BLK, k * BLK, -1);
		t[k].inject_err = errs[k];
		ioeng_submit(e, &t[k].r);
	}
	waiter_wait(&w, 4);
	ck_assert_int_eq(t[0].r.res, -EIO);
	ck_assert_int_eq(t[1].r.res, -ENOSPC);
	ck_assert_int_eq(t[2].r.res, BLK);
	ck_assert_int_eq(t[3].r.res, -EIO); /* a failed fsync */
	ioeng_get_stats(e, &st);
	ck_assert_uint_eq(st.errors, 3);
	ck_assert_uint_eq(st.writes, 1);
	ck_assert_uint_eq(st.fsyncs, 0);
	ioeng_destroy(e);
	close(fd);
	free(buf);
}
END_TEST

START_TEST(test_zero_write_is_eio)
{
	unsigned char *buf = malloc(BLK);
	struct treq t;
	struct waiter w;
	struct ioeng *e;
	int fd = open_file("zero", false);

	inject = INJ_ZERO;
	e = engine(_i, 2, &inject_ops);
	waiter_init(&w);
	memset(buf, 3, BLK);
	req(&t, &w, IO_WRITE, fd, buf, BLK, 0, -1);
	ioeng_submit(e, &t.r);
	waiter_wait(&w, 1);
	ck_assert_int_eq(t.r.res, -EIO);
	ck_assert_uint_ge(t.calls, 2); /* tried again before giving up */
	ck_assert_uint_le(t.calls, 10);
	ioeng_destroy(e);
	close(fd);
	free(buf);
}
END_TEST

/* fsync, reads that meet the end of the file, and requests without bytes. */
START_TEST(test_fsync_eof_empty)
{
	unsigned char *buf = malloc(16384), *back = calloc(1, 16384);
	struct ioeng *e = engine(_i, 2, NULL);
	struct treq t;
	struct waiter w;
	int fd = open_file("eof", false);

	waiter_init(&w);
	fill(buf, 10000, 23);
	req(&t, &w, IO_WRITE, fd, buf, 10000, 0, -1);
	ioeng_submit(e, &t.r);
	waiter_wait(&w, 1);
	ck_assert_int_eq(t.r.res, 10000);
	req(&t, &w, IO_FSYNC, fd, NULL, 0, 0, -1);
	ioeng_submit(e, &t.r);
	waiter_wait(&w, 2);
	ck_assert_int_eq(t.r.res, 0);
	req(&t, &w, IO_READ, fd, back, 16384, 0, -1);
	ioeng_submit(e, &t.r);
	waiter_wait(&w, 3);
	ck_assert_int_eq(t.r.res, 10000);
	ck_assert(memcmp(buf, back, 10000) == 0);
	req(&t, &w, IO_READ, fd, back, 4096, 20000, -1);
	ioeng_submit(e, &t.r);
	waiter_wait(&w, 4);
	ck_assert_int_eq(t.r.res, 0);
	req(&t, &w, IO_WRITE, fd, buf, 0, 0, -1);
	ioeng_submit(e, &t.r);
	waiter_wait(&w, 5);
	ck_assert_int_eq(t.r.res, 0);
	req(&t, &w, (enum io_op)42, fd, buf, 16, 0, -1);
	ioeng_submit(e, &t.r);
	waiter_wait(&w, 6);
	ck_assert_int_eq(t.r.res, -EINVAL);
	ioeng_destroy(e);
	close(fd);
	free(buf);
	free(back);
}
END_TEST

/* ---- shutdown and threads --------------------------------------------- */

#define NDESTROY 256

START_TEST(test_destroy_completes_inflight)
{
	static struct treq t[NDESTROY];
	unsigned char *buf = aligned(NDESTROY * BLK);
	struct ioeng *e = engine(_i, 2, NULL);
	struct waiter w;
	int fd = open_file("destroy", true);

	waiter_init(&w);
	fill(buf, NDESTROY * BLK, 29);
	for (unsigned k = 0; k < NDESTROY; k++) {
		req(&t[k], &w, IO_WRITE, fd, buf + k * BLK, BLK, (uint64_t)k * BLK, -1);
		t[k].chain = k % 16 == 0; /* some chain an fsync from done() */
		t[k].e = e;
		ioeng_submit(e, &t[k].r);
	}
	ioeng_destroy(e); /* at once: most are still queued */
	ck_assert_uint_eq(waiter_count(&w), NDESTROY);
	for (unsigned k = 0; k < NDESTROY; k++) {
		ck_assert_int_eq(t[k].r.res, k % 16 == 0 ? 0 : (int64_t)BLK);
		ck_assert_int_eq(t[k].r.op, k % 16 == 0 ? IO_FSYNC : IO_WRITE);
	}
	check_file(fd, buf, NDESTROY * BLK);
	close(fd);
	free(buf);
}
END_TEST

#define NTHREADS 4
#define PER_THREAD 64

struct submitter {
	pthread_t t;
	struct ioeng *e;
	struct waiter *w;
	int fd;
	unsigned char *buf;
	unsigned base;
	struct treq req[PER_THREAD];
};

static void *submit_main(void *arg)
{
	struct submitter *s = arg;

	for (unsigned k = 0; k < PER_THREAD; k++) {
		unsigned blk = s->base + k;

		req(&s->req[k], s->w, IO_WRITE, s->fd, s->buf + (size_t)blk * BLK, BLK,
		    (uint64_t)blk * BLK, -1);
		ioeng_submit(s->e, &s->req[k].r);
	}
	return NULL;
}

START_TEST(test_threads_submit)
{
	static struct submitter s[NTHREADS];
	unsigned char *buf = aligned(NTHREADS * PER_THREAD * BLK);
	struct ioeng *e = engine(_i, 8, NULL);
	struct ioeng_stats st;
	struct waiter w;
	int fd = open_file("threads", true);

	waiter_init(&w);
	fill(buf, NTHREADS * PER_THREAD * BLK, 31);
	for (unsigned k = 0; k < NTHREADS; k++) {
		s[k].e = e;
		s[k].w = &w;
		s[k].fd = fd;
		s[k].buf = buf;
		s[k].base = k * PER_THREAD;
		ck_assert_int_eq(pthread_create(&s[k].t, NULL, submit_main, &s[k]), 0);
	}
	for (unsigned k = 0; k < NTHREADS; k++)
		pthread_join(s[k].t, NULL);
	waiter_wait(&w, NTHREADS * PER_THREAD);
	for (unsigned k = 0; k < NTHREADS; k++)
		for (unsigned j = 0; j < PER_THREAD; j++)
			ck_assert_int_eq(s[k].req[j].r.res, BLK);
	ioeng_get_stats(e, &st);
	ck_assert_uint_eq(st.writes, NTHREADS * PER_THREAD);
	ioeng_destroy(e);
	check_file(fd, buf, NTHREADS * PER_THREAD * BLK);
	close(fd);
	free(buf);
}
END_TEST

/* ---- creation --------------------------------------------------------- */

START_TEST(test_create)
{
	struct ioeng_opts o = {.kind = IOENG_AUTO, .queue_depth = 0};
	char err[IPC_ERRLEN] = "";
	struct ioeng *e = NULL;

	ck_assert_int_eq(ioeng_create(&o, &e, err), -EINVAL);
	ck_assert_ptr_null(e);
	ck_assert_msg(strstr(err, "1..256") != NULL, "err: %s", err);
	o.queue_depth = 257;
	ck_assert_int_eq(ioeng_create(&o, &e, err), -EINVAL);
	o.queue_depth = 8;
	ck_assert_int_eq(ioeng_create(&o, &e, err), 0);
	if (strcmp(ioeng_name(e), "pwrite") == 0)
		ck_assert_msg(strncmp(ioeng_detail(e), "pwrite (io_uring_queue_init: ", 29) == 0,
		              "detail: %s", ioeng_detail(e));
	else
		ck_assert_str_eq(ioeng_detail(e), "io_uring, unregistered buffers");
	ioeng_destroy(e);
	o.kind = IOENG_PWRITE;
	ck_assert_int_eq(ioeng_create(&o, &e, err), 0);
	ck_assert_str_eq(ioeng_name(e), "pwrite");
	ck_assert_str_eq(ioeng_detail(e), "pwrite (configured)");
	ck_assert(!ioeng_registered(e));
	ioeng_destroy(e);
	ioeng_destroy(NULL);
}
END_TEST

static Suite *suite(int nkinds)
{
	Suite *s = suite_create("ioeng");
	TCase *tc = tcase_create("engines");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_loop_test(tc, test_roundtrip_unregistered, 0, nkinds);
	tcase_add_loop_test(tc, test_roundtrip_registered, 0, nkinds);
	tcase_add_loop_test(tc, test_fifo_prep_order, 0, nkinds);
	tcase_add_loop_test(tc, test_short_transfers, 0, nkinds);
	tcase_add_loop_test(tc, test_eagain_retried, 0, nkinds);
	tcase_add_loop_test(tc, test_eagain_bounded, 0, nkinds);
	tcase_add_loop_test(tc, test_errors_reach_res, 0, nkinds);
	tcase_add_loop_test(tc, test_zero_write_is_eio, 0, nkinds);
	tcase_add_loop_test(tc, test_fsync_eof_empty, 0, nkinds);
	tcase_add_loop_test(tc, test_destroy_completes_inflight, 0, nkinds);
	tcase_add_loop_test(tc, test_threads_submit, 0, nkinds);
	if (nkinds > 1) {
		tcase_add_test(tc, test_register_refused);
		tcase_add_test(tc, test_register_memlock);
	}
	tcase_add_test(tc, test_create);
	suite_add_tcase(s, tc);
	return s;
}

/* io_uring_queue_init's answer here: 0 where io_uring runs (test_before). */
static int uring_rc;

int test_before(int argc, char **argv)
{
	struct io_uring ring;

	(void)argc;
	(void)argv;
	uring_rc = io_uring_queue_init(4, &ring, 0);
	if (uring_rc == 0)
		io_uring_queue_exit(&ring);
	return TEST_RUN;
}

Suite *test_suite(void)
{
	return suite(uring_rc == 0 ? 2 : 1);
}

/* Without io_uring: a skip, once the pwrite cases passed. */
int test_after(int failed)
{
	if (failed)
		return EXIT_FAILURE;
	if (uring_rc) {
		printf("io_uring is unavailable here (io_uring_queue_init: %s): the pwrite cases "
		       "passed, the io_uring cases were skipped\n",
		       strerror(-uring_rc));
		return TEST_SKIP;
	}
	return EXIT_SUCCESS;
}
