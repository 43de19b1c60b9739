/*
 * libckpt's plan calls (rpc.h): CreatePlan from a struct plan_spec (the
 * request packed into the plan first, kept for an agent that comes back),
 * the kept request again for such an agent (its host regions the new
 * agent's, found through each region's key), and DropPlan. The checks on a
 * plan are trainer_plan.c's, done before anything reaches here.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>

#include "client/rpc.h"
#include "client/rpc_call.h"

/* ckpt.h's and the library's numbers are the protocol's: a plan passes them on as they are. */
#define SAME(a, b) _Static_assert((int)(a) == (int)(b), #a " is not " #b)
SAME(CKPT_BOOL, CKPT__V1__DTYPE__DTYPE_BOOL);
SAME(CKPT_U8, CKPT__V1__DTYPE__DTYPE_U8);
SAME(CKPT_I8, CKPT__V1__DTYPE__DTYPE_I8);
SAME(CKPT_F8_E5M2, CKPT__V1__DTYPE__DTYPE_F8_E5M2);
SAME(CKPT_F8_E4M3, CKPT__V1__DTYPE__DTYPE_F8_E4M3);
SAME(CKPT_I16, CKPT__V1__DTYPE__DTYPE_I16);
SAME(CKPT_U16, CKPT__V1__DTYPE__DTYPE_U16);
SAME(CKPT_F16, CKPT__V1__DTYPE__DTYPE_F16);
SAME(CKPT_BF16, CKPT__V1__DTYPE__DTYPE_BF16);
SAME(CKPT_I32, CKPT__V1__DTYPE__DTYPE_I32);
SAME(CKPT_U32, CKPT__V1__DTYPE__DTYPE_U32);
SAME(CKPT_F32, CKPT__V1__DTYPE__DTYPE_F32);
SAME(CKPT_F64, CKPT__V1__DTYPE__DTYPE_F64);
SAME(CKPT_I64, CKPT__V1__DTYPE__DTYPE_I64);
SAME(CKPT_U64, CKPT__V1__DTYPE__DTYPE_U64);
SAME(CKPT_BP_DEFAULT, CKPT__V1__BACKPRESSURE__BACKPRESSURE_DEFAULT);
SAME(CKPT_BP_BLOCK, CKPT__V1__BACKPRESSURE__BACKPRESSURE_BLOCK);
SAME(CKPT_BP_SKIP, CKPT__V1__BACKPRESSURE__BACKPRESSURE_SKIP);
SAME(CL_REGION_HOST, CKPT__V1__REGION_KIND__REGION_HOST);
SAME(CL_REGION_CUDA, CKPT__V1__REGION_KIND__REGION_CUDA);

/* ---- a new plan ---------------------------------------------------------- */

/* The arrays a request points into, freed after the call. */
struct plan_bufs {
	Ckpt__V1__TensorSpec *specs, **pv;
	Ckpt__V1__CudaRegion *regs, **pregs;
};

static void tensor_spec(const struct ipc_tensor *t, Ckpt__V1__TensorSpec *s)
{
	ckpt__v1__tensor_spec__init(s);
	s->name = (char *)t->name;
	s->dtype = (Ckpt__V1__DType)t->dtype;
	s->n_shape = t->ndim;
	s->shape = (int64_t *)t->shape;
	s->kind = (Ckpt__V1__RegionKind)t->kind;
	s->region = t->region;
	s->offset = t->offset;
	s->nbytes = t->nbytes;
	s->n_global_shape = s->n_global_offset = t->global_ndim;
	s->global_shape = (int64_t *)t->global_shape;
	s->global_offset = (int64_t *)t->global_offset;
}

static void cuda_region(const struct cl_gpu_alloc *g, Ckpt__V1__CudaRegion *r)
{
	ckpt__v1__cuda_region__init(r);
	r->ipc_handle.data = (uint8_t *)g->handle;
	r->ipc_handle.len = CL_GPU_HANDLE;
	r->size = g->size;
	r->device = g->dev;
	r->device_uuid.data = (uint8_t *)g->uuid;
	r->device_uuid.len = CL_GPU_UUID;
}

/* The request from the spec (its arrays into b): 0 or -ENOMEM. */
static int plan_request(struct ckpt_client *c, const struct plan_spec *sp,
                        Ckpt__V1__CreatePlanRequest *req, struct plan_bufs *b)
{
	size_t n = sp->n ? sp->n : 1, ng = sp->ngpu ? sp->ngpu : 1;

	b->specs = calloc(n, sizeof(*b->specs));
	b->pv = calloc(n, sizeof(*b->pv));
	b->regs = calloc(ng, sizeof(*b->regs));
	b->pregs = calloc(ng, sizeof(*b->pregs));
	if (!b->specs || !b->pv || !b->regs || !b->pregs)
		return -ENOMEM;
	for (size_t i = 0; i < sp->n; i++) {
		tensor_spec(&sp->tensors[i], &b->specs[i]);
		b->pv[i] = &b->specs[i];
	}
	for (size_t i = 0; i < sp->ngpu; i++) {
		cuda_region(&sp->gpu[i], &b->regs[i]);
		b->pregs[i] = &b->regs[i];
	}
	req->n_tensors = sp->n;
	req->tensors = b->pv;
	req->n_cuda_regions = sp->ngpu;
	req->cuda_regions = sp->ngpu ? b->pregs : NULL;
	req->fence_region = sp->fence_region;
	req->session_id = c->session_id;
	req->job = (char *)sp->job;
	req->rank = sp->rank;
	req->world = sp->world;
	req->backpressure = (Ckpt__V1__Backpressure)sp->backpressure;
	req->run = (char *)sp->run;
	req->copies = sp->copies;
	return 0;
}

