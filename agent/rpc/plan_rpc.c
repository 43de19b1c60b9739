/*
 * The plan RPCs: CreatePlan (a plan made from a request: the tensors
 * checked here, as libckpt checked them before sending, because the agent
 * trusts no client; the shard laid out; a CUDA plan's GPU side opened on
 * a capture worker; the job's owner claimed on the maint thread) and
 * DropPlan. The plan itself, once made, is plan.c's.
 *
 * Control thread, but for gpu_open_run (a capture worker) and claim_run
 * (the maint thread), each handing the call back under agent.mu.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/node/node.h"
#include "agent/rpc/access.h"
#include "agent/node/session.h"
#include "agent/node/plan.h"
#include "agent/rpc/ops.h"
#include "agent/rpc/handlers.h"
#include "agent/rpc/server.h"
#include "ipc/base/log.h"
#include "storage/store.h"

#define MAX_PLANS 65536

/* ---- creation --------------------------------------------------------- */

struct region_lookup {
	struct session *sess;
	const Ckpt__V1__CreatePlanRequest *req;
};

static int region_size(void *ctx, int kind, uint64_t region, uint64_t *size)
{
	struct region_lookup *l = ctx;
	struct region *r;

	if (kind == CKPT__V1__REGION_KIND__REGION_CUDA) {
		if (region >= l->req->n_cuda_regions)
			return -ENOENT;
		*size = l->req->cuda_regions[region]->size;
		return 0;
	}
	if (kind != CKPT__V1__REGION_KIND__REGION_HOST)
		return -ENOTSUP;
	r = region_find(l->sess, region);
	if (!r)
		return -ENOENT;
	*size = r->shm.size;
	return 0;
}

static int cmp_name(const void *x, const void *y)
{
	return strcmp(((const struct plan_tensor *)x)->name, ((const struct plan_tensor *)y)->name);
}

/*
 * Another live plan of the same job must agree: same world, another rank,
 * and a tensor name on two ranks only as chunks of one sharded tensor.
 */
static int check_job_peers(struct agent *a, const struct plan *np, char *err)
{
	struct plan_tensor *sorted = NULL;
	struct list *pos;
	int rc = 0;

	list_for_each(pos, &a->plans)
	{
		struct plan *p = container_of(pos, struct plan, link);

		if (strcmp(p->job, np->job) != 0)
			continue;
		if (p->world != np->world)
			return ipc_errf(err, -EINVAL,
			                "job %s already has plans with world %d; this one says %d",
			                np->job, p->world, np->world);
		if (p->rank == np->rank)
			return ipc_errf(err, -EEXIST,
			                "job %s rank %d already has a plan (client %s, pid %u): "
			                "destroy it first",
			                np->job, np->rank, p->sess ? p->sess->client : "?",
			                p->sess ? p->sess->pid : 0);
		if (!sorted) {
			sorted = malloc(np->n * sizeof(*sorted) + 1);
			if (!sorted)
				return ipc_errf(err, -ENOMEM, "out of memory");
			memcpy(sorted, np->t, np->n * sizeof(*sorted));
			qsort(sorted, np->n, sizeof(*sorted), cmp_name);
		}
		for (size_t i = 0; i < p->n; i++) {
			const struct plan_tensor *o = &p->t[i], *t;

			t = bsearch(o, sorted, np->n, sizeof(*sorted), cmp_name);
			if (!t)
				continue;
			if (!t->sharded || !o->sharded || t->dtype != o->dtype ||
			    t->ndim != o->ndim ||
			    memcmp(t->global_shape, o->global_shape, t->ndim * sizeof(int64_t))) {
				rc = ipc_errf(
				    err, -EINVAL,
				    "tensor '%s' is also saved by rank %d of job %s: a name "
				    "on several ranks must be chunks of one sharded tensor "
				    "(same dtype and global shape)",
				    t->name, p->rank, np->job);
				goto out;
			}
		}
	}
out:
	free(sorted);
	return rc;
}

/* The plan's own layout: every tensor whole, in the request's order. */
static int lay_out(struct plan *p, char *err)
{
	p->whole = (struct shard_layout){.n = p->n, .t = p->t};
	for (size_t i = 0; i < p->n; i++)
		p->whole.held_bytes += p->t[i].nbytes;
	return shard_layout_header(&p->whole, p, err);
}

/*
 * Copies the request's tensors into the plan. Regions are attached last, with
 * one reference per distinct region, so a failure half way leaves none taken.
 */
