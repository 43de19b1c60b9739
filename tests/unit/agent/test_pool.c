/*
 * The staging pool (agent/pipe/pool.c): its memory (layout, alignment, huge
 * pages, locking and why not), option checks, and admission by windows:
 * a reservation holds at most `want` chunks, is sure of its window
 * (pool_floor), and shares what is beyond the windows oldest first; at most
 * n / 2 are active, more wait FIFO or are refused; "skip" reservations are
 * refused when other groups' chunks leave them no window; chunks go back to
 * the pool, not to the reservation; takes end on abort and on release.
 *
 * Threads stand in for saves and for the I/O thread; they record what
 * happened and the main thread asserts, after joining them. A reservation
 * that waits shows in the pool's stats (waiters). A take that waits is run
 * as a job of a one-at-a-time elastic work queue: pool_take says it waits
 * (workq_wait_begin) only once it has found no chunk for it, and only then
 * does the queue run the next job, so a marker job queued behind it proves
 * that the take returned or waits (take_start). Where a test must show that
 * something is still blocked it waits a little and looks: a wrong pool lets
 * it through in microseconds, so 50 ms is plenty.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent/pipe/pool.h"
#include "ipc/base/work.h"
#include "support/check_main.h"

#define KiB 1024ull
#define MiB (1024ull * 1024)

/* Groups: the checkpoints reservations belong to. */
static const char G1[] = "step 1", G2[] = "step 2", G3[] = "step 3";

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

/* n chunks of 4 KiB, each reservation sure of `window` of them. */
static struct pool *make_wpool(unsigned n, unsigned window)
{
	struct pool_opts o = {.bytes = n * 4 * KiB, .chunk_bytes = 4 * KiB, .window = window};
	char err[IPC_ERRLEN] = "";
	struct pool *p = NULL;
	int rc = pool_create(&o, &p, err);

	ck_assert_msg(rc == 0, "pool_create: %d: %s", rc, err);
	ck_assert_uint_eq(pool_nchunks(p), n);
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

/* Takes with pool_try_take until it says no; returns how many it took. */
static unsigned take_all(struct pool_resv *r, struct pool_chunk **out, unsigned max)
{
	unsigned k = 0;
	struct pool_chunk *c;

	while (k < max && (c = pool_try_take(r)))
		out[k++] = c;
	return k;
}

/* ---- a save, waiting for its reservation on a thread ------------------ */

struct resv_thread {
	struct pool *p;
	unsigned n;
	const void *group;
	struct pool_resv r;
	atomic_bool abort;
	atomic_bool done;
	int rc;
	pthread_t t;
};

static void *resv_main(void *arg)
{
	struct resv_thread *rt = arg;

	rt->rc = pool_reserve(rt->p, &rt->r, rt->n, rt->group, true, &rt->abort, NULL);
	atomic_store(&rt->done, true);
	return NULL;
}

static void resv_start(struct resv_thread *rt, struct pool *p, unsigned n, const void *group)
{
	rt->p = p;
	rt->n = n;
	rt->group = group;
	rt->rc = 1;
	atomic_init(&rt->abort, false);
	atomic_init(&rt->done, false);
	ck_assert_int_eq(pthread_create(&rt->t, NULL, resv_main, rt), 0);
}

/* Joins it, once it has returned (up to 10 s: a wrong pool fails, it does not hang). */
static int resv_join(struct resv_thread *rt)
{
	for (int i = 0; i < 10000 && !atomic_load(&rt->done); i++)
		sleep_ms(1);
	ck_assert_msg(atomic_load(&rt->done), "a reservation still waits");
	ck_assert_int_eq(pthread_join(rt->t, NULL), 0);
	return rt->rc;
}

/* ---- a capture, waiting for a chunk as a job of a work queue ----------- */

#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

/* One job at a time; a job that waits lets the next one run (work.h). */
static struct workq *make_tq(void)
{
	char err[IPC_ERRLEN] = "";
	struct workq *q = NULL;

