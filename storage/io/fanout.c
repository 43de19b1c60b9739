/*
 * fanout.c: fanout.h's threads. Each takes the next index from one atomic
 * counter until none is left, so a slow read holds up its thread only.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "storage/io/fanout.h"

struct fanout {
	atomic_size_t next;
	size_t n;
	void (*fn)(void *arg, size_t i);
	void *arg;
};

static void *worker(void *x)
{
	struct fanout *f = x;
	size_t i;

	while ((i = atomic_fetch_add(&f->next, 1)) < f->n)
		f->fn(f->arg, i);
	return NULL;
}

void fanout_run(size_t n, unsigned width, void (*fn)(void *arg, size_t i), void *arg)
{
	struct fanout f = {.n = n, .fn = fn, .arg = arg};
	size_t want = n < width ? n : width, made = 0;
	pthread_t *t = want > 1 ? calloc(want - 1, sizeof(*t)) : NULL;
	pthread_attr_t attr;

	atomic_init(&f.next, 0);
	if (t && pthread_attr_init(&attr) == 0) {
		pthread_attr_setstacksize(&attr, 1u << 20); /* a read and a parse */
		while (made + 1 < want && pthread_create(&t[made], &attr, worker, &f) == 0)
			made++;
		pthread_attr_destroy(&attr);
	}
	worker(&f);
	for (size_t i = 0; i < made; i++)
		pthread_join(t[i], NULL);
	free(t);
}
