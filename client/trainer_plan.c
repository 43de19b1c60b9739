/*
 * libckpt's plans (ckpt_plan_create*, ckpt_plan_destroy, ckpt_plan_bytes):
 * each call checks its arguments with the same rules the agent applies
 * (ipc/validate.c), so a mistake is reported before anything is sent, in the
 * same words; the request is built and sent in rpc_plan.c, which keeps it
 * for an agent that comes back (trainer_register.c). The caller's thread.
 * Host memory: trainer_host.c; saves: trainer_save.c; restores: trainer_restore.c.
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

/* Under c->mu: the region holding [p, p + n), and the offset of p in it. */
static const struct cl_alloc *locate(struct ckpt_client *c, const void *p, uint64_t n,
                                     uint64_t *offset)
{
	const char *q = p;

	for (const struct cl_alloc *a = c->allocs; a; a = a->next) {
		const char *d = a->shm.data;

		if (q >= d && q <= d + a->shm.size && n <= (uint64_t)(d + a->shm.size - q)) {
			*offset = (uint64_t)(q - d);
			return a;
		}
	}
	/* An empty tensor needs no memory: any region will do for it. */
	if (n == 0 && c->allocs) {
		*offset = 0;
		return c->allocs;
	}
	return NULL;
}

/* What a plan request is built from: the client, and the CUDA allocations met. */
struct build {
	struct ckpt_client *c;
	struct ipc_tensor *v; /* the tensors, as the request names them */
	struct cl_gpu_alloc *gpu; /* each allocation once, in first-seen order */
	size_t ngpu;
	uint64_t *keys; /* each tensor's host region (its key), 0 for CUDA memory */
	uint64_t fence_region; /* a CUDA plan's fence page */
};

static int region_size(void *ctx, int kind, uint64_t region, uint64_t *size)
{
	struct build *b = ctx;

	if (kind == CL_REGION_CUDA) {
		if (region >= b->ngpu)
			return -ENOENT;
		*size = b->gpu[region].size;
		return 0;
	}
	for (const struct cl_alloc *a = b->c->allocs; a; a = a->next)
		if (kind == CL_REGION_HOST && a->region_id == region) {
			*size = a->shm.size;
			return 0;
		}
	return -ENOENT;
}

/* ---- plans ------------------------------------------------------------ */

/* The index of a CUDA allocation in the request, added if new: one handle each. */
static int gpu_region(struct build *b, const struct cl_gpu_alloc *a, char *err)
{
	struct cl_gpu_alloc *v;

	for (size_t i = 0; i < b->ngpu; i++)
		if (b->gpu[i].base == a->base && b->gpu[i].dev == a->dev)
			return (int)i;
	v = realloc(b->gpu, (b->ngpu + 1) * sizeof(*v));
	if (!v)
		return ipc_errf(err, -ENOMEM, "out of memory");
	b->gpu = v;
	b->gpu[b->ngpu] = *a;
	return (int)b->ngpu++;
}

/* Where a tensor's bytes are: a host region, or a CUDA allocation. */
static int place(struct build *b, const struct ckpt_tensor *t, uint64_t nbytes,
                 struct ipc_tensor *s, uint64_t *key, char *err)
{
	const struct cl_alloc *a = locate(b->c, t->data, nbytes, &s->offset);
	struct cl_gpu_alloc g;
	int rc, idx;

	if (a) {
		s->kind = CL_REGION_HOST;
		s->region = a->region_id;
		*key = a->key;
		return 0;
	}
	rc = cl_gpu_locate(t->data, nbytes, &g, err);
	if (rc == -ENOENT)
		return ipc_errf(
		    err, -EINVAL,
		    "tensor '%s': its memory is neither from ckpt_host_alloc nor a CUDA "
		    "device pointer (or runs past the end of its allocation)",
		    t->name);
	if (rc)
		return rc;
	idx = gpu_region(b, &g, err);
	if (idx < 0)
		return idx;
	s->kind = CL_REGION_CUDA;
	s->region = (uint64_t)idx;
	s->offset = (uint64_t)((uintptr_t)t->data - g.base);
	return 0;
}

