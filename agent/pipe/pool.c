/*
 * The staging pool (pool.h): one region of host memory, pre-faulted and
 * locked (and pinned for the GPUs by gpu_pin), cut into fixed chunks, and the
 * admission of saves to it by reservation.
 *
 *   pool_create / pool_destroy   start-up and shutdown, agent main thread
 *   pool_reserve                 a capture worker (saves, restores), maint (verify)
 *   pool_take / pool_try_take    the same threads: captures and readers
 *   pool_give                    whoever finishes a chunk last: the I/O thread,
 *                                the hasher, a reader
 *   pool_release                 the capture worker, or the I/O thread (a
 *                                save's pipeline end)
 *
 * Accounting, all under p->mu. Every chunk is either on the free list
 * (p->nfree) or taken (p->in_use), and then counted in the `held` of the
 * reservation that took it. Reservations are on p->first..last, oldest first, from
 * admission until they are released and every chunk they took is back.
 *
 * Who may take a free chunk (may_take): a reservation below its window
 * (floor) always; above it, only out of the chunks that no other active
 * window is still owed, and only if no older reservation waits for one.
 * The windows sum to at most the pool (at most n / 2 active, each at most
 * n / active), so every reservation gets its window back as its own chunks
 * come back, whatever the others do.
 *
 * Waiting: reservers queue on a FIFO list of nodes on their own stacks and
 * sleep on p->room; only the head may be admitted, so a large save is not
 * starved by a stream of small ones. Takers sleep on p->chunk until a give.
 * Both are broadcasts: the waiters are a handful of saves and restores, and
 * each rechecks its own condition.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent/pipe/pool.h"

#define POOL_ALIGN 4096u /* O_DIRECT's alignment: chunks start and end on it */
/*
 * A PMD-sized (transparent huge) page on x86-64 and arm64 with 4 KiB base
 * pages. The region starts on this boundary so that all of it, not just the
 * middle, can be backed by huge pages; elsewhere it is merely harmless.
 */
#define POOL_HUGE (2u << 20)

struct waiter {
	struct waiter *next;
};

struct pool {
	pthread_mutex_t mu;
	pthread_cond_t room; /* reservers: credits came back, or the head left */
	pthread_cond_t chunk; /* takers: a credit came back to a reservation */

	/* Fixed at creation; read without the lock. */
	void *base;
	uint64_t bytes, chunk_bytes;
	unsigned n;
	struct pool_chunk *chunks;
	struct iovec *iov;
	bool locked;
	char detail[256];

	unsigned window; /* pool_opts.window, at least 2 */

	/* Under mu. */
	struct pool_chunk *free_list;
	unsigned nfree, in_use, waiters, active;
	uint64_t waits;
	struct waiter *head, *tail; /* reservations waiting to be admitted */
	struct pool_resv *first, *last; /* admitted, or with chunks out; oldest first */
};

/* "2048 MiB", "12 KiB" or "100 bytes": whichever is exact. */
static void fmt_size(char *buf, size_t len, uint64_t v)
{
	if (v && v % (1ull << 20) == 0)
		snprintf(buf, len, "%" PRIu64 " MiB", v >> 20);
	else if (v && v % (1ull << 10) == 0)
		snprintf(buf, len, "%" PRIu64 " KiB", v >> 10);
	else
		snprintf(buf, len, "%" PRIu64 " bytes", v);
}

static bool aborted(const atomic_bool *abort)
{
	return abort && atomic_load(abort);
}

/* ---- creation --------------------------------------------------------- */

