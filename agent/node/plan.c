/*
 * Plans: what one rank saves. Made once (plan_rpc.c), reused by every
 * save: the shard laid out (header, then each tensor in the order given,
 * contiguous), its safetensors header built once; here the plan's life
 * (references, use, drop, its regions and GPU side let go) and its shard
 * image, filled chunk by chunk for a capture.
 *
 * Under agent.mu, but plan_queue_image, on capture workers, without the
 * lock: a plan's layout never changes and its regions stay mapped while it
 * is busy (plan_busy/plan_idle).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/node/node.h"
#include "agent/node/owners.h"
#include "agent/node/session.h"
#include "agent/node/plan.h"
#include "agent/node/layouts.h"
#include "agent/node/save.h"
#include "agent/pipe/safecopy.h"

struct plan *plan_find(struct agent *a, uint64_t id)
{
	struct list *pos;

	list_for_each(pos, &a->plans)
	{
		struct plan *p = container_of(pos, struct plan, link);

		if (p->id == id)
			return p;
	}
	return NULL;
}

struct plan *plan_of(struct agent *a, uid_t uid, uint64_t id)
{
	struct plan *p = plan_find(a, id);

	return p && p->uid == uid ? p : NULL;
}

void plan_get(struct plan *p)
{
	p->refs++;
}

/*
 * No lock: a GPU side's lane (waiting for its copies first) and allocations
 * (closed through the cache with their last plan). CUDA calls that may take
 * long: never under agent.mu.
 */
void plan_gpu_close(struct agent *a, struct plan_gpu *g)
{
	if (!g)
		return;
	if (g->lane)
		gpu_lane_destroy(g->lane);
	pthread_mutex_destroy(&g->capture);
	for (size_t i = 0; i < g->n; i++)
		if (g->mem[i])
			gpu_mem_put(a->gpu, g->dev, g->mem[i]);
	free(g->mem);
	free(g);
}

/* A capture worker: the GPU side of a plan that is gone. */
static void gpu_side_close_job(struct work *w)
{
	struct plan_gpu *g = container_of(w, struct plan_gpu, close);
	struct workq *q = g->agent->capture;

	workq_wait_begin(q); /* its stream's last copies, not a copy of ours */
	plan_gpu_close(g->agent, g);
	workq_wait_end(q);
}

/* Under mu: the GPU side goes (its CUDA teardown on a worker, outside the lock). */
static void release_gpu(struct agent *a, struct plan *p)
{
	struct plan_gpu *g = p->gpu;

	if (!g)
		return;
	if (g->fence_region)
		region_put(g->fence_region);
	g->fence_region = NULL;
	p->gpu = NULL;
	g->agent = a;
	g->close.fn = gpu_side_close_job;
	if (a->capture)
		workq_push(a->capture, &g->close);
	else /* at exit, the workers gone: nothing else runs */
		plan_gpu_close(a, g);
	for (size_t i = 0; i < p->n; i++)
		p->t[i].dptr = NULL;
}

/* Each region once: plans hold one reference per distinct region. */
static void release_regions(struct agent *a, struct plan *p)
{
	release_gpu(a, p);
	for (size_t i = 0; i < p->n; i++) {
		struct region *r = p->t[i].region;

		if (!r)
			continue;
		for (size_t j = i; j < p->n; j++)
			if (p->t[j].region == r)
				p->t[j].region = NULL;
		region_put(r);
	}
}

void plan_free(struct agent *a, struct plan *p)
{
	release_regions(a, p);
	for (size_t i = 0; i < p->n; i++)
		free(p->t[i].name);
	free(p->t);
	free(p->whole.header);
	if (p->dedup)
		layout_put(p->dedup);
	free(p);
}

void plan_put(struct agent *a, struct plan *p)
{
	if (--p->refs == 0)
		plan_free(a, p);
}

void plan_busy(struct plan *p)
{
	p->active++;
}

void plan_idle(struct agent *a, struct plan *p)
{
	if (--p->active == 0 && p->dropped)
		release_regions(a, p);
}

void plan_drop(struct agent *a, struct plan *p)
{
	if (p->dropped)
		return;
	p->dropped = true;
	a->nplans--;
	usage_release(a, p->uid, USE_PLANS, 1);
	usage_release(a, p->uid, USE_TENSORS, p->n);
	list_del(&p->link);
	list_del(&p->slink);
	p->sess = NULL;
	/* its saves not CAPTURED and its rank's steps in flight fail (checkpoint.c) */
	hub_plan(&a->hub, a, p, true);
	/* Mappings keep a dead trainer's memory alive: let them go as soon as idle. */
	if (p->active == 0)
		release_regions(a, p);
	plan_put(a, p);
}

/* ---- what a plan holds, as a manifest says it ----------------------- */

int plan_tensor_entry(struct manifest_tensor *mt, const struct plan_tensor *t, int rank)
{
	mt->name = strdup(t->name);
	mt->chunks = calloc(1, sizeof(*mt->chunks));
	if (!mt->name || !mt->chunks)
		return -ENOMEM;
	mt->dtype = t->dtype;
	mt->ndim = t->ndim;
	mt->sharded = t->sharded;
	mt->nchunks = 1;
	memcpy(mt->global_shape, t->global_shape, sizeof(mt->global_shape));
	mt->chunks[0].rank = rank;
	memcpy(mt->chunks[0].shape, t->shape, sizeof(mt->chunks[0].shape));
	memcpy(mt->chunks[0].global_offset, t->global_offset, sizeof(mt->chunks[0].global_offset));
	return 0;
}