/* Under c->mu: one tensor into the request, with its region found. */
static int spec_tensor(struct build *b, const struct ckpt_tensor *t, struct ipc_tensor *s,
                       uint64_t *key, char *err)
{
	uint64_t nbytes;
	int rc;

	if (!t->name)
		return ipc_errf(err, -EINVAL, "a tensor has no name");
	if (t->ndim < 0 || t->ndim > CKPT_MAX_NDIM || (t->ndim && !t->shape))
		return ipc_errf(err, -EINVAL, "tensor '%s': ndim %d (0..%d, with a shape)", t->name,
		                t->ndim, CKPT_MAX_NDIM);
	rc = ipc_tensor_nbytes(t->name, t->dtype, (size_t)t->ndim, t->shape, &nbytes, err);
	if (rc)
		return rc;
	*s = (struct ipc_tensor){0};
	rc = place(b, t, nbytes, s, key, err);
	if (rc)
		return rc;
	s->name = t->name;
	s->dtype = (int)t->dtype;
	s->ndim = (size_t)t->ndim;
	s->shape = t->shape;
	s->nbytes = nbytes;
	if (t->global_shape) {
		if (!t->global_offset)
			return ipc_errf(err, -EINVAL,
			                "tensor '%s': global_shape without global_offset", t->name);
		s->global_ndim = (size_t)t->ndim;
		s->global_shape = t->global_shape;
		s->global_offset = t->global_offset;
	}
	return 0;
}

static int plan_request(struct build *b, const struct ckpt_tensor *t, size_t n, char *err)
{
	int rc = 0;

	b->v = calloc(n ? n : 1, sizeof(*b->v));
	b->keys = calloc(n ? n : 1, sizeof(*b->keys));
	if (!b->v || !b->keys)
		return ipc_errf(err, -ENOMEM, "out of memory for %zu tensors", n);
	pthread_mutex_lock(&b->c->mu);
	for (size_t i = 0; i < n && !rc; i++)
		rc = spec_tensor(b, &t[i], &b->v[i], &b->keys[i], err);
	if (!rc)
		rc = ipc_check_tensors(b->v, n, region_size, b, err);
	pthread_mutex_unlock(&b->c->mu);
	return rc;
}

/*
 * A CUDA plan's side: the allocations, the request's CUDA regions (all on
 * one GPU: a rank drives one), its event, and its fence page: a host region
 * the agent maps too, registered with CUDA so a stream can wait on it.
 */
static int gpu_side(struct build *b, struct ckpt_plan *p, char *err)
{
	const struct cl_alloc *fa;
	uint64_t off;
	int rc;

	for (size_t i = 0; i < b->ngpu; i++)
		if (b->gpu[i].dev != b->gpu[0].dev)
			return ipc_errf(err, -EINVAL,
			                "tensors on GPUs %d and %d: a rank's plan names "
			                "one GPU",
			                b->gpu[0].dev, b->gpu[i].dev);
	rc = cl_host_alloc(b->c, 4096, &p->fence_mem);
	if (rc)
		return ipc_errf(err, rc, "the fence page: %s", b->c->last_error);
	rc = cl_gpu_plan_init(&p->gpu, b->gpu[0].dev, p->fence_mem, err);
	if (rc)
		return rc;
	pthread_mutex_lock(&b->c->mu);
	fa = locate(b->c, p->fence_mem, 4096, &off);
	b->fence_region = fa ? fa->region_id : 0;
	p->fence_key = fa ? fa->key : 0;
	pthread_mutex_unlock(&b->c->mu);
	p->cuda = true;
	return 0;
}

/* Frees a plan that never reached (or has left) the agent; agent: whether one answers. */
static void plan_free_local(struct ckpt_client *c, struct ckpt_plan *p, bool agent)
{
	if (!p)
		return;
	cl_gpu_plan_free(&p->gpu); /* unregisters the fence page before it goes */
	if (p->fence_mem && c)
		cl_host_free(c, p->fence_mem, agent);
	free(p->req);
	free(p->keys);
	free(p);
}

int cl_opts_take(const void *in, void *out, size_t known, size_t least, const char *name, char *err)
{
	size_t size = *(const size_t *)in;

	memset(out, 0, known);
	if (size < least)
		return ipc_errf(err, -EINVAL,
		                "struct %s: size %zu is too small (set it to sizeof, or start from "
		                "its _INIT)",
		                name, size);
	for (size_t i = known; i < size; i++)
		if (((const unsigned char *)in)[i])
			return ipc_errf(
			    err, -E2BIG,
			    "struct %s: an option this libckpt does not know is set (byte "
			    "%zu of %zu): a newer libckpt is needed",
			    name, i, size);
	memcpy(out, in, size < known ? size : known);
	*(size_t *)out = known;
	return 0;
}

