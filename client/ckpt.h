/*
 * libckpt: the trainer's side of ckptd.
 *
 * A trainer connects to the node's agent, hands it its tensors once (a plan),
 * then asks for saves by step. ckpt_save returns as soon as the agent has
 * queued the save; ckpt_save_wait(s, CKPT_CAPTURED, ...) returns once every
 * byte is out of the trainer's memory, and the trainer may write its tensors
 * again. Everything after that (write, fsync, commit) is the agent's work and
 * finishes even if the trainer exits.
 *
 * Conventions: every int-returning function returns 0 (or a non-negative
 * value) on success and a negative errno on failure. ckpt_strerror() turns
 * such a value into text; ckpt_last_error() gives the agent's own message for
 * the client's last failure (what was wrong, on which job/step/tensor).
 *
 * Threads: a client may be used from several threads. ckpt_last_error() is
 * per client; under concurrent failures it holds the latest.
 */
#ifndef CKPT_H
#define CKPT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CKPT_VERSION_MAJOR 0
#define CKPT_VERSION_MINOR 1

/* The safetensors dtype set. */
enum ckpt_dtype {
	CKPT_BOOL = 1,
	CKPT_U8 = 2,
	CKPT_I8 = 3,
	CKPT_F8_E5M2 = 4,
	CKPT_F8_E4M3 = 5,
	CKPT_I16 = 6,
	CKPT_U16 = 7,
	CKPT_F16 = 8,
	CKPT_BF16 = 9,
	CKPT_I32 = 10,
	CKPT_U32 = 11,
	CKPT_F32 = 12,
	CKPT_F64 = 13,
	CKPT_I64 = 14,
	CKPT_U64 = 15,
};

/* Per rank, then per checkpoint; monotonic except for the two ends. */
enum ckpt_state {
	CKPT_QUEUED = 1,
	CKPT_CAPTURED = 2, /* out of trainer memory: tensors may be written */
	CKPT_DURABLE = 3, /* this rank's shard is written and fsync'd */
	CKPT_COMMITTED = 4, /* every rank durable, manifest durable */
	CKPT_UPLOADED = 5, /* also complete in the object store */
	CKPT_FAILED = 6, /* with a reason: ckpt_last_error() */
	CKPT_SKIPPED = 7, /* staging pool full and the job's policy is skip */
};

/* What a save does when the agent's staging pool is taken. */
enum ckpt_backpressure {
	CKPT_BP_DEFAULT = 0, /* the agent's configured policy */
	CKPT_BP_BLOCK = 1, /* wait for room */
	CKPT_BP_SKIP = 2, /* SKIPPED at once, with the reason */
};

#define CKPT_LATEST ((int64_t)-1)
#define CKPT_MAX_NDIM 16

struct ckpt_client;
struct ckpt_plan;
struct ckpt_save;

struct ckpt_tensor {
	const char *name; /* unique within the job */
	enum ckpt_dtype dtype;
	int ndim; /* 0..CKPT_MAX_NDIM */
	const int64_t *shape; /* this rank's local shape */
	void *data; /* from ckpt_host_alloc, or a CUDA device pointer */
	const int64_t *global_shape; /* NULL unless sharded across ranks */
	const int64_t *global_offset; /* where this chunk starts in the global tensor */
};

/*
 * Connects to the agent. endpoint NULL: $CKPT_ENDPOINT, else
 * unix:/run/ckptd/ckptd.sock. Fails with -ECONNREFUSED when no agent answers,
 * -ENOTSUP when the agent speaks another protocol (the message names both
 * versions).
 *
 * Agent restarts: when the agent goes away (restarted, upgraded, crashed),
 * the client attaches again to the one that comes back, for up to
 * $CKPT_RECONNECT_SECONDS (default 300; 0: never), and hands it its host
 * memory and plans again; nothing changes for the caller's pointers. Saves
 * the agent had not committed end FAILED with a reason saying it went away;
 * a save asked while it is away is FAILED at once (the training loop is not
 * held); other calls wait for the new agent. Committed checkpoints are the
 * agent's root's, untouched.
 */
int ckpt_connect(const char *endpoint, struct ckpt_client **out);
/* The release of the agent the client is attached to ("0.1.0"). */
const char *ckpt_agent_version(struct ckpt_client *c);

/* Releases the client's plans and memory; saves past CAPTURED still commit. */
void ckpt_disconnect(struct ckpt_client *c);

/*
 * Host memory the agent can read (save) and write (restore): a sealed memfd
 * handed to the agent, page-aligned, zero-filled, every page allocated now
 * (-ENOMEM/-ENOSPC here rather than a fault later). Tensors of a plan must
 * lie inside such regions (or be CUDA device pointers). The region is
 * released when freed or when the client disconnects or exits.
 */
int ckpt_host_alloc(struct ckpt_client *c, size_t bytes, void **ptr);
/*
 * Unmaps the region and tells the agent, waiting at most 5 s for it (not at
 * all once a call went unanswered: the agent then releases it when the
 * client disconnects or exits).
 */
