/*
 * Handing the trainer's regions and plans to the agent: a region's
 * RegisterRegion (at ckpt_host_alloc, on the caller's thread), and, on the
 * session thread once it attached to an agent that came back, every region
 * and plan again (cl_register_again, set as c->register_again by the first
 * region or plan: session_thread.c calls it through that pointer, never by
 * name). Calls nothing of trainer_host.c or trainer_plan.c.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <unistd.h>

#include "client/rpc.h"

/* ---- host memory ------------------------------------------------------ */

/*
 * Hands a region to the agent: its descriptor on the credentials socket,
 * then RegisterRegion with the ticket; the agent's id into a->region_id.
 * Ours stays open, for an agent that comes back after a restart.
 */
int cl_register_region(struct ckpt_client *c, struct cl_alloc *a, int timeout_ms)
{
	uint64_t ticket;
	int rc = cl_cred_send_region(c, a->shm.fd, a->shm.size, &ticket);

	if (rc)
		return rc;
	return cl_rpc_register_region(c, ticket, a->shm.size, &a->region_id, timeout_ms);
}

/* ---- attaching again to an agent that came back ------------------------ */

/*
 * Calls made while attaching again get this long: an agent that does not
 * answer costs a try, not a minute a region.
 */
#define REATTACH_CALL_MS 10000

static bool closing(struct ckpt_client *c)
{
	bool v;

	pthread_mutex_lock(&c->mu);
	v = c->closing;
	pthread_mutex_unlock(&c->mu);
	return v;
}

/* The agent did not answer (or went), or we are closing: attach again, not give a plan up. */
static bool unreachable(int rc)
{
	return rc == -ECONNREFUSED || rc == -ENOTCONN || rc == -EPIPE || rc == -ECONNRESET ||
	       rc == -ETIMEDOUT || rc == -ECANCELED;
}

/* One plan created again; a refusal is kept in p->lost. 0, or the agent is unreachable. */
static int create_again(struct ckpt_client *c, struct ckpt_plan *p)
{
	struct plan_made rep;
	int rc = cl_rpc_create_plan_again(c, p, &rep, REATTACH_CALL_MS);

	if (rc == CL_RPC_NO_REQUEST) {
		snprintf(p->lost, sizeof(p->lost), "out of memory re-creating the plan");
		return 0;
	}
	if (rc && unreachable(rc))
		return rc;
	pthread_mutex_lock(&c->mu);
	if (rc) {
		snprintf(p->lost, sizeof(p->lost),
		         "the plan of job %s rank %d could not be created again after ckptd "
		         "restarted: %s (destroy it and create it anew)",
		         p->job, p->rank, c->session_error);
	} else {
		/* its saves follow it (ckpt_plan_destroy finds them by the id) */
		for (struct ckpt_save *s = c->saves; s; s = s->next)
			if (s->plan_id == p->id)
				s->plan_id = rep.plan_id;
		p->id = rep.plan_id;
		p->shard_bytes = rep.shard_bytes;
		p->uploads = rep.uploads;
		p->lost[0] = '\0';
	}
	pthread_mutex_unlock(&c->mu);
	if (rc)
		fprintf(stderr, "libckpt: %s\n", p->lost);
	return 0;
}

int cl_register_again(struct ckpt_client *c)
{
	struct cl_alloc *a;
	struct ckpt_plan *p;
	int rc;

	/* No call of the trainer runs now (cl_enter waits): the lists stay as they are. */
	for (a = c->allocs; a; a = a->next) {
		if (closing(c))
			return -ECANCELED;
		a->region_id = 0;
		rc = cl_register_region(c, a, REATTACH_CALL_MS);
		if (rc && unreachable(rc))
			return rc;
		if (rc)
			fprintf(stderr, "libckpt: a region of %zu bytes: %s\n", a->shm.size,
			        c->session_error);
	}
	for (p = c->plans; p; p = p->next) {
		if (p->lost[0])
			continue; /* refused before: destroy and create it anew */
		if (closing(c))
			return -ECANCELED;
		rc = create_again(c, p);
		if (rc)
			return rc;
	}
	return 0;
}
