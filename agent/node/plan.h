/*
 * agent/node/plan.h: plans (plan.c): what one rank saves, its shard's
 * layouts, a CUDA plan's GPU side, and the shard image the pipeline copies.
 *
 * Locks: a plan's fields are under agent.mu, but those set at creation
 * (id, job, run, rank, world, n, t, whole) which are read without it while
 * a reference is held; plan_gpu.capture is held by one capture at a time
 * (before agent.mu); a shard_layout is read only while referenced.
 */
#ifndef CKPT_AGENT_NODE_PLAN_H
#define CKPT_AGENT_NODE_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <pthread.h>

#include "agent/node/node.h"
#include "agent/pipe/fence.h"
#include "agent/pipe/gpu.h"
#include "storage/format/format.h"

struct region;
struct session;

struct plan_tensor {
	char *name;
	int dtype;
	size_t ndim;
	int64_t shape[IPC_MAX_NDIM];
	bool sharded;
	int64_t global_shape[IPC_MAX_NDIM];
	int64_t global_offset[IPC_MAX_NDIM];
	struct region *region; /* host memory; NULL for a GPU tensor */
	void *dptr; /* GPU tensor: where it is, in the agent's mapping */
	uint64_t offset;
	uint64_t nbytes;
	uint64_t begin, end; /* bytes of the shard file */
};

/*
 * What a save's shard holds: bytes of the plan's tensors in file order
 * (each whole, or a piece of rows), its header and its size. A plan's own
 * layout (`whole`: every tensor) is made with it; where replicas are
 * written once (layouts.c), the layout of the assignment the plan set
 * gives, made once per plan set. A save keeps the one it was admitted
 * with: its file, chunks and checksums follow it.
 */
struct shard_layout {
	unsigned refs; /* under mu: a plan's `dedup` + 1 per save using it (whole: unused) */
	size_t n;
	struct plan_tensor *t; /* names are the plan's; region, offset, dptr moved to the rows */
	void *header; /* the shard's first header_len bytes, with the stamp's placeholders */
	uint64_t header_len;
	struct st_stamp_at stamp_at; /* where each save writes its stamp into them */
	uint64_t shard_bytes;
	uint64_t held_bytes; /* the plan's tensors' bytes, all of them */
	uint64_t key; /* the plan set it was made for; 0: the plan's own */
};

/* A CUDA plan's GPU side: its allocations (opened once: gpu.h), its lane, its fence. */
struct plan_gpu {
	struct agent *agent;
	struct work close; /* its CUDA teardown, queued once its plan lets it go */
	int dev;
	size_t n;
	void **mem; /* the opened allocations, in the request's order */
	/*
	 * Held by a capture from its first wait to its last copy: captures of
	 * one plan use the lane (and may replace it) one at a time.
	 */
	pthread_mutex_t capture;
	struct gpu_lane *lane; /* the stream its copies go on */
	struct region *fence_region; /* the trainer's fence page */
	struct fence fence;
	/*
	 * Under mu: its captures run one after another in fence order, each
	 * queued by the one before (a capture may wait for the trainer's work,
	 * which may wait on the fence of the save before).
	 */
	bool capturing;
	struct save *next_capture, *last_capture;
};

