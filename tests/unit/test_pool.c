/*
 * The staging pool (agent/pool.c): its memory (layout, alignment, huge
 * pages, locking and why not), option checks, and admission: no-wait
 * refusal, FIFO waiting, streaming through a small reservation, abort.
 *
 * Threads stand in for saves and for the I/O thread; they record what
 * happened and the main thread asserts, after joining them. Where a test
 * must show that something is still blocked it waits a little and looks:
 * a wrong pool lets it through in microseconds, so 50 ms is plenty.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pool.h"

#define KiB 1024ull
#define MiB (1024ull * 1024)

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static struct pool *make_pool(uint64_t bytes, uint64_t chunk, bool lock)
{
	struct pool_opts o = {.bytes = bytes, .chunk_bytes = chunk, .lock = lock};
	char err[IPC_ERRLEN] = "";
	struct pool *p = NULL;
	int rc = pool_create(&o, &p, err);

	ck_assert_msg(rc == 0, "pool_create: %d: %s", rc, err);
	ck_assert_ptr_nonnull(p);
	return p;
}

static struct pool_stats stats(struct pool *p)
{
	struct pool_stats s;

	pool_get_stats(p, &s);
	return s;
}

/* Waits (up to 10 s) until `waiters` reservations wait, or *done is set. */
static bool wait_waiters(struct pool *p, unsigned waiters, atomic_bool *done)
{
	for (int i = 0; i < 10000; i++) {
		if (stats(p).waiters == waiters)
			return true;
		if (done && atomic_load(done))
			return false;
		sleep_ms(1);
	}
	return false;
}

/* ---- a save, waiting for its reservation on a thread ------------------ */

struct resv_thread {
	struct pool *p;
	unsigned n;
	struct pool_resv r;
	atomic_bool abort;
	atomic_bool done;
	int rc;
	pthread_t t;
};

static void *resv_main(void *arg)
{
	struct resv_thread *rt = arg;

	rt->rc = pool_reserve(rt->p, &rt->r, rt->n, true, &rt->abort);
	atomic_store(&rt->done, true);
	return NULL;
}

static void resv_start(struct resv_thread *rt, struct pool *p, unsigned n)
{
	rt->p = p;
	rt->n = n;
	rt->rc = 1;
	atomic_init(&rt->abort, false);
	atomic_init(&rt->done, false);
	ck_assert_int_eq(pthread_create(&rt->t, NULL, resv_main, rt), 0);
}

static int resv_join(struct resv_thread *rt)
{
	ck_assert_int_eq(pthread_join(rt->t, NULL), 0);
	return rt->rc;
}

/* ---- creation --------------------------------------------------------- */

