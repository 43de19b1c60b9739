/*
 * Worker threads over a mutex-protected FIFO, and a list of jobs sorted by
 * the time they run at (see work.h). Jobs run without the queue's lock
 * held; they take the agent's lock themselves when needed. A worker with
 * nothing due sleeps until the first timed job's time (CLOCK_MONOTONIC),
 * or until a push wakes it.
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>

#include "ipc/base/base.h"
#include "ipc/base/work.h"

struct workq {
	int nice;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct work *head, *tail;
	struct work *timed; /* sorted by when */
	unsigned busy; /* queued + timed + running */
	bool stop;
	unsigned nthreads, max; /* started; at most (elastic queues start more as jobs wait) */
	unsigned limit; /* jobs running at once, not counting those that said they wait */
	unsigned running; /* jobs running and not waiting */
	unsigned idle; /* workers asleep on cv */
	pthread_t *threads;
	char name[16];
};

static void spare(struct workq *q);

/* Under q->mu: w at the end of the FIFO. */
static void append(struct workq *q, struct work *w)
{
	w->next = NULL;
	if (q->tail)
		q->tail->next = w;
	else
		q->head = w;
	q->tail = w;
}

static void *worker(void *arg)
{
	struct workq *q = arg;

	pthread_setname_np(pthread_self(), q->name);
	/* Per thread on Linux: only this worker yields. Failing is harmless. */
	if (q->nice && setpriority(PRIO_PROCESS, (id_t)gettid(), q->nice))
		q->nice = 0;
	pthread_mutex_lock(&q->mu);
	for (;;) {
		struct work *w;
		int64_t now = ipc_mono_ns();

		/* Due timed jobs join the FIFO first: a stream of pushes cannot starve them. */
		while (q->timed && q->timed->when <= now) {
			w = q->timed;
			q->timed = w->next;
			append(q, w);
		}
		if (!q->head && q->stop)
			break;
		if (!q->head || q->running >= q->limit) {
			q->idle++;
			if (q->timed) {
				struct timespec ts = {q->timed->when / 1000000000,
				                      q->timed->when % 1000000000};

				pthread_cond_timedwait(&q->cv, &q->mu, &ts);
			} else {
				pthread_cond_wait(&q->cv, &q->mu);
			}
			q->idle--;
			continue;
		}
		w = q->head;
		q->head = w->next;
		if (!q->head)
			q->tail = NULL;
		q->running++;
		/*
		 * More queued: a push may have signalled a worker already woken
		 * (counted idle until it runs) and so woken none; wake one now,
		 * or start one if every other is in a job.
		 */
		if (q->head) {
			spare(q);
			pthread_cond_signal(&q->cv);
		}
		pthread_mutex_unlock(&q->mu);
		w->fn(w);
		pthread_mutex_lock(&q->mu);
		q->running--;
		q->busy--;
		if (q->head) /* a worker held back by the limit may go now */
			pthread_cond_signal(&q->cv);
	}
	pthread_mutex_unlock(&q->mu);
	return NULL;
}

int workq_create(const char *name, unsigned threads, struct workq **out, char *err)
{
	return workq_create_nice(name, threads, 0, out, err);
}

static int start(struct workq *q, unsigned threads, unsigned max, int nice, const char *name,
                 char *err)
{
	int rc;

	if (!(q->threads = calloc(max, sizeof(pthread_t))))
		return ipc_errf(err, -ENOMEM, "out of memory for the %s workers", name);
	q->nice = nice;
	q->limit = threads;
	q->max = max;
	pthread_mutex_init(&q->mu, NULL);
	{
		pthread_condattr_t ca; /* timed waits on the monotonic clock: ipc_mono_ns */

		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&q->cv, &ca);
		pthread_condattr_destroy(&ca);
	}
	snprintf(q->name, sizeof(q->name), "%s", name);
	for (; q->nthreads < threads; q->nthreads++) {
		rc = pthread_create(&q->threads[q->nthreads], NULL, worker, q);
		if (rc)
			return ipc_errf(err, -rc, "starting %s worker: %s", name, strerror(rc));
	}
	return 0;
}