static int check_opts(const struct pool_opts *o, unsigned *n, char *err)
{
	char b[32], c[32];
	uint64_t chunks, phys;
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);

	if (!o)
		return ipc_errf(err, -EINVAL, "staging pool: no options given");
	if (o->chunk_bytes == 0 || o->chunk_bytes % POOL_ALIGN)
		return ipc_errf(err, -EINVAL,
		                "staging pool: chunk size of %" PRIu64 " bytes is not a non-zero "
		                "multiple of %u (O_DIRECT writes go out of whole chunks)",
		                o->chunk_bytes, POOL_ALIGN);
	chunks = o->bytes / o->chunk_bytes;
	fmt_size(b, sizeof(b), o->bytes);
	fmt_size(c, sizeof(c), o->chunk_bytes);
	/* Two at least: one being filled while the other is written. */
	if (chunks < 2)
		return ipc_errf(err, -EINVAL,
		                "staging pool: %s holds %" PRIu64 " chunk(s) of %s; it needs at "
		                "least 2: raise the pool size or lower the chunk size",
		                b, chunks, c);
	/* Indexes are unsigned in pool.h and int in io_req.buf_index. */
	if (chunks > INT_MAX)
		return ipc_errf(err, -EINVAL,
		                "staging pool: %s in chunks of %s is %" PRIu64 " chunks, more than "
		                "%d: raise the chunk size",
		                b, c, chunks, INT_MAX);
	/* chunks * chunk_bytes <= bytes: no overflow; but it must be addressable. */
	if ((uint64_t)(size_t)(chunks * o->chunk_bytes) != chunks * o->chunk_bytes ||
	    chunks * o->chunk_bytes > SIZE_MAX - POOL_HUGE)
		return ipc_errf(err, -EINVAL, "staging pool: %s is more than this process can map",
		                b);
	/*
	 * Pre-faulting more than the machine has ends in the OOM killer, not in
	 * an error: refuse it here, where the reason can still be said.
	 */
	phys = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : UINT64_MAX;
	if (chunks * o->chunk_bytes > phys) {
		fmt_size(c, sizeof(c), phys);
		return ipc_errf(err, -ENOMEM,
		                "staging pool: %s is more than this machine's %s of memory: lower "
		                "the pool size",
		                b, c);
	}
	*n = (unsigned)chunks;
	return 0;
}

/*
 * Memory from mmap. Not MAP_POPULATE: it faults every page in inside mmap(),
 * before madvise(MADV_HUGEPAGE) can mark the range, and with THP in
 * "madvise" mode (as on our machines) that gives 4 KiB pages, which
 * khugepaged collapses only slowly, if ever. So: map, align to a huge page,
 * advise, and only then fault in (pool_prefault): each fault then maps
 * 2 MiB, 512x fewer faults and TLB entries for capture and for io_uring's
 * pinning at registration.
 */
static int map_region(struct pool *p, char *huge, size_t hlen, char *err)
{
	char b[32];
	size_t len = p->bytes + POOL_HUGE;
	uintptr_t raw, start;

	raw =
	    (uintptr_t)mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if ((void *)raw == MAP_FAILED) {
		int e = errno;

		fmt_size(b, sizeof(b), p->bytes);
		return ipc_errf(err, -e, "staging pool: mmap of %s failed: %s: lower the pool size",
		                b, strerror(e));
	}
	start = (raw + POOL_HUGE - 1) & ~(uintptr_t)(POOL_HUGE - 1);
	if (start > raw)
		munmap((void *)raw, start - raw);
	if (raw + len > start + p->bytes)
		munmap((void *)(start + p->bytes), raw + len - (start + p->bytes));
	p->base = (void *)start;

	if (madvise(p->base, p->bytes, MADV_HUGEPAGE) == 0)
		snprintf(huge, hlen, "huge pages advised");
	else
		snprintf(huge, hlen, "huge pages not advised (madvise: %s)", strerror(errno));
	/*
	 * Registered buffers and in-flight writes point into these pages: a
	 * fork (a helper process) must not make them copy-on-write under the
	 * kernel's feet, nor copy 2 GiB of page tables. Best effort.
	 */
	madvise(p->base, p->bytes, MADV_DONTFORK);
	return 0;
}

/*
 * Fresh pages fault in at ~0.26 GB/s on first touch: pay that here, once,
 * and not in the trainer's first capture. A write per 4 KiB reaches every
 * page whatever the page size; a read would map the shared zero page and
 * fault again on the first real write.
 */
static void prefault(struct pool *p)
{
	volatile char *m = p->base;

	for (uint64_t off = 0; off < p->bytes; off += POOL_ALIGN)
		m[off] = 0;
}

/* mlock after the pages exist, so that it only pins, and say why not. */
static void lock_region(struct pool *p, bool want, char *lock, size_t llen)
{
	struct rlimit rl;
	char lim[32];
	int e;

	if (!want) {
		snprintf(lock, llen, "not locked (not asked to)");
		return;
	}
	/*
	 * Just try: root (CAP_IPC_LOCK) may lock past RLIMIT_MEMLOCK, and the
	 * kernel checks the limit before locking anything. Unlocked, the pool
	 * still works, but can be swapped out and io_uring registration (which
	 * counts against the same limit) will fail too.
	 *
	 * The raw syscall, because ASan and TSan replace mlock() with a no-op
	 * that reports success: a sanitizer build would say "mlock'd" of memory
	 * that is not, and its tests could not see the refusal.
	 */
	if (syscall(SYS_mlock, p->base, (size_t)p->bytes) == 0) {
		p->locked = true;
		snprintf(lock, llen, "mlock'd");
		return;
	}
	e = errno;
	syscall(SYS_munlock, p->base, (size_t)p->bytes); /* in case it failed half-way */
	if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0)
		snprintf(lim, sizeof(lim), "unknown");
	else if (rl.rlim_cur == RLIM_INFINITY)
		snprintf(lim, sizeof(lim), "unlimited");
	else
		fmt_size(lim, sizeof(lim), rl.rlim_cur);
	snprintf(lock, llen, "not locked (mlock: %s; RLIMIT_MEMLOCK %s)", strerror(e), lim);
}

