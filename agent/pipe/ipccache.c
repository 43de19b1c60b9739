/*
 * The CUDA IPC handle cache (ipccache.h): a short list of open mappings
 * keyed by (device, handle bytes), with reference counts. A node has a few
 * trainers with a few allocations each: a list is enough.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/ipc.h"
#include "agent/pipe/ipccache.h"

struct entry {
	struct entry *next;
	int dev;
	uint8_t handle[IPC_HANDLE_BYTES];
	void *ptr;
	uint64_t size;
	unsigned refs;
};

struct ipc_cache {
	struct ipc_cache_ops ops;
	struct entry *head;
	unsigned n;
};

int ipc_cache_create(const struct ipc_cache_ops *ops, struct ipc_cache **out)
{
	struct ipc_cache *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	c->ops = *ops;
	*out = c;
	return 0;
}

void ipc_cache_destroy(struct ipc_cache *c)
{
	if (!c)
		return;
	while (c->head) {
		struct entry *e = c->head;

		c->head = e->next;
		c->ops.close(c->ops.ctx, e->dev, e->ptr);
		free(e);
	}
	free(c);
}

/* The entry of (dev, handle) with a reference taken, opened if new. */
static int lookup(struct ipc_cache *c, int dev, const uint8_t *handle, struct entry **out,
                  char *err)
{
	struct entry *e;
	int rc;

	for (e = c->head; e; e = e->next)
		if (e->dev == dev && memcmp(e->handle, handle, IPC_HANDLE_BYTES) == 0) {
			e->refs++;
			*out = e;
			return 0;
		}
	e = calloc(1, sizeof(*e));
	if (!e)
		return ipc_errf(err, -ENOMEM, "out of memory");
	rc = c->ops.open(c->ops.ctx, dev, handle, &e->ptr, &e->size, err);
	if (rc) {
		free(e);
		return rc;
	}
	e->dev = dev;
	memcpy(e->handle, handle, IPC_HANDLE_BYTES);
	e->refs = 1;
	e->next = c->head;
	c->head = e;
	c->n++;
	*out = e;
	return 0;
}

int ipc_cache_get(struct ipc_cache *c, int dev, const uint8_t *handle, uint64_t need, void **ptr,
                  char *err)
{
	struct entry *e = NULL;
	int rc = lookup(c, dev, handle, &e, err);

	if (rc)
		return rc;
	if (need > e->size) {
		uint64_t have = e->size;

		ipc_cache_put(c, dev, e->ptr);
		return ipc_errf(err, -ERANGE,
		                "a CUDA allocation of %llu bytes, but the plan says %llu: its "
		                "tensors would reach past it",
		                (unsigned long long)have, (unsigned long long)need);
	}
	*ptr = e->ptr;
	return 0;
}

void ipc_cache_put(struct ipc_cache *c, int dev, void *ptr)
{
	for (struct entry **pe = &c->head; *pe; pe = &(*pe)->next) {
		struct entry *e = *pe;

		if (e->dev != dev || e->ptr != ptr)
			continue;
		if (--e->refs == 0) {
			*pe = e->next;
			c->ops.close(c->ops.ctx, e->dev, e->ptr);
			c->n--;
			free(e);
		}
		return;
	}
}

unsigned ipc_cache_open_count(const struct ipc_cache *c)
{
	return c ? c->n : 0;
}