START_TEST(test_create_layout)
{
	/* 4 chunks and a remainder, which is dropped. */
	struct pool *p = make_pool(4 * 8 * KiB + 5000, 8 * KiB, false);
	struct pool_stats s = stats(p);
	unsigned char vec[32 * KiB / 4096]; /* a page per byte */
	const struct iovec *iov;
	unsigned n = 0;
	char *base;

	ck_assert_uint_eq(s.bytes, 32 * KiB);
	ck_assert_uint_eq(s.chunk_bytes, 8 * KiB);
	ck_assert_uint_eq(s.chunks, 4);
	ck_assert_uint_eq(s.free_credits, 4);
	ck_assert_uint_eq(s.in_use, 0);
	ck_assert_uint_eq(s.waiters, 0);
	ck_assert_uint_eq(s.waits, 0);
	ck_assert(!s.locked);
	ck_assert_uint_eq(pool_nchunks(p), 4);
	ck_assert_uint_eq(pool_chunk_bytes(p), 8 * KiB);
	ck_assert_str_eq(pool_detail(p), "mmap, 32 KiB in 4 x 8 KiB chunks, huge pages advised, "
	                                 "not locked (not asked to)");

	iov = pool_iovecs(p, &n);
	ck_assert_uint_eq(n, 4);
	base = pool_chunk_at(p, 0)->buf;
	/* Pre-faulted: every page is there before anything writes to it. */
	ck_assert_int_eq(mincore(base, 32 * KiB, vec), 0);
	for (size_t i = 0; i < sizeof(vec); i++)
		ck_assert_msg(vec[i] & 1, "page %zu of the pool is not resident", i);
	for (unsigned i = 0; i < n; i++) {
		struct pool_chunk *c = pool_chunk_at(p, i);

		ck_assert_ptr_nonnull(c);
		ck_assert_uint_eq(c->index, i);
		ck_assert_ptr_eq(c->buf, base + i * 8 * KiB);
		ck_assert_uint_eq((uintptr_t)c->buf % 4096, 0);
		ck_assert_ptr_eq(iov[i].iov_base, c->buf);
		ck_assert_uint_eq(iov[i].iov_len, 8 * KiB);
		ck_assert_int_eq(c->req.buf_index, (int)i);
		memset(c->buf, 0x11 * (int)(i + 1), 8 * KiB);
	}
	ck_assert_ptr_null(pool_chunk_at(p, 4));
	/* Every byte holds what was written to it: no chunk overlaps another. */
	for (unsigned i = 0; i < n; i++)
		for (uint64_t b = 0; b < 8 * KiB; b++)
			ck_assert_uint_eq((unsigned char)base[i * 8 * KiB + b], 0x11 * (i + 1));
	pool_destroy(p);
	pool_destroy(NULL);
}
END_TEST

START_TEST(test_create_bad_options)
{
	static const struct {
		uint64_t bytes, chunk;
		int rc;
		const char *says;
	} cases[] = {
	    {64 * KiB, 0, -EINVAL, "multiple of 4096"},
	    {64 * KiB, 1000, -EINVAL, "multiple of 4096"},
	    {64 * KiB, 4097, -EINVAL, "multiple of 4096"},
	    {64 * KiB, 3 * 4096 + 512, -EINVAL, "multiple of 4096"},
	    {0, 4096, -EINVAL, "at least 2"},
	    {8191, 4096, -EINVAL, "at least 2"}, /* rounds down to 1 chunk */
	    {64 * KiB, 64 * KiB, -EINVAL, "at least 2"},
	    {UINT64_MAX, 4096, -EINVAL, "raise the chunk size"}, /* > INT_MAX chunks */
	    {UINT64_MAX, 1ull << 62, -ENOMEM, "memory"}, /* 3 x 4 EiB: no overflow */
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct pool_opts o = {.bytes = cases[i].bytes, .chunk_bytes = cases[i].chunk};
		struct pool *p = (struct pool *)&o; /* must come back NULL */
		char err[IPC_ERRLEN] = "";
		int rc = pool_create(&o, &p, err);

		ck_assert_msg(rc == cases[i].rc, "case %zu: rc %d, not %d (%s)", i, rc, cases[i].rc,
		              err);
		ck_assert_ptr_null(p);
		ck_assert_msg(strstr(err, cases[i].says), "case %zu: '%s' lacks '%s'", i, err,
		              cases[i].says);
	}

	{
		struct pool *p = (struct pool *)cases;
		char err[IPC_ERRLEN] = "";

		ck_assert_int_eq(pool_create(NULL, &p, err), -EINVAL);
		ck_assert_ptr_null(p);
		ck_assert_str_ne(err, "");
	}
}
END_TEST

/* VmLck of this process, in KiB. */
static long vm_locked_kib(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kib = -1;

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmLck: %ld kB", &kib) == 1)
			break;
	fclose(f);
	ck_assert_int_ge(kib, 0);
	return kib;
}

START_TEST(test_create_locked)
{
	/* 8 KiB is under any RLIMIT_MEMLOCK (8 MiB for a user here): always lockable. */
	long before = vm_locked_kib();
	struct pool *p = make_pool(8 * KiB, 4 * KiB, true);

	ck_assert(stats(p).locked);
	ck_assert_str_eq(pool_detail(p),
	                 "mmap, 8 KiB in 2 x 4 KiB chunks, huge pages advised, mlock'd");
	ck_assert_int_ge(vm_locked_kib() - before, 8);
	pool_destroy(p);
}
END_TEST

