/*
 * libckpt's host memory (ckpt_host_alloc, ckpt_host_free): a sealed memfd
 * per region, mapped here and handed to the agent (trainer_register.c), its
 * descriptor kept for an agent that comes back. The caller's thread; plans
 * take their CUDA fence page here too (trainer_plan.c).
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

/* ckpt_host_alloc inside a call that has entered (cl_enter) already. */
int cl_host_alloc(struct ckpt_client *c, size_t bytes, void **ptr)
{
	char err[IPC_ERRLEN];
	struct cl_alloc *a;
	int rc;

	a = calloc(1, sizeof(*a));
	if (!a)
		return cl_fail(c, -ENOMEM, "out of memory");
	rc = ipc_shm_create(bytes, &a->shm, err);
	if (rc) {
		free(a);
		return cl_fail(c, rc, "ckpt_host_alloc(%zu): %s", bytes, err);
	}
	rc = cl_register_region(c, a, CL_DEFAULT_TIMEOUT_MS);
	if (rc) {
		ipc_shm_unmap(&a->shm);
		free(a);
		return rc;
	}
	pthread_mutex_lock(&c->mu);
	a->key = ++c->next_key;
	a->next = c->allocs;
	c->allocs = a;
	c->register_again = cl_register_again;
	pthread_mutex_unlock(&c->mu);
	*ptr = a->shm.data;
	return 0;
}

int ckpt_host_alloc(struct ckpt_client *c, size_t bytes, void **ptr)
{
	int rc;

	if (!c || !ptr)
		return -EINVAL;
	*ptr = NULL;
	if (!c->attached)
		return cl_fail(c, -EINVAL, "ckpt_host_alloc needs a client from ckpt_connect");
	rc = cl_enter(c);
	if (rc)
		return rc;
	rc = cl_host_alloc(c, bytes, ptr);
	cl_leave(c);
	return rc;
}

/* ckpt_host_free inside a call that has entered already (or with no agent). */
void cl_host_free(struct ckpt_client *c, void *ptr, bool agent)
{
	struct cl_alloc **pa, *a = NULL;

	pthread_mutex_lock(&c->mu);
	for (pa = &c->allocs; *pa; pa = &(*pa)->next)
		if ((*pa)->shm.data == ptr) {
			a = *pa;
			*pa = a->next;
			break;
		}
	pthread_mutex_unlock(&c->mu);
	if (!a)
		return;
	if (agent && a->region_id)
		cl_rpc_drop_region(c, a->region_id);
	ipc_shm_unmap(&a->shm);
	free(a);
}

void ckpt_host_free(struct ckpt_client *c, void *ptr)
{
	bool agent;

	if (!c || !ptr)
		return;
	/* away or gone: the agent dropped it with the session */
	agent = cl_enter_tidy(c);
	cl_host_free(c, ptr, agent);
	if (agent)
		cl_leave(c);
	else
		cl_leave_local(c);
}