int workq_create_nice(const char *name, unsigned threads, int nice, struct workq **out, char *err)
{
	struct workq *q = calloc(1, sizeof(*q));
	int rc;

	if (!q)
		return ipc_errf(err, -ENOMEM, "out of memory for the %s workers", name);
	rc = start(q, threads, threads, nice, name, err);
	if (rc) {
		workq_destroy(q);
		return rc;
	}
	*out = q;
	return 0;
}

/*
 * Under q->mu: a job is queued, it may run now (fewer than `limit` run),
 * and no worker sleeps to take it (every one is in a job that waits): a new
 * worker, up to `max` (best effort: without it the job waits for a worker
 * to come free, as on a fixed queue).
 */
static void spare(struct workq *q)
{
	if (q->head && q->running < q->limit && !q->idle && q->nthreads < q->max && !q->stop &&
	    pthread_create(&q->threads[q->nthreads], NULL, worker, q) == 0)
		q->nthreads++;
}

int workq_create_elastic(const char *name, unsigned threads, unsigned max, struct workq **out,
                         char *err)
{
	struct workq *q = calloc(1, sizeof(*q));
	int rc;

	if (!q)
		return ipc_errf(err, -ENOMEM, "out of memory for the %s workers", name);
	rc = start(q, threads, max > threads ? max : threads, 0, name, err);
	if (rc) {
		workq_destroy(q);
		return rc;
	}
	*out = q;
	return 0;
}

void workq_wait_begin(struct workq *q)
{
	if (!q)
		return;
	pthread_mutex_lock(&q->mu);
	q->running--;
	spare(q);
	pthread_cond_signal(&q->cv);
	pthread_mutex_unlock(&q->mu);
}

void workq_wait_end(struct workq *q)
{
	if (!q)
		return;
	pthread_mutex_lock(&q->mu);
	q->running++;
	pthread_mutex_unlock(&q->mu);
}

void workq_push(struct workq *q, struct work *w)
{
	pthread_mutex_lock(&q->mu);
	append(q, w);
	q->busy++;
	spare(q);
	pthread_cond_signal(&q->cv);
	pthread_mutex_unlock(&q->mu);
}

void workq_push_at(struct workq *q, struct work *w, int64_t when)
{
	struct work **pp;

	w->when = when;
	pthread_mutex_lock(&q->mu);
	for (pp = &q->timed; *pp && (*pp)->when <= when; pp = &(*pp)->next)
		;
	w->next = *pp;
	*pp = w;
	q->busy++;
	/* all: the earliest time may have changed, and every idle worker waits on it */
	pthread_cond_broadcast(&q->cv);
	pthread_mutex_unlock(&q->mu);
}

bool workq_hurry(struct workq *q, struct work *w)
{
	struct work **pp;
	bool found;

	pthread_mutex_lock(&q->mu);
	for (pp = &q->timed; *pp && *pp != w; pp = &(*pp)->next)
		;
	found = *pp != NULL;
	if (found) {
		*pp = w->next;
		append(q, w);
		spare(q);
		pthread_cond_signal(&q->cv);
	}
	pthread_mutex_unlock(&q->mu);
	return found;
}

unsigned workq_busy(struct workq *q)
{
	unsigned n;

	pthread_mutex_lock(&q->mu);
	n = q->busy;
	pthread_mutex_unlock(&q->mu);
	return n;
}

void workq_destroy(struct workq *q)
{
	if (!q)
		return;
	if (!q->threads) { /* never started */
		free(q);
		return;
	}
	pthread_mutex_lock(&q->mu);
	q->stop = true;
	pthread_cond_broadcast(&q->cv);
	pthread_mutex_unlock(&q->mu);
	for (unsigned i = 0; i < q->nthreads; i++)
		pthread_join(q->threads[i], NULL);
	q->timed = NULL; /* dropped: see work.h */
	pthread_cond_destroy(&q->cv);
	pthread_mutex_destroy(&q->mu);
	free(q->threads);
	free(q);
}
