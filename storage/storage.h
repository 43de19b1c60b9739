/*
 * storage: where checkpoints live, and how bytes get there.
 *
 *   format.h   the bytes: safetensors header, manifest (safetensors.c,
 *              manifest.c)
 *   fsops.h    the syscalls that can fail, in a table tests can replace
 *   ioeng.h    asynchronous I/O: one thread owning an io_uring ring (or,
 *              where io_uring is unavailable, doing pwrite/pread itself)
 *   storage.h  (this file) the backend interface, and the local-filesystem
 *              backend that implements it (local.c, DESIGN.md §4.3)
 *
 * Threads: the I/O engine runs one thread of its own; requests are handed to
 * it from any thread and their completions run on it. The backend's other
 * calls are synchronous and run on the caller's thread (the agent calls them
 * from its worker threads, never from the gRPC thread).
 *
 * Errors: negative errno, and a sentence in `err` (IPC_ERRLEN bytes).
 */
#ifndef CKPT_STORAGE_H
#define CKPT_STORAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format.h"
#include "ioeng.h"

/* ---- backends --------------------------------------------------------- */

struct storage;
struct storage_shard;

struct storage_step {
	int64_t step;
	bool committed; /* has a manifest */
	bool pinned; /* committed and pinned (set_pinned): retention keeps it */
};

struct storage_recovery {
	unsigned partial_removed; /* step directories without a manifest */
	unsigned temp_removed; /* temporary and half-deleted leftovers */
	unsigned latest_fixed; /* LATEST files rewritten */
};

struct storage_ops {
	const char *name;
	/* Write side: creates the step directory as needed and the shard. */
	int (*shard_create)(struct storage *s, const char *job, int64_t step, int rank,
	                    uint64_t size, struct storage_shard **out, char *err);
	/* Queues r (buf, len, off set by the caller; aligned) to the shard. */
	void (*shard_write)(struct storage_shard *sh, struct io_req *r);
	/* After the last write completed: exact size, then durable; r->done. */
	void (*shard_finish)(struct storage_shard *sh, struct io_req *r);
	/* Read side: opens a committed shard; *size its length. */
	int (*shard_open)(struct storage *s, const char *job, int64_t step, int rank,
	                  struct storage_shard **out, uint64_t *size, char *err);
	void (*shard_read)(struct storage_shard *sh, struct io_req *r);
	/* Either side; NULL is fine. */
	void (*shard_close)(struct storage_shard *sh);
	/* "<root>/<job>/step-.../rank-....safetensors", for messages. */
	void (*shard_path)(struct storage *s, const char *job, int64_t step, int rank, char *buf,
	                   size_t len);

	/* Makes the checkpoint visible: manifest, then LATEST if newer. */
	int (*commit)(struct storage *s, const struct manifest *m, char *err);
	int (*read_manifest)(struct storage *s, const char *job, int64_t step,
	                     struct manifest **out, char *err);
	int (*list_jobs)(struct storage *s, char ***jobs, size_t *n, char *err);
	int (*list_steps)(struct storage *s, const char *job, struct storage_step **steps,
	                  size_t *n, char *err);
	/* -ENOENT when the job has no LATEST. */
	int (*get_latest)(struct storage *s, const char *job, int64_t *step, char *err);
	/* step < 0: remove LATEST. */
	int (*set_latest)(struct storage *s, const char *job, int64_t step, char *err);
	/*
	 * Pins (or unpins) a committed checkpoint, durably: list_steps reports
	 * it after a restart. -ENOENT when the step is not committed.
	 */
	int (*set_pinned)(struct storage *s, const char *job, int64_t step, bool pinned, char *err);
	/* Removes a checkpoint, committed or not, out of sight first. */
	int (*remove)(struct storage *s, const char *job, int64_t step, char *err);
	/* Start-up: removes what is not a checkpoint, makes LATEST right. */
	int (*recover)(struct storage *s, struct storage_recovery *r, char *err);
	void (*destroy)(struct storage *s);
};

struct storage {
	const struct storage_ops *ops;
};

struct local_opts {
	const char *root;
	struct ioeng *io; /* asynchronous shard I/O */
	const struct fsops *ops; /* synchronous calls; NULL: fsops_posix */
	bool direct; /* O_DIRECT for shards (falls back when refused) */
};

/* Opens (creating if needed) the root directory. */
int local_create(const struct local_opts *o, struct storage **out, char *err);
/* Whether shard files are opened with O_DIRECT, and why not. */
bool local_direct(const struct storage *s, const char **why);

/* The calls, so callers read as storage_commit(s, ...). */
static inline int storage_commit(struct storage *s, const struct manifest *m, char *err)
{
	return s->ops->commit(s, m, err);
}

static inline void storage_destroy(struct storage *s)
{
	if (s)
		s->ops->destroy(s);
}

#endif /* CKPT_STORAGE_H */