static int fill_tensors(struct plan *p, struct session *sess, const struct ipc_tensor *v, size_t n,
                        char *err)
{
	p->t = calloc(n ? n : 1, sizeof(*p->t));
	if (!p->t)
		return ipc_errf(err, -ENOMEM, "out of memory for %zu tensors", n);
	for (size_t i = 0; i < n; i++) {
		struct plan_tensor *t = &p->t[i];

		t->name = strdup(v[i].name);
		if (!t->name)
			return ipc_errf(err, -ENOMEM, "out of memory");
		p->n = i + 1;
		t->dtype = v[i].dtype;
		t->ndim = v[i].ndim;
		/* A scalar (ndim 0) arrives with no shape array at all: copy nothing. */
		if (t->ndim)
			memcpy(t->shape, v[i].shape, t->ndim * sizeof(int64_t));
		t->sharded = v[i].global_ndim > 0;
		if (t->sharded) {
			memcpy(t->global_shape, v[i].global_shape, t->ndim * sizeof(int64_t));
			memcpy(t->global_offset, v[i].global_offset, t->ndim * sizeof(int64_t));
		} else if (t->ndim) {
			memcpy(t->global_shape, t->shape, t->ndim * sizeof(int64_t));
		}
		t->offset = v[i].offset;
		t->nbytes = v[i].nbytes;
	}
	for (size_t i = 0; i < n; i++) {
		struct region *r;
		bool seen = false;

		if (v[i].kind == CKPT__V1__REGION_KIND__REGION_CUDA) {
			p->t[i].dptr = (char *)p->gpu->mem[v[i].region] + v[i].offset;
			continue;
		}
		r = region_find(sess, v[i].region);
		for (size_t j = 0; j < i && !seen; j++)
			seen = p->t[j].region == r;
		if (!seen)
			r->refs++;
		p->t[i].region = r;
	}
	return 0;
}

/* The first CUDA plan pins the staging pool for DMA (once: gpu.h). */
static void pin_pool(struct agent *a, int dev)
{
	unsigned n;
	const struct iovec *iov = pool_iovecs(a->pool, &n);

	gpu_pin(a->gpu, dev, iov[0].iov_base, (uint64_t)n * pool_chunk_bytes(a->pool));
}

/*
 * No lock (a worker): a CUDA plan's GPU side: every allocation on one device
 * (a rank drives one GPU), opened once through the cache, and a lane; the
 * first pins the staging pool. The slow CUDA calls of a plan, all here.
 */
static int gpu_side_open(struct agent *a, const Ckpt__V1__CreatePlanRequest *req,
                         struct plan_gpu **out, char *err)
{
	struct plan_gpu *g;
	int dev = -1, rc;

	*out = NULL;
	if (!gpu_usable(a->gpu))
		return ipc_errf(err, -ENOTSUP, "CUDA tensors, but %s", gpu_status(a->gpu));
	for (size_t i = 0; i < req->n_cuda_regions; i++) {
		const Ckpt__V1__CudaRegion *r = req->cuda_regions[i];
		int d = gpu_device_of(a->gpu, r->device_uuid.data, r->device_uuid.len, err);

		if (d < 0)
			return d;
		if (dev >= 0 && d != dev)
			return ipc_errf(err, -EINVAL,
			                "CUDA tensors on two GPUs in one plan: a "
			                "rank's plan names one GPU");
		dev = d;
	}
	g = calloc(1, sizeof(*g));
	if (!g)
		return ipc_errf(err, -ENOMEM, "out of memory");
	if (pthread_mutex_init(&g->capture, NULL)) {
		free(g);
		return ipc_errf(err, -ENOMEM, "out of memory");
	}
	g->dev = dev;
	g->mem = calloc(req->n_cuda_regions, sizeof(void *));
	rc = g->mem ? 0 : ipc_errf(err, -ENOMEM, "out of memory");
	if (!rc) {
		g->n = req->n_cuda_regions;
		pin_pool(a, dev);
	}
	for (size_t i = 0; !rc && i < g->n; i++) {
		const Ckpt__V1__CudaRegion *r = req->cuda_regions[i];

		rc = gpu_mem_get(a->gpu, dev, r->ipc_handle.data, r->ipc_handle.len, r->size,
		                 &g->mem[i], err);
	}
	if (!rc)
		rc = gpu_lane_create(a->gpu, dev, &g->lane, err);
	if (rc) {
		plan_gpu_close(a, g);
		return rc;
	}
	*out = g;
	return 0;
}