/*
 * The caller's options into o (zeroed first): fields past what the caller
 * knows stay at their defaults; fields we do not know must be zero.
 */
static int plan_opts(const struct ckpt_plan_opts *in, struct ckpt_plan_opts *o, char *err)
{
	const size_t least =
	    offsetof(struct ckpt_plan_opts, backpressure) + sizeof(o->backpressure);
	int rc;

	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	if (!in)
		goto run;
	if ((rc = cl_opts_take(in, o, sizeof(*o), least, "ckpt_plan_opts", err)))
		return rc;
	if (o->reserved)
		return ipc_errf(err, -EINVAL,
		                "struct ckpt_plan_opts: `reserved` is %u, it must be zero (start "
		                "from CKPT_PLAN_OPTS_INIT)",
		                o->reserved);
run:
	if (!o->run || !*o->run)
		o->run = getenv("CKPT_RUN");
	if (o->run && *o->run) {
		char why[IPC_ERRLEN];

		if ((rc = ipc_check_run(o->run, why)))
			return ipc_errf(err, rc, "%s%s",
			                in && in->run && *in->run ? "" : "$CKPT_RUN: ", why);
	}
	return 0;
}

static int plan_args(struct ckpt_client *c, const char *job, int rank, int world, size_t n,
                     enum ckpt_backpressure bp, char *err)
{
	int rc = ipc_check_job(job, err);

	if (!rc)
		rc = ipc_check_rank(rank, world, err);
	if (!rc && (bp < CKPT_BP_DEFAULT || bp > CKPT_BP_SKIP))
		rc = ipc_errf(err, -EINVAL, "unknown backpressure policy %d", bp);
	if (!rc && n > IPC_MAX_TENSORS)
		rc = ipc_errf(err, -EINVAL, "%zu tensors in one plan, at most %d", n,
		              IPC_MAX_TENSORS);
	return rc;
}

/* p, as the agent made it: the client's, handed again to a new agent. */
static void plan_add(struct ckpt_client *c, struct ckpt_plan *p, const struct plan_made *rep,
                     const char *job, int rank, int world)
{
	p->c = c;
	p->id = rep->plan_id;
	snprintf(p->job, sizeof(p->job), "%s", job);
	p->rank = rank;
	p->world = world;
	p->shard_bytes = rep->shard_bytes;
	p->uploads = rep->uploads;
	pthread_mutex_lock(&c->mu);
	p->next = c->plans;
	c->plans = p;
	c->register_again = cl_register_again;
	pthread_mutex_unlock(&c->mu);
}

/*
 * The request, sent (cl_rpc_create_plan): packed into p->req first, kept for
 * an agent that comes back (trainer_register.c).
 */
static int plan_send(struct build *b, struct ckpt_plan *p, const char *job, int rank, int world,
                     size_t n, const struct ckpt_plan_opts *o, struct plan_made *rep)
{
	struct plan_spec spec = {
	    .job = job,
	    .rank = rank,
	    .world = world,
	    .backpressure = o->backpressure,
	    .run = o->run && *o->run ? o->run : "",
	    .copies = o->copies,
	    .tensors = b->v,
	    .n = n,
	    .gpu = b->gpu,
	    .ngpu = b->ngpu,
	    .fence_region = b->fence_region,
	};

	return cl_rpc_create_plan(b->c, &spec, p, rep, CL_DEFAULT_TIMEOUT_MS);
}

int ckpt_plan_create_opts(struct ckpt_client *c, const char *job, int rank, int world,
                          const struct ckpt_tensor *t, size_t n, const struct ckpt_plan_opts *opts,
                          struct ckpt_plan **out)
{
	struct ckpt_plan_opts o;
	struct plan_made rep;
	struct build b = {.c = c};
	struct ckpt_plan *p = NULL;
	char err[IPC_ERRLEN];
	int rc;