/*
 * Without CAP_IPC_LOCK and with a low RLIMIT_MEMLOCK (a user's daemon), the
 * pool is made anyway, unlocked, and says why. Root ignores the limit, so
 * the child gives up root first.
 */
START_TEST(test_create_lock_refused)
{
	struct {
		int rc;
		bool locked;
		int reserve, took;
		char detail[256];
	} res;
	int fds[2];
	pid_t pid;
	int status;

	ck_assert_int_eq(pipe(fds), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct rlimit rl = {64 * KiB, 64 * KiB};
		struct pool_opts o = {.bytes = 1 * MiB, .chunk_bytes = 256 * KiB, .lock = true};
		char err[IPC_ERRLEN] = "";
		struct pool_resv r;
		struct pool *p = NULL;

		memset(&res, 0, sizeof(res));
		if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0)
			_exit(2);
		if (geteuid() == 0 && setuid(65534) != 0)
			_exit(3);
		res.rc = pool_create(&o, &p, err);
		if (res.rc == 0) {
			res.locked = stats(p).locked;
			snprintf(res.detail, sizeof(res.detail), "%s", pool_detail(p));
			/* And it works, unlocked. */
			res.reserve = pool_reserve(p, &r, 4, false, NULL);
			if (res.reserve == 0) {
				struct pool_chunk *c = pool_take(&r, NULL);

				res.took = c != NULL;
				if (c) {
					memset(c->buf, 1, 256 * KiB);
					pool_give(&r, c);
				}
				pool_release(&r);
			}
			pool_destroy(p);
		} else {
			snprintf(res.detail, sizeof(res.detail), "%s", err);
		}
		_exit(write(fds[1], &res, sizeof(res)) == (ssize_t)sizeof(res) ? 0 : 4);
	}
	close(fds[1]);
	ck_assert_int_eq(read(fds[0], &res, sizeof(res)), (ssize_t)sizeof(res));
	close(fds[0]);
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	ck_assert_msg(res.rc == 0, "pool_create: %d: %s", res.rc, res.detail);
	ck_assert(!res.locked);
	ck_assert_str_eq(res.detail,
	                 "mmap, 1 MiB in 4 x 256 KiB chunks, huge pages advised, not "
	                 "locked (mlock: Cannot allocate memory; RLIMIT_MEMLOCK 64 KiB)");
	ck_assert_int_eq(res.reserve, 0);
	ck_assert(res.took);
}
END_TEST

static bool thp_mode_is(const char *mode)
{
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
	char line[128] = "";
	bool yes;

	if (!f)
		return false;
	yes = fgets(line, sizeof(line), f) && strstr(line, mode);
	fclose(f);
	return yes;
}

/* AnonHugePages of the mapping that holds addr, in KiB. */
static long anon_huge_kib(const void *addr)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	char line[512];
	bool in = false;
	long kib = -1;

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi, v;

		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 &&
		    strchr(line, '-') < strchr(line, ' '))
			in = lo <= (uintptr_t)addr && (uintptr_t)addr < hi;
		else if (in && sscanf(line, "AnonHugePages: %lu kB", &v) == 1)
			kib = (long)v;
	}
	fclose(f);
	return kib;
}

/*
 * With THP in "madvise" mode, huge pages come only to a range advised
 * before it is faulted in: this fails if the pool is populated first.
 */
START_TEST(test_create_huge_pages)
{
	struct pool *p;
	long kib;

	if (!thp_mode_is("[madvise]") && !thp_mode_is("[always]")) {
		fprintf(stderr, "test_create_huge_pages: THP is off here; not checked\n");
		return;
	}
	/* 9 MiB: not a multiple of 2 MiB, which the kernel would align by itself. */
	p = make_pool(9 * MiB, 3 * MiB, false);
	ck_assert_uint_eq((uintptr_t)pool_chunk_at(p, 0)->buf % (2 * MiB), 0);
	kib = anon_huge_kib(pool_chunk_at(p, 0)->buf);
	ck_assert_msg(kib >= 2048, "AnonHugePages %ld kB in the pool's mapping", kib);
	pool_destroy(p);
}
END_TEST

