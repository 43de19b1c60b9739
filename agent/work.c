/*
 * Worker threads over a mutex-protected FIFO (see work.h). Jobs run without
 * the queue's lock held; they take the agent's lock themselves when needed.
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <pthread.h>

#include "ipc.h"
#include "work.h"

struct workq {
	int nice;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct work *head, *tail;
	unsigned busy; /* queued + running */
	bool stop;
	unsigned nthreads;
	pthread_t *threads;
	char name[16];
};

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

		while (!q->head && !q->stop)
			pthread_cond_wait(&q->cv, &q->mu);
		if (!q->head)
			break;
		w = q->head;
		q->head = w->next;
		if (!q->head)
			q->tail = NULL;
		pthread_mutex_unlock(&q->mu);
		w->fn(w);
		pthread_mutex_lock(&q->mu);
		q->busy--;
	}
	pthread_mutex_unlock(&q->mu);
	return NULL;
}

int workq_create(const char *name, unsigned threads, struct workq **out, char *err)
{
	return workq_create_nice(name, threads, 0, out, err);
}

int workq_create_nice(const char *name, unsigned threads, int nice, struct workq **out, char *err)
{
	struct workq *q = calloc(1, sizeof(*q));
	int rc;

	if (!q || !(q->threads = calloc(threads, sizeof(pthread_t)))) {
		free(q);
		return ipc_errf(err, -ENOMEM, "out of memory for the %s workers", name);
	}
	q->nice = nice;
	pthread_mutex_init(&q->mu, NULL);
	pthread_cond_init(&q->cv, NULL);
	snprintf(q->name, sizeof(q->name), "%s", name);
	for (; q->nthreads < threads; q->nthreads++) {
		rc = pthread_create(&q->threads[q->nthreads], NULL, worker, q);
		if (rc) {
			ipc_errf(err, -rc, "starting %s worker: %s", name, strerror(rc));
			workq_destroy(q);
			return -rc;
		}
	}
	*out = q;
	return 0;
}

void workq_push(struct workq *q, struct work *w)
{
	w->next = NULL;
	pthread_mutex_lock(&q->mu);
	if (q->tail)
		q->tail->next = w;
	else
		q->head = w;
	q->tail = w;
	q->busy++;
	pthread_cond_signal(&q->cv);
	pthread_mutex_unlock(&q->mu);
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
	pthread_mutex_lock(&q->mu);
	q->stop = true;
	pthread_cond_broadcast(&q->cv);
	pthread_mutex_unlock(&q->mu);
	for (unsigned i = 0; i < q->nthreads; i++)
		pthread_join(q->threads[i], NULL);
	pthread_cond_destroy(&q->cv);
	pthread_mutex_destroy(&q->mu);
	free(q->threads);
	free(q);
}