/* Under mu: the GPU side opened for p, with the trainer's fence page. */
static int attach_gpu(struct plan *p, struct session *sess, struct plan_gpu *g,
                      const Ckpt__V1__CreatePlanRequest *req, char *err)
{
	struct region *fence = region_find(sess, req->fence_region);

	if (!fence || fence->shm.size < sizeof(uint32_t))
		return ipc_errf(err, -EINVAL,
		                "a CUDA plan needs its fence page (a registered "
		                "host region)");
	p->gpu = g;
	g->fence_region = fence;
	fence->refs++;
	/*
	 * Numbers go on from the word the page holds: a trainer that attaches
	 * again after an agent restart keeps its page, which its streams may
	 * still wait on, and the word never moves back (a new page holds 0).
	 */
	g->fence.issued = g->fence.released =
	    __atomic_load_n((uint32_t *)fence->shm.data, __ATOMIC_ACQUIRE);
	return 0;
}

/*
 * Under mu: what can be checked of a request without building the plan:
 * the caller's session, the limit, its tensors against its regions. The
 * session and the tensors (malloc'd) into *sess and *v.
 */
static int request_check(struct agent *a, struct rpc *c, const Ckpt__V1__CreatePlanRequest *req,
                         struct session **sess, struct ipc_tensor **v, char *err)
{
	struct region_lookup l;
	int rc;

	*v = NULL;
	*sess = session_of(a, rpc_peer(c)->uid, req->session_id, err);
	if (!*sess)
		return -ENOENT;
	if (a->nplans >= MAX_PLANS)
		return ipc_errf(err, -EAGAIN, "the agent holds %u plans, its limit", a->nplans);
	rc = ipc_tensors_from_request(req, v, err);
	if (rc)
		return rc;
	l.sess = *sess;
	l.req = req;
	return ipc_check_tensors(*v, req->n_tensors, region_size, &l, err);
}

static int plan_build(struct agent *a, struct rpc *c, const Ckpt__V1__CreatePlanRequest *req,
                      struct plan_gpu **gpu, struct plan **out, char *err)
{
	struct ipc_tensor *v = NULL;
	struct session *sess;
	struct plan *p;
	int rc;

	rc = request_check(a, c, req, &sess, &v, err);
	if (rc)
		goto out;
	p = calloc(1, sizeof(*p));
	if (!p) {
		rc = ipc_errf(err, -ENOMEM, "out of memory");
		goto out;
	}
	*out = p;
	snprintf(p->job, sizeof(p->job), "%s", req->job);
	snprintf(p->run, sizeof(p->run), "%s", req->run && *req->run ? req->run : IPC_DEFAULT_RUN);
	p->rank = req->rank;
	p->world = req->world;
	p->backpressure = req->backpressure
	                      ? (enum backpressure)req->backpressure /* checked: BLOCK or SKIP */
	                      : a->cfg.backpressure;
	p->copies = req->copies ? req->copies : 1;
	p->sess = sess;
	p->refs = 1;
	if (req->n_cuda_regions) {
		rc = attach_gpu(p, sess, *gpu, req, err);
		if (rc)
			goto out;
		*gpu = NULL; /* the plan's now */
	}
	rc = fill_tensors(p, sess, v, req->n_tensors, err);
	if (rc)
		goto out;
	rc = check_job_peers(a, p, err);
	if (rc)
		goto out;
	rc = lay_out(p, err);
out:
	free(v);
	return rc;
}

/* Under mu: the plan charged to its user, listed, and published. */
static int plan_add(struct agent *a, struct rpc *c, struct plan *p, char *err)
{
	uid_t uid = rpc_peer(c)->uid;
	int rc = usage_charge(a, uid, USE_PLANS, 1, err);

	if (!rc && (rc = usage_charge(a, uid, USE_TENSORS, p->n, err)))
		usage_release(a, uid, USE_PLANS, 1);
	if (rc)
		return rc;
	p->uid = uid;
	p->id = ipc_random_id();
	list_add_tail(&a->plans, &p->link);
	list_add_tail(&p->sess->plans, &p->slink);
	a->nplans++;
	/* the other nodes of the job learn from the plans file where this rank is */
	hub_plan(&a->hub, a, p, false);
	return 0;
}

/*
 * The plan, once the job's owner is known to allow the caller, with its GPU
 * side opened (NULL: host memory only); replies.
 */