/* ---- reservations ----------------------------------------------------- */

START_TEST(test_reserve_nowait_full)
{
	struct pool *p = make_pool(4 * 4 * KiB, 4 * KiB, false);
	struct pool_resv a, b, c, d;

	ck_assert_int_eq(pool_reserve(p, &a, 0, false, NULL), -EINVAL);
	ck_assert_int_eq(pool_reserve(p, &a, 5, false, NULL), -EINVAL);
	ck_assert_int_eq(pool_reserve(p, &a, 5, true, NULL), -EINVAL);
	ck_assert_int_eq(stats(p).free_credits, 4);

	ck_assert_int_eq(pool_reserve(p, &a, 3, false, NULL), 0);
	ck_assert(a.active);
	ck_assert_uint_eq(a.credits, 3);
	ck_assert_uint_eq(a.held, 3);
	ck_assert_uint_eq(stats(p).free_credits, 1);

	ck_assert_int_eq(pool_reserve(p, &b, 2, false, NULL), -EAGAIN);
	ck_assert(!b.active);
	ck_assert_uint_eq(b.credits, 0);
	ck_assert_uint_eq(stats(p).free_credits, 1);
	ck_assert_int_eq(pool_reserve(p, &c, 1, false, NULL), 0);
	ck_assert_int_eq(pool_reserve(p, &d, 1, false, NULL), -EAGAIN);
	ck_assert_uint_eq(stats(p).free_credits, 0);
	ck_assert_uint_eq(stats(p).waits, 0);

	pool_release(&a);
	ck_assert(!a.active);
	ck_assert_uint_eq(stats(p).free_credits, 3);
	pool_release(&a); /* twice: nothing more comes back */
	ck_assert_uint_eq(stats(p).free_credits, 3);
	pool_release(&c);
	ck_assert_uint_eq(stats(p).free_credits, 4);
	pool_destroy(p);
}
END_TEST

/* "skip" must not overtake a "block" save that came first. */
START_TEST(test_reserve_nowait_behind_waiter)
{
	struct pool *p = make_pool(4 * 4 * KiB, 4 * KiB, false);
	struct resv_thread t;
	struct pool_resv a, b;

	ck_assert_int_eq(pool_reserve(p, &a, 3, false, NULL), 0);
	resv_start(&t, p, 2);
	ck_assert(wait_waiters(p, 1, &t.done));
	ck_assert_uint_eq(stats(p).free_credits, 1); /* 1 would fit ... */
	ck_assert_int_eq(pool_reserve(p, &b, 1, false, NULL), -EAGAIN); /* ... but it waits */
	ck_assert(!b.active);

	pool_release(&a);
	ck_assert_int_eq(resv_join(&t), 0);
	ck_assert_uint_eq(t.r.credits, 2);
	/* Nobody waits now: the same request goes through. */
	ck_assert_int_eq(pool_reserve(p, &b, 1, false, NULL), 0);
	pool_release(&b);
	pool_release(&t.r);
	ck_assert_uint_eq(stats(p).free_credits, 4);
	pool_destroy(p);
}
END_TEST

START_TEST(test_reserve_waits_for_release)
{
	struct pool *p = make_pool(4 * 4 * KiB, 4 * KiB, false);
	struct resv_thread t;
	struct pool_resv a;
	struct pool_stats s;

	ck_assert_int_eq(pool_reserve(p, &a, 4, false, NULL), 0);
	resv_start(&t, p, 2);
	ck_assert(wait_waiters(p, 1, &t.done));
	sleep_ms(50);
	ck_assert(!atomic_load(&t.done));
	s = stats(p);
	ck_assert_uint_eq(s.waiters, 1);
	ck_assert_uint_eq(s.waits, 1);

	pool_release(&a);
	ck_assert_int_eq(resv_join(&t), 0);
	ck_assert(t.r.active);
	ck_assert_uint_eq(t.r.credits, 2);
	ck_assert_uint_eq(t.r.held, 2);
	s = stats(p);
	ck_assert_uint_eq(s.waiters, 0);
	ck_assert_uint_eq(s.waits, 1);
	ck_assert_uint_eq(s.free_credits, 2);
	pool_release(&t.r);
	pool_destroy(p);
}
END_TEST