static void carve(struct pool *p)
{
	for (unsigned i = p->n; i-- > 0;) {
		struct pool_chunk *c = &p->chunks[i];

		c->buf = (char *)p->base + (uint64_t)i * p->chunk_bytes;
		c->index = i;
		c->req.fd = -1;
		c->req.buf = c->buf;
		c->req.buf_index = (int)i;
		p->iov[i].iov_base = c->buf;
		p->iov[i].iov_len = p->chunk_bytes;
		/* Pushed from the end: chunk 0 is taken first. */
		c->next = p->free_list;
		p->free_list = c;
	}
	p->nfree = p->n;
}

static void free_region(struct pool *p)
{
	if (!p->base)
		return;
	munmap(p->base, p->bytes); /* also unlocks */
	p->base = NULL;
}

int pool_create(const struct pool_opts *o, struct pool **out, char *err)
{
	char sz[32], csz[32], huge[128] = "", lock[160];
	struct pool *p;
	unsigned n = 0;
	int rc;

	*out = NULL;
	rc = check_opts(o, &n, err);
	if (rc)
		return rc;
	p = calloc(1, sizeof(*p));
	if (!p)
		return ipc_errf(err, -ENOMEM, "staging pool: out of memory");
	rc = -pthread_mutex_init(&p->mu, NULL);
	if (rc) {
		ipc_errf(err, rc, "staging pool: pthread_mutex_init: %s", strerror(-rc));
		goto free_pool;
	}
	rc = -pthread_cond_init(&p->room, NULL);
	if (rc) {
		ipc_errf(err, rc, "staging pool: pthread_cond_init: %s", strerror(-rc));
		goto destroy_mu;
	}
	rc = -pthread_cond_init(&p->chunk, NULL);
	if (rc) {
		ipc_errf(err, rc, "staging pool: pthread_cond_init: %s", strerror(-rc));
		goto destroy_room;
	}

	p->n = n;
	p->window = o->window > 2 ? o->window : 2;
	p->chunk_bytes = o->chunk_bytes;
	p->bytes = (uint64_t)n * o->chunk_bytes;
	p->chunks = calloc(n, sizeof(*p->chunks));
	p->iov = calloc(n, sizeof(*p->iov));
	if (!p->chunks || !p->iov) {
		rc = ipc_errf(err, -ENOMEM, "staging pool: out of memory for its %u chunks", n);
		goto free_arrays;
	}
	rc = map_region(p, huge, sizeof(huge), err);
	if (rc)
		goto free_memory;
	prefault(p);
	lock_region(p, o->lock, lock, sizeof(lock));
	carve(p);

	fmt_size(sz, sizeof(sz), p->bytes);
	fmt_size(csz, sizeof(csz), p->chunk_bytes);
	snprintf(p->detail, sizeof(p->detail), "mmap, %s in %u x %s chunks, %s%s%s", sz, n, csz,
	         huge, huge[0] ? ", " : "", lock);
	*out = p;
	return 0;

free_memory:
	free_region(p);
free_arrays:
	free(p->iov);
	free(p->chunks);
	pthread_cond_destroy(&p->chunk);
destroy_room:
	pthread_cond_destroy(&p->room);
destroy_mu:
	pthread_mutex_destroy(&p->mu);
free_pool:
	free(p);
	return rc;
}

void pool_destroy(struct pool *p)
{
	if (!p)
		return;
	assert(p->in_use == 0 && p->waiters == 0);
	pthread_cond_destroy(&p->chunk);
	pthread_cond_destroy(&p->room);
	pthread_mutex_destroy(&p->mu);
	free_region(p);
	free(p->iov);
	free(p->chunks);
	free(p);
}

/* ---- what it is ------------------------------------------------------- */

const struct iovec *pool_iovecs(const struct pool *p, unsigned *n)
{
	*n = p->n;
	return p->iov;
}

struct pool_chunk *pool_chunk_at(struct pool *p, unsigned index)
{
	return index < p->n ? &p->chunks[index] : NULL;
}

const char *pool_detail(const struct pool *p)
{
	return p->detail;
}

