/*
 * libckpt's plans (ckpt_plan_create*, ckpt_plan_destroy, ckpt_plan_bytes):
 * each call checks its arguments with the same rules the agent applies
 * (ipc/validate.c), so a mistake is reported before anything is sent, in the
 * same words; the CreatePlan request is kept for an agent that comes back
 * (trainer_register.c). The caller's thread. Host memory: trainer_host.c;
 * saves: trainer_save.c; restores: restore.c.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <unistd.h>

#include "client/client.h"

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
	struct cl_gpu_alloc *gpu; /* each allocation once, in first-seen order */
	size_t ngpu;
	uint64_t *keys; /* each tensor's host region (its key), 0 for CUDA memory */
};

static int region_size(void *ctx, int kind, uint64_t region, uint64_t *size)
{
	struct build *b = ctx;

	if (kind == CKPT__V1__REGION_KIND__REGION_CUDA) {
		if (region >= b->ngpu)
			return -ENOENT;
		*size = b->gpu[region].size;
		return 0;
	}
	for (const struct cl_alloc *a = b->c->allocs; a; a = a->next)
		if (kind == CKPT__V1__REGION_KIND__REGION_HOST && a->region_id == region) {
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
                 Ckpt__V1__TensorSpec *s, uint64_t *key, char *err)
{
	const struct cl_alloc *a = locate(b->c, t->data, nbytes, &s->offset);
	struct cl_gpu_alloc g;
	int rc, idx;

	if (a) {
		s->kind = CKPT__V1__REGION_KIND__REGION_HOST;
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
	s->kind = CKPT__V1__REGION_KIND__REGION_CUDA;
	s->region = (uint64_t)idx;
	s->offset = (uint64_t)((uintptr_t)t->data - g.base);
	return 0;
}

/* Under c->mu: one tensor into the request, with its region found. */
static int spec_tensor(struct build *b, const struct ckpt_tensor *t, Ckpt__V1__TensorSpec *s,
                       struct ipc_tensor *v, uint64_t *key, char *err)
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
	ckpt__v1__tensor_spec__init(s);
	rc = place(b, t, nbytes, s, key, err);
	if (rc)
		return rc;
	s->name = (char *)t->name;
	s->dtype = (Ckpt__V1__DType)t->dtype;
	s->n_shape = (size_t)t->ndim;
	s->shape = (int64_t *)t->shape;
	s->nbytes = nbytes;
	if (t->global_shape) {
		if (!t->global_offset)
			return ipc_errf(err, -EINVAL,
			                "tensor '%s': global_shape without global_offset", t->name);
		s->n_global_shape = s->n_global_offset = (size_t)t->ndim;
		s->global_shape = (int64_t *)t->global_shape;
		s->global_offset = (int64_t *)t->global_offset;
	}
	*v = (struct ipc_tensor){s->name,           s->dtype,        s->n_shape,      s->shape,
	                         s->kind,           s->region,       s->offset,       s->nbytes,
	                         s->n_global_shape, s->global_shape, s->global_offset};
	return 0;
}

static int plan_request(struct build *b, const struct ckpt_tensor *t, size_t n,
                        Ckpt__V1__CreatePlanRequest *req, char *err)
{
	Ckpt__V1__TensorSpec *specs = calloc(n ? n : 1, sizeof(*specs));
	Ckpt__V1__TensorSpec **pv = calloc(n ? n : 1, sizeof(*pv));
	struct ipc_tensor *v = calloc(n ? n : 1, sizeof(*v));
	int rc = 0;

	b->keys = calloc(n ? n : 1, sizeof(*b->keys));
	if (!specs || !pv || !v || !b->keys) {
		rc = ipc_errf(err, -ENOMEM, "out of memory for %zu tensors", n);
		goto out;
	}
	pthread_mutex_lock(&b->c->mu);
	for (size_t i = 0; i < n && !rc; i++) {
		rc = spec_tensor(b, &t[i], &specs[i], &v[i], &b->keys[i], err);
		pv[i] = &specs[i];
	}
	if (!rc)
		rc = ipc_check_tensors(v, n, region_size, b, err);
	pthread_mutex_unlock(&b->c->mu);
	req->n_tensors = n;
	req->tensors = pv;
out:
	free(v);
	if (rc) {
		free(specs);
		free(pv);
		req->tensors = NULL;
	}
	return rc;
}

/*
 * A CUDA plan's side: the allocations as the request's CUDA regions (all on
 * one GPU: a rank drives one), its event, and its fence page: a host region
 * the agent maps too, registered with CUDA so a stream can wait on it.
 */
static int gpu_side(struct build *b, struct ckpt_plan *p, Ckpt__V1__CreatePlanRequest *req,
                    Ckpt__V1__CudaRegion *regs, Ckpt__V1__CudaRegion **pregs, char *err)
{
	const struct cl_alloc *fa;
	uint64_t off;
	int rc;

	for (size_t i = 0; i < b->ngpu; i++) {
		if (b->gpu[i].dev != b->gpu[0].dev)
			return ipc_errf(err, -EINVAL,
			                "tensors on GPUs %d and %d: a rank's plan names "
			                "one GPU",
			                b->gpu[0].dev, b->gpu[i].dev);
		ckpt__v1__cuda_region__init(&regs[i]);
		regs[i].ipc_handle.data = b->gpu[i].handle;
		regs[i].ipc_handle.len = CL_GPU_HANDLE;
		regs[i].size = b->gpu[i].size;
		regs[i].device = b->gpu[i].dev;
		regs[i].device_uuid.data = b->gpu[i].uuid;
		regs[i].device_uuid.len = CL_GPU_UUID;
		pregs[i] = &regs[i];
	}
	rc = cl_host_alloc(b->c, 4096, &p->fence_mem);
	if (rc)
		return ipc_errf(err, rc, "the fence page: %s", b->c->last_error);
	rc = cl_gpu_plan_init(&p->gpu, b->gpu[0].dev, p->fence_mem, err);
	if (rc)
		return rc;
	pthread_mutex_lock(&b->c->mu);
	fa = locate(b->c, p->fence_mem, 4096, &off);
	req->fence_region = fa ? fa->region_id : 0;
	p->fence_key = fa ? fa->key : 0;
	pthread_mutex_unlock(&b->c->mu);
	p->cuda = true;
	req->n_cuda_regions = b->ngpu;
	req->cuda_regions = pregs;
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

/* p, as the agent made it (rep, freed here): the client's, handed again to a new agent. */
static void plan_made(struct ckpt_client *c, struct ckpt_plan *p, Ckpt__V1__CreatePlanReply *rep,
                      const char *job, int rank, int world)
{
	p->c = c;
	p->id = rep->plan_id;
	snprintf(p->job, sizeof(p->job), "%s", job);
	p->rank = rank;
	p->world = world;
	p->shard_bytes = rep->shard_bytes;
	p->uploads = rep->uploads;
	protobuf_c_message_free_unpacked(&rep->base, NULL);
	pthread_mutex_lock(&c->mu);
	p->next = c->plans;
	c->plans = p;
	c->register_again = cl_register_again;
	pthread_mutex_unlock(&c->mu);
}

/* The CUDA side of the request (gpu_side), its region arrays allocated into *regs and *pregs. */
static int gpu_request(struct build *b, struct ckpt_plan *p, Ckpt__V1__CreatePlanRequest *req,
                       Ckpt__V1__CudaRegion **regs, Ckpt__V1__CudaRegion ***pregs, char *err)
{
	*regs = calloc(b->ngpu, sizeof(**regs));
	*pregs = calloc(b->ngpu, sizeof(**pregs));
	return *regs && *pregs ? gpu_side(b, p, req, *regs, *pregs, err)
	                       : ipc_errf(err, -ENOMEM, "out of memory");
}

/*
 * The request's plan-wide fields, then the request packed into p->req: kept
 * for an agent that comes back (trainer_register.c). 0 or -ENOMEM (said).
 */
static int request_kept(struct ckpt_client *c, struct ckpt_plan *p,
                        Ckpt__V1__CreatePlanRequest *req, const char *job, int rank, int world,
                        const struct ckpt_plan_opts *o)
{
	req->session_id = c->session_id;
	req->job = (char *)job;
	req->rank = rank;
	req->world = world;
	req->backpressure = (Ckpt__V1__Backpressure)o->backpressure;
	req->run = (char *)(o->run && *o->run ? o->run : "");
	req->copies = o->copies;
	p->req_len = protobuf_c_message_get_packed_size(&req->base);
	p->req = malloc(p->req_len ? p->req_len : 1);
	if (!p->req)
		return cl_fail(c, -ENOMEM, "out of memory");
	protobuf_c_message_pack(&req->base, p->req);
	return 0;
}

int ckpt_plan_create_opts(struct ckpt_client *c, const char *job, int rank, int world,
                          const struct ckpt_tensor *t, size_t n, const struct ckpt_plan_opts *opts,
                          struct ckpt_plan **out)
{
	struct ckpt_plan_opts o;
	Ckpt__V1__CreatePlanRequest req = CKPT__V1__CREATE_PLAN_REQUEST__INIT;
	Ckpt__V1__CreatePlanReply *rep = NULL;
	Ckpt__V1__CudaRegion *regs = NULL, **pregs = NULL;
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
		rc = plan_request(&b, t, n, &req, err);
	if (!rc && !(p = calloc(1, sizeof(*p))))
		rc = ipc_errf(err, -ENOMEM, "out of memory");
	if (!rc && b.ngpu)
		rc = gpu_request(&b, p, &req, &regs, &pregs, err);
	if (rc) { /* the job is named only once it is known to be a name */
		rc = ipc_check_job(job, NULL)
		         ? cl_fail(c, rc, "plan: %s", err)
		         : cl_fail(c, rc, "plan for job %s rank %d: %s", job, rank, err);
		goto out;
	}
	rc = request_kept(c, p, &req, job, rank, world, &o);
	if (!rc)
		rc = cl_call(c, IPC_CREATE_PLAN, &req.base, (ProtobufCMessage **)&rep,
		             CL_DEFAULT_TIMEOUT_MS);
	if (rc)
		goto out;
	p->keys = b.keys;
	b.keys = NULL;
	plan_made(c, p, rep, job, rank, world);
	*out = p;
	p = NULL;
out:
	plan_free_local(c, p, true);
	if (req.n_tensors && req.tensors)
		free(req.tensors[0]);
	free(req.tensors);
	free(regs);
	free(pregs);
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
	Ckpt__V1__DropPlanRequest req = CKPT__V1__DROP_PLAN_REQUEST__INIT;
	struct ckpt_client *c = p ? p->c : NULL;
	ProtobufCMessage *rep;

	bool agent = false;

	if (!p)
		return;
	if (p->c) { /* else the client is gone, and the agent dropped the plan with it */
		agent = cl_enter_tidy(p->c);
		req.plan_id = p->id;
		if (agent && !p->lost[0] && cl_tidy_call(p->c, IPC_DROP_PLAN, &req.base, &rep) == 0)
			protobuf_c_message_free_unpacked(rep, NULL);
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