/*
 * First come, first served: the second waiter's 1 chunk is free all along,
 * but it waits until the first, which needs 2, has been served.
 */
START_TEST(test_reserve_fifo)
{
	struct pool *p = make_pool(4 * 4 * KiB, 4 * KiB, false);
	struct resv_thread t1, t2;
	struct pool_resv a, b;

	ck_assert_int_eq(pool_reserve(p, &a, 1, false, NULL), 0);
	ck_assert_int_eq(pool_reserve(p, &b, 2, false, NULL), 0);
	resv_start(&t1, p, 2);
	ck_assert(wait_waiters(p, 1, &t1.done));
	resv_start(&t2, p, 1);
	wait_waiters(p, 2, &t2.done);
	sleep_ms(50);
	ck_assert_msg(!atomic_load(&t2.done), "the second in line went first");
	ck_assert_uint_eq(stats(p).free_credits, 1);
	ck_assert_uint_eq(stats(p).waiters, 2);

	pool_release(&a); /* 2 free: the first is served, and takes both */
	ck_assert_int_eq(resv_join(&t1), 0);
	sleep_ms(50);
	ck_assert(!atomic_load(&t2.done));
	ck_assert_uint_eq(stats(p).free_credits, 0);
	ck_assert_uint_eq(stats(p).waiters, 1);

	pool_release(&t1.r);
	ck_assert_int_eq(resv_join(&t2), 0);
	ck_assert_uint_eq(t2.r.credits, 1);
	ck_assert_uint_eq(stats(p).waits, 2);
	pool_release(&t2.r);
	pool_release(&b);
	ck_assert_uint_eq(stats(p).free_credits, 4);
	pool_destroy(p);
}
END_TEST

/* ---- streaming: a save larger than its reservation -------------------- */

#define STREAM_CHUNKS 10

struct io_thread {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct pool_chunk *q[STREAM_CHUNKS];
	unsigned head, tail;
	struct pool *p;
	struct pool_resv *r;
	/* results */
	unsigned written, bad, max_in_use, free_credits_seen;
};

/* Stands in for the I/O thread: "writes" each chunk, then gives it back. */
static void *io_main(void *arg)
{
	struct io_thread *io = arg;

	for (unsigned i = 0; i < STREAM_CHUNKS; i++) {
		struct pool_chunk *c;
		struct pool_stats s;
		const unsigned char *b;

		pthread_mutex_lock(&io->mu);
		while (io->head == io->tail)
			pthread_cond_wait(&io->cv, &io->mu);
		c = io->q[io->head++];
		pthread_mutex_unlock(&io->mu);

		b = c->buf;
		for (uint64_t k = 0; k < c->fill; k++)
			io->bad += b[k] != (unsigned char)(0xa0 + i);
		/* A slow disk: the capture side has taken its next chunk meanwhile. */
		sleep_ms(2);
		pool_get_stats(io->p, &s);
		if (s.in_use > io->max_in_use)
			io->max_in_use = s.in_use;
		io->free_credits_seen |= s.free_credits;
		io->written++;
		pool_give(io->r, c);
	}
	return NULL;
}