void ckpt_host_free(struct ckpt_client *c, void *ptr);

/*
 * Registers what this rank saves: n tensors of job `job`, rank `rank` of
 * `world`. The agent checks every tensor (name, dtype x shape = bytes, inside
 * its region, no overlap, unique names) and lays out the shard once. The
 * plan is reused by every save.
 */
int ckpt_plan_create(struct ckpt_client *c, const char *job, int rank, int world,
                     const struct ckpt_tensor *t, size_t n, struct ckpt_plan **out);

/*
 * A plan's options. `size` is sizeof(struct ckpt_plan_opts) as the caller
 * was compiled with: fields added later sit after the ones known today, and
 * an older library refuses (-E2BIG) a newer caller's options only when it
 * sets one it does not know. Start from CKPT_PLAN_OPTS_INIT.
 */
struct ckpt_plan_opts {
	size_t size;
	enum ckpt_backpressure backpressure; /* CKPT_BP_DEFAULT: the agent's policy */
	/*
	 * The run (one incarnation of the job: a restart is a new run), as
	 * [A-Za-z0-9._-]{1,64}, not beginning with '.' (as job and node
	 * names). NULL: $CKPT_RUN, else "0". Every rank of one run must say
	 * the same; a part of another run never joins a checkpoint, which
	 * fences out late writers of a run that died.
	 */
	const char *run;
	/*
	 * How many ranks write each box that several ranks hold (its replicas:
	 * the same tensor name, dtype, global shape, offset and local shape).
	 * 0: one (each replicated box written once, the writers balanced);
	 * CKPT_COPIES_ALL: every replica writes its own copy. A restore and
	 * verify use any good copy. Every rank of a run should say the same
	 * (the largest any rank says is used).
	 */
	unsigned copies;
	/*
	 * Zero. Named so that no padding follows `copies`: an older libckpt
	 * checks that the bytes past what it knows are zero.
	 */
	unsigned reserved;
};

#define CKPT_COPIES_ALL 0xffffffffu

#define CKPT_PLAN_OPTS_INIT                                                                        \
	{                                                                                          \
		sizeof(struct ckpt_plan_opts), CKPT_BP_DEFAULT, NULL, 0, 0                         \
	}

/* ckpt_plan_create with options (opts NULL: the defaults). */
int ckpt_plan_create_opts(struct ckpt_client *c, const char *job, int rank, int world,
                          const struct ckpt_tensor *t, size_t n, const struct ckpt_plan_opts *opts,
                          struct ckpt_plan **out);

/* ckpt_plan_create with a backpressure policy: ckpt_plan_create_opts with only that. */
int ckpt_plan_create2(struct ckpt_client *c, const char *job, int rank, int world,
                      const struct ckpt_tensor *t, size_t n, enum ckpt_backpressure bp,
                      struct ckpt_plan **out);

/*
 * Drops the plan; its saves past CAPTURED still commit. Like ckpt_host_free
 * it waits at most 5 s for the agent's answer, not at all once a call went
 * unanswered; a CUDA plan's then waits for its saves to be captured (its
 * fence, see ckpt_save_fence), unless the agent is gone or not answering.
 */
void ckpt_plan_destroy(struct ckpt_plan *p);

/* Shard bytes of this rank (the exact size of its safetensors file). */
uint64_t ckpt_plan_bytes(const struct ckpt_plan *p);

/*
 * Asks for a save of `step`. Returns once the agent has queued it (or
 * skipped it: then the save's state is CKPT_SKIPPED). meta_json: NULL, or a
 * JSON value stored in the manifest and returned by ckpt_restore.
 */
int ckpt_save(struct ckpt_plan *p, int64_t step, const char *meta_json, struct ckpt_save **out);

/*
 * Waits until the save reaches `until` or a later state. 0 once reached;
 * -ETIMEDOUT after timeout_ms (negative: no limit); -EIO if FAILED (also
 * when the agent went away before it committed: the reason says so);
 * -ECANCELED if SKIPPED; -ENOTCONN once the client is disconnected or no
 * longer attaches again ($CKPT_RECONNECT_SECONDS=0, or it gave up).
 */
int ckpt_save_wait(struct ckpt_save *s, enum ckpt_state until, int timeout_ms);
enum ckpt_state ckpt_save_state(struct ckpt_save *s);
/* Why the save FAILED or was SKIPPED; "" otherwise. Valid until release. */
const char *ckpt_save_reason(struct ckpt_save *s);
void ckpt_save_release(struct ckpt_save *s);