	if (!c || !out || (n && !t))
		return c ? cl_fail(c, -EINVAL, "ckpt_plan_create: NULL argument") : -EINVAL;
	*out = NULL;
	if (!c->attached)
		return cl_fail(c, -EINVAL, "ckpt_plan_create needs a client from ckpt_connect");
	rc = cl_enter(c);
	if (rc)
		return rc;
	rc = plan_opts(opts, &o, err);
	if (!rc)
		rc = plan_args(c, job, rank, world, n, o.backpressure, err);
	if (!rc)
		rc = plan_request(&b, t, n, err);
	if (!rc && !(p = calloc(1, sizeof(*p))))
		rc = ipc_errf(err, -ENOMEM, "out of memory");
	if (!rc && b.ngpu)
		rc = gpu_side(&b, p, err);
	if (rc) { /* the job is named only once it is known to be a name */
		rc = ipc_check_job(job, NULL)
		         ? cl_fail(c, rc, "plan: %s", err)
		         : cl_fail(c, rc, "plan for job %s rank %d: %s", job, rank, err);
		goto out;
	}
	rc = plan_send(&b, p, job, rank, world, n, &o, &rep);
	if (rc)
		goto out;
	p->keys = b.keys;
	b.keys = NULL;
	plan_add(c, p, &rep, job, rank, world);
	*out = p;
	p = NULL;
out:
	plan_free_local(c, p, true);
	free(b.v);
	free(b.gpu);
	free(b.keys);
	cl_leave(c);
	return rc;
}

int ckpt_plan_create2(struct ckpt_client *c, const char *job, int rank, int world,
                      const struct ckpt_tensor *t, size_t n, enum ckpt_backpressure bp,
                      struct ckpt_plan **out)
{
	struct ckpt_plan_opts o = CKPT_PLAN_OPTS_INIT;

	o.backpressure = bp;
	return ckpt_plan_create_opts(c, job, rank, world, t, n, &o, out);
}

int ckpt_plan_create(struct ckpt_client *c, const char *job, int rank, int world,
                     const struct ckpt_tensor *t, size_t n, struct ckpt_plan **out)
{
	return ckpt_plan_create_opts(c, job, rank, world, t, n, NULL, out);
}

/*
 * A dropped CUDA plan's saves still capture (the agent keeps its memory open
 * until they end), and the trainer's streams may wait on its fence: the page
 * goes only once the agent has moved the word past every number it gave, or
 * is gone or not answering (its DropPlan went unanswered), or has not in
 * CL_DEFAULT_TIMEOUT_MS (then the word is moved here, and the log says so).
 */
static void wait_fence(struct ckpt_plan *p)
{
	struct ckpt_client *c = p->c;
	int64_t waited_us = 0;
	uint32_t last;
	bool gone;

	for (;;) {
		pthread_mutex_lock(&c->mu);
		last = p->last_seq;
		/* an agent that does not answer (or went away) moves nothing */
		gone = c->gone || c->away || c->unanswered;
		pthread_mutex_unlock(&c->mu);
		if (gone || cl_gpu_passed(cl_gpu_fence_word(&p->gpu), last))
			break;
		if (waited_us >= (int64_t)CL_DEFAULT_TIMEOUT_MS * 1000) {
			fprintf(stderr,
			        "libckpt: job %s rank %d: the agent has not finished the "
			        "plan's saves in %d s; its fence is opened\n",
			        p->job, p->rank, CL_DEFAULT_TIMEOUT_MS / 1000);
			break;
		}
		usleep(1000);
		waited_us += 1000;
	}
	cl_gpu_release(&p->gpu, last);
}

void ckpt_plan_destroy(struct ckpt_plan *p)
{
	struct ckpt_client *c = p ? p->c : NULL;
	bool agent = false;

	if (!p)
		return;
	if (p->c) { /* else the client is gone, and the agent dropped the plan with it */
		agent = cl_enter_tidy(p->c);
		if (agent && !p->lost[0])
			cl_rpc_drop_plan(p->c, p->id);
		if (p->cuda)
			wait_fence(p);
		pthread_mutex_lock(&p->c->mu);
		for (struct ckpt_plan **pp = &p->c->plans; *pp; pp = &(*pp)->next)
			if (*pp == p) {
				*pp = p->next;
				break;
			}
		for (struct ckpt_save *s = p->c->saves; s; s = s->next)
			if (s->plan_id == p->id)
				s->fence_dev = 0; /* the page goes: ckpt_save_fence has passed */
		pthread_mutex_unlock(&p->c->mu);
	}
	plan_free_local(p->c, p, agent);
	if (agent)
		cl_leave(c);
	else if (c)
		cl_leave_local(c);
}

uint64_t ckpt_plan_bytes(const struct ckpt_plan *p)
{
	return p ? p->shard_bytes : 0;
}