static void create_plan_with(struct agent *a, struct rpc *c, Ckpt__V1__CreatePlanRequest *req,
                             struct plan_gpu *gpu)
{
	Ckpt__V1__CreatePlanReply rep = CKPT__V1__CREATE_PLAN_REPLY__INIT;
	char err[IPC_ERRLEN];
	struct plan *p = NULL;
	int rc;

	pthread_mutex_lock(&a->mu);
	rc = access_job(a, rpc_peer(c), req->job, ACCESS_OWN, err);
	if (!rc && (rc = plan_build(a, c, req, &gpu, &p, err)) == 0)
		rc = plan_add(a, c, p, err);
	if (rc) {
		if (p)
			plan_free(a, p);
		pthread_mutex_unlock(&a->mu);
		plan_gpu_close(a, gpu); /* not taken by a plan */
		rpc_fail(c, rc, "plan for job %s rank %d: %s", req->job, req->rank, err);
		return;
	}
	rep.plan_id = p->id;
	rep.shard_bytes = p->whole.shard_bytes;
	rep.header_bytes = p->whole.header_len;
	rep.run = p->run;
	rep.node = (char *)a->cfg.node;
	rep.uploads = a->up != NULL;
	/*
	 * Logged and packed under the lock: off the control thread (a worker
	 * made the GPU side, or the commit thread the owner), the trainer's
	 * session may end, and free p, as soon as the lock is let go.
	 */
	log_msg(LOG_INFO, "plan for job %s rank %d/%d (run %s, uid %u): %zu tensors, %llu bytes",
	        p->job, p->rank, p->world, p->run, (unsigned)p->uid, p->n,
	        (unsigned long long)p->whole.shard_bytes);
	rpc_reply(c, &rep.base);
	pthread_mutex_unlock(&a->mu);
}

/*
 * A CreatePlan call handed to a worker: a CUDA plan waiting for its GPU side
 * (capture worker), a plan of a job whose owner is not known here yet, found
 * or recorded first (commit thread).
 */
struct plan_job {
	struct work w;
	struct agent *a;
	struct rpc *c;
	Ckpt__V1__CreatePlanRequest *req;
};

static void gpu_open_run(struct work *w)
{
	struct plan_job *go = container_of(w, struct plan_job, w);
	struct plan_gpu *g = NULL;
	char err[IPC_ERRLEN];
	int rc;

	workq_wait_begin(go->a->capture); /* the driver's time, not a copy */
	rc = gpu_side_open(go->a, go->req, &g, err);
	workq_wait_end(go->a->capture);
	if (rc)
		rpc_fail(go->c, rc, "plan for job %s rank %d: %s", go->req->job, go->req->rank,
		         err);
	else
		create_plan_with(go->a, go->c, go->req, g);
	protobuf_c_message_free_unpacked(&go->req->base, NULL);
	free(go);
}

/*
 * The plan, once the job's owner is known to allow the caller; replies. A
 * CUDA plan's GPU side is opened first on a capture worker (pinning the pool
 * and opening IPC handles take the driver's time): true when req was handed
 * over there, and is no longer the caller's to free.
 */
static bool create_plan(struct agent *a, struct rpc *c, Ckpt__V1__CreatePlanRequest *req)
{
	struct plan_job *go;
	struct session *sess;
	struct ipc_tensor *v = NULL;
	char err[IPC_ERRLEN];
	int rc;

	if (!req->n_cuda_regions) {
		create_plan_with(a, c, req, NULL);
		return false;
	}
	/* Nothing is opened on a GPU for a caller the plan would refuse anyway. */
	pthread_mutex_lock(&a->mu);
	rc = access_job(a, rpc_peer(c), req->job, ACCESS_OWN, err);
	if (!rc)
		rc = request_check(a, c, req, &sess, &v, err);
	pthread_mutex_unlock(&a->mu);
	free(v);
	if (rc) {
		rpc_fail(c, rc, "plan for job %s rank %d: %s", req->job, req->rank, err);
		return false;
	}
	go = calloc(1, sizeof(*go));
	if (!go) {
		rpc_fail(c, -ENOMEM, "plan for job %s: out of memory", req->job);
		return false;
	}
	*go = (struct plan_job){.w.fn = gpu_open_run, .a = a, .c = c, .req = req};
	workq_push(a->capture, &go->w);
	return true;
}