/*
 * Reads the checkpoint `step` (or CKPT_LATEST: the newest committed) of the
 * plan's job back into the plan's tensors, checking every tensor's checksum.
 * *restored_step gets the step; *meta_json the user meta (malloc'd, caller
 * frees; NULL if none). Either out may be NULL.
 *
 * "Nothing there" and "there but damaged" are different answers:
 *   -ENOENT   no such checkpoint: the job has none committed (a fresh
 *             start), or not that step. Only this one means "start over".
 *   -EBADMSG  a committed checkpoint that cannot be read whole: a file
 *             missing or not what the manifest says, a checksum mismatch,
 *             a manifest that does not parse; ckpt_last_error() names the
 *             step, the rank, the file and what is wrong. Never a fresh start.
 *   -EIO      the storage failed (say why; try again): the checkpoint may
 *             well be whole.
 *   -EINVAL   a plan that does not match the checkpoint's layout.
 * With CKPT_LATEST, a damaged newest step is passed over for the newest
 * one that restores whole, loudly: libckpt says on stderr which steps were
 * passed over and why (so do the agent's log and its metrics), and
 * *restored_step says which was restored. ckpt_restore_opts chooses
 * otherwise (CKPT_FALLBACK_NEVER) and returns those notes.
 *
 * Ranks restoring LATEST alone may land on different steps when the damage
 * is in a file only some of them read: compare the restored steps across
 * ranks (the trainer has the collective) and restore the smallest by
 * number where they differ. ckpt.torch does this when torch.distributed is
 * initialized.
 */
int ckpt_restore(struct ckpt_plan *p, int64_t step, int64_t *restored_step, char **meta_json);

/*
 * Saves and restores of a plan that the agent that came back after a
 * restart refused: -ESTALE, with its reason (destroy the plan, create it anew).
 */

/* With CKPT_LATEST, which failures of the newest step send a restore to an older one. */
enum ckpt_fallback {
	CKPT_FALLBACK_DAMAGED = 0, /* damage, loudly (the default: ckpt_restore) */
	CKPT_FALLBACK_NEVER = 1, /* strict: the newest step, or its error */
	CKPT_FALLBACK_ANY = 2, /* any failure but -EINVAL (an I/O error too) */
};

/*
 * A restore's options, grown as ckpt_plan_opts grows (`size` first; start
 * from CKPT_RESTORE_OPTS_INIT). `skipped` is an answer, not an option.
 */
struct ckpt_restore_opts {
	size_t size;
	enum ckpt_fallback fallback;
	unsigned reserved; /* zero */
	/*
	 * Out: NULL, or the steps passed over and the other notes of the
	 * restore (copies read from replicas, the upload tier's copy), one a
	 * line ("step 12: rank 3's shard ...: missing"); malloc'd, the caller
	 * frees it. Set on success; a failure's message (ckpt_last_error)
	 * names them all.
	 */
	char *skipped;
};

#define CKPT_RESTORE_OPTS_INIT                                                                     \
	{                                                                                          \
		sizeof(struct ckpt_restore_opts), CKPT_FALLBACK_DAMAGED, 0, NULL                   \
	}

/* ckpt_restore with options (o NULL: the defaults, and the notes said on stderr). */
int ckpt_restore_opts(struct ckpt_plan *p, int64_t step, struct ckpt_restore_opts *o,
                      int64_t *restored_step, char **meta_json);

/* ckpt_restore; fallback 1: CKPT_FALLBACK_ANY, 0: the default (CKPT_FALLBACK_DAMAGED). */
int ckpt_restore2(struct ckpt_plan *p, int64_t step, int fallback, int64_t *restored_step,
                  char **meta_json);

const char *ckpt_strerror(int err);
/*
 * The agent's (or libckpt's) message for c's last failure; with NULL, why
 * this thread's last ckpt_connect failed ("" if none did).
 */
const char *ckpt_last_error(struct ckpt_client *c);
const char *ckpt_state_name(enum ckpt_state s);

/*
 * The CUDA transport. Tensors whose data is a CUDA device pointer (memory from
 * cudaMalloc, or a caching allocator's blocks of it) go into a plan like host
 * tensors; all of one plan on one GPU. Define CKPT_HAVE_CUDA_API before
 * including this header to declare these (libckpt built with CUDA has them).
 */
#ifdef CKPT_HAVE_CUDA_API
#include <cuda_runtime_api.h>
/*
 * ckpt_save, with the agent's copies ordered after the work queued on
 * `stream` (ckpt_save uses the default stream of the plan's GPU). Nothing
 * waits on the host. -EBUSY while 64 saves of the plan are not yet captured.
 */
int ckpt_save_on(struct ckpt_plan *p, int64_t step, const char *meta_json, cudaStream_t stream,
                 struct ckpt_save **out);
/*
 * Makes `stream` wait for CAPTURED without blocking the host thread: work
 * queued on it afterwards (the next step's writes to the tensors) runs only
 * once the agent's copies of this save are done. If the agent goes away the
 * fence opens. -EINVAL for a save of a host-memory plan; -ENOTCONN once
 * the client is disconnected. After ckpt_plan_destroy (which waits for its
 * saves to be captured) there is nothing left to wait for: 0.
 */
int ckpt_save_fence(struct ckpt_save *s, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif /* CKPT_H */