int plan_holds(const struct plan *p, struct manifest_tensor **v, size_t *n)
{
	*n = 0;
	*v = calloc(p->n + 1, sizeof(**v));
	if (!*v)
		return -ENOMEM;
	for (size_t i = 0; i < p->n; i++)
		if (plan_tensor_entry(&(*v)[(*n)++], &p->t[i], p->rank))
			return -ENOMEM; /* freed with its owner, half made */
	return 0;
}

/* ---- a shard's layout -------------------------------------------------- */

void layout_put(struct shard_layout *l)
{
	if (--l->refs)
		return;
	free(l->t);
	free(l->header);
	free(l);
}

int shard_layout_header(struct shard_layout *l, const struct plan *p, char *err)
{
	struct st_tensor *st = calloc(l->n ? l->n : 1, sizeof(*st));
	char rank[16], world[16];
	struct st_meta meta[] = {
	    {"format", "pt"},        {"producer", "ckptd"},   {"job", p->job},
	    {"run", p->run},         {"rank", rank},          {"world", world},
	    {"step", ST_STAMP_STEP}, {"save", ST_STAMP_SAVE},
	};
	struct plan_tensor *t = l->t;
	uint64_t pos = 0;
	size_t len;
	int rc;

	if (!st)
		return ipc_errf(err, -ENOMEM, "out of memory");
	snprintf(rank, sizeof(rank), "%d", p->rank);
	snprintf(world, sizeof(world), "%d", p->world);
	for (size_t i = 0; i < l->n; i++) {
		st[i] = (struct st_tensor){t[i].name,  t[i].dtype, t[i].ndim,
		                           t[i].shape, pos,        pos + t[i].nbytes};
		t[i].begin = pos;
		t[i].end = pos + t[i].nbytes;
		pos = t[i].end;
	}
	rc = st_header_build(st, l->n, meta, sizeof(meta) / sizeof(meta[0]), &l->header, &len, err);
	free(st);
	if (!rc)
		rc = st_stamp_find(l->header, len, &l->stamp_at, err);
	if (rc)
		return rc;
	l->header_len = len;
	l->shard_bytes = len + pos;
	for (size_t i = 0; i < l->n; i++) {
		t[i].begin += len;
		t[i].end += len;
	}
	return 0;
}

/* ---- the shard image -------------------------------------------------- */

void *plan_tensor_addr(const struct plan *p, size_t i)
{
	return (char *)p->t[i].region->shm.data + p->t[i].offset;
}

/* The first tensor of l whose bytes end after `off`. */
static size_t tensor_at(const struct shard_layout *l, uint64_t off)
{
	size_t lo = 0, hi = l->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (l->t[mid].end <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/*
 * One walk for both kinds: host bytes copied now, GPU bytes queued on the
 * plan's lane. l's tensors carry the plan's regions: read only while the
 * plan is busy (a capture), which keeps them.
 */
int plan_queue_image(const struct plan *p, const struct shard_layout *l, const struct st_stamp *st,
                     uint64_t off, void *dst, uint64_t len, char *err)
{
	char *d = dst;
	uint64_t end = off + len;
	int rc;

	if (off < l->header_len) {
		uint64_t n = (end < l->header_len ? end : l->header_len) - off;

		memcpy(d, (const char *)l->header + off, n);
		st_stamp_apply(&l->stamp_at, st, off, d, n);
		d += n;
		off += n;
	}
	for (size_t i = tensor_at(l, off); i < l->n && off < end; i++) {
		const struct plan_tensor *t = &l->t[i];
		uint64_t n = (end < t->end ? end : t->end) - off;

		if (t->dptr) {
			rc = gpu_lane_copy(p->gpu->lane, d,
			                   (const char *)t->dptr + (off - t->begin), n, true, err);
			if (rc)
				return rc;
		} else if (safe_copy(
		               d, (const char *)t->region->shm.data + t->offset + (off - t->begin),
		               n)) {
			return err ? ipc_errf(err, -EFAULT,
			                      "tensor '%s': its host memory faulted under the copy "
			                      "(SIGBUS): the region was taken away",
			                      t->name)
			           : -EFAULT;
		}
		d += n;
		off += n;
	}
	return 0;
}

void plan_fence_finish(struct plan *p, uint32_t seq)
{
	struct plan_gpu *g = p->gpu;
	uint32_t word, *fw;

	if (!g || !g->fence_region)
		return; /* dropped: its trainer is gone, and its fence page with it */
	fw = (uint32_t *)g->fence_region->shm.data;
	word = fence_finish(&g->fence, seq);
	/*
	 * The trainer's GPU polls this word (cuStreamWaitValue32, >=): publish
	 * it, never moving it back (libckpt opens it itself when we go away).
	 */
	if ((int32_t)(word - __atomic_load_n(fw, __ATOMIC_ACQUIRE)) > 0)
		__atomic_store_n(fw, word, __ATOMIC_RELEASE);
}

struct plan *plan_rank0(struct agent *a, const char *job, const char *run)
{
	struct list *pos;

	list_for_each(pos, &a->plans)
	{
		struct plan *p = container_of(pos, struct plan, link);

		if (!p->dropped && p->rank == 0 && strcmp(p->job, job) == 0 &&
		    strcmp(p->run, run) == 0)
			return p;
	}
	return NULL;
}