unsigned pool_nchunks(const struct pool *p)
{
	return p->n;
}

uint64_t pool_chunk_bytes(const struct pool *p)
{
	return p->chunk_bytes;
}

void pool_get_stats(struct pool *p, struct pool_stats *out)
{
	out->bytes = p->bytes;
	out->chunk_bytes = p->chunk_bytes;
	out->chunks = p->n;
	out->locked = p->locked;
	pthread_mutex_lock(&p->mu);
	out->in_use = p->in_use;
	out->active = p->active;
	out->waiters = p->waiters;
	out->waits = p->waits;
	pthread_mutex_unlock(&p->mu);
}

/* ---- reservations ----------------------------------------------------- */

static void dequeue(struct pool *p, struct waiter *w)
{
	struct waiter **pp = &p->head, *prev = NULL;

	while (*pp != w) {
		prev = *pp;
		pp = &(*pp)->next;
	}
	*pp = w->next;
	if (p->tail == w)
		p->tail = prev;
	p->waiters--;
}

static unsigned max_active(const struct pool *p)
{
	return p->n / 2; /* each window at least 2 chunks; n >= 2 */
}

/* The window of a reservation wanting `want` among `active` admitted ones. */
static unsigned floor_of(const struct pool *p, unsigned want, unsigned active)
{
	unsigned share = p->n / (active ? active : 1);
	unsigned f = p->window < share ? p->window : share;

	if (f < 2)
		f = 2;
	return want < f ? want : f;
}

/* Chunks taken by reservations of groups other than `group`. */
static unsigned held_by_others(const struct pool *p, const void *group)
{
	unsigned n = 0;

	for (const struct pool_resv *s = p->first; s; s = s->next)
		if (!group || s->group != group)
			n += s->held;
	return n;
}

/* Under mu: could a reservation be admitted now, without waiting? */
static bool admissible(const struct pool *p, bool queued_head)
{
	if (p->active >= max_active(p))
		return false;
	if (p->head && !queued_head)
		return false; /* nobody overtakes those waiting */
	return true;
}

/* Under mu: and does it have a window now that other groups' chunks leave free? */
static bool window_now(const struct pool *p, const void *group, unsigned want)
{
	return p->n - held_by_others(p, group) >= floor_of(p, want, p->active + 1);
}

static void link_resv(struct pool *p, struct pool_resv *r)
{
	r->prev = p->last;
	r->next = NULL;
	if (p->last)
		p->last->next = r;
	else
		p->first = r;
	p->last = r;
	r->listed = true;
}

static void unlink_resv(struct pool *p, struct pool_resv *r)
{
	if (r->prev)
		r->prev->next = r->next;
	else
		p->first = r->next;
	if (r->next)
		r->next->prev = r->prev;
	else
		p->last = r->prev;
	r->prev = r->next = NULL;
	r->listed = false;
}

static void admit(struct pool *p, struct pool_resv *r)
{
	r->active = true;
	p->active++;
	link_resv(p, r);
	/* the others' windows shrank: those above theirs take nothing more for now */
}

bool pool_may_admit(struct pool *p, const void *group, unsigned want)
{
	bool ok;

	if (want == 0 || want > p->n)
		return false;
	pthread_mutex_lock(&p->mu);
	ok = admissible(p, false) && window_now(p, group, want);
	pthread_mutex_unlock(&p->mu);
	return ok;
}

int pool_reserve(struct pool *p, struct pool_resv *r, unsigned want, const void *group, bool wait,
                 const atomic_bool *abort, struct workq *q)
{
	struct waiter me = {0};
	bool waiting = false;
	int rc = 0;

	pthread_mutex_lock(&p->mu);
	*r = (struct pool_resv){.pool = p, .group = group, .want = want};
	if (want == 0 || want > p->n) {
		rc = -EINVAL;
		goto unlock;
	}
	if (admissible(p, false) && (wait || window_now(p, group, want))) {
		admit(p, r);
		goto unlock;
	}
	if (!wait) {
		rc = -EAGAIN;
		goto unlock;
	}
	if (p->tail)
		p->tail->next = &me;
	else
		p->head = &me;
	p->tail = &me;
	p->waiters++;
	p->waits++;
	while (p->head != &me || !admissible(p, true)) {
		if (aborted(abort)) {
			bool was_head = p->head == &me;

			dequeue(p, &me);
			/* The next in line may fit where we did not. */
			if (was_head && p->head)
				pthread_cond_broadcast(&p->room);
			rc = -ECANCELED;
			goto unlock;
		}
		if (!waiting) {
			waiting = true;
			pthread_mutex_unlock(&p->mu);
			workq_wait_begin(q);
			pthread_mutex_lock(&p->mu);
			continue;
		}
		pthread_cond_wait(&p->room, &p->mu);
	}
	dequeue(p, &me);
	admit(p, r);
	if (p->head)
		pthread_cond_broadcast(&p->room);
unlock:
	pthread_mutex_unlock(&p->mu);
	if (waiting)
		workq_wait_end(q);
	return rc;
}

