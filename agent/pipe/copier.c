/*
 * The copier (copier.h): helper threads that join a capture worker's copy.
 * Called by capture workers; helpers sleep on a condition variable between
 * jobs. A job is only ever touched by participants that registered under
 * the mutex, and the caller waits for all of them to leave before it
 * returns, so the job can live on the caller's stack.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>

#include "agent/pipe/copier.h"
#include "ipc/ipc.h"

struct job {
	copier_fn fn;
	const void *src;
	uint64_t off, len, part;
	char *dst;
	unsigned nparts;
	atomic_uint next; /* the next part to claim */
	atomic_int err; /* the first part that failed */
	unsigned inside; /* helpers working on it (under mu) */
};

/*
 * After a job a helper spins this long for the next one before it sleeps: a
 * capture posts its chunks back to back, and a helper woken through the
 * scheduler for each would arrive after the caller had done the work.
 */
#define SPIN_NS 200000

struct copier {
	pthread_mutex_t mu;
	pthread_cond_t work, left;
	struct job *job; /* the one job helpers may join */
	atomic_uint_fast64_t gen; /* bumped per job, so a helper joins each once */
	bool stop;
	unsigned nthreads;
	pthread_t *threads;
};

/* Claims parts until none is left. */
static void drain(struct job *j)
{
	for (;;) {
		unsigned i = atomic_fetch_add(&j->next, 1);
		uint64_t from, n;

		if (i >= j->nparts)
			return;
		from = (uint64_t)i * j->part;
		n = j->len - from < j->part ? j->len - from : j->part;
		int rc = j->fn(j->src, j->off + from, j->dst + from, n), none = 0;

		if (rc)
			atomic_compare_exchange_strong(&j->err, &none, rc);
	}
}

static int64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Spins a while for a job after `seen`; whether one came. */
static bool spin_for_job(struct copier *c, uint64_t seen)
{
	int64_t until = mono_ns() + SPIN_NS;

	do {
		for (int i = 0; i < 64; i++) {
			if (atomic_load_explicit(&c->gen, memory_order_relaxed) != seen)
				return true;
			__builtin_ia32_pause();
		}
	} while (mono_ns() < until);
	return false;
}

static void *helper(void *arg)
{
	struct copier *c = arg;
	uint64_t seen = 0;

	pthread_mutex_lock(&c->mu);
	for (;;) {
		struct job *j;

		if (!c->stop && (!c->job || atomic_load(&c->gen) == seen)) {
			pthread_mutex_unlock(&c->mu);
			spin_for_job(c, seen);
			pthread_mutex_lock(&c->mu);
		}
		while (!c->stop && (!c->job || atomic_load(&c->gen) == seen))
			pthread_cond_wait(&c->work, &c->mu);
		if (c->stop)
			break;
		seen = atomic_load(&c->gen);
		j = c->job;
		j->inside++;
		pthread_mutex_unlock(&c->mu);
		drain(j);
		pthread_mutex_lock(&c->mu);
		if (--j->inside == 0)
			pthread_cond_broadcast(&c->left);
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

int copier_create(unsigned helpers, struct copier **out, char *err)
{
	struct copier *c = calloc(1, sizeof(*c));
	int rc;

	if (!c || !(c->threads = calloc(helpers ? helpers : 1, sizeof(pthread_t)))) {
		free(c);
		return ipc_errf(err, -ENOMEM, "out of memory for the copier");
	}
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->work, NULL);
	pthread_cond_init(&c->left, NULL);
	for (; c->nthreads < helpers; c->nthreads++) {
		rc = pthread_create(&c->threads[c->nthreads], NULL, helper, c);
		if (rc) {
			copier_destroy(c);
			return ipc_errf(err, -rc, "starting copy helpers: %s", strerror(rc));
		}
	}
	*out = c;
	return 0;
}

void copier_destroy(struct copier *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->mu);
	c->stop = true;
	pthread_cond_broadcast(&c->work);
	pthread_mutex_unlock(&c->mu);
	for (unsigned i = 0; i < c->nthreads; i++)
		pthread_join(c->threads[i], NULL);
	pthread_cond_destroy(&c->work);
	pthread_cond_destroy(&c->left);
	pthread_mutex_destroy(&c->mu);
	free(c->threads);
	free(c);
}

unsigned copier_helpers(const struct copier *c)
{
	return c ? c->nthreads : 0;
}

int copier_run(struct copier *c, copier_fn fn, const void *src, uint64_t off, void *dst,
               uint64_t len, uint64_t min_part)
{
	struct job j = {.fn = fn, .src = src, .off = off, .len = len, .dst = dst};
	unsigned parts = c ? 2 * (c->nthreads + 1) : 1;
	bool shared = false;

	/* Parts small enough to share, big enough that claiming one costs nothing. */
	while (parts > 1 && len / parts < min_part)
		parts--;
	j.part = (len + parts - 1) / parts;
	j.nparts = j.part ? (unsigned)((len + j.part - 1) / j.part) : 0;
	atomic_init(&j.next, 0);
	atomic_init(&j.err, 0);
	if (c && j.nparts > 1) {
		pthread_mutex_lock(&c->mu);
		if (!c->job) { /* helpers free: they join this copy */
			c->job = &j;
			atomic_fetch_add(&c->gen, 1);
			shared = true;
			pthread_cond_broadcast(&c->work);
		}
		pthread_mutex_unlock(&c->mu);
	}
	drain(&j);
	if (!shared)
		return atomic_load(&j.err);
	pthread_mutex_lock(&c->mu);
	c->job = NULL; /* no helper joins from now on */
	while (j.inside)
		pthread_cond_wait(&c->left, &c->mu);
	pthread_mutex_unlock(&c->mu);
	return atomic_load(&j.err);
}