	ck_assert_msg(workq_create_elastic("tq", 1, 8, &q, err) == 0, "workq: %s", err);
	return q;
}

struct take_job {
	struct work w;
	struct workq *q;
	struct pool_resv *r;
	atomic_bool abort;
	atomic_bool done;
	struct pool_chunk *c;
};

static void take_fn(struct work *w)
{
	struct take_job *j = container_of(w, struct take_job, w);

	j->c = pool_take(j->r, &j->abort, j->q);
	atomic_store(&j->done, true);
}

struct marker {
	struct work w;
	atomic_bool ran;
};

static void marker_fn(struct work *w)
{
	atomic_store(&container_of(w, struct marker, w)->ran, true);
}

/* Holds the queue's one running slot until opened. */
struct gate {
	struct work w;
	atomic_bool open;
};

static void gate_fn(struct work *w)
{
	struct gate *g = container_of(w, struct gate, w);

	while (!atomic_load(&g->open))
		sleep_ms(1);
}

/*
 * Starts a pool_take on r as a job of q, and returns once it has returned
 * or waits (its pool_take found no chunk for it and said so). Behind a
 * gate, so that a marker is queued before the take can run: the queue runs
 * one job at a time and lets the next one (the marker) run only once the
 * take finishes or says it waits.
 */
static void take_start(struct take_job *j, struct workq *q, struct pool_resv *r)
{
	struct gate g = {.w = {.fn = gate_fn}};
	struct marker m = {.w = {.fn = marker_fn}};

	atomic_init(&g.open, false);
	atomic_init(&m.ran, false);
	memset(&j->w, 0, sizeof(j->w));
	j->w.fn = take_fn;
	j->q = q;
	j->r = r;
	j->c = (struct pool_chunk *)r; /* must be overwritten */
	atomic_init(&j->abort, false);
	atomic_init(&j->done, false);
	workq_push(q, &g.w);
	workq_push(q, &j->w);
	workq_push(q, &m.w);
	atomic_store(&g.open, true);
	for (int i = 0; i < 10000 && !atomic_load(&m.ran); i++)
		sleep_ms(1);
	/* (the workers are done with g and m once m has run) */
	ck_assert_msg(atomic_load(&m.ran), "the take neither returned nor waited");
}

/* A take that must be waiting. */
static void assert_waiting(struct take_job *j)
{
	ck_assert_msg(!atomic_load(&j->done), "the take did not wait");
}

/*
 * Waits (up to 10 s) for a take job to return (after a give, an abort, a
 * release: a job that has waited once no longer holds a marker back).
 */
static struct pool_chunk *take_join(struct take_job *j)
{
	for (int i = 0; i < 10000 && !atomic_load(&j->done); i++)
		sleep_ms(1);
	ck_assert_msg(atomic_load(&j->done), "the take is still waiting");
	return j->c;
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
	ck_assert_uint_eq(s.in_use, 0);
	ck_assert_uint_eq(s.active, 0);
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
			res.reserve = pool_reserve(p, &r, 4, NULL, false, NULL, NULL);
			if (res.reserve == 0) {
				struct pool_chunk *c = pool_take(&r, NULL, NULL);

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

/* A counter of /proc/vmstat (-1 if it has none). */
static long vmstat(const char *name)
{
	FILE *f = fopen("/proc/vmstat", "r");
	char key[64];
	long v, found = -1;

	if (!f)
		return -1;
	while (fscanf(f, "%63s %ld", key, &v) == 2)
		if (strcmp(key, name) == 0)
			found = v;
	fclose(f);
	return found;
}

/*
 * With THP in "madvise" mode, huge pages come only to a range advised
 * before it is faulted in: this fails if the pool is populated first. A
 * kernel with no huge page to give at that moment (memory fragmented by
 * the tests beside this one) says so in thp_fault_fallback: then there is
 * nothing to check. A pool populated before the advice never asks for one,
 * so it never gets that excuse.
 */
START_TEST(test_create_huge_pages)
{
	long kib, fell0, fell1;
	struct pool *p;

	if (!thp_mode_is("[madvise]") && !thp_mode_is("[always]")) {
		fprintf(stderr, "test_create_huge_pages: THP is off here; not checked\n");
		return;
	}
	fell0 = vmstat("thp_fault_fallback");
	/* 9 MiB: not a multiple of 2 MiB, which the kernel would align by itself. */
	p = make_pool(9 * MiB, 3 * MiB, false);
	fell1 = vmstat("thp_fault_fallback");
	ck_assert_uint_eq((uintptr_t)pool_chunk_at(p, 0)->buf % (2 * MiB), 0);
	kib = anon_huge_kib(pool_chunk_at(p, 0)->buf);
	if (kib < 2048 && fell0 >= 0 && fell1 > fell0) {
		fprintf(stderr,
		        "test_create_huge_pages: the kernel had no huge page to give "
		        "(thp_fault_fallback +%ld); not checked\n",
		        fell1 - fell0);
		pool_destroy(p);
		return;
	}
	ck_assert_msg(kib >= 2048, "AnonHugePages %ld kB in the pool's mapping", kib);
	pool_destroy(p);
}
END_TEST

/* ---- reservations: arguments, want, windows ---------------------------- */

START_TEST(test_reserve_bad_args)
{
	struct pool *p = make_wpool(4, 2);
	struct pool_resv a;

	ck_assert_int_eq(pool_reserve(p, &a, 0, G1, false, NULL, NULL), -EINVAL);
	ck_assert(!a.active);
	ck_assert_int_eq(pool_reserve(p, &a, 0, G1, true, NULL, NULL), -EINVAL);
	ck_assert_int_eq(pool_reserve(p, &a, 5, G1, false, NULL, NULL), -EINVAL);
	ck_assert_int_eq(pool_reserve(p, &a, 5, G1, true, NULL, NULL), -EINVAL);
	ck_assert(!a.active);
	ck_assert(!a.listed);
	ck_assert_ptr_null(pool_try_take(&a)); /* never admitted: takes nothing */
	ck_assert_ptr_null(pool_take(&a, NULL, NULL));
	pool_release(&a); /* harmless */
	ck_assert(!pool_may_admit(p, G1, 0));
	ck_assert(!pool_may_admit(p, G1, 5));
	ck_assert(pool_may_admit(p, G1, 4));
	ck_assert_uint_eq(stats(p).active, 0);
	ck_assert_uint_eq(stats(p).waits, 0);

	/* The whole pool is a valid want. */
	ck_assert_int_eq(pool_reserve(p, &a, 4, G1, false, NULL, NULL), 0);
	ck_assert(a.active);
	ck_assert_uint_eq(a.want, 4);
	ck_assert_uint_eq(a.held, 0);
	ck_assert_uint_eq(stats(p).active, 1);
	pool_release(&a);
	ck_assert_uint_eq(stats(p).active, 0);
	pool_destroy(p);
}
END_TEST

/* Alone, a reservation takes up to `want` (its window and the surplus), never more. */
START_TEST(test_lone_takes_up_to_want)
{
	struct pool *p = make_wpool(8, 2);
	struct workq *q = make_tq();
	struct pool_chunk *c[8];
	struct take_job j;
	struct pool_resv a;
	bool seen[8] = {false};

	ck_assert_int_eq(pool_reserve(p, &a, 6, G1, false, NULL, NULL), 0);
	ck_assert_uint_eq(pool_floor(&a), 2);
	ck_assert_uint_eq(take_all(&a, c, 8), 6); /* 2 of window, 4 of surplus */
	for (unsigned i = 0; i < 6; i++) {
		ck_assert(!seen[c[i]->index]);
		seen[c[i]->index] = true;
	}
	ck_assert_uint_eq(a.held, 6);
	ck_assert_uint_eq(stats(p).in_use, 6); /* 2 free, but not for a */
	ck_assert_ptr_null(pool_try_take(&a));

	/* A take at `want` waits for one of its own to come back. */
	take_start(&j, q, &a);
	assert_waiting(&j);
	sleep_ms(50);
	ck_assert(!atomic_load(&j.done));
	pool_give(&a, c[5]);
	c[5] = take_join(&j);
	ck_assert_ptr_nonnull(c[5]);
	ck_assert_uint_eq(a.held, 6);
	ck_assert_uint_eq(stats(p).in_use, 6);
	for (unsigned i = 0; i < 6; i++)
		pool_give(&a, c[i]);
	ck_assert_uint_eq(a.held, 0);
	pool_release(&a);

	/* Wanting the whole pool, it gets the whole pool. */
	ck_assert_int_eq(pool_reserve(p, &a, 8, G1, false, NULL, NULL), 0);
	ck_assert_uint_eq(take_all(&a, c, 8), 8);
	ck_assert_ptr_null(pool_try_take(&a));
	ck_assert_uint_eq(stats(p).in_use, 8);
	for (unsigned i = 0; i < 8; i++)
		pool_give(&a, c[i]);
	pool_release(&a);
	ck_assert_uint_eq(stats(p).in_use, 0);
	ck_assert_uint_eq(stats(p).active, 0);
	workq_destroy(q);
	pool_destroy(p);
}
END_TEST

/*
 * The younger is sure of its window however greedy the older one: whether
 * the older takes after the younger came (it stops short of the younger's
 * window) or had taken everything before (what it gives back goes to the
 * younger's window first).
 */
START_TEST(test_younger_gets_window)
{
	struct pool *p = make_wpool(8, 8); /* window 8: n / active decides */
	struct workq *q = make_tq();
	struct pool_chunk *ca[8], *cb[8];
	struct pool_resv a, b;
	struct take_job j;

	ck_assert_int_eq(pool_reserve(p, &a, 8, G1, false, NULL, NULL), 0);
	ck_assert_uint_eq(pool_floor(&a), 8);
	ck_assert_int_eq(pool_reserve(p, &b, 8, G1, false, NULL, NULL), 0);
	ck_assert_uint_eq(pool_floor(&a), 4);
	ck_assert_uint_eq(pool_floor(&b), 4);
	ck_assert_uint_eq(take_all(&a, ca, 8), 4); /* the rest is b's window */
	ck_assert_uint_eq(take_all(&b, cb, 8), 4);
	ck_assert_uint_eq(stats(p).in_use, 8);
	for (unsigned i = 0; i < 4; i++) {
		pool_give(&a, ca[i]);
		pool_give(&b, cb[i]);
	}
	pool_release(&b);

	/* a alone takes all 8; b comes, and its takes wait for a's gives. */
	ck_assert_uint_eq(take_all(&a, ca, 8), 8);
	ck_assert_int_eq(pool_reserve(p, &b, 8, G1, false, NULL, NULL), 0); /* same group */
	ck_assert_uint_eq(pool_floor(&b), 4);
	ck_assert_ptr_null(pool_try_take(&b));
	take_start(&j, q, &b);
	assert_waiting(&j);
	pool_give(&a, ca[7]);
	/* a is above its window of 4 now: the chunk is b's, whoever asks first */
	ck_assert_ptr_null(pool_try_take(&a));
	cb[0] = take_join(&j);
	ck_assert_ptr_eq(cb[0], ca[7]);
	ck_assert_uint_eq(b.held, 1);
	for (unsigned i = 6; i >= 4; i--) {
		pool_give(&a, ca[i]);
		ck_assert_ptr_null(pool_try_take(&a));
		cb[7 - i] = pool_try_take(&b);
		ck_assert_ptr_eq(cb[7 - i], ca[i]);
	}
	ck_assert_uint_eq(a.held, 4);
	ck_assert_uint_eq(b.held, 4);
	/* And a's window is as sure: b, at its own, cannot take what a is owed. */
	pool_give(&a, ca[3]);
	ck_assert_ptr_null(pool_try_take(&b));
	ca[3] = pool_try_take(&a);
	ck_assert_ptr_nonnull(ca[3]);

	for (unsigned i = 0; i < 4; i++) {
		pool_give(&a, ca[i]);
		pool_give(&b, cb[i]);
	}
	pool_release(&a);
	pool_release(&b);
	ck_assert_uint_eq(stats(p).in_use, 0);
	workq_destroy(q);
	pool_destroy(p);
}
END_TEST

/*
 * Beyond the windows, the oldest that waits goes first: a younger one at
 * its window may not take a surplus chunk while an older one waits in
 * pool_take for it; it may when the older one is not waiting, or waits
 * only because it holds its `want` already.
 */
START_TEST(test_age_priority)
{
	struct pool *p = make_wpool(8, 2);
	struct workq *q = make_tq();
	struct pool_chunk *ca[8], *cb[8];
	struct pool_resv a, b;
	struct take_job j;
	unsigned na, nb;

	ck_assert_int_eq(pool_reserve(p, &a, 8, G1, false, NULL, NULL), 0);
	ck_assert_int_eq(pool_reserve(p, &b, 8, G1, false, NULL, NULL), 0);
	na = take_all(&a, ca, 8);
	ck_assert_uint_eq(na, 6); /* all but b's window of 2 */
	nb = take_all(&b, cb, 8);
	ck_assert_uint_eq(nb, 2);

	/* Several rounds: a wrong pool would let b win most of them. */
	for (int round = 0; round < 5; round++) {
		take_start(&j, q, &a);
		assert_waiting(&j);
		pool_give(&a, ca[--na]); /* one surplus chunk free: a's, as it waits */
		ck_assert_msg(!pool_try_take(&b), "round %d: b overtook the older a", round);
		ca[na] = take_join(&j);
		ck_assert_ptr_nonnull(ca[na]);
		na++;
		ck_assert_uint_eq(a.held, 6);
		ck_assert_uint_eq(b.held, 2);
	}

	/* a not waiting: the surplus chunk goes to b, who asks. */
	pool_give(&a, ca[--na]);
	cb[nb] = pool_try_take(&b);
	ck_assert_ptr_nonnull(cb[nb]);
	nb++;
	ck_assert_uint_eq(b.held, 3);
	while (na)
		pool_give(&a, ca[--na]);
	while (nb)
		pool_give(&b, cb[--nb]);
	pool_release(&a);
	pool_release(&b);

	/* a waits, but at its want: it is owed nothing, b may take. */
	ck_assert_int_eq(pool_reserve(p, &a, 4, G1, false, NULL, NULL), 0);
	ck_assert_int_eq(pool_reserve(p, &b, 8, G1, false, NULL, NULL), 0);
	ck_assert_uint_eq(take_all(&a, ca, 8), 4);
	ck_assert_uint_eq(take_all(&b, cb, 8), 4);
	take_start(&j, q, &a);
	assert_waiting(&j);
	pool_give(&b, cb[3]);
	cb[3] = pool_try_take(&b);
	ck_assert_msg(cb[3] != NULL, "b was held back for a, which wants no more");
	/* a's own give lets its take go */
	pool_give(&a, ca[3]);
	ca[3] = take_join(&j);
	ck_assert_ptr_nonnull(ca[3]);
	for (unsigned i = 0; i < 4; i++) {
		pool_give(&a, ca[i]);
		pool_give(&b, cb[i]);
	}
	pool_release(&a);
	pool_release(&b);
	ck_assert_uint_eq(stats(p).in_use, 0);
	workq_destroy(q);
	pool_destroy(p);
}
END_TEST

/*
 * A release frees the windows it was owed all at once: the oldest waiting
 * take gets the first chunk, and, having it, lets the younger one held back
 * behind it take the next.
 */
START_TEST(test_release_wakes_takers)
{
	struct pool *p = make_wpool(8, 2);
	struct workq *q = make_tq();
	struct pool_chunk *ca[8], *cb[8];
	struct pool_resv a, b, c;
	struct take_job ja, jb;
	unsigned na, nb;

	ck_assert_int_eq(pool_reserve(p, &a, 8, G1, false, NULL, NULL), 0);
	ck_assert_int_eq(pool_reserve(p, &b, 8, G1, false, NULL, NULL), 0);
	for (int round = 0; round < 5; round++) {
		ck_assert_int_eq(pool_reserve(p, &c, 8, G1, false, NULL, NULL), 0);
		if (round == 0) {
			/* 2 of window, 2 beyond: b and c are owed 2 each */
			na = take_all(&a, ca, 8);
			ck_assert_uint_eq(na, 4);
			nb = take_all(&b, cb, 8);
			ck_assert_uint_eq(nb, 2);
		}
		/* 2 free, both c's window: b and a wait (b first: woken first, it must yield) */
		take_start(&jb, q, &b);
		assert_waiting(&jb);
		take_start(&ja, q, &a);
		assert_waiting(&ja);
		pool_release(&c);
		ca[na++] = take_join(&ja);
		ck_assert_ptr_nonnull(ca[na - 1]);
		cb[nb++] = take_join(&jb);
		ck_assert_msg(cb[nb - 1] != NULL, "round %d", round);
		ck_assert_uint_eq(stats(p).in_use, 8);
		pool_give(&a, ca[--na]);
		pool_give(&b, cb[--nb]);
	}
	while (na)
		pool_give(&a, ca[--na]);
	while (nb)
		pool_give(&b, cb[--nb]);
	pool_release(&a);
	pool_release(&b);
	ck_assert_uint_eq(stats(p).in_use, 0);
	workq_destroy(q);
	pool_destroy(p);
}
END_TEST

/*
 * Windows shrink as reservations come (the option's window, then n /
 * active, never below 2, never above want) and grow back as they go; a
 * grown window is as sure as the others.
 */
START_TEST(test_windows_shrink_and_grow)
{
	static const unsigned expect[7] = {0, 5, 5, 4, 3, 2, 2}; /* n 12, window 5 */
	struct pool *p = make_wpool(12, 5);
	struct pool_chunk *c[6][12];
	struct pool_resv r[6], small;
	unsigned held[6];

	for (unsigned k = 0; k < 6; k++) {
		ck_assert_int_eq(pool_reserve(p, &r[k], 12, G1, false, NULL, NULL), 0);
		ck_assert_uint_eq(stats(p).active, k + 1);
		for (unsigned i = 0; i <= k; i++)
			ck_assert_msg(pool_floor(&r[i]) == expect[k + 1],
			              "%u active: r%u's window %u, not %u", k + 1, i,
			              pool_floor(&r[i]), expect[k + 1]);
	}
	ck_assert_uint_eq(stats(p).active, 6); /* n / 2: full */

	/* Each takes greedily, oldest first: none can eat into a younger window. */
	for (unsigned k = 0; k < 6; k++) {
		held[k] = take_all(&r[k], c[k], 12);
		ck_assert_uint_eq(held[k], 2);
	}
	ck_assert_uint_eq(stats(p).in_use, 12);

	/* r5 goes (5 active: still 2 each); r4 goes (4 active: 3 each). */
	for (unsigned k = 5; k >= 4; k--) {
		pool_release(&r[k]);
		while (held[k])
			pool_give(&r[k], c[k][--held[k]]);
	}
	ck_assert_uint_eq(stats(p).active, 4);
	for (unsigned i = 0; i < 4; i++)
		ck_assert_uint_eq(pool_floor(&r[i]), 3);
	/* 4 free: r0 takes its third; not a fourth, the three others are owed one each */
	c[0][held[0]] = pool_try_take(&r[0]);
	ck_assert_ptr_nonnull(c[0][held[0]]);
	held[0]++;
	ck_assert_ptr_null(pool_try_take(&r[0]));
	for (unsigned i = 1; i < 4; i++) {
		c[i][held[i]] = pool_try_take(&r[i]);
		ck_assert_ptr_nonnull(c[i][held[i]]);
		held[i]++;
		ck_assert_ptr_null(pool_try_take(&r[i]));
	}

	/* Back to one: 5, the option's window. */
	for (unsigned k = 3; k >= 1; k--) {
		pool_release(&r[k]);
		ck_assert_uint_eq(pool_floor(&r[0]), expect[k]);
		while (held[k])
			pool_give(&r[k], c[k][--held[k]]);
	}
	ck_assert_uint_eq(stats(p).active, 1);

	/* A small want caps the window; and 1 chunk is a valid window. */
	ck_assert_int_eq(pool_reserve(p, &small, 3, G1, false, NULL, NULL), 0);
	ck_assert_uint_eq(pool_floor(&small), 3);
	ck_assert_uint_eq(pool_floor(&r[0]), 5);
	pool_release(&small);
	ck_assert_int_eq(pool_reserve(p, &small, 1, G1, false, NULL, NULL), 0);
	ck_assert_uint_eq(pool_floor(&small), 1);
	pool_release(&small);

	while (held[0])
		pool_give(&r[0], c[0][--held[0]]);
	pool_release(&r[0]);
	ck_assert_uint_eq(stats(p).in_use, 0);
	ck_assert_uint_eq(stats(p).active, 0);
	pool_destroy(p);

	/* No window option: 2, the least (one filled while one is written). */
	p = make_wpool(4, 0);
	ck_assert_int_eq(pool_reserve(p, &small, 4, G1, false, NULL, NULL), 0);
	ck_assert_uint_eq(pool_floor(&small), 2);
	pool_release(&small);
	pool_destroy(p);
}
END_TEST

/* ---- reservations: at most n / 2 active, FIFO, abort -------------------- */

START_TEST(test_max_active)
{
	struct pool *p = make_wpool(8, 2);
	struct resv_thread t;
	struct pool_resv r[4], x;
	struct pool_stats s;

	for (unsigned i = 0; i < 4; i++)
		ck_assert_int_eq(pool_reserve(p, &r[i], 2, G1, false, NULL, NULL), 0);
	/* 8 chunks, 4 active: no room for a fifth, free chunks or not */
	ck_assert_uint_eq(stats(p).in_use, 0);
	ck_assert(!pool_may_admit(p, G1, 1));
	ck_assert_int_eq(pool_reserve(p, &x, 1, G1, false, NULL, NULL), -EAGAIN);
	ck_assert(!x.active);
	s = stats(p);
	ck_assert_uint_eq(s.active, 4);
	ck_assert_uint_eq(s.waiters, 0);
	ck_assert_uint_eq(s.waits, 0);

	resv_start(&t, p, 2, G2);
	ck_assert(wait_waiters(p, 1, &t.done));
	sleep_ms(50);
	ck_assert(!atomic_load(&t.done));
	s = stats(p);
	ck_assert_uint_eq(s.active, 4);
	ck_assert_uint_eq(s.waiters, 1);
	ck_assert_uint_eq(s.waits, 1);

	/* One goes: the waiter comes in. */
	pool_release(&r[0]);
	ck_assert_int_eq(resv_join(&t), 0);
	ck_assert(t.r.active);
	s = stats(p);
	ck_assert_uint_eq(s.active, 4);
	ck_assert_uint_eq(s.waiters, 0);
	ck_assert_uint_eq(s.waits, 1);

	/* Admitted without waiting: wait true does not count as a wait. */
	pool_release(&r[1]);
	ck_assert(pool_may_admit(p, G1, 1));
	ck_assert_uint_eq(stats(p).active, 3); /* may_admit reserves nothing */
	ck_assert_int_eq(pool_reserve(p, &r[1], 2, G1, true, NULL, NULL), 0);
	ck_assert_uint_eq(stats(p).waits, 1);

	pool_release(&t.r);
	for (unsigned i = 1; i < 4; i++)
		pool_release(&r[i]);
	ck_assert_uint_eq(stats(p).active, 0);
	pool_destroy(p);
}
END_TEST

/*
 * A "skip" reservation never overtakes one waiting in line: right after a
 * release it is refused, whether the waiter is still in line or already
 * in. (A wrong pool lets it through whenever this thread is quicker than
 * the waiter's wake-up: most rounds.)
 */
#define OVERTAKE_ROUNDS 20

START_TEST(test_skip_never_overtakes)
{
	struct pool *p = make_wpool(8, 2);
	struct resv_thread *t = calloc(OVERTAKE_ROUNDS, sizeof(*t));
	struct pool_resv r[4], *in[4], x;
	unsigned lost = 0;

	ck_assert_ptr_nonnull(t);
	for (unsigned i = 0; i < 4; i++) {
		ck_assert_int_eq(pool_reserve(p, &r[i], 2, G1, false, NULL, NULL), 0);
		in[i] = &r[i];
	}
	for (unsigned k = 0; k < OVERTAKE_ROUNDS; k++) {
		int rc;

		resv_start(&t[k], p, 2, G2);
		ck_assert(wait_waiters(p, 1, &t[k].done));
		pool_release(in[k % 4]);
		rc = pool_reserve(p, &x, 1, G1, false, NULL, NULL);
		if (rc == 0) {
			lost++;
			pool_release(&x);
		} else {
			ck_assert_int_eq(rc, -EAGAIN);
		}
		ck_assert_int_eq(resv_join(&t[k]), 0);
		in[k % 4] = &t[k].r;
	}
	ck_assert_msg(lost == 0, "a skip overtook the waiter in %u of %d rounds", lost,
	              OVERTAKE_ROUNDS);
	ck_assert_uint_eq(stats(p).waits, OVERTAKE_ROUNDS);
	for (unsigned i = 0; i < 4; i++)
		pool_release(in[i]);
	ck_assert_uint_eq(stats(p).active, 0);
	free(t);
	pool_destroy(p);
}
END_TEST

/* Waiters are admitted in the order they came, one per release. */
START_TEST(test_reserve_fifo)
{
	struct pool *p = make_wpool(4, 2);
	struct resv_thread t[13];
	struct pool_resv a, b;

	ck_assert_int_eq(pool_reserve(p, &a, 1, G1, false, NULL, NULL), 0);
	ck_assert_int_eq(pool_reserve(p, &b, 2, G1, false, NULL, NULL), 0);
	/* the first wants the whole pool, the others a chunk: order, not size, decides */
	resv_start(&t[0], p, 4, G2);
	ck_assert(wait_waiters(p, 1, &t[0].done));
	resv_start(&t[1], p, 1, G1);
	ck_assert(wait_waiters(p, 2, &t[1].done));
	resv_start(&t[2], p, 1, G3);
	ck_assert(wait_waiters(p, 3, &t[2].done));

	pool_release(&a);
	ck_assert_int_eq(resv_join(&t[0]), 0);
	sleep_ms(50);
	ck_assert_msg(!atomic_load(&t[1].done) && !atomic_load(&t[2].done),
	              "a later waiter went with the first");
	ck_assert_uint_eq(stats(p).waiters, 2);

	pool_release(&b);
	ck_assert_int_eq(resv_join(&t[1]), 0);
	sleep_ms(50);
	ck_assert(!atomic_load(&t[2].done));
	ck_assert_uint_eq(stats(p).waiters, 1);

	pool_release(&t[0].r);
	ck_assert_int_eq(resv_join(&t[2]), 0);
	ck_assert_uint_eq(stats(p).waiters, 0);
	ck_assert_uint_eq(stats(p).waits, 3);
	ck_assert_uint_eq(stats(p).active, 2);

	/*
	 * Two released at once: both waiters come in (the first in wakes the
	 * next, which may have looked, and gone back to sleep, before).
	 */
	for (unsigned round = 0, in1 = 1, in2 = 2; round < 5; round++) {
		unsigned w1 = 3 + 2 * round, w2 = w1 + 1;

		resv_start(&t[w1], p, 2, G1);
		ck_assert(wait_waiters(p, 1, &t[w1].done));
		resv_start(&t[w2], p, 2, G2);
		ck_assert(wait_waiters(p, 2, &t[w2].done));
		pool_release(&t[in1].r);
		pool_release(&t[in2].r);
		ck_assert_int_eq(resv_join(&t[w1]), 0);
		ck_assert_int_eq(resv_join(&t[w2]), 0);
		ck_assert_uint_eq(stats(p).active, 2);
		ck_assert_uint_eq(stats(p).waiters, 0);
		in1 = w1;
		in2 = w2;
	}
	pool_release(&t[11].r);
	pool_release(&t[12].r);
	ck_assert_uint_eq(stats(p).active, 0);
	pool_destroy(p);
}
END_TEST

/* An aborted waiter leaves the line (at its head or behind); the others keep their places. */
START_TEST(test_abort_reserve)
{
	struct pool *p = make_wpool(4, 2);
	struct resv_thread t[4];
	struct pool_resv a, b;

	ck_assert_int_eq(pool_reserve(p, &a, 2, G1, false, NULL, NULL), 0);
	ck_assert_int_eq(pool_reserve(p, &b, 2, G1, false, NULL, NULL), 0);
	resv_start(&t[0], p, 2, G1);
	ck_assert(wait_waiters(p, 1, &t[0].done));
	resv_start(&t[1], p, 2, G1);
	ck_assert(wait_waiters(p, 2, &t[1].done));

	/* The head gives up: the next is head now, but there is still no room. */
	atomic_store(&t[0].abort, true);
	pool_wake(p);
	ck_assert_int_eq(resv_join(&t[0]), -ECANCELED);
	ck_assert(!t[0].r.active);
	ck_assert(!t[0].r.listed);
	ck_assert_uint_eq(stats(p).waiters, 1);
	ck_assert_uint_eq(stats(p).active, 2);
	sleep_ms(50);
	ck_assert(!atomic_load(&t[1].done));

	/* One behind the head gives up: the head stays. */
	resv_start(&t[2], p, 2, G1);
	ck_assert(wait_waiters(p, 2, &t[2].done));
	atomic_store(&t[2].abort, true);
	pool_wake(p);
	ck_assert_int_eq(resv_join(&t[2]), -ECANCELED);
	ck_assert_uint_eq(stats(p).waiters, 1);
	sleep_ms(50);
	ck_assert(!atomic_load(&t[1].done));

	pool_release(&a);
	ck_assert_int_eq(resv_join(&t[1]), 0);
	ck_assert_uint_eq(stats(p).waiters, 0);
	ck_assert_uint_eq(stats(p).active, 2);
	ck_assert_uint_eq(stats(p).waits, 3);

	/* One alone in line, aborted: the line is empty after it, and a skip goes. */
	resv_start(&t[3], p, 4, G1);
	ck_assert(wait_waiters(p, 1, &t[3].done));
	atomic_store(&t[3].abort, true);
	pool_wake(p);
	ck_assert_int_eq(resv_join(&t[3]), -ECANCELED);
	ck_assert_uint_eq(stats(p).waiters, 0);
	pool_release(&b);
	ck_assert_int_eq(pool_reserve(p, &a, 4, G1, false, NULL, NULL), 0);
	pool_release(&a);
	pool_release(&t[1].r);
	ck_assert_uint_eq(stats(p).active, 0);
	pool_destroy(p);
}
END_TEST

/* ---- groups --------------------------------------------------------------- */

/*
 * A "skip" reservation is refused while other groups' chunks (taken, by
 * active or released reservations) leave it less than its window; its own
 * group's never count. A waiting one is admitted anyway, and its takes wait.
 */
START_TEST(test_groups)
{
	struct pool *p = make_wpool(8, 2);
	struct workq *q = make_tq();
	struct pool_chunk *ca[8], *cb[8], *cc;
	struct pool_resv a, b, c, x;
	struct take_job j;
	unsigned na;

	ck_assert_int_eq(pool_reserve(p, &a, 8, G1, false, NULL, NULL), 0);
	for (na = 0; na < 7; na++)
		ca[na] = pool_try_take(&a);
	ck_assert_uint_eq(stats(p).in_use, 7);

	/* G2: 1 chunk free, its window would be 2 */
	ck_assert(!pool_may_admit(p, G2, 2));
	ck_assert(!pool_may_admit(p, G2, 8));
	ck_assert_int_eq(pool_reserve(p, &x, 2, G2, false, NULL, NULL), -EAGAIN);
	ck_assert(!x.active);
	ck_assert_uint_eq(stats(p).active, 1);
	ck_assert_uint_eq(stats(p).waits, 0);
	/* a window of 1 (want 1) fits */
	ck_assert(pool_may_admit(p, G2, 1));
	/* G1: its own chunks do not count */
	ck_assert(pool_may_admit(p, G1, 8));
	ck_assert_int_eq(pool_reserve(p, &b, 8, G1, false, NULL, NULL), 0);
	ck_assert_uint_eq(take_all(&b, cb, 8), 1);
	/* and b's chunks are G1's too: G2 is still out, G1 still in */
	ck_assert(!pool_may_admit(p, G2, 2));
	ck_assert(!pool_may_admit(p, G2, 1));
	ck_assert(pool_may_admit(p, G1, 2));

	/* G2 that may wait: admitted at once (room for 4), its take waits for a give */
	ck_assert_int_eq(pool_reserve(p, &c, 2, G2, true, NULL, NULL), 0);
	ck_assert(c.active);
	ck_assert_uint_eq(stats(p).waits, 0);
	ck_assert_ptr_null(pool_try_take(&c));
	take_start(&j, q, &c);
	assert_waiting(&j);
	pool_give(&a, ca[--na]);
	cc = take_join(&j);
	ck_assert_ptr_nonnull(cc);
	ck_assert_uint_eq(c.held, 1);

	/* a released with its 6 still out: they still count against other groups */
	pool_release(&a);
	ck_assert_uint_eq(stats(p).active, 2);
	ck_assert_uint_eq(stats(p).in_use, 8);
	ck_assert(!pool_may_admit(p, G3, 2));
	ck_assert_int_eq(pool_reserve(p, &x, 2, G3, false, NULL, NULL), -EAGAIN);
	pool_give(&a, ca[--na]); /* 1 free */
	ck_assert(!pool_may_admit(p, G3, 2));
	pool_give(&a, ca[--na]); /* 2 free: G3's window */
	ck_assert(pool_may_admit(p, G3, 2));
	ck_assert_int_eq(pool_reserve(p, &x, 2, G3, false, NULL, NULL), 0);
	pool_release(&x);
	while (na)
		pool_give(&a, ca[--na]);
	ck_assert(!a.listed);

	pool_give(&b, cb[0]);
	pool_give(&c, cc);
	pool_release(&b);
	pool_release(&c);
	ck_assert_uint_eq(stats(p).in_use, 0);
	ck_assert_uint_eq(stats(p).active, 0);
	workq_destroy(q);
	pool_destroy(p);

	/*
	 * The window asked of the free chunks is the one it will have once in
	 * (n / 2 = 4 here, with one other active), not the whole pool it would
	 * have alone.
	 */
	p = make_wpool(8, 8);
	ck_assert_int_eq(pool_reserve(p, &a, 8, G1, false, NULL, NULL), 0);
	ck_assert_uint_eq(take_all(&a, ca, 5), 5);
	ck_assert(!pool_may_admit(p, G2, 8)); /* 3 free */
	pool_give(&a, ca[4]);
	ck_assert(pool_may_admit(p, G2, 8)); /* 4 free */
	ck_assert_int_eq(pool_reserve(p, &x, 8, G2, false, NULL, NULL), 0);
	ck_assert_uint_eq(pool_floor(&x), 4);
	ck_assert_uint_eq(take_all(&x, cb, 8), 4);
	for (unsigned i = 0; i < 4; i++) {
		pool_give(&a, ca[i]);
		pool_give(&x, cb[i]);
	}
	pool_release(&a);
	pool_release(&x);
	pool_destroy(p);
}
END_TEST

/* ---- give and release ---------------------------------------------------- */

/* A given chunk goes back to the pool: another reservation may take it. */
START_TEST(test_give_returns_to_pool)
{
	struct pool *p = make_wpool(4, 2);
	struct pool_chunk *ca[4], *cb[4];
	struct pool_resv a, b;

	ck_assert_int_eq(pool_reserve(p, &a, 4, G1, false, NULL, NULL), 0);
	ck_assert_uint_eq(take_all(&a, ca, 4), 4);
	ck_assert_int_eq(pool_reserve(p, &b, 4, G1, false, NULL, NULL), 0);
	ck_assert_ptr_null(pool_try_take(&b));

	pool_give(&a, ca[3]);
	ck_assert_uint_eq(a.held, 3);
	ck_assert_uint_eq(stats(p).in_use, 3);
	cb[0] = pool_try_take(&b);
	ck_assert_ptr_eq(cb[0], ca[3]);
	ck_assert_uint_eq(b.held, 1);
	ck_assert_uint_eq(stats(p).in_use, 4);

	pool_give(&a, ca[2]);
	ck_assert_ptr_null(pool_try_take(&a)); /* b's window, not a's */
	cb[1] = pool_try_take(&b);
	ck_assert_ptr_eq(cb[1], ca[2]);

	/* and b's, once given, come back to a, below its window now */
	pool_give(&a, ca[1]);
	pool_give(&a, ca[0]);
	ck_assert_uint_eq(a.held, 0);
	pool_give(&b, cb[1]);
	ck_assert_ptr_eq(pool_try_take(&a), cb[1]);
	ck_assert_uint_eq(a.held, 1);
	ck_assert_uint_eq(b.held, 1);
	pool_give(&a, cb[1]);
	pool_give(&b, cb[0]);
	pool_release(&a);
	pool_release(&b);
	ck_assert_uint_eq(stats(p).in_use, 0);
	pool_destroy(p);
}
END_TEST

/*
 * A released reservation takes nothing more; its chunks still out come
 * back as given, and it leaves the pool's list with the last of them.
 */
START_TEST(test_release_with_chunks_out)
{
	struct pool *p = make_wpool(8, 2);
	struct pool_chunk *ca[8], *cb[2], *cc[2];
	struct pool_resv a, b, c;
	struct pool_stats s;
	unsigned na;

	ck_assert_int_eq(pool_reserve(p, &a, 8, G1, false, NULL, NULL), 0);
	ck_assert_int_eq(pool_reserve(p, &b, 8, G1, false, NULL, NULL), 0);
	ck_assert_int_eq(pool_reserve(p, &c, 8, G2, false, NULL, NULL), 0);
	na = take_all(&a, ca, 2); /* windows only */
	ck_assert_uint_eq(take_all(&b, cb, 2), 2);
	ck_assert_uint_eq(take_all(&c, cc, 2), 2);
	ck_assert_ptr_eq(a.next, &b);
	ck_assert_ptr_eq(c.prev, &b);

	pool_release(&b);
	s = stats(p);
	ck_assert_uint_eq(s.active, 2);
	ck_assert_uint_eq(s.in_use, 6);
	ck_assert(!b.active);
	ck_assert(b.listed);
	ck_assert_uint_eq(b.held, 2);
	ck_assert_ptr_null(pool_try_take(&b));
	ck_assert_ptr_null(pool_take(&b, NULL, NULL)); /* at once */
	pool_release(&b); /* twice: nothing changes */
	ck_assert_uint_eq(stats(p).active, 2);

	pool_give(&b, cb[0]);
	ck_assert_uint_eq(stats(p).in_use, 5);
	ck_assert(b.listed);
	pool_give(&b, cb[1]);
	ck_assert_uint_eq(stats(p).in_use, 4);
	ck_assert_uint_eq(b.held, 0);
	ck_assert(!b.listed);
	ck_assert_ptr_eq(a.next, &c);
	ck_assert_ptr_eq(c.prev, &a);
	ck_assert_uint_eq(stats(p).active, 2);

	/* Its chunks are the pool's: a takes the surplus (c is at its window). */
	na += take_all(&a, ca + na, 6);
	ck_assert_uint_eq(na, 6);
	ck_assert_uint_eq(stats(p).in_use, 8);

	/* Released with nothing out: off the list at once. */
	pool_give(&c, cc[0]);
	pool_give(&c, cc[1]);
	ck_assert(c.listed);
	pool_release(&c);
	ck_assert(!c.listed);
	ck_assert_ptr_null(a.next);
	while (na)
		pool_give(&a, ca[--na]);
	pool_release(&a);
	s = stats(p);
	ck_assert_uint_eq(s.active, 0);
	ck_assert_uint_eq(s.in_use, 0);
	pool_destroy(p);
}
END_TEST

/* ---- takes that must not wait, or stop waiting ---------------------------- */

START_TEST(test_take_abort_release_try)
{
	struct pool *p = make_wpool(4, 2);
	struct workq *q = make_tq();
	struct pool_chunk *ca[4], *cb[4], *c;
	atomic_bool stop = true;
	struct pool_resv a, b;
	struct take_job j;

	ck_assert_int_eq(pool_reserve(p, &a, 4, G1, false, NULL, NULL), 0);
	ck_assert_int_eq(pool_reserve(p, &b, 4, G1, false, NULL, NULL), 0);
	ck_assert_uint_eq(take_all(&a, ca, 4), 2);
	ck_assert_uint_eq(take_all(&b, cb, 4), 2);
	/* nothing free: try_take says no at once (it would hang the test otherwise) */
	ck_assert_ptr_null(pool_try_take(&a));
	ck_assert_ptr_null(pool_try_take(&b));

	/* A waiting take, aborted. */
	take_start(&j, q, &a);
	assert_waiting(&j);
	atomic_store(&j.abort, true);
	pool_wake(p);
	ck_assert_ptr_null(take_join(&j));
	ck_assert_uint_eq(a.held, 2);
	ck_assert_uint_eq(stats(p).in_use, 4);

	/* Already aborted: NULL at once, even with a chunk free for it. */
	pool_give(&a, ca[1]);
	ck_assert_ptr_null(pool_take(&a, &stop, NULL));
	ck_assert_uint_eq(a.held, 1);
	ca[1] = pool_take(&a, NULL, NULL);
	ck_assert_ptr_nonnull(ca[1]);

	/* A waiting take, its reservation released from this thread. */
	take_start(&j, q, &a);
	assert_waiting(&j);
	pool_release(&a);
	ck_assert_ptr_null(take_join(&j));
	ck_assert_uint_eq(stats(p).in_use, 4);
	pool_give(&a, ca[0]);
	ck_assert_ptr_null(pool_try_take(&a)); /* released: a chunk is free, not for it */
	c = pool_try_take(&b); /* b's: the only one active */
	ck_assert_ptr_nonnull(c);
	pool_give(&a, ca[1]);
	ck_assert(!a.listed);
	pool_give(&b, c);
	pool_give(&b, cb[0]);
	pool_give(&b, cb[1]);
	pool_release(&b);
	ck_assert_uint_eq(stats(p).in_use, 0);
	ck_assert_uint_eq(stats(p).active, 0);
	workq_destroy(q);
	pool_destroy(p);
}
END_TEST

/* ---- stress --------------------------------------------------------------- */

#define ST_N 8
#define ST_THREADS 6 /* more than ST_N / 2: some wait to be admitted */
#define ST_ROUNDS 25
#define ST_TAKES 40

struct st_resv {
	struct pool_resv r;
	atomic_uint out; /* taken and not yet being given back */
};

struct st_item {
	struct st_resv *sr;
	struct pool_chunk *c;
	uint64_t tag;
};

struct stress {
	struct pool *p;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct st_item q[ST_THREADS * ST_TAKES + 1];
	unsigned head, tail, count;
	unsigned takers_left;
	atomic_bool chunk_out[ST_N];
	/* results */
	atomic_uint over_want, double_take, over_n, bad_tag, reserve_err, completed, null_take;
};

struct st_taker {
	struct stress *st;
	unsigned id;
	struct st_resv rs[ST_ROUNDS];
	pthread_t t;
};

static void st_push(struct stress *st, struct st_item it)
{
	pthread_mutex_lock(&st->mu);
	st->q[st->tail] = it;
	st->tail = (st->tail + 1) % (sizeof(st->q) / sizeof(st->q[0]));
	st->count++;
	pthread_cond_signal(&st->cv);
	pthread_mutex_unlock(&st->mu);
}

static void *st_taker_main(void *arg)
{
	static const void *const groups[] = {G1, G2, G3};
	struct st_taker *tk = arg;
	struct stress *st = tk->st;
	unsigned seed = 1234 + tk->id;

	for (unsigned round = 0; round < ST_ROUNDS; round++) {
		struct st_resv *sr = &tk->rs[round];
		unsigned want = 1 + (unsigned)rand_r(&seed) % ST_N;
		const void *group = groups[tk->id % 3];
		int rc = -EAGAIN;

		atomic_init(&sr->out, 0);
		/* Every third round a "skip" first, as the agent's skip policy does. */
		if (round % 3 == 0)
			rc = pool_reserve(st->p, &sr->r, want, group, false, NULL, NULL);
		if (rc == -EAGAIN)
			rc = pool_reserve(st->p, &sr->r, want, group, true, NULL, NULL);
		if (rc) {
			atomic_fetch_add(&st->reserve_err, 1);
			continue;
		}
		for (unsigned k = 0; k < ST_TAKES; k++) {
			struct pool_chunk *c = NULL;
			struct pool_stats s;
			uint64_t tag = ((uint64_t)tk->id << 32) | (round << 16) | k;

			if (k % 4 == 0)
				c = pool_try_take(&sr->r);
			if (!c)
				c = pool_take(&sr->r, NULL, NULL);
			if (!c) {
				atomic_fetch_add(&st->null_take, 1);
				break;
			}
			if (atomic_exchange(&st->chunk_out[c->index], true))
				atomic_fetch_add(&st->double_take, 1);
			if (atomic_fetch_add(&sr->out, 1) + 1 > want)
				atomic_fetch_add(&st->over_want, 1);
			pool_get_stats(st->p, &s);
			if (s.in_use > ST_N)
				atomic_fetch_add(&st->over_n, 1);
			memcpy(c->buf, &tag, sizeof(tag)); /* a capture: the chunk is ours */
			if (rand_r(&seed) % 8 == 0)
				sched_yield();
			st_push(st, (struct st_item){sr, c, tag});
		}
		/* Released with chunks still being written: they come back as given. */
		pool_release(&sr->r);
		atomic_fetch_add(&st->completed, 1);
	}
	pthread_mutex_lock(&st->mu);
	st->takers_left--;
	pthread_cond_signal(&st->cv);
	pthread_mutex_unlock(&st->mu);
	return NULL;
}

/* The I/O thread: "writes" each chunk, then gives it back. */
static void *st_io_main(void *arg)
{
	struct stress *st = arg;
	unsigned seed = 99, i = 0;

	for (;;) {
		struct st_item it;
		uint64_t tag;

		pthread_mutex_lock(&st->mu);
		while (!st->count && st->takers_left)
			pthread_cond_wait(&st->cv, &st->mu);
		if (!st->count) {
			pthread_mutex_unlock(&st->mu);
			break;
		}
		it = st->q[st->head];
		st->head = (st->head + 1) % (sizeof(st->q) / sizeof(st->q[0]));
		st->count--;
		pthread_mutex_unlock(&st->mu);

		memcpy(&tag, it.c->buf, sizeof(tag));
		if (tag != it.tag)
			atomic_fetch_add(&st->bad_tag, 1);
		if (++i % 16 == 0)
			sleep_ms(0 + (rand_r(&seed) % 2)); /* now and then a slow write */
		else if (rand_r(&seed) % 4 == 0)
			sched_yield();
		atomic_fetch_sub(&it.sr->out, 1);
		atomic_store(&st->chunk_out[it.c->index], false);
		pool_give(&it.sr->r, it.c);
	}
	return NULL;
}

START_TEST(test_stress)
{
	struct stress *st = calloc(1, sizeof(*st));
	struct st_taker *tk = calloc(ST_THREADS, sizeof(*tk));
	struct pool_stats s;
	pthread_t io;

	ck_assert_ptr_nonnull(st);
	ck_assert_ptr_nonnull(tk);
	st->p = make_wpool(ST_N, 3);
	pthread_mutex_init(&st->mu, NULL);
	pthread_cond_init(&st->cv, NULL);
	st->takers_left = ST_THREADS;
	ck_assert_int_eq(pthread_create(&io, NULL, st_io_main, st), 0);
	for (unsigned i = 0; i < ST_THREADS; i++) {
		tk[i].st = st;
		tk[i].id = i;
		ck_assert_int_eq(pthread_create(&tk[i].t, NULL, st_taker_main, &tk[i]), 0);
	}
	/* A deadlock shows as the test's timeout (CK_DEFAULT_TIMEOUT). */
	for (unsigned i = 0; i < ST_THREADS; i++)
		ck_assert_int_eq(pthread_join(tk[i].t, NULL), 0);
	ck_assert_int_eq(pthread_join(io, NULL), 0);

	ck_assert_uint_eq(atomic_load(&st->reserve_err), 0);
	ck_assert_uint_eq(atomic_load(&st->null_take), 0);
	ck_assert_uint_eq(atomic_load(&st->completed), ST_THREADS * ST_ROUNDS);
	ck_assert_msg(atomic_load(&st->double_take) == 0, "%u chunks handed out twice",
	              atomic_load(&st->double_take));
	ck_assert_msg(atomic_load(&st->over_want) == 0, "%u takes beyond want",
	              atomic_load(&st->over_want));
	ck_assert_uint_eq(atomic_load(&st->over_n), 0);
	ck_assert_uint_eq(atomic_load(&st->bad_tag), 0);
	for (unsigned i = 0; i < ST_THREADS; i++)
		for (unsigned r = 0; r < ST_ROUNDS; r++) {
			ck_assert(!tk[i].rs[r].r.active);
			ck_assert(!tk[i].rs[r].r.listed);
			ck_assert_uint_eq(tk[i].rs[r].r.held, 0);
		}
	s = stats(st->p);
	ck_assert_uint_eq(s.in_use, 0);
	ck_assert_uint_eq(s.active, 0);
	ck_assert_uint_eq(s.waiters, 0);
	ck_assert_uint_gt(s.waits, 0); /* 6 threads, room for 4: some waited */
	pool_destroy(st->p);
	pthread_cond_destroy(&st->cv);
	pthread_mutex_destroy(&st->mu);
	free(tk);
	free(st);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("pool");
	TCase *mem = tcase_create("memory");
	TCase *adm = tcase_create("admission");
	TCase *str = tcase_create("stress");

	tcase_add_test(mem, test_create_layout);
	tcase_add_test(mem, test_create_bad_options);
	tcase_add_test(mem, test_create_locked);
	tcase_add_test(mem, test_create_lock_refused);
	tcase_add_test(mem, test_create_huge_pages);
	suite_add_tcase(s, mem);

	tcase_add_test(adm, test_reserve_bad_args);
	tcase_add_test(adm, test_lone_takes_up_to_want);
	tcase_add_test(adm, test_younger_gets_window);
	tcase_add_test(adm, test_age_priority);
	tcase_add_test(adm, test_release_wakes_takers);
	tcase_add_test(adm, test_windows_shrink_and_grow);
	tcase_add_test(adm, test_max_active);
	tcase_add_test(adm, test_skip_never_overtakes);
	tcase_add_test(adm, test_reserve_fifo);
	tcase_add_test(adm, test_abort_reserve);
	tcase_add_test(adm, test_groups);
	tcase_add_test(adm, test_give_returns_to_pool);
	tcase_add_test(adm, test_release_with_chunks_out);
	tcase_add_test(adm, test_take_abort_release_try);
	suite_add_tcase(s, adm);

	tcase_add_test(str, test_stress);
	suite_add_tcase(s, str);
	return s;
}