/* The request packed into p->req: kept for an agent that comes back (cl_rpc_create_plan_again). */
static int request_kept(struct ckpt_plan *p, const Ckpt__V1__CreatePlanRequest *req)
{
	p->req_len = protobuf_c_message_get_packed_size(&req->base);
	p->req = malloc(p->req_len ? p->req_len : 1);
	if (!p->req)
		return -ENOMEM;
	protobuf_c_message_pack(&req->base, p->req);
	return 0;
}

/* The reply read into *out, and freed. */
static void made_of(Ckpt__V1__CreatePlanReply *rep, struct plan_made *out)
{
	out->plan_id = rep->plan_id;
	out->shard_bytes = rep->shard_bytes;
	out->uploads = rep->uploads;
	protobuf_c_message_free_unpacked(&rep->base, NULL);
}

int cl_rpc_create_plan(struct ckpt_client *c, const struct plan_spec *spec, struct ckpt_plan *p,
                       struct plan_made *out, int timeout_ms)
{
	Ckpt__V1__CreatePlanRequest req = CKPT__V1__CREATE_PLAN_REQUEST__INIT;
	Ckpt__V1__CreatePlanReply *rep;
	struct plan_bufs b = {0};
	int rc = plan_request(c, spec, &req, &b);

	if (!rc)
		rc = request_kept(p, &req);
	if (rc)
		rc = cl_fail(c, rc, "out of memory");
	else
		rc = cl_call(c, IPC_CREATE_PLAN, &req.base, (ProtobufCMessage **)&rep, timeout_ms);
	if (!rc)
		made_of(rep, out);
	free(b.specs);
	free(b.pv);
	free(b.regs);
	free(b.pregs);
	return rc;
}

/* ---- a plan again, for an agent that came back --------------------------- */

/* Under c->mu: the new agent's id of the region with `key`; 0 if it has none. */
static uint64_t region_of(struct ckpt_client *c, uint64_t key)
{
	for (const struct cl_alloc *a = c->allocs; a; a = a->next)
		if (a->key == key)
			return a->region_id;
	return 0;
}

/*
 * The plan's request again, its region ids the new agent's. 0, or why not
 * (a region freed by the trainer, or one the agent refused) into `why`.
 */
static int request_again(struct ckpt_client *c, const struct ckpt_plan *p,
                         Ckpt__V1__CreatePlanRequest *req, char *why, size_t len)
{
	int rc = 0;

	req->session_id = c->session_id;
	pthread_mutex_lock(&c->mu);
	for (size_t i = 0; i < req->n_tensors && !rc; i++) {
		Ckpt__V1__TensorSpec *t = req->tensors[i];

		if (t->kind != CKPT__V1__REGION_KIND__REGION_HOST)
			continue;
		t->region = region_of(c, p->keys[i]);
		if (!t->region) {
			snprintf(why, len,
			         "tensor '%s': its memory (from ckpt_host_alloc) is freed, or the "
			         "agent refused it",
			         t->name);
			rc = -ENOENT;
		}
	}
	if (!rc && p->cuda) {
		req->fence_region = region_of(c, p->fence_key);
		if (!req->fence_region) {
			snprintf(why, len, "its fence page is not registered");
			rc = -ENOENT;
		}
	}
	pthread_mutex_unlock(&c->mu);
	return rc;
}

int cl_rpc_create_plan_again(struct ckpt_client *c, const struct ckpt_plan *p,
                             struct plan_made *out, int timeout_ms)
{
	Ckpt__V1__CreatePlanRequest *req =
	    ckpt__v1__create_plan_request__unpack(NULL, p->req_len, p->req);
	Ckpt__V1__CreatePlanReply *rep;
	char why[IPC_ERRLEN];
	int rc;

	if (!req)
		return CL_RPC_NO_REQUEST;
	rc = request_again(c, p, req, why, sizeof(why));
	if (!rc)
		rc = cl_call(c, IPC_CREATE_PLAN, &req->base, (ProtobufCMessage **)&rep, timeout_ms);
	else
		cl_fail(c, rc, "%s", why);
	ckpt__v1__create_plan_request__free_unpacked(req, NULL);
	if (!rc)
		made_of(rep, out);
	return rc;
}

void cl_rpc_drop_plan(struct ckpt_client *c, uint64_t plan_id)
{
	Ckpt__V1__DropPlanRequest req = CKPT__V1__DROP_PLAN_REQUEST__INIT;
	ProtobufCMessage *rep;

	req.plan_id = plan_id;
	if (cl_tidy_call(c, IPC_DROP_PLAN, &req.base, &rep) == 0)
		protobuf_c_message_free_unpacked(rep, NULL);
}