unsigned pool_floor(struct pool_resv *r)
{
	struct pool *p = r->pool;
	unsigned f;

	pthread_mutex_lock(&p->mu);
	f = floor_of(p, r->want, p->active);
	pthread_mutex_unlock(&p->mu);
	return f;
}

/* Under mu: may r take a free chunk now? */
static bool may_take(const struct pool *p, const struct pool_resv *r)
{
	unsigned owed = 0;

	if (!p->nfree || r->held >= r->want)
		return false;
	if (r->held < floor_of(p, r->want, p->active))
		return true; /* its window */
	for (const struct pool_resv *s = p->first; s; s = s->next) {
		unsigned f;

		if (s == r || !s->active)
			continue;
		f = floor_of(p, s->want, p->active);
		if (s->held < f)
			owed += f - s->held;
	}
	if (p->nfree <= owed)
		return false;
	for (const struct pool_resv *s = p->first; s && s != r; s = s->next)
		if (s->active && s->taking && s->held < s->want)
			return false; /* older, and waiting for one: it goes first */
	return true;
}

static struct pool_chunk *take_one(struct pool *p, struct pool_resv *r)
{
	struct pool_chunk *c = p->free_list;

	/* nfree counts the list (top of file) */
	assert(c);
	p->free_list = c->next;
	c->next = NULL;
	p->nfree--;
	p->in_use++;
	r->held++;
	return c;
}

struct pool_chunk *pool_try_take(struct pool_resv *r)
{
	struct pool *p = r->pool;
	struct pool_chunk *c = NULL;

	pthread_mutex_lock(&p->mu);
	if (r->active && may_take(p, r))
		c = take_one(p, r);
	pthread_mutex_unlock(&p->mu);
	return c;
}

struct pool_chunk *pool_take(struct pool_resv *r, const atomic_bool *abort, struct workq *q)
{
	struct pool *p = r->pool;
	struct pool_chunk *c = NULL;
	bool waiting = false;

	pthread_mutex_lock(&p->mu);
	for (;;) {
		/*
		 * Aborted: nothing more is copied. Released (by an abort path
		 * on another thread): nothing will come.
		 */
		if (aborted(abort) || !r->active)
			break;
		if (may_take(p, r)) {
			c = take_one(p, r);
			break;
		}
		if (!waiting) {
			waiting = true;
			r->taking = true;
			pthread_mutex_unlock(&p->mu);
			workq_wait_begin(q);
			pthread_mutex_lock(&p->mu);
			continue;
		}
		pthread_cond_wait(&p->chunk, &p->mu);
	}
	if (waiting) {
		r->taking = false;
		/* younger ones may have been held back for us */
		pthread_cond_broadcast(&p->chunk);
	}
	pthread_mutex_unlock(&p->mu);
	if (waiting)
		workq_wait_end(q);
	return c;
}

void pool_give(struct pool_resv *r, struct pool_chunk *c)
{
	struct pool *p = r->pool;

	assert(c >= p->chunks && c < p->chunks + p->n);
	pthread_mutex_lock(&p->mu);
	assert(p->in_use > 0 && r->held > 0);
	c->next = p->free_list;
	p->free_list = c;
	p->nfree++;
	p->in_use--;
	r->held--;
	if (!r->active && !r->held && r->listed)
		unlink_resv(p, r);
	pthread_cond_broadcast(&p->chunk);
	pthread_mutex_unlock(&p->mu);
}

void pool_release(struct pool_resv *r)
{
	struct pool *p = r->pool;

	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	if (r->active) {
		r->active = false;
		p->active--;
		if (!r->held)
			unlink_resv(p, r);
		/* windows grew, and one more may be admitted */
		if (p->head)
			pthread_cond_broadcast(&p->room);
		pthread_cond_broadcast(&p->chunk); /* a take waiting on r gives up */
	}
	pthread_mutex_unlock(&p->mu);
}

void pool_wake(struct pool *p)
{
	pthread_mutex_lock(&p->mu);
	pthread_cond_broadcast(&p->room);
	pthread_cond_broadcast(&p->chunk);
	pthread_mutex_unlock(&p->mu);
}
