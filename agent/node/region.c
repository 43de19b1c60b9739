/*
 * Host regions: a trainer's shared memory, mapped once it registers it
 * (session.c), found by its id among its session's, and unmapped once the
 * last plan using it lets it go.
 *
 * Under agent.mu.
 */
#include <stdlib.h>

#include "agent/node/node.h"
#include "agent/node/session.h"

struct region *region_find(struct session *s, uint64_t id)
{
	struct list *pos;

	list_for_each(pos, &s->regions)
	{
		struct region *r = container_of(pos, struct region, link);

		if (r->id == id)
			return r;
	}
	return NULL;
}

void region_put(struct region *r)
{
	if (--r->refs)
		return;
	ipc_shm_unmap(&r->shm);
	free(r);
}
