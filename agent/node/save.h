/*
 * agent/node/save.h: saves (save.c): a rank's save from QUEUED to its end,
 * the capture job, and what it tells its checkpoint.
 *
 * Locks: under agent.mu but the pipeline's fields: the atomics (bytes_*,
 * stages, io_err, abort), the checksums (the hasher's while it streams),
 * resv and shard (the pipeline's while it runs).
 */
#ifndef CKPT_AGENT_NODE_SAVE_H
#define CKPT_AGENT_NODE_SAVE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "agent/node/hub.h"
#include "agent/node/plan.h"
#include "agent/pipe/gpu.h"
#include "agent/pipe/pool.h"
#include "ipc/ipc.h"
#include "storage/storage.h"

struct checkpoint;
struct session;
struct rpc;

/* What a save tells its checkpoint (save.tell). */
enum save_news {
	SAVE_NEWS_FAILED, /* it failed (why: "rank R: ..."): so does the checkpoint */
	SAVE_NEWS_SKIPPED, /* no room in the pool under the skip policy: the checkpoint fails */
	SAVE_NEWS_DURABLE, /* its shard is durable */
	SAVE_NEWS_STOPPED, /* its pipeline stopped (after any of the above, or aborted) */
};

struct save {
	struct list link; /* agent->saves */
	struct work work; /* the capture job */
	uint64_t id;
	struct agent *a;
	struct plan *plan; /* until its checkpoint is released */
	struct shard_layout *lay; /* what its shard holds (the plan's whole, or dedup) */
	char job[IPC_MAX_JOB + 1];
	int rank, world;
	uint64_t bytes_total;
	struct checkpoint *cp;
	struct session *sess; /* to tell; NULL once the client left */
	int64_t step;
	enum save_state state;
	char reason[IPC_ERRLEN];
	atomic_bool abort;
	bool fenced; /* a CUDA plan's: it holds a number on the plan's fence */
	uint32_t fence_seq; /* that number */
	bool fence_done; /* it has released its number */
	bool capturing; /* its capture job is queued or running */
	struct save *next_capture; /* plan_gpu's queue */
	uint8_t cuda_event[GPU_EVENT_HANDLE_BYTES]; /* the trainer's event for this save */
	bool pool_limited;
	bool upload_failed; /* COMMITTED, and it will not be UPLOADED: reason says why */
	unsigned want; /* chunks to reserve; counted in queued_chunks until then */
	struct pool_resv resv;
	struct storage_shard *shard;
	char file[SHARD_FILE_MAX]; /* the shard's name, once created */
	char *meta; /* the user meta of this rank's save, or NULL */
	unsigned nchunks;
	atomic_uint_fast64_t bytes_captured, bytes_written;
	atomic_int stages; /* capture running + chunks in flight + fsync */
	atomic_int io_err; /* first I/O error (the thread its write ended on) */
	/* checksums, the hasher's alone while it streams: a tensor at a time, in file order */
	void *xs;
	size_t hash_next;
	uint64_t *digest;
	struct io_req finish;
	int64_t t_queued, t_captured, t_durable, t_committed; /* monotonic ns */
	int64_t queued_unix_ns;
	struct st_stamp stamp; /* its step and a random number: its header's, its part's */
	/*
	 * Under mu: its pipeline has stopped (stream.c): durable (the final
	 * fsync done), or failure (why; NULL: aborted, and it says why already).
	 * Set by whoever started it (save.c).
	 */
	void (*ended)(struct agent *a, struct save *s, bool durable, const char *failure);
	/* Under mu: its checkpoint hears what befalls it (set as it joins: cp_join). */
	void (*tell)(struct agent *a, struct save *s, enum save_news what, const char *why);
	/*
	 * No lock: bytes [off, off + len) of its shard, its header stamped, into
	 * dst from its plan's memory (a CUDA plan's queued on its lane), for the
	 * pipeline's copies (plan_queue_image). Set by save.c.
	 */
	int (*image)(const struct save *s, uint64_t off, void *dst, uint64_t len, char *err);
	/*
	 * No lock: its shard could not be created (rc): true where the root has
	 * been made usable again and the create is worth one more try, else err
	 * says what is wrong with the root (root_after_failure). Set by save.c.
	 */
	bool (*root_again)(struct agent *a, int rc, char *err);
};

/*
 * Under mu: a save of plan p's rank for step, QUEUED, its capture job set
 * (not queued), counted in flight; NULL without memory. It joins its
 * checkpoint next (cp_join).
 */
struct save *save_new(struct agent *a, struct plan *p, int64_t step);
/*
 * Under mu: moves s to `state` (monotonic), then publishes it (hub_save:
 * each subscriber hears it once s is there, its t_* set, and changes
 * nothing of the save).
 */
void save_set_state(struct agent *a, struct save *s, enum save_state state, const char *reason);
/* Under mu (a hub_save_fn): the log hears of saves that end other than committed. */
void save_log(struct agent *a, struct save *s, enum save_state state);
/*
 * Under mu (a hub_ckpt_fn): a step uploaded to the tier, or given up: this
 * node's COMMITTED saves of it are UPLOADED, or say why not.
 */
void save_on_ckpt(struct agent *a, const struct hub_ckpt *c);
/*
 * Under mu: a COMMITTED save will not be UPLOADED (upload.c gave it up): the
 * trainer (waiting for UPLOADED) and watchers hear why; its state stays.
 */
void save_upload_failed(struct agent *a, struct save *s, const char *why);
/* Under mu: the client left; its saves tell nobody. */
void save_forget_session(struct agent *a, struct session *sess);
/* Under mu: frees finished saves beyond AGENT_KEEP_FINISHED. */
void save_trim(struct agent *a);
/* Under mu: its checkpoint is released; the plan and checksums are no longer needed. */
void save_detach(struct agent *a, struct save *s);
/* Unlinks and frees a save whose pipeline has stopped. */
void save_free(struct agent *a, struct save *s);

#endif /* CKPT_AGENT_NODE_SAVE_H */