START_TEST(test_streaming_take_give)
{
	struct pool *p = make_pool(4 * 8 * KiB, 8 * KiB, false);
	struct io_thread io = {.p = p};
	struct pool_resv other, s;
	pthread_t t;

	/* Another save holds half the pool; ours gets the other half: 2 chunks for 10. */
	ck_assert_int_eq(pool_reserve(p, &other, 2, false, NULL), 0);
	ck_assert_int_eq(pool_reserve(p, &s, 2, false, NULL), 0);
	ck_assert_uint_eq(stats(p).free_credits, 0);
	io.r = &s;
	pthread_mutex_init(&io.mu, NULL);
	pthread_cond_init(&io.cv, NULL);
	ck_assert_int_eq(pthread_create(&t, NULL, io_main, &io), 0);

	for (unsigned i = 0; i < STREAM_CHUNKS; i++) {
		struct pool_chunk *c = pool_take(&s, NULL);

		ck_assert_ptr_nonnull(c);
		c->fill = 8 * KiB;
		memset(c->buf, 0xa0 + (int)i, c->fill);
		pthread_mutex_lock(&io.mu);
		io.q[io.tail++] = c;
		pthread_cond_signal(&io.cv);
		pthread_mutex_unlock(&io.mu);
	}
	ck_assert_int_eq(pthread_join(t, NULL), 0);
	ck_assert_uint_eq(io.written, STREAM_CHUNKS);
	ck_assert_uint_eq(io.bad, 0);
	/* Never more out than reserved, and the other save's chunks untouched. */
	ck_assert_uint_eq(io.max_in_use, 2);
	ck_assert_uint_eq(io.free_credits_seen, 0);
	ck_assert_uint_eq(other.credits, 2);
	ck_assert_uint_eq(s.credits, 2);
	ck_assert_uint_eq(stats(p).in_use, 0);

	pool_release(&s);
	pool_release(&other);
	ck_assert_uint_eq(stats(p).free_credits, 4);
	pthread_cond_destroy(&io.cv);
	pthread_mutex_destroy(&io.mu);
	pool_destroy(p);
}
END_TEST

struct take_thread {
	struct pool_resv *r;
	atomic_bool abort;
	atomic_bool done;
	struct pool_chunk *c;
	pthread_t t;
};

static void *take_main(void *arg)
{
	struct take_thread *tt = arg;

	tt->c = pool_take(tt->r, &tt->abort);
	atomic_store(&tt->done, true);
	return NULL;
}

static void take_start(struct take_thread *tt, struct pool_resv *r)
{
	tt->r = r;
	tt->c = (struct pool_chunk *)r; /* must be overwritten */
	atomic_init(&tt->abort, false);
	atomic_init(&tt->done, false);
	ck_assert_int_eq(pthread_create(&tt->t, NULL, take_main, tt), 0);
}

/* A take with no credit left waits for a give to this reservation. */
START_TEST(test_take_waits_for_give)
{
	struct pool *p = make_pool(4 * 4 * KiB, 4 * KiB, false);
	struct pool_chunk *c1, *c2;
	struct take_thread tt;
	struct pool_resv r;

	ck_assert_int_eq(pool_reserve(p, &r, 2, false, NULL), 0);
	c1 = pool_take(&r, NULL);
	c2 = pool_take(&r, NULL);
	ck_assert_ptr_nonnull(c1);
	ck_assert_ptr_nonnull(c2);
	ck_assert_ptr_ne(c1, c2);
	ck_assert_uint_eq(r.credits, 0);
	ck_assert_uint_eq(stats(p).in_use, 2);
	ck_assert_uint_eq(stats(p).free_credits, 2); /* free, but not ours */

	take_start(&tt, &r);
	sleep_ms(50);
	ck_assert(!atomic_load(&tt.done));
	pool_give(&r, c1);
	ck_assert_int_eq(pthread_join(tt.t, NULL), 0);
	ck_assert_ptr_nonnull(tt.c);
	ck_assert_ptr_ne(tt.c, c2);
	ck_assert_uint_eq(stats(p).in_use, 2);
	ck_assert_uint_eq(stats(p).free_credits, 2);

	pool_give(&r, tt.c);
	pool_give(&r, c2);
	ck_assert_uint_eq(r.credits, 2);
	pool_release(&r);
	ck_assert_uint_eq(stats(p).free_credits, 4);
	pool_destroy(p);
}
END_TEST