/* Any thread: whether the root holds any step of job. */
static bool job_has_steps(struct agent *a, const char *job)
{
	struct storage_step *steps = NULL;
	char err[IPC_ERRLEN];
	size_t n = 0;
	int rc = a->store->ops->list_steps(a->store, job, &steps, &n, err);

	free(steps);
	return rc == 0 && n > 0;
}

/* Commit thread: the owner read from the root, or the caller recorded as it. */
static void claim_run(struct work *w)
{
	struct plan_job *oc = container_of(w, struct plan_job, w);
	struct agent *a = oc->a;
	char err[IPC_ERRLEN];
	const struct peer *who = rpc_peer(oc->c);
	uint32_t owner = 0;
	int rc = store_owner_get(a->store, oc->req->job, &owner, err);

	/*
	 * Nobody owns it yet. A job that already holds steps was made before
	 * owners were recorded: not for the first user who names it.
	 */
	if (rc == -ENOENT && !who->super && job_has_steps(a, oc->req->job))
		rc =
		    ipc_errf(err, -EACCES,
		             "it holds checkpoints but no owner is recorded: root assigns it (echo "
		             "UID > %s/%s/OWNER)",
		             a->cfg.root, oc->req->job);
	else if (rc == -ENOENT)
		rc = store_owner_claim(a->store, oc->req->job, (uint32_t)who->uid, &owner, err);
	if (rc) {
		rpc_fail(oc->c, rc, "plan for job %s: %s", oc->req->job, err);
	} else {
		pthread_mutex_lock(&a->mu);
		owner_note(a, oc->req->job, true, owner);
		pthread_mutex_unlock(&a->mu);
		if (create_plan(a, oc->c, oc->req))
			oc->req = NULL; /* handed over */
	}
	if (oc->req)
		protobuf_c_message_free_unpacked(&oc->req->base, NULL);
	free(oc);
}

void rpc_create_plan(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__CreatePlanRequest *req = (Ckpt__V1__CreatePlanRequest *)m;
	struct agent *a = ctx;
	struct plan_job *oc;
	char err[IPC_ERRLEN];
	uint32_t owner;
	int rc;

	rc = ipc_check_job(req->job, err);
	if (!rc)
		rc = ipc_check_rank(req->rank, req->world, err);
	if (!rc && req->run && *req->run)
		rc = ipc_check_run(req->run, err);
	if (!rc && (req->backpressure < 0 ||
	            req->backpressure > CKPT__V1__BACKPRESSURE__BACKPRESSURE_SKIP))
		rc = ipc_errf(err, -EINVAL, "unknown backpressure policy %d", req->backpressure);
	if (rc) {
		rpc_fail(c, rc, "%s", err);
		goto out;
	}
	pthread_mutex_lock(&a->mu);
	rc = owner_lookup(a, req->job, &owner);
	if (rc) { /* the whole request checked before any owner is recorded for it */
		struct session *sess;
		struct ipc_tensor *v;

		rc = request_check(a, c, req, &sess, &v, err);
		free(v);
		if (rc) {
			pthread_mutex_unlock(&a->mu);
			rpc_fail(c, rc, "plan for job %s rank %d: %s", req->job, req->rank, err);
			goto out;
		}
		rc = 1;
	}
	pthread_mutex_unlock(&a->mu);
	if (rc == 0) {
		if (create_plan(a, c, req))
			return; /* req handed over */
		goto out;
	}
	/* The disk decides who owns a job seen first now (maybe on another node). */
	oc = calloc(1, sizeof(*oc));
	if (!oc) {
		rpc_fail(c, -ENOMEM, "out of memory");
		goto out;
	}
	*oc = (struct plan_job){.w.fn = claim_run, .a = a, .c = c, .req = req};
	workq_push(a->commit, &oc->w);
	return;
out:
	protobuf_c_message_free_unpacked(m, NULL);
}

void rpc_drop_plan(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__DropPlanRequest *req = (Ckpt__V1__DropPlanRequest *)m;
	Ckpt__V1__Empty rep = CKPT__V1__EMPTY__INIT;
	struct agent *a = ctx;
	struct plan *p;

	pthread_mutex_lock(&a->mu);
	p = plan_of(a, rpc_peer(c)->uid, req->plan_id);
	if (p)
		plan_drop(a, p);
	pthread_mutex_unlock(&a->mu);
	if (p)
		rpc_reply(c, &rep.base);
	else
		rpc_fail(c, -ENOENT, "no plan %llu", (unsigned long long)req->plan_id);
	protobuf_c_message_free_unpacked(m, NULL);
}