struct plan {
	struct list link; /* agent->plans */
	struct list slink; /* session->plans */
	uint64_t id;
	struct session *sess; /* NULL once dropped */
	char job[IPC_MAX_JOB + 1];
	char run[IPC_MAX_JOB + 1]; /* the trainer's run ("0" unless it said) */
	int rank, world;
	enum backpressure backpressure; /* the plan's, or the agent's where it said DEFAULT */
	unsigned copies; /* ranks writing each replicated box (>= 1; the plan option) */
	size_t n;
	struct plan_tensor *t; /* in file order */
	struct shard_layout whole; /* every tensor, whole (t: the plan's) */
	/*
	 * Under mu: the layout saves use where this rank writes less than it
	 * holds (layouts.c); NULL: whole. dedup_key: the plan set it follows
	 * (0: none complete yet).
	 */
	struct shard_layout *dedup;
	uint64_t dedup_key;
	int64_t dedup_at; /* monotonic ns of the last look at the plan set (layouts.c) */
	uint64_t set_gen; /* the job's plans generation at that look (0: none known) */
	int set_ranks; /* ranks the run's plans files held once at that look */
	bool set_missing; /* they did not hold every rank once */
	bool set_waited; /* a save of it waited --plans-wait in vain: the next do not */
	int64_t mark_since; /* monotonic ns it began waiting for rank 0's node's set (0: not) */
	uint64_t shares_key; /* rank 0's node: the set whose shares it wrote */
	/*
	 * A look that failed (plans files not read or not the set their
	 * summaries say; shares or the set mark not put; no generation): the
	 * next is made at relook_at (monotonic ns; 0: none owed), after a
	 * back-off of relook_ns that grows while they keep failing.
	 */
	int64_t relook_at, relook_ns;
	struct plan_gpu *gpu; /* NULL: host memory only */
	unsigned refs; /* 1 until dropped, + 1 per save or restore holding it */
	unsigned active; /* captures and restores using its regions now */
	unsigned restoring; /* restores writing its regions: saves must wait */
	bool gathered; /* its restore is past read-once's gathering: nobody waits for it */
	bool dropped;
	uid_t uid; /* its user's (limits) */
};

/* Under mu. */
struct plan *plan_find(struct agent *a, uint64_t id);
/* Under mu: the live plan of rank 0 of (job, run) here, or NULL. */
struct plan *plan_rank0(struct agent *a, const char *job, const char *run);
/* Under mu: uid's own plan: another user's is as good as none. */
struct plan *plan_of(struct agent *a, uid_t uid, uint64_t id);
void plan_drop(struct agent *a, struct plan *p);
void plan_get(struct plan *p);
void plan_put(struct agent *a, struct plan *p);
/* Under mu: a plan never added (its creation failed) freed, whatever its references. */
void plan_free(struct agent *a, struct plan *p);
/* A CUDA plan's GPU side closed (its mappings, lane, fence). */
void plan_gpu_close(struct agent *a, struct plan_gpu *g);
/* Its regions are in use / no longer: once dropped and idle they are released. */
void plan_busy(struct plan *p);
void plan_idle(struct agent *a, struct plan *p);
/*
 * Bytes [off, off + len) (header and tensors) of a shard of layout l into
 * dst, its header stamped with st (the save's step and number): host
 * bytes copied now, a CUDA plan's GPU bytes queued on its lane (wait for
 * them with gpu_lane_wait). No lock. Fails only for a GPU copy, or a fault
 * of host memory.
 */
int plan_queue_image(const struct plan *p, const struct shard_layout *l, const struct st_stamp *st,
                     uint64_t off, void *dst, uint64_t len, char *err);
/*
 * l's header, and each tensor's place in the file: t[0..n) laid out one
 * after the other (the shard of rank of job/run). No lock.
 */
int shard_layout_header(struct shard_layout *l, const struct plan *p, char *err);

/*
 * Under mu: what plan p holds, as tensors of one chunk each of its rank
 * (file order), into *v, *n (freed with them, as a plans_rank's). -ENOMEM.
 */
int plan_holds(const struct plan *p, struct manifest_tensor **v, size_t *n);
/* Under mu: a reference to l let go (a plan's whole layout is never freed here). */
void layout_put(struct shard_layout *l);
/* Tensor t of rank `rank`, as a manifest's entry of one chunk, whole (-ENOMEM, half made). */
int plan_tensor_entry(struct manifest_tensor *mt, const struct plan_tensor *t, int rank);

#endif /* CKPT_AGENT_NODE_PLAN_H */