START_TEST(test_give_after_release)
{
	struct pool *p = make_pool(4 * 4 * KiB, 4 * KiB, false);
	struct pool_chunk *c1, *c2;
	struct resv_thread t;
	struct pool_resv r;
	struct pool_stats s;

	ck_assert_int_eq(pool_reserve(p, &r, 3, false, NULL), 0);
	c1 = pool_take(&r, NULL);
	c2 = pool_take(&r, NULL);
	resv_start(&t, p, 4); /* the whole pool: waits for every chunk */
	ck_assert(wait_waiters(p, 1, &t.done));

	pool_release(&r); /* the unused credit comes back now */
	ck_assert(!r.active);
	ck_assert_uint_eq(r.credits, 0);
	s = stats(p);
	ck_assert_uint_eq(s.free_credits, 2);
	ck_assert_uint_eq(s.in_use, 2);

	pool_give(&r, c1); /* the rest as they are given */
	ck_assert_uint_eq(r.credits, 0);
	s = stats(p);
	ck_assert_uint_eq(s.free_credits, 3);
	ck_assert_uint_eq(s.in_use, 1);
	sleep_ms(50);
	ck_assert(!atomic_load(&t.done));

	pool_give(&r, c2);
	ck_assert_int_eq(resv_join(&t), 0);
	ck_assert_uint_eq(t.r.credits, 4);
	s = stats(p);
	ck_assert_uint_eq(s.free_credits, 0);
	ck_assert_uint_eq(s.in_use, 0);
	pool_release(&t.r);
	pool_destroy(p);
}
END_TEST

/* ---- abort -------------------------------------------------------------- */

START_TEST(test_abort_reserve)
{
	struct pool *p = make_pool(4 * 4 * KiB, 4 * KiB, false);
	struct resv_thread t1, t2;
	struct pool_resv a;

	ck_assert_int_eq(pool_reserve(p, &a, 3, false, NULL), 0);
	resv_start(&t1, p, 2);
	ck_assert(wait_waiters(p, 1, &t1.done));
	resv_start(&t2, p, 1);
	ck_assert(wait_waiters(p, 2, &t2.done));

	/* The head of the line gives up: the next one fits, and goes. */
	atomic_store(&t1.abort, true);
	pool_wake(p);
	ck_assert_int_eq(resv_join(&t1), -ECANCELED);
	ck_assert(!t1.r.active);
	ck_assert_uint_eq(t1.r.credits, 0);
	ck_assert_int_eq(resv_join(&t2), 0);
	ck_assert_uint_eq(stats(p).waiters, 0);
	ck_assert_uint_eq(stats(p).free_credits, 0);

	/* One alone in line, aborted: the line is empty after it. */
	resv_start(&t1, p, 4);
	ck_assert(wait_waiters(p, 1, &t1.done));
	atomic_store(&t1.abort, true);
	pool_wake(p);
	ck_assert_int_eq(resv_join(&t1), -ECANCELED);
	ck_assert_uint_eq(stats(p).waiters, 0);

	pool_release(&a);
	pool_release(&t2.r);
	ck_assert_int_eq(pool_reserve(p, &a, 4, false, NULL), 0);
	pool_release(&a);
	pool_destroy(p);
}
END_TEST

START_TEST(test_abort_take)
{
	struct pool *p = make_pool(2 * 4 * KiB, 4 * KiB, false);
	atomic_bool stop = true;
	struct take_thread tt;
	struct pool_chunk *c;
	struct pool_resv r;

	ck_assert_int_eq(pool_reserve(p, &r, 1, false, NULL), 0);
	c = pool_take(&r, NULL);
	ck_assert_ptr_nonnull(c);

	take_start(&tt, &r);
	sleep_ms(50);
	ck_assert(!atomic_load(&tt.done));
	atomic_store(&tt.abort, true);
	pool_wake(p);
	ck_assert_int_eq(pthread_join(tt.t, NULL), 0);
	ck_assert_ptr_null(tt.c);
	ck_assert_uint_eq(stats(p).in_use, 1);
	ck_assert_ptr_null(pool_take(&r, &stop)); /* already aborted: at once */

	pool_give(&r, c);
	ck_assert_uint_eq(r.credits, 1);
	/* aborted with a credit left: nothing more is taken (the copies stop) */
	ck_assert_ptr_null(pool_take(&r, &stop));
	ck_assert_uint_eq(r.credits, 1);
	ck_assert_uint_eq(stats(p).in_use, 0);
	c = pool_take(&r, NULL);
	ck_assert_ptr_nonnull(c);

	/* Released under a waiting take (an abort path on another thread). */
	take_start(&tt, &r);
	sleep_ms(50);
	ck_assert(!atomic_load(&tt.done));
	pool_release(&r);
	ck_assert_int_eq(pthread_join(tt.t, NULL), 0);
	ck_assert_ptr_null(tt.c);
	ck_assert_uint_eq(stats(p).free_credits, 1);
	pool_give(&r, c);
	ck_assert_uint_eq(r.credits, 0);
	ck_assert_uint_eq(stats(p).free_credits, 2);
	pool_destroy(p);
}
END_TEST

START_TEST(test_stats)
{
	struct pool *p = make_pool(6 * 4 * KiB, 4 * KiB, false);
	struct pool_chunk *c[3];
	struct resv_thread t;
	struct pool_resv r;
	struct pool_stats s;

	ck_assert_int_eq(pool_reserve(p, &r, 4, true, NULL), 0); /* did not have to wait */
	for (int i = 0; i < 3; i++)
		c[i] = pool_take(&r, NULL);
	s = stats(p);
	ck_assert_uint_eq(s.free_credits, 2);
	ck_assert_uint_eq(s.in_use, 3);
	ck_assert_uint_eq(s.waiters, 0);
	ck_assert_uint_eq(s.waits, 0);
	ck_assert_uint_eq(r.credits, 1);
	ck_assert_uint_eq(r.held, 4);

	resv_start(&t, p, 3);
	ck_assert(wait_waiters(p, 1, &t.done));
	s = stats(p);
	ck_assert_uint_eq(s.waiters, 1);
	ck_assert_uint_eq(s.waits, 1);

	pool_give(&r, c[0]);
	s = stats(p);
	ck_assert_uint_eq(s.in_use, 2);
	ck_assert_uint_eq(s.free_credits, 2); /* to r, not the pool */
	ck_assert_uint_eq(r.credits, 2);

	pool_release(&r); /* 2 unused credits: 4 free, the waiter takes 3 */
	ck_assert_int_eq(resv_join(&t), 0);
	s = stats(p);
	ck_assert_uint_eq(s.free_credits, 1);
	ck_assert_uint_eq(s.in_use, 2);
	ck_assert_uint_eq(s.waiters, 0);
	ck_assert_uint_eq(s.waits, 1);

	pool_give(&r, c[1]);
	pool_give(&r, c[2]);
	pool_release(&t.r);
	s = stats(p);
	ck_assert_uint_eq(s.free_credits, 6);
	ck_assert_uint_eq(s.in_use, 0);
	pool_destroy(p);
}
END_TEST

static Suite *pool_suite(void)
{
	Suite *s = suite_create("pool");
	TCase *mem = tcase_create("memory");
	TCase *adm = tcase_create("admission");

	tcase_add_test(mem, test_create_layout);
	tcase_add_test(mem, test_create_bad_options);
	tcase_add_test(mem, test_create_locked);
	tcase_add_test(mem, test_create_lock_refused);
	tcase_add_test(mem, test_create_huge_pages);
	suite_add_tcase(s, mem);

	tcase_add_test(adm, test_reserve_nowait_full);
	tcase_add_test(adm, test_reserve_nowait_behind_waiter);
	tcase_add_test(adm, test_reserve_waits_for_release);
	tcase_add_test(adm, test_reserve_fifo);
	tcase_add_test(adm, test_streaming_take_give);
	tcase_add_test(adm, test_take_waits_for_give);
	tcase_add_test(adm, test_give_after_release);
	tcase_add_test(adm, test_abort_reserve);
	tcase_add_test(adm, test_abort_take);
	tcase_add_test(adm, test_stats);
	suite_add_tcase(s, adm);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(pool_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
